"""A server's TLS context from its certificate settings (docs/security.md, "TLS").

The local API and the Kafka listener use the ``[api] tls_*`` settings: the
context is loaded once at start, before the port is bound: a missing,
unreadable or mismatched file stops ``edgegw serve`` with one line naming the
key (:class:`~edge_gateway.errors.ConfigError`), not a traceback. The builtin
HTTP server (:mod:`edge_gateway.net.http11`) and the Kafka listener wrap each
accepted connection in a :class:`~edge_gateway.net.tlsstream.TlsStream` with
this context; hypercorn is given the files.
"""

from __future__ import annotations

import ssl
from typing import Final, Protocol

from edge_gateway.errors import ConfigError

__all__ = ["API_TLS_SETTINGS", "TLS_HANDSHAKE_RECORD", "TlsSettings", "server_context"]

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


class TlsSettings(Protocol):
    """The certificate settings of a server (as :class:`edge_gateway.config.ApiConfig` has them)."""

    @property
    def tls_cert(self) -> str:
        """The server's certificate chain (PEM file)."""

    @property
    def tls_key(self) -> str:
        """The server's private key (PEM file, not encrypted)."""

    @property
    def tls_client_ca(self) -> str:
        """CA certificates that sign the clients' certificates (PEM), or ``""``."""


#: How :func:`server_context`'s errors name the three settings by default: the
#: ``[api]`` section's, which the local API and the Kafka listener share.
API_TLS_SETTINGS: Final = ("api.tls_cert", "api.tls_key", "api.tls_client_ca")


def server_context(
    settings: TlsSettings, *, names: tuple[str, str, str] = API_TLS_SETTINGS
) -> ssl.SSLContext:
    """The server-side context for ``settings`` (TLS 1.2 or later; ALPN ``http/1.1``).

    A file that cannot be loaded is a :class:`~edge_gateway.errors.ConfigError`
    that names the setting as ``names`` spell it (certificate, key, client CA):
    a config file's keys, or a command's options (``--tls-cert``).
    """
    cert_name, key_name, ca_name = names
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    try:
        ctx.load_cert_chain(settings.tls_cert, settings.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"{cert_name} / {key_name}: cannot load {settings.tls_cert} "
            f"with {settings.tls_key}: {_reason(exc)}"
        ) from None
    if settings.tls_client_ca:
        try:
            ctx.load_verify_locations(cafile=settings.tls_client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"{ca_name}: cannot load {settings.tls_client_ca}: {_reason(exc)}"
            ) from None
        # Optional in the handshake: a certificate presented is verified
        # there (a bad one fails it), a missing one is answered over TLS with
        # 403 client_certificate_required, which says what is wrong, where a
        # failed handshake only closes the connection.
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx
