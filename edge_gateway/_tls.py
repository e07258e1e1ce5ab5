"""TLS of the local API: the server's context from ``[api] tls_*`` (docs/security.md, "TLS").

Loaded once at start, before the port is bound: a missing, unreadable or
mismatched file stops ``edgegw serve`` with one line naming the key
(:class:`~edge_gateway.errors.ConfigError`), not a traceback. Both servers
use the same settings: the builtin one wraps each accepted connection in
a :class:`~edge_gateway._tlsstream.TlsStream` with this context,
hypercorn is given the files.
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Final

from edge_gateway.errors import ConfigError

if TYPE_CHECKING:
    from edge_gateway.config import ApiConfig

__all__ = ["TLS_HANDSHAKE_RECORD", "server_context"]

#: The first byte of every TLS connection (a handshake record). A connection
#: that starts with anything else is a plain HTTP client on the HTTPS port.
TLS_HANDSHAKE_RECORD: Final = 0x16


def _reason(exc: Exception) -> str:
    if isinstance(exc, ssl.SSLError):
        if exc.reason == "PEM_LIB" or "PEM lib" in str(exc):
            return "not PEM (or an encrypted key, which the gateway cannot use)"
        if exc.reason:
            return exc.reason.replace("_", " ").lower()
    elif isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def server_context(api: ApiConfig) -> ssl.SSLContext:
    """The server-side context for ``api`` (TLS 1.2 or later; ALPN ``http/1.1``)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    try:
        ctx.load_cert_chain(api.tls_cert, api.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"api.tls_cert / api.tls_key: cannot load {api.tls_cert} with {api.tls_key}: "
            f"{_reason(exc)}"
        ) from None
    if api.tls_client_ca:
        try:
            ctx.load_verify_locations(cafile=api.tls_client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"api.tls_client_ca: cannot load {api.tls_client_ca}: {_reason(exc)}"
            ) from None
        # Optional in the handshake: a certificate presented is verified
        # there (a bad one fails it), a missing one is answered over TLS with
        # 403 client_certificate_required, which says what is wrong, where a
        # failed handshake only closes the connection.
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx
