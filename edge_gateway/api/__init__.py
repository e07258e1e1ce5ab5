"""The local HTTP API that a site's producers and consumers use (``docs/api.md``).

* :func:`serve_api` — the gateway service: the builtin HTTP/1.1 server (or
  hypercorn, ``api.server``) on trio, bound to ``api.listen``; add it with
  ``gateway.add_service("api", serve_api)``;
* :func:`create_app` — the ASGI app alone (over a gateway; routing in :mod:`._asgi`);
* :func:`status_document` — the status document (``GET /v1/status``) of a gateway;
* :mod:`edge_gateway.api.wire` — media types, headers and error codes,
  shared with :mod:`edge_gateway.client`.

The server parts load on first use, so that the client can import
:mod:`edge_gateway.api.wire` without the server (and hypercorn, loaded only
when it is ``api.server``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_gateway._lazy import lazy_attributes

if TYPE_CHECKING:
    from edge_gateway.api._app import ApiApp, ApiError, create_app
    from edge_gateway.api._server import ADDR_FILE, serve_api
    from edge_gateway.api._status import status_document

__all__ = ["ADDR_FILE", "ApiApp", "ApiError", "create_app", "serve_api", "status_document"]

__getattr__ = lazy_attributes(
    __name__,
    {
        "ApiApp": "edge_gateway.api._app",
        "ApiError": "edge_gateway.api._app",
        "create_app": "edge_gateway.api._app",
        "serve_api": "edge_gateway.api._server",
        "ADDR_FILE": "edge_gateway.api._server",
        "status_document": "edge_gateway.api._status",
    },
)
