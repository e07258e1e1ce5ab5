"""SASL/PLAIN for the Kafka listener, as a sans-IO per-connection state machine.

When ``api.token`` is set, a Kafka connection must authenticate before anything
but ApiVersions, SaslHandshake and SaslAuthenticate: SaslHandshake (v1) with
mechanism ``PLAIN``, then SaslAuthenticate carrying PLAIN's message
``[authzid] NUL username NUL password`` (RFC 4616). The password is the API
token; the username is free (it is logged, not checked). The listener closes a
connection whose first other request comes before authentication, and one
whose authentication failed (after sending the failure, as Kafka does).

Without a token SASL is off: SaslHandshake answers UNSUPPORTED_SASL_MECHANISM
with an empty mechanism list, so a client configured for SASL says why it
cannot connect instead of sending credentials nobody checks.

SaslHandshake v0 (the raw SASL bytes that follow it outside Kafka's framing)
is not supported: every client of the last years uses v1 with SaslAuthenticate.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from enum import Enum

from kio.schema.errors import ErrorCode

__all__ = ["ALWAYS_ALLOWED_API_KEYS", "SaslOutcome", "SaslPlain", "SaslState", "parse_plain"]

#: ApiVersions, SaslHandshake, SaslAuthenticate: allowed before authentication.
ALWAYS_ALLOWED_API_KEYS = frozenset({18, 17, 36})

MECHANISM = "PLAIN"

#: Longest PLAIN message accepted (authzid, username and password together).
_MAX_PLAIN_BYTES = 4096


class SaslState(Enum):
    #: No handshake yet (or SASL is off).
    START = "start"
    #: SaslHandshake(PLAIN) accepted; SaslAuthenticate expected.
    HANDSHAKEN = "handshaken"
    AUTHENTICATED = "authenticated"
    #: A failed attempt: the listener closes the connection after the answer.
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class SaslOutcome:
    error: ErrorCode
    message: str | None = None
    #: The listener must close the connection once this answer is sent.
    close: bool = False


def parse_plain(message: bytes) -> tuple[str, str, bytes]:
    """Split a PLAIN message into (authzid, username, password); raise ValueError."""
    if len(message) > _MAX_PLAIN_BYTES:
        raise ValueError("PLAIN message too long")
    parts = message.split(b"\x00")
    if len(parts) != 3:
        raise ValueError("PLAIN message must be authzid NUL username NUL password")
    authzid, username, password = parts
    if not username:
        raise ValueError("PLAIN message without a username")
    return authzid.decode("utf-8"), username.decode("utf-8"), password


class SaslPlain:
    """One connection's SASL/PLAIN state against one token (sans-IO)."""

    def __init__(self, token: str) -> None:
        self._token = token.encode("utf-8")
        self.state = SaslState.START
        #: The PLAIN username of an authenticated connection (for logs).
        self.username: str | None = None

    @property
    def required(self) -> bool:
        return bool(self._token)

    def allows(self, api_key: int) -> bool:
        """May a request with this API key be served on this connection now?"""
        if not self.required or api_key in ALWAYS_ALLOWED_API_KEYS:
            return True
        return self.state is SaslState.AUTHENTICATED

    def mechanisms(self) -> tuple[str, ...]:
        return (MECHANISM,) if self.required else ()

    def handshake(self, version: int, mechanism: str) -> SaslOutcome:
        if not self.required:
            return SaslOutcome(ErrorCode.unsupported_sasl_mechanism, "SASL is off (no api.token)")
        if self.state is not SaslState.START:
            return SaslOutcome(ErrorCode.illegal_sasl_state, "handshake already done", close=True)
        if version < 1:
            # v0 sends the SASL bytes unframed after the handshake: not supported.
            return SaslOutcome(ErrorCode.unsupported_version, "SaslHandshake v1+ only", close=True)
        if mechanism != MECHANISM:
            return SaslOutcome(ErrorCode.unsupported_sasl_mechanism, f"only {MECHANISM}")
        self.state = SaslState.HANDSHAKEN
        return SaslOutcome(ErrorCode.none)

    def authenticate(self, auth_bytes: bytes) -> SaslOutcome:
        if self.state is not SaslState.HANDSHAKEN:
            return SaslOutcome(
                ErrorCode.illegal_sasl_state,
                "SaslAuthenticate before SaslHandshake(PLAIN) or after authentication",
                close=True,
            )
        try:
            _authzid, username, password = parse_plain(auth_bytes)
        except (ValueError, UnicodeDecodeError) as exc:
            self.state = SaslState.FAILED
            return SaslOutcome(
                ErrorCode.sasl_authentication_failed, f"malformed PLAIN message: {exc}", close=True
            )
        # Constant-time: the comparison's duration tells nothing about the token.
        if not hmac.compare_digest(password, self._token):
            self.state = SaslState.FAILED
            return SaslOutcome(
                ErrorCode.sasl_authentication_failed,
                "authentication failed: the password must be the gateway's api.token",
                close=True,
            )
        self.state = SaslState.AUTHENTICATED
        self.username = username
        return SaslOutcome(ErrorCode.none)
