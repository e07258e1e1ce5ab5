"""The local API's connection limits (docs/api.md, "HTTP"), on both servers.

An `edgegw serve` process per server (``api.server`` = ``hypercorn`` and
``builtin``) with short limits, driven over raw sockets:

* an idle keep-alive connection, and one that never sends a byte, close
  after ``api.keep_alive_timeout_s``;
* a request head that trickles in (a byte every half second) closes after
  ``api.keep_alive_timeout_s`` too: its bytes do not extend the deadline;
* a body that stops mid-way gets ``408 request_timeout`` and the connection
  closes after ``api.read_timeout_s`` — a hundred such connections at once;
  a slow body whose reads each bring data in time is served;
* requests that rightly take longer than the read timeout once their body
  is in (a long poll) are not cut;
* a long poll whose client disconnects ends then (not at its ``wait_ms``),
  and bytes of a pipelined request during a poll are no disconnect.

The limits are ``keep_alive_timeout_s = 10`` (above hypercorn's own default
of 5 s, which the server used to keep) and ``read_timeout_s = 4``. Checks are
"still open after a time well below the limit" and "closed within a generous
bound", never exact timings. The defaults are checked against the docs
without a server.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from _serve import Gateway, TopicSpec

from edge_gateway.config import ApiConfig, parse_config
from edge_gateway.errors import ConfigError
from edge_gateway.metadata.server import MetadataServerConfig
from edge_gateway.net.http import KEEP_ALIVE_TIMEOUT_S, READ_TIMEOUT_S

KEEP_ALIVE_S = 10.0
READ_S = 4.0
#: "Closed within": far above both limits, for a loaded 2-core machine.
GENEROUS_S = 40.0
#: How long a connection must stay open (below KEEP_ALIVE_S, above hypercorn's 5 s default).
IDLE_OPEN_S = 6.5
STALLED = 100

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module", params=["hypercorn", "builtin"])
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp(f"timeouts-{request.param}")
    api = {"server": request.param, "keep_alive_timeout_s": KEEP_ALIVE_S, "read_timeout_s": READ_S}
    (root / "bucket").mkdir()  # a configured bucket.path must exist
    gw = Gateway(
        "north",
        root,
        {"type": "local", "path": str(root / "bucket")},
        [TopicSpec("t", "north", partitions=1)],
        {"api": api},
    )
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()


async def connect(gw: Gateway) -> trio.SocketStream:
    host, _, port = gw.url.removeprefix("http://").rpartition(":")
    return await trio.open_tcp_stream(host, int(port))


async def stays_open(stream: trio.SocketStream, seconds: float) -> None:
    """Fail if the server sends anything or closes within ``seconds``."""
    with trio.move_on_after(seconds):
        data = await stream.receive_some(65536)
        raise AssertionError(f"the server answered or closed after less than {seconds}s: {data!r}")


async def until_closed(stream: trio.SocketStream, within: float = GENEROUS_S) -> bytes:
    """Everything the server sends until it closes the connection (within ``within`` s)."""
    received = b""
    with trio.move_on_after(within):
        while True:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:  # reset: closed as well
                return received
            if not data:
                return received
            received += data
    raise AssertionError(f"the server kept the connection open over {within}s: {received!r}")


def parse_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(lines[0].split()[1]), headers, body


async def read_response(stream: trio.SocketStream) -> tuple[int, dict[str, str], bytes]:
    """One Content-Length framed response (the connection stays usable)."""
    raw = b""
    with trio.fail_after(GENEROUS_S):
        while b"\r\n\r\n" not in raw:
            data = await stream.receive_some(65536)
            assert data, f"closed before a whole response: {raw!r}"
            raw += data
        status, headers, body = parse_response(raw)
        while len(body) < int(headers.get("content-length", "0")):
            data = await stream.receive_some(65536)
            assert data, f"closed mid-body: {raw!r}"
            body += data
    return status, headers, body


def post_head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


ONE = b'{"records":[{"value":"x"}]}'


# ------------------------------------------------------------------ limits


async def test_idle_connections_close_after_the_keep_alive_timeout(gateway: Gateway) -> None:
    async with await connect(gateway) as used, await connect(gateway) as silent:
        await used.send_all(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        status, headers, _ = await read_response(used)
        assert status == 200
        assert headers.get("connection") != "close"
        async with trio.open_nursery() as nursery:  # both wait at once
            nursery.start_soon(stays_open, used, IDLE_OPEN_S)
            nursery.start_soon(stays_open, silent, IDLE_OPEN_S)
        assert await until_closed(used) == b""
        assert await until_closed(silent) == b""


async def test_a_trickling_request_head_closes_after_the_keep_alive_timeout(
    gateway: Gateway,
) -> None:
    async with await connect(gateway) as stream:
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Slow: ")
        start = trio.current_time()
        closed = False
        with trio.move_on_after(GENEROUS_S):
            while not closed:
                try:
                    await stream.send_all(b"a")
                except trio.BrokenResourceError:
                    break
                with trio.move_on_after(0.5):
                    closed = await stream.receive_some(65536) == b""
        elapsed = trio.current_time() - start
        assert elapsed < GENEROUS_S, "the server kept reading an unfinished head"
        assert elapsed > IDLE_OPEN_S, f"closed after {elapsed:.1f}s, below the keep-alive timeout"


async def test_stalled_bodies_get_408_and_close(gateway: Gateway) -> None:
    streams = [await connect(gateway) for _ in range(STALLED)]
    answers: list[bytes] = []

    async def stall(stream: trio.SocketStream, watch: bool) -> None:
        await stream.send_all(post_head("/v1/topics/t/records", len(ONE)) + ONE[:10])
        if watch:
            await stays_open(stream, 1.5)
        answers.append(await until_closed(stream))

    try:
        async with trio.open_nursery() as nursery:
            for i, stream in enumerate(streams):
                nursery.start_soon(stall, stream, i == 0)
    finally:
        for stream in streams:
            await stream.aclose()
    assert len(answers) == STALLED
    for raw in answers:
        status, headers, body = parse_response(raw)
        assert status == 408, raw
        assert headers["connection"] == "close"
        assert json.loads(body)["error"]["code"] == "request_timeout"
    # The gateway serves on.
    async with await connect(gateway) as stream:
        await stream.send_all(post_head("/v1/topics/t/records", len(ONE)) + ONE)
        status, _, body = await read_response(stream)
        assert status == 200, body


async def test_a_slow_body_whose_reads_come_in_time_is_served(gateway: Gateway) -> None:
    async with await connect(gateway) as stream:
        await stream.send_all(post_head("/v1/topics/t/records", len(ONE)))
        # Seven pieces a second apart: 6 s in all, above read_timeout_s (4 s),
        # but each read brings data well within it.
        for i in range(0, len(ONE), 4):
            await stream.send_all(ONE[i : i + 4])
            await trio.sleep(1.0)
        status, _, body = await read_response(stream)
        assert status == 200, body
        assert json.loads(body)["offsets"]


async def test_a_long_poll_longer_than_the_read_timeout_is_not_cut(gateway: Gateway) -> None:
    async with await connect(gateway) as stream:
        await stream.send_all(b"GET /v1/topics/t HTTP/1.1\r\nHost: gw\r\n\r\n")
        status, _, body = await read_response(stream)
        assert status == 200, body
        offset = json.loads(body)["partitions"][0]["next_offset"]
        # Nothing is produced: the poll waits its whole wait_ms, above read_timeout_s.
        wait_ms = int(READ_S * 1000) + 2000
        path = f"/v1/topics/t/partitions/0/records?offset={offset}&wait_ms={wait_ms}"
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: gw\r\n\r\n".encode())
        status, _, body = await read_response(stream)
        assert status == 200, body
        assert json.loads(body)["records"] == []
        # ... and the connection is still usable.
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        assert (await read_response(stream))[0] == 200


FETCH_ROUTE = "/v1/topics/{topic}/partitions/{partition}/records"


async def metric_lines(gw: Gateway) -> list[str]:
    async with await connect(gw) as stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: gw\r\n\r\n")
        status, _, body = await read_response(stream)
    assert status == 200
    return body.decode().splitlines()


async def finished_fetches(gw: Gateway) -> int:
    """How many fetches the gateway has finished (its request histogram's count)."""
    total = 0
    for line in await metric_lines(gw):
        if line.startswith("edgegw_api_request_seconds_count{") and FETCH_ROUTE in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def metric(lines: list[str], name: str) -> float | None:
    for line in lines:
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_a_client_that_leaves_a_long_poll_ends_it(gateway: Gateway) -> None:
    """A long poll whose client disconnects ends then, not at its wait_ms: the
    server does not hold a wait (and its connection) for an answer no one reads."""
    before = await finished_fetches(gateway)
    abandoned = metric(await metric_lines(gateway), "edgegw_api_waits_abandoned_total")
    assert abandoned is not None
    async with await connect(gateway) as stream:
        await stream.send_all(b"GET /v1/topics/t HTTP/1.1\r\nHost: gw\r\n\r\n")
        offset = json.loads((await read_response(stream))[2])["partitions"][0]["next_offset"]
        # A wait far above the bound below: only the disconnect can end it in time.
        path = f"/v1/topics/t/partitions/0/records?offset={offset}&wait_ms=600000"
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: gw\r\n\r\n".encode())
        await stays_open(stream, 1.0)  # the poll is waiting
        connections = metric(await metric_lines(gateway), "edgegw_api_connections")
        if '"builtin"' in gateway.config.read_text():  # hypercorn does not tell
            assert connections is not None
            assert connections >= 2  # this one and the scrape's
        else:
            assert connections is None
    with trio.fail_after(GENEROUS_S):
        while await finished_fetches(gateway) == before:  # noqa: ASYNC110 (another process)
            await trio.sleep(0.2)
    lines = await metric_lines(gateway)
    assert metric(lines, "edgegw_api_waits_abandoned_total") == abandoned + 1
    # The gateway serves on.
    async with await connect(gateway) as stream:
        await stream.send_all(post_head("/v1/topics/t/records", len(ONE)) + ONE)
        assert (await read_response(stream))[0] == 200


async def test_a_long_poll_keeps_a_pipelined_request_for_after_it(gateway: Gateway) -> None:
    """Bytes that arrive during a long poll (a pipelined request) are not taken
    for a disconnect, and are served after the poll."""
    async with await connect(gateway) as stream:
        path = "/v1/topics/t/partitions/0/records?offset=1000000&wait_ms=1500"
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: gw\r\n\r\n".encode())
        await trio.sleep(0.3)
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        raw = b""
        with trio.fail_after(GENEROUS_S):  # both answers, maybe in one read
            while raw.count(b"HTTP/1.1 ") < 2 or not raw.endswith(b"}"):
                data = await stream.receive_some(65536)
                assert data, f"closed before both responses: {raw!r}"
                raw += data
        first, second = raw.split(b"HTTP/1.1 ")[1:]
        assert first.startswith(b"200 "), raw  # the poll's (empty) answer
        assert second.startswith(b"200 "), raw
        assert b'"status":"ok"' in second, raw


# ---------------------------------------------------------------- defaults


def _documented_default(key: str) -> float:
    """The default of ``api.<key>`` in docs/configuration.md's table."""
    text = (DOCS / "configuration.md").read_text()
    m = re.search(rf"^\| `api\.{key}` \| `([0-9.]+)` \|", text, re.MULTILINE)
    assert m, f"api.{key} is not in docs/configuration.md"
    return float(m.group(1))


def test_defaults_are_the_documented_limits() -> None:
    api = ApiConfig()
    assert api.keep_alive_timeout_s == KEEP_ALIVE_TIMEOUT_S == 75.0
    assert api.read_timeout_s == READ_TIMEOUT_S == 60.0
    assert _documented_default("keep_alive_timeout_s") == api.keep_alive_timeout_s
    assert _documented_default("read_timeout_s") == api.read_timeout_s
    http = (DOCS / "api.md").read_text()
    assert "closed after 75 s" in http
    assert "within 60 s" in http
    meta = MetadataServerConfig(db=Path("meta.sqlite"))
    assert (meta.keep_alive_timeout_s, meta.read_timeout_s) == (75.0, 60.0)


@pytest.mark.parametrize("value", [0, -1.0, math.inf, math.nan, "10", True])
def test_bad_limits_are_refused(tmp_path: Path, value: object) -> None:
    for key in ("keep_alive_timeout_s", "read_timeout_s"):
        doc = {"region": "north", "data_dir": str(tmp_path), "api": {key: value}}
        with pytest.raises(ConfigError, match=rf"api\.{key}"):
            parse_config(doc)
