"""``net.asgi.parse_query`` answers as ``parse_qsl(keep_blank_values=True)`` does."""

from __future__ import annotations

from urllib.parse import parse_qsl

from hypothesis import given
from hypothesis import strategies as st

from edge_gateway.net.asgi import Request, parse_query

#: The characters that matter to a query's parse, and a few that do not.
_QUERY = st.text(alphabet="ab=&%+;,.-_~0123456789AFaf \u00e9", max_size=40)


def _reference(qs: bytes) -> dict[str, str]:
    return dict(parse_qsl(qs.decode("latin-1"), keep_blank_values=True))


@given(_QUERY)
def test_parse_query_is_parse_qsl(text: str) -> None:
    qs = text.encode("utf-8")
    assert parse_query(qs) == _reference(qs)


def test_examples() -> None:
    assert parse_query(b"since=3&wait_ms=30000&regions=a,b") == {
        "since": "3",
        "wait_ms": "30000",
        "regions": "a,b",
    }
    assert parse_query(b"a=1&a=2&b&=c") == {"a": "2", "b": "", "": "c"}
    assert parse_query(b"regions=a%2Cb&x=1+2") == {"regions": "a,b", "x": "1 2"}
    assert parse_query(b"") == {}


def test_request_uses_it() -> None:
    scope = {"type": "http", "query_string": b"since=0&wait_ms=5", "headers": []}

    async def receive() -> dict[str, object]:
        raise AssertionError("not read")

    assert Request(scope, receive, {}).query_params == {"since": "0", "wait_ms": "5"}
