"""HTTP pieces shared by the gateway's local API and the metadata server.

* :class:`ListenAddress`: ``host``, ``port`` and ``is_loopback`` of a
  ``listen = "host:port"`` setting (a mixin for the settings dataclasses);
* :class:`ApiError` and :func:`error_response`: a refusal with a stable code,
  answered as ``{"error": {"code": ..., "message": ..., ...}}``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse

__all__ = ["ApiError", "ListenAddress", "error_response"]


class ListenAddress:
    """``host``/``port``/``is_loopback`` derived from a ``listen`` attribute (``host:port``)."""

    __slots__ = ()
    listen: str

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


class ApiError(Exception):
    """An HTTP-level refusal with a stable code (401, 413, 415, ...)."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def error_response(
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message, **extra}}, status, headers=headers
    )
