"""The sans-IO SASL/PLAIN state machine of a Kafka connection."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from edge_gateway.kafka._sasl import SaslPlain, SaslState, parse_plain

TOKEN = "tok-23"


def test_without_a_token_everything_is_allowed_and_sasl_is_refused() -> None:
    s = SaslPlain("")
    assert not s.required
    assert s.allows(0)  # Produce
    assert s.allows(3)  # Metadata
    out = s.handshake(1, "PLAIN")
    assert out.error is ErrorCode.unsupported_sasl_mechanism
    assert not out.close
    assert s.mechanisms() == ()


def test_with_a_token_only_the_handshake_apis_before_authentication() -> None:
    s = SaslPlain(TOKEN)
    assert [s.allows(k) for k in (18, 17, 36)] == [True, True, True]
    assert [s.allows(k) for k in (0, 1, 3, 8, 11)] == [False] * 5
    assert s.handshake(1, "PLAIN").error is ErrorCode.none
    assert s.state is SaslState.HANDSHAKEN
    assert not s.allows(3)
    out = s.authenticate(b"\x00site-7\x00" + TOKEN.encode())
    assert (out.error, out.close) == (ErrorCode.none, False)
    assert s.state is SaslState.AUTHENTICATED
    assert s.username == "site-7"
    assert s.allows(3)
    assert s.allows(0)


def test_wrong_password_fails_and_closes() -> None:
    s = SaslPlain(TOKEN)
    s.handshake(1, "PLAIN")
    out = s.authenticate(b"\x00site\x00tok-24")
    assert out.error is ErrorCode.sasl_authentication_failed
    assert out.close
    assert out.message is not None
    assert TOKEN not in out.message
    assert s.state is SaslState.FAILED
    assert not s.allows(3)
    # No second chance on the same connection.
    assert s.authenticate(b"\x00site\x00" + TOKEN.encode()).error is ErrorCode.illegal_sasl_state


@pytest.mark.parametrize(
    "message",
    [
        b"",
        b"no-nul",
        b"a\x00b",
        b"\x00\x00" + TOKEN.encode(),
        b"a\x00b\x00c\x00d",
        b"\xff\x00u\x00p",
    ],
)
def test_malformed_plain_messages_fail(message: bytes) -> None:
    s = SaslPlain(TOKEN)
    s.handshake(1, "PLAIN")
    out = s.authenticate(message)
    assert out.error is ErrorCode.sasl_authentication_failed
    assert out.close
    assert s.state is SaslState.FAILED


def test_oversized_plain_message_fails() -> None:
    s = SaslPlain(TOKEN)
    s.handshake(1, "PLAIN")
    out = s.authenticate(b"\x00u\x00" + b"x" * 5000)
    assert out.error is ErrorCode.sasl_authentication_failed


def test_other_mechanisms_and_handshake_misuse() -> None:
    s = SaslPlain(TOKEN)
    out = s.handshake(1, "SCRAM-SHA-256")
    assert out.error is ErrorCode.unsupported_sasl_mechanism
    assert s.mechanisms() == ("PLAIN",)
    assert s.state is SaslState.START
    assert s.handshake(0, "PLAIN").error is ErrorCode.unsupported_version
    assert s.authenticate(b"\x00u\x00" + TOKEN.encode()).error is ErrorCode.illegal_sasl_state
    s2 = SaslPlain(TOKEN)
    s2.handshake(1, "PLAIN")
    again = s2.handshake(1, "PLAIN")
    assert (again.error, again.close) == (ErrorCode.illegal_sasl_state, True)


def test_authzid_is_accepted_and_ignored() -> None:
    s = SaslPlain(TOKEN)
    s.handshake(1, "PLAIN")
    assert s.authenticate(b"admin\x00site\x00" + TOKEN.encode()).error is ErrorCode.none
    assert s.username == "site"


@given(st.binary(max_size=300))
def test_any_bytes_give_an_answer_never_an_exception(message: bytes) -> None:
    s = SaslPlain(TOKEN)
    s.handshake(1, "PLAIN")
    out = s.authenticate(message)
    ok = message.count(b"\x00") == 2 and message.rsplit(b"\x00", 1)[1] == TOKEN.encode()
    if out.error is ErrorCode.none:
        assert ok
        assert s.allows(3)
    else:
        assert out.close
        assert not s.allows(3)


def test_parse_plain() -> None:
    assert parse_plain(b"z\x00u\x00p") == ("z", "u", b"p")
    with pytest.raises(ValueError, match="username"):
        parse_plain(b"\x00\x00p")
