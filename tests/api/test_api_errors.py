"""Every documented error of the local API, with its status code and stable code."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio
from _api_support import make_config, running, url_of

from edge_gateway.api import create_app
from edge_gateway.api.wire import BATCH_MEDIA_TYPE, ERROR_CODES
from edge_gateway.format.batch import encode_batch
from edge_gateway.gateway import Gateway
from edge_gateway.journal import OffsetOutOfRange

JSON = {"content-type": "application/json"}
BATCH = {"content-type": BATCH_MEDIA_TYPE}
ONE = b'{"records": [{"value": "x"}]}'


def assert_error(r: httpx.Response, status: int, code: str) -> dict[str, object]:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert err["code"] == code, err
    assert isinstance(err["message"], str)
    assert err["message"]
    assert ERROR_CODES[code][0] == status
    return err  # type: ignore[no-any-return]


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    cfg = make_config(tmp_path, api={"max_body_bytes": 4096})
    async with running(cfg) as gw, httpx.AsyncClient(base_url=url_of(gw)) as client:
        yield client


async def test_bad_names_unknown_topics_and_mirrors(http: httpx.AsyncClient) -> None:
    assert_error(await http.post("/v1/topics/b%24d/records", content=ONE), 400, "invalid_name")
    assert_error(await http.post("/v1/topics/a..b/records", content=ONE), 400, "invalid_name")
    long = "x" * 201
    assert_error(await http.post(f"/v1/topics/{long}/records", content=ONE), 400, "invalid_name")
    assert_error(await http.get("/v1/topics/b%24d"), 400, "invalid_name")
    assert_error(await http.post("/v1/topics/nope/records", content=ONE), 404, "unknown_topic")
    assert_error(await http.get("/v1/topics/nope"), 404, "unknown_topic")
    assert_error(
        await http.get("/v1/topics/nope/partitions/0/records?offset=0"), 404, "unknown_topic"
    )
    # a topic homed elsewhere, mirrored here or not: read-only
    err = assert_error(
        await http.post("/v1/topics/south.s/records", content=ONE), 409, "read_only_topic"
    )
    assert "south" in str(err["message"])
    assert_error(await http.post("/v1/topics/east.x/records", content=ONE), 409, "read_only_topic")
    batch = encode_batch([b"x"], timestamps=1)
    r = await http.post("/v1/topics/south.s/partitions/0/batches", content=batch, headers=BATCH)
    assert_error(r, 409, "read_only_topic")
    # reading the mirror is fine
    r = await http.get("/v1/topics/south.s/partitions/1/records?offset=0")
    assert r.status_code == 200
    # unknown routes and methods
    assert_error(await http.get("/v2/nothing"), 404, "not_found")
    r = await http.delete("/v1/topics/t")
    assert_error(r, 405, "method_not_allowed")
    assert "GET" in r.headers["allow"]
    # bad group names
    assert_error(await http.get("/v1/groups/%07bell/offsets"), 400, "invalid_request")


async def test_bad_bodies(http: httpx.AsyncClient) -> None:
    bad_json = [
        b"",
        b"{",
        b"[]",
        b'{"records": []}',
        b'{"records": {}}',
        b'{"records": [1]}',
        b'{"records": [{}]}',
        b'{"records": [{"value": "x", "extra": 1}]}',
        b'{"records": [{"value": "x"}], "more": 1}',
        b'{"records": [{"value": "x", "value_b64": "eA=="}]}',
        b'{"records": [{"value_b64": "not base64!"}]}',
        b'{"records": [{"value": "x", "key": 5}]}',
        b'{"records": [{"value": "x", "key": "k", "key_b64": "aw=="}]}',
        b'{"records": [{"value": "x", "headers": {"h": 1}}]}',
        b'{"records": [{"value": "x", "headers": []}]}',
        b'{"records": [{"value": "x", "timestamp": "now"}]}',
        b'{"records": [{"value": "x", "timestamp": true}]}',
        b'{"records": [{"value": "x", "timestamp": 1e3}]}',
        b'{"records": [{"value": "x", "timestamp": 99999999999999999999}]}',
        b'{"records": [{"value": "x", "partition": -1}]}',
        b'{"records": [{"value": "x", "partition": 3}]}',
        b'{"records": [{"value": "x", "partition": 99999999999}]}',
        b'{"records": [{"value": NaN}]}',
        b'{"records": [{"value": "\\ud800"}]}',
        b'{"records": [{"value": "x", "key": "\\udfff"}]}',
        b"\xff\xfe\x00",
        b"[" * 1900 + b"]" * 1900,
        b'{"records": [{"value": ' + b"[" * 1800 + b"]" * 1800 + b"}]}",
    ]
    for body in bad_json:
        r = await http.post("/v1/topics/t/records", content=body, headers=JSON)
        assert_error(r, 400, "invalid_request")

    # malformed batches
    good = encode_batch([b"a", b"b"], timestamps=5)
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF
    for body in (
        b"",
        b"short",
        good[:-1],
        bytes(corrupt),
        good + b"extra",
        good + good,
        b"\x00" * 64,
    ):
        r = await http.post("/v1/topics/t/partitions/0/batches", content=body, headers=BATCH)
        assert_error(r, 400, "bad_batch")
    # nothing of that reached the journal
    r = await http.get("/v1/topics/t")
    assert all(p["next_offset"] == 0 for p in r.json()["partitions"])

    # commit bodies
    for body in (
        b"{}",
        b'{"offsets": []}',
        b'{"offsets": [{"topic": "t", "partition": 0}]}',
        b'{"offsets": [{"topic": "t", "partition": 0, "offset": -1}]}',
        b'{"offsets": [{"topic": "t", "partition": 9, "offset": 1}]}',
        b'{"offsets": [{"topic": 1, "partition": 0, "offset": 1}]}',
        b'{"offsets": [{"topic": "t", "partition": 0, "offset": 1, "metadata": 5}]}',
        b'{"offsets": [{"topic": "t", "partition": 0, "offset": 1, "x": 5}]}',
    ):
        r = await http.post("/v1/groups/g/offsets", content=body, headers=JSON)
        assert_error(r, 400, "invalid_request")
    r = await http.post(
        "/v1/groups/g/offsets",
        content=b'{"offsets": [{"topic": "nope", "partition": 0, "offset": 1}]}',
        headers=JSON,
    )
    assert_error(r, 404, "unknown_topic")


async def test_bad_query_and_path_parameters(http: httpx.AsyncClient) -> None:
    base = "/v1/topics/t/partitions/0/records"
    for query in (
        "",
        "offset=",
        "offset=abc",
        "offset=-1",
        "offset=1.5",
        "offset=1_000",
        "offset=%D9%A3",  # an Arabic-Indic digit: int() would take it
        "offset=99999999999999999999",
        "offset=0&max_records=0",
        "offset=0&max_records=10001",
        "offset=0&max_bytes=0",
        "offset=0&wait_ms=-5",
        "offset=0&wait_ms=soon",
    ):
        assert_error(await http.get(f"{base}?{query}"), 400, "invalid_request")
    for partition in ("x", "-1", "+1", "3", "99999999999"):
        r = await http.get(f"/v1/topics/t/partitions/{partition}/records?offset=0")
        assert_error(r, 400, "invalid_request")
        r = await http.post(
            f"/v1/topics/t/partitions/{partition}/batches",
            content=encode_batch([b"x"], timestamps=1),
            headers=BATCH,
        )
        assert_error(r, 400, "invalid_request")
    for ack in ("maybe", "LOCAL", "1"):
        r = await http.post(f"/v1/topics/t/records?ack={ack}", content=ONE, headers=JSON)
        assert_error(r, 400, "invalid_request")
    # a wait beyond api.max_wait_ms is clamped, not refused
    r = await http.get(f"{base}?offset=0&wait_ms=1&max_records=10000&max_bytes=67108864")
    assert r.status_code == 200


async def test_content_types_and_body_limits(http: httpx.AsyncClient) -> None:
    batch = encode_batch([b"x"], timestamps=1)
    r = await http.post("/v1/topics/t/records", content=ONE, headers={"content-type": "text/plain"})
    assert_error(r, 415, "unsupported_media_type")
    r = await http.post("/v1/topics/t/records", content=ONE, headers=BATCH)
    assert_error(r, 415, "unsupported_media_type")
    r = await http.post("/v1/topics/t/partitions/0/batches", content=batch, headers=JSON)
    assert_error(r, 415, "unsupported_media_type")
    r = await http.post("/v1/topics/t/partitions/0/batches", content=batch)
    assert_error(r, 415, "unsupported_media_type")
    r = await http.post(
        "/v1/groups/g/offsets", content=b"{}", headers={"content-type": "application/xml"}
    )
    assert_error(r, 415, "unsupported_media_type")
    # JSON with parameters and without a Content-Type is accepted
    r = await http.post(
        "/v1/topics/t/records",
        content=ONE,
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert r.status_code == 200
    r = await http.post("/v1/topics/t/records", content=ONE)
    assert r.status_code == 200

    # over max_body_bytes (4096): refused from Content-Length ...
    big = b'{"records": [{"value": "' + b"x" * 5000 + b'"}]}'
    assert_error(
        await http.post("/v1/topics/t/records", content=big, headers=JSON), 413, "body_too_large"
    )
    big_batch = encode_batch([b"y" * 5000], timestamps=1)
    r = await http.post("/v1/topics/t/partitions/0/batches", content=big_batch, headers=BATCH)
    assert_error(r, 413, "body_too_large")

    # ... and while reading a chunked body that has no Content-Length
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"records": [{"value": "'
        for _ in range(5):
            yield b"z" * 1000
        yield b'"}]}'

    r = await http.post("/v1/topics/t/records", content=chunks(), headers=JSON)
    assert "content-length" not in r.request.headers
    assert_error(r, 413, "body_too_large")
    # exactly at the limit is fine
    at_limit = b'{"records": [{"value": "' + b"a" * (4096 - 28) + b'"}]}'
    assert len(at_limit) == 4096
    r = await http.post("/v1/topics/t/records", content=at_limit, headers=JSON)
    assert r.status_code == 200, r.text
    # the server still answers on new connections
    assert (await http.get("/healthz")).status_code == 200


async def test_auth(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, api={"token": "s3cret-token", "public_metrics": False})
    async with running(cfg) as gw, httpx.AsyncClient(base_url=url_of(gw)) as http:
        for headers in (
            {},
            {"authorization": "Bearer wrong"},
            {"authorization": "Bearer s3cret-token-and-more"},
            {"authorization": "Basic s3cret-token"},
            {"authorization": "s3cret-token"},
            {"authorization": "Bearer"},
        ):
            for method, path in (
                ("GET", "/v1/status"),
                ("GET", "/v1/topics"),
                ("GET", "/v1/topics/t"),
                ("POST", "/v1/topics/t/records"),
                ("POST", "/v1/topics/t/partitions/0/batches"),
                ("GET", "/v1/topics/t/partitions/0/records?offset=0"),
                ("GET", "/v1/groups/g/offsets"),
                ("POST", "/v1/groups/g/offsets"),
                ("GET", "/metrics"),
            ):
                r = await http.request(method, path, content=ONE, headers=headers)
                assert_error(r, 401, "unauthorized")
                assert r.headers["www-authenticate"].startswith("Bearer")
        # health checks need no token
        assert (await http.get("/healthz")).status_code == 200
        ok = {"authorization": "Bearer s3cret-token"}
        r = await http.post("/v1/topics/t/records", content=ONE, headers=ok)
        assert r.status_code == 200
        assert (await http.get("/metrics", headers=ok)).status_code == 200
        from edge_gateway.client import AsyncClient
        from edge_gateway.errors import InvalidInput

        async with AsyncClient(url_of(gw), token="s3cret-token") as client:
            assert (await client.status())["region"] == "north"
        async with AsyncClient(url_of(gw), token="nope") as client:
            with pytest.raises(InvalidInput, match="bearer token"):
                await client.status()


async def test_metrics_public_by_default(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, api={"token": "s3cret-token"})
    async with running(cfg) as gw, httpx.AsyncClient(base_url=url_of(gw)) as http:
        assert (await http.get("/metrics")).status_code == 200
        assert_error(await http.get("/v1/status"), 401, "unauthorized")


async def test_not_running_is_unavailable(tmp_path: Path) -> None:
    """A gateway that is not (or no longer) running: 503 unavailable, never a 500."""
    gw = Gateway(make_config(tmp_path))
    app = create_app(gw)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
        r = await http.post("/v1/topics/t/records", content=ONE, headers=JSON)
        err = assert_error(r, 503, "unavailable")
        # The reason /healthz gives, and what to do.
        assert str(err["message"]) == "the gateway is starting: retry after Retry-After"
        assert r.headers["retry-after"] == "1"
        assert_error(await http.get("/healthz"), 503, "unavailable")
        assert_error(await http.get("/v1/status"), 503, "unavailable")
        assert_error(
            await http.get("/v1/topics/t/partitions/0/records?offset=0"), 503, "unavailable"
        )
        assert (await http.get("/metrics")).status_code == 200


async def test_unexpected_errors_are_500_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(make_config(tmp_path)) as gw, httpx.AsyncClient(base_url=url_of(gw)) as http:

        def broken() -> dict[str, object]:
            raise RuntimeError("boom")

        monkeypatch.setattr(gw, "status", broken)
        caplog.set_level(logging.ERROR, logger="edgegw.api")
        r = await http.get("/v1/status")
        err = assert_error(r, 500, "internal")
        assert "boom" not in str(err["message"])  # details go to the log, not the caller

        # the traceback is logged right after the response went out
        def internal() -> list[logging.LogRecord]:
            return [
                rec
                for rec in caplog.records
                if rec.name == "edgegw.api" and rec.msg.startswith("internal error")
            ]

        with trio.move_on_after(10):
            while not internal():  # noqa: ASYNC110
                await trio.sleep(0.01)
        logged = internal()
        assert logged
        assert logged[0].exc_info is not None
        assert "RuntimeError: boom" in caplog.text

        # the journal's offset_out_of_range carries the earliest offset
        async def gone(*args: object, **kwargs: object) -> None:
            raise OffsetOutOfRange("t", 0, 3, 9)

        monkeypatch.setattr(gw, "fetch", gone)
        r = await http.get("/v1/topics/t/partitions/0/records?offset=3")
        err = assert_error(r, 400, "offset_out_of_range")
        assert err["earliest_offset"] == 9
        # the server is still fine
        assert (await http.get("/healthz")).status_code == 200


async def test_refusals_keep_the_connection_usable(http: httpx.AsyncClient) -> None:
    """Refused before its body was read, a request must not break the next one.

    hypercorn drops a connection whose request body was not read to the end;
    the API reads the rest of small bodies (or says Connection: close), so a
    keep-alive client never sends into a connection that is going away.
    """
    body = encode_batch([b"v" * 3000], timestamps=1)
    for i in range(60):
        r = await http.post("/v1/topics/t/partitions/0/batches", content=body, headers=JSON)
        assert_error(r, 415, "unsupported_media_type")
        r = await http.post(
            f"/v1/topics/t/partitions/{'x' if i % 2 else 0}/batches?ack=bad",
            content=body,
            headers=BATCH,
        )
        assert_error(r, 400, "invalid_request")
        assert (await http.get("/healthz")).status_code == 200
    big = b"z" * 5000
    for _ in range(5):
        r = await http.post("/v1/topics/t/records", content=big, headers=JSON)
        assert_error(r, 413, "body_too_large")
        assert r.headers["connection"] == "close"
        assert (await http.get("/healthz")).status_code == 200
