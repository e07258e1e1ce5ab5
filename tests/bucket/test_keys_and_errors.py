"""Key rules and the bucket error tree (pure, no store)."""

from __future__ import annotations

import pytest

import edge_gateway.bucket as bucket_pkg
from edge_gateway.bucket import (
    AccessDenied,
    BucketError,
    BucketUnavailable,
    InvalidRequest,
    NotFound,
    PreconditionFailed,
    UnsupportedStore,
    probe_key,
    validate_key,
    validate_prefix,
)
from edge_gateway.errors import (
    ConfigError,
    Denied,
    EdgeGatewayError,
    InvalidInput,
    Unavailable,
)


@pytest.mark.parametrize(
    "key",
    ["a", "regions/r1/log/00000000000000000001.eglog", "a b/c", "ü/к", "..x/y.", "x" * 1024],
)
def test_valid_keys(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize(
    "key",
    ["", "/a", "a/", "a//b", ".", "..", "a/..", "./a", "a\\b", "a\nb", "a\x7fb", "é" * 513],
)
def test_invalid_keys(key: str) -> None:
    with pytest.raises(InvalidRequest):
        validate_key(key)


@pytest.mark.parametrize("prefix", ["", "regions/", "regions/r1/log/0000", "a/.", "..x"])
def test_valid_prefixes(prefix: str) -> None:
    assert validate_prefix(prefix) == prefix


@pytest.mark.parametrize("prefix", ["/", "a//", "../", "a/./", "x" * 1024, 5])
def test_invalid_prefixes(prefix: object) -> None:
    with pytest.raises(InvalidRequest):
        validate_prefix(prefix)


def test_probe_keys_are_valid_and_unique() -> None:
    for prefix in ("", "/", "regions", "regions/", "a/b/"):
        key = probe_key(prefix)
        assert validate_key(key) == key
        assert key.startswith(prefix.strip("/"))
    assert probe_key("p") != probe_key("p")


def test_error_tree() -> None:
    # Each bucket error is also the project-wide kind that says what to do.
    assert issubclass(BucketUnavailable, Unavailable)
    # A refusal needs a person, but is retried like an outage meanwhile (issue 26).
    assert issubclass(AccessDenied, Denied)
    assert issubclass(Denied, Unavailable)
    assert not issubclass(AccessDenied, InvalidInput)
    assert not issubclass(AccessDenied, BucketUnavailable)
    assert issubclass(InvalidRequest, InvalidInput)
    assert issubclass(UnsupportedStore, ConfigError)
    for cls in (PreconditionFailed, NotFound, BucketUnavailable, AccessDenied, InvalidRequest):
        assert issubclass(cls, BucketError)
        assert issubclass(cls, EdgeGatewayError)
        assert cls("m", key="k").key == "k"
    assert not issubclass(PreconditionFailed, InvalidInput)
    assert not issubclass(NotFound, Unavailable)


@pytest.mark.parametrize(
    ("code", "says", "credentials"),
    [
        ("InvalidAccessKeyId", "credential_process", True),
        ("AccessDenied", "edgegw iam policy", True),
        ("NoSuchBucket", "create the bucket", False),
        ("PermanentRedirect", "region", False),
        ("RequestTimeTooSkewed", "NTP", False),
        ("EACCES", "bucket directory", False),
        ("SomethingNew", "credentials", True),
    ],
)
def test_access_denied_carries_the_code_and_what_to_do(
    code: str, says: str, credentials: bool
) -> None:
    exc = AccessDenied("put of key 'k': refused", key="k", code=code)
    assert (exc.code, exc.key, str(exc)) == (code, "k", "put of key 'k': refused")
    assert says in exc.action
    assert exc.credentials_may_help is credentials
    assert AccessDenied("m").code == "AccessDenied"  # the default


def test_public_names_are_exported_and_documented() -> None:
    for name in bucket_pkg.__all__:
        value = getattr(bucket_pkg, name)
        if not name.isupper():  # constants have no docstrings of their own
            assert value.__doc__, name
