"""The local API's route table and responses (``edge_gateway.net.asgi``), as a unit.

The API's behaviour over HTTP (404, 405 with ``Allow``, ``HEAD``) is checked
by test_api_errors and test_api_http11 against real servers; these pin the
matching rules themselves.
"""

from __future__ import annotations

from typing import Any

from edge_gateway.net.asgi import JSONResponse, Request, Response, Route, Router, serve_lifespan


async def _endpoint(request: Request) -> Response:
    return Response(b"")


ROUTER = Router(
    [
        Route("/healthz", _endpoint, ["GET"]),
        Route("/v1/topics/{topic}", _endpoint, ["GET"]),
        Route("/v1/topics/{topic}/partitions/{partition}/records", _endpoint, ["GET"]),
        Route("/v1/groups/{group}/offsets", _endpoint, ["POST"]),
        Route("/v1/groups/{group}/offsets", _endpoint, ["GET"]),
    ]
)


def test_a_parameter_is_one_path_segment() -> None:
    m = ROUTER.match("GET", "/v1/topics/t.x-1/partitions/3/records")
    assert m.route is not None
    assert dict(m.params) == {"topic": "t.x-1", "partition": "3"}
    assert ROUTER.match("GET", "/v1/topics/a/b").route is None
    assert ROUTER.match("GET", "/v1/topics/").route is None
    assert ROUTER.match("GET", "/v1/topics/a/partitions/0/records/x").route is None


def test_head_is_allowed_wherever_get_is() -> None:
    assert ROUTER.match("HEAD", "/healthz").route is not None


def test_another_method_on_a_known_path_lists_the_allowed_ones() -> None:
    m = ROUTER.match("DELETE", "/v1/groups/g/offsets")
    assert m.route is None
    assert sorted(m.allowed) == ["GET", "HEAD", "POST"]  # both routes of the path
    assert ROUTER.match("POST", "/v1/groups/g/offsets").route is not None
    assert ROUTER.match("GET", "/v1/groups/g/offsets").route is not None


def test_an_unknown_path_allows_nothing() -> None:
    for path in ("/v2/nothing", "/healthz/", "/v1/topics/t/"):  # no trailing-slash redirects
        m = ROUTER.match("GET", path)
        assert m.route is None, path
        assert not m.allowed, path


def test_special_characters_of_a_template_are_literal() -> None:
    router = Router([Route("/a.b/{x}", _endpoint, ["GET"])])
    assert router.match("GET", "/a.b/1").route is not None
    assert router.match("GET", "/aXb/1").route is None


def _request(query: bytes, headers: list[tuple[bytes, bytes]]) -> Request:
    scope = {"method": "GET", "path": "/p", "query_string": query, "headers": headers}

    async def receive() -> dict[str, Any]:
        raise AssertionError("not read")

    return Request(scope, receive, {})


def test_request_headers_and_query() -> None:
    r = _request(
        b"a=1&b=&a=2&c=%20x", [(b"authorization", b"Bearer t"), (b"authorization", b"second")]
    )
    assert r.headers["authorization"] == "Bearer t"  # the first of a repeated header
    assert r.query_params == {"a": "2", "b": "", "c": " x"}  # the last of a repeated name


async def _sent(response: Response) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        raise AssertionError("not read")

    async def send(message: Any) -> None:
        sent.append(dict(message))

    await response({"type": "http"}, receive, send)
    return sent


async def test_json_response_is_compact_utf8_with_length_and_type() -> None:
    start, body = await _sent(JSONResponse({"é": [1, None]}, 409, {"Retry-After": "1"}))
    assert start["status"] == 409
    assert body["body"] == '{"é":[1,null]}'.encode()
    headers = dict(start["headers"])
    assert headers[b"content-length"] == str(len(body["body"])).encode()
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"retry-after"] == b"1"


async def test_text_gets_a_charset() -> None:
    start, _ = await _sent(Response("x", media_type="text/plain; version=0.0.4"))
    assert dict(start["headers"])[b"content-type"] == b"text/plain; version=0.0.4; charset=utf-8"


async def test_lifespan_is_answered() -> None:
    incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[str] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: Any) -> None:
        sent.append(message["type"])

    await serve_lifespan(receive, send)
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
