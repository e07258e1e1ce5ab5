"""The head stream (``POST /v1/regions/{region}/head-stream``, protocol 3): reports as lines.

Real server processes: the gateway's reporter streams its reports to a new
server and falls back to one request per report against the previous
server's code (from git history); the previous client's reports still work
against this server; a stream cut mid-line applies nothing of that line; a
bad line ends the stream with an error line after acking the lines before
it; a token revoked while a stream is open ends it with ``unauthorized``;
a server killed with -9 while reports stream is reconnected to with the
reporter's backoff, and the heads a watcher sees never go back. The wire
format is tested fed whole and byte by byte.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from _meta_support import ADMIN_TOKEN, Fleet, MetaServer, admin, http
from _old_code import old_sources

from edge_gateway.errors import CorruptData, Unavailable
from edge_gateway.metadata import HeadReporter, MetadataClient, MetadataRefused
from edge_gateway.metadata._headstream import (
    AckDecoder,
    BadReportLine,
    ReportReader,
    encode_ack,
    encode_error,
    encode_report,
)
from edge_gateway.testing.ports import free_port

#: The last commit before the head stream (protocol 2: the watch, reports one request each).
PROTOCOL_2_COMMIT = "f052d73ecc9e73be94bf8146e5b76239ce4e6e74"


def _head(url: str, region: str) -> int | None:
    with http(url) as c:
        return c.get(f"/v1/regions/{region}").json().get("head_seq")


def _healthz(url: str) -> dict[str, Any]:
    with http(url) as c:
        return c.get("/healthz").json()


async def _wait_reported(reporter: HeadReporter, seq: int) -> None:
    with trio.fail_after(20):
        while (reporter.statistics().sent or -1) < seq:  # noqa: ASYNC110 - polls stats
            await trio.sleep(0.01)


# ----------------------------------------------------------- new <-> new


async def test_the_reporter_streams_to_a_new_server(fleet: Fleet) -> None:
    before = _healthz(fleet.url)
    async with MetadataClient(fleet.url, token=fleet.tokens["north"], region="north") as c:
        base = await c.report_head(0)  # a request: its answer names protocol 3
        assert c.streams_heads
        reporter = HeadReporter(c)
        async with trio.open_nursery() as nursery:
            await nursery.start(reporter.run)
            for seq in range(base + 1, base + 21):
                reporter.report_nowait(seq)
                await _wait_reported(reporter, seq)
            assert _healthz(fleet.url)["head_streams"] == 1
            nursery.cancel_scope.cancel()
    stats = reporter.statistics()
    assert stats.streamed == stats.reports == 20
    assert stats.streams_opened == 1
    assert _head(fleet.url, "north") == base + 20
    after = _healthz(fleet.url)
    assert after["stream_lines"] - before["stream_lines"] == 20
    with trio.fail_after(10):  # the stream ended with the reporter
        while _healthz(fleet.url)["head_streams"]:  # noqa: ASYNC110 - polls the server
            await trio.sleep(0.05)


async def test_a_watch_sees_streamed_reports_in_order(fleet: Fleet) -> None:
    async with (
        MetadataClient(fleet.url, token=ADMIN_TOKEN) as watcher,
        MetadataClient(fleet.url, token=fleet.tokens["south"], region="south") as south,
    ):
        base = await south.report_head(0)
        stream = await south.open_head_stream()
        try:
            async with aclosing(watcher.watch_heads(0, ["south"], wait_ms=30_000)) as updates:
                with trio.fail_after(20):
                    first = await anext(updates)
                assert first.heads.get("south", 0) == base
                seen: list[int] = []
                for seq in range(base + 1, base + 6):
                    assert await stream.report(seq) == seq
                with trio.fail_after(20):
                    while not seen or seen[-1] < base + 5:
                        update = await anext(updates)
                        seen += [update.heads["south"]] if "south" in update.heads else []
                assert seen == sorted(set(seen))
                assert seen[-1] == base + 5
        finally:
            await stream.aclose()


def test_refusals_before_the_stream_starts_are_http_answers(fleet: Fleet) -> None:
    path = "/v1/regions/north/head-stream"
    ndjson = {"Content-Type": "application/x-ndjson"}
    with http(fleet.url, token=None) as c:
        assert c.post(path, content=b"", headers=ndjson).status_code == 401
    with http(fleet.url, token=fleet.tokens["south"]) as c:
        r = c.post(path, content=b"", headers=ndjson)
        assert (r.status_code, r.json()["error"]["code"]) == (403, "forbidden")
    with http(fleet.url) as c:
        r = c.post(path, content=b"{}", headers={"Content-Type": "application/json"})
        assert (r.status_code, r.json()["error"]["code"]) == (415, "unsupported_media_type")
        # A whole body in one request (not a stream) is answered the same way: acks, then the end.
        r = c.post(path, content=b'{"seq":1}\n{"seq":2}\n', headers=ndjson)
        assert r.status_code == 200
        acks = AckDecoder("test").feed(r.content)
        assert acks[-1].acked == 2
        assert r.headers["edgegw-protocol"] == "3"


# ------------------------------------------------------- raw streams


class _RawStream:
    """A head stream spoken by hand on a socket (chunked body; the answer read raw)."""

    def __init__(self, url: str, region: str, token: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.sendall(
            f"POST /v1/regions/{region}/head-stream HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/x-ndjson\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 200"), head

    def chunk(self, data: bytes) -> None:
        self.sock.sendall(b"%x\r\n%b\r\n" % (len(data), data))

    def lines(self, n: int) -> list[bytes]:
        """The next ``n`` lines of the answer (chunk framing stripped)."""
        out: list[bytes] = []
        while len(out) < n:
            data = self._dechunked()
            out += [line for line in data.split(b"\n") if line]
        return out

    def _dechunked(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                size = int(self.buf[:end], 16)
                if len(self.buf) >= end + 2 + size + 2:
                    data = self.buf[end + 2 : end + 2 + size]
                    self.buf = self.buf[end + 2 + size + 2 :]
                    if size == 0:
                        return b"<end>\n"
                    return data
            got = self.sock.recv(65536)
            if not got:
                return b"<closed>\n"
            self.buf += got

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(fleet: Fleet) -> Iterator[Any]:
    opened: list[_RawStream] = []

    def open_stream(region: str = "north", token: str | None = None) -> _RawStream:
        s = _RawStream(fleet.url, region, token or fleet.tokens[region])
        opened.append(s)
        return s

    yield open_stream
    for s in opened:
        s.close()


def test_a_stream_cut_mid_line_applies_nothing_of_that_line(fleet: Fleet, raw: Any) -> None:
    base = _head(fleet.url, "north") or 0
    s = raw()
    s.chunk(encode_report(base + 1))
    assert AckDecoder("t").feed(s.lines(1)[0] + b"\n")[0].seq == base + 1
    s.chunk(b'{"seq":%d' % (base + 1000))  # half a line, then the connection is gone
    s.close()
    time.sleep(0.3)
    assert _head(fleet.url, "north") == base + 1
    # The server goes on: a new stream works.
    t = raw()
    t.chunk(encode_report(base + 2))
    assert AckDecoder("t").feed(t.lines(1)[0] + b"\n")[0].acked == 1
    assert _head(fleet.url, "north") == base + 2


def test_a_bad_line_ends_the_stream_after_acking_the_lines_before_it(
    fleet: Fleet, raw: Any
) -> None:
    base = _head(fleet.url, "north") or 0
    s = raw()
    # Read together: one good line applied, then the bad one refused.
    s.chunk(encode_report(base + 3) + b"not json\n" + encode_report(base + 9))
    lines = s.lines(3)
    acks = AckDecoder("t").feed(b"\n".join(lines[:2]) + b"\n")
    assert (acks[0].acked, acks[0].seq) == (1, base + 3)
    assert acks[1].acked == 1
    assert acks[1].error is not None
    assert acks[1].error[0] == "invalid_json"
    assert "line 2" in acks[1].error[1]
    assert lines[2] == b"<end>"  # the server ended its answer
    assert _head(fleet.url, "north") == base + 3
    # A line that is JSON but not a report.
    t = raw()
    t.chunk(b'{"seq": -1}\n')
    ack = AckDecoder("t").feed(t.lines(1)[0] + b"\n")[0]
    assert ack.error is not None
    assert (ack.acked, ack.error[0]) == (0, "invalid_request")


async def test_a_token_revoked_while_a_stream_is_open_ends_it(fleet: Fleet) -> None:
    admin(fleet.url, "POST", "/v1/regions", {"id": "east"})  # its token is not needed
    with http(fleet.url) as c:
        token = c.post("/v1/regions/east/token", json={"keep_previous_s": 0}).json()["token"]
    async with MetadataClient(fleet.url, token=token, region="east") as c:
        stream = await c.open_head_stream()
        try:
            assert await stream.report(1) == 1
            admin(fleet.url, "DELETE", "/v1/regions/east")
            with pytest.raises(MetadataRefused) as refused:
                await stream.report(2)
            assert (refused.value.status, refused.value.code) == (401, "unauthorized")
        finally:
            await stream.aclose()
        with pytest.raises(MetadataRefused) as again:
            await c.open_head_stream()
        assert again.value.status == 401


# ------------------------------------------------------------- kill -9


async def test_a_server_killed_while_reports_stream_is_reconnected_to(tmp_path: Path) -> None:
    port = free_port()
    db = tmp_path / "meta.sqlite"
    server = MetaServer(db, listen=f"127.0.0.1:{port}")
    try:
        url = server.url
        token = admin(url, "POST", "/v1/regions", {"id": "north"})["token"]
        seen: list[int] = []
        async with (
            MetadataClient(url, token=token, region="north", timeout_s=2) as c,
            MetadataClient(url, token=ADMIN_TOKEN, timeout_s=2) as w,
        ):
            reporter = HeadReporter(c, retry_cap_s=0.5)
            async with trio.open_nursery() as nursery:
                await nursery.start(reporter.run)

                async def watch() -> None:
                    since = 0
                    while True:
                        try:
                            async with aclosing(w.watch_heads(since, ["north"], 1000)) as ups:
                                async for update in ups:
                                    since = update.version
                                    if "north" in update.heads:
                                        seen.append(update.heads["north"])
                        except Exception:  # the server is away: resume
                            await trio.sleep(0.1)

                nursery.start_soon(watch)
                seq = 0
                for seq in range(1, 31):
                    reporter.report_nowait(seq)
                    await trio.sleep(0.01)
                await _wait_reported(reporter, 30)
                assert reporter.statistics().streamed > 0
                server.kill()  # kill -9 while the stream is open
                for seq in range(31, 61):  # commits go on while the server is away
                    reporter.report_nowait(seq)
                    await trio.sleep(0.01)
                await trio.to_thread.run_sync(time.sleep, 0.5)
                server = MetaServer(db, listen=f"127.0.0.1:{port}")
                await _wait_reported(reporter, 60)
                with trio.fail_after(20):
                    while not seen or seen[-1] < 60:  # noqa: ASYNC110 - polls the watcher
                        await trio.sleep(0.05)
                nursery.cancel_scope.cancel()
        stats = reporter.statistics()
        assert stats.failures >= 1
        assert stats.streams_opened >= 2  # a new stream to the restarted server
        # The relay restarted empty (heads are kept in memory): what a watcher
        # saw never went back within one server run, and ends at the latest.
        assert _head(url, "north") == 60
        assert seen[-1] == 60
        restart = (
            next(i for i in range(1, len(seen)) if seen[i] < seen[i - 1])
            if any(seen[i] < seen[i - 1] for i in range(1, len(seen)))
            else len(seen)
        )
        assert seen[:restart] == sorted(set(seen[:restart]))
        assert seen[restart:] == sorted(set(seen[restart:]))
    finally:
        server.stop()


# ------------------------------------------------------- old <-> new


@pytest.fixture
def protocol_2_server(tmp_path: Path) -> Iterator[str]:
    """The server's code before the head stream, in open mode (loopback, no admin token)."""
    old = old_sources(PROTOCOL_2_COMMIT, tmp_path / "old")
    addr = tmp_path / "old.addr"
    script = (
        "import sys, trio\n"
        "from pathlib import Path\n"
        "from edge_gateway.metadata.server import MetadataServerConfig, serve_metadata\n"
        "config = MetadataServerConfig(db=Path(sys.argv[1]), listen='127.0.0.1:0',"
        " addr_file=Path(sys.argv[2]))\n"
        "trio.run(serve_metadata, config)\n"
    )
    with open(tmp_path / "old.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "old.sqlite"), str(addr)],
            env={**os.environ, "PYTHONPATH": str(old)},
            cwd=old,
            stdout=log,
            stderr=log,
        )
    try:
        deadline = time.monotonic() + 60
        while not addr.exists():
            assert proc.poll() is None, (tmp_path / "old.log").read_text()
            assert time.monotonic() < deadline, "the old server did not start"
            time.sleep(0.05)
        url = addr.read_text().strip()
        with httpx.Client(base_url=url, timeout=30) as c:
            assert c.post("/v1/regions", json={"id": "north"}).status_code == 201
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def test_the_reporter_sends_requests_to_an_older_server(protocol_2_server: str) -> None:
    async with MetadataClient(protocol_2_server, region="north") as c:
        reporter = HeadReporter(c)
        async with trio.open_nursery() as nursery:
            await nursery.start(reporter.run)
            for seq in range(1, 11):
                reporter.report_nowait(seq)
                await _wait_reported(reporter, seq)
            nursery.cancel_scope.cancel()
        assert not c.streams_heads
    stats = reporter.statistics()
    assert (stats.reports, stats.streamed, stats.streams_opened) == (10, 0, 0)
    async with httpx.AsyncClient(base_url=protocol_2_server, timeout=30) as h:
        assert (await h.get("/v1/regions/north")).json()["head_seq"] == 10
        # No stream was tried: the older server has no such route.
        r = await h.post("/v1/regions/north/head-stream", content=b"")
        assert r.status_code == 404


def test_the_previous_client_reports_to_this_server(fleet: Fleet, tmp_path: Path) -> None:
    old = old_sources(PROTOCOL_2_COMMIT, tmp_path / "old")
    base = _head(fleet.url, "south") or 0
    script = (
        "import sys, trio\n"
        "from edge_gateway.metadata.client import HeadReporter, MetadataClient\n"
        "async def main():\n"
        "    async with MetadataClient(sys.argv[1], token=sys.argv[2], region='south') as c:\n"
        "        r = HeadReporter(c)\n"
        "        async with trio.open_nursery() as n:\n"
        "            await n.start(r.run)\n"
        "            for seq in range(int(sys.argv[3]), int(sys.argv[3]) + 5):\n"
        "                r.report_nowait(seq)\n"
        "                with trio.fail_after(20):\n"
        "                    while (r.statistics().sent or -1) < seq:\n"
        "                        await trio.sleep(0.01)\n"
        "            n.cancel_scope.cancel()\n"
        "        print(r.statistics().reports)\n"
        "trio.run(main)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, fleet.url, fleet.tokens["south"], str(base + 1)],
        env={**os.environ, "PYTHONPATH": str(old)},
        cwd=old,
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.decode().strip() == "5"
    assert _head(fleet.url, "south") == base + 5


# ------------------------------------------------------------ the format


def test_report_lines_fed_whole_and_byte_by_byte() -> None:
    data = encode_report(0) + b'{"seq": 7}\n\n' + encode_report(2**62) + b'{ "seq" : 9 }\r\n'
    whole = ReportReader()
    assert whole.feed(data) == [0, 7, 2**62, 9]
    assert whole.lines == 4
    pieces = ReportReader()
    got: list[int] = []
    for i in range(len(data)):
        got += pieces.feed(data[i : i + 1])
    assert got == [0, 7, 2**62, 9]


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b"nope\n", "invalid_json"),
        (b"[1]\n", "invalid_json"),
        (b'{"seq": true}\n', "invalid_request"),
        (b'{"seq": 1, "x": 2}\n', "invalid_request"),
        (b'{"seq": 1.5}\n', "invalid_request"),
        (b'{"seq": %d}\n' % 2**63, "invalid_request"),
        (b" " * 300, "invalid_request"),
    ],
)
def test_a_bad_report_line_is_refused_with_its_number(line: bytes, code: str) -> None:
    reader = ReportReader()
    with pytest.raises(BadReportLine) as bad:
        reader.feed(encode_report(1) + line)
    assert bad.value.code == code
    assert "line 2" in bad.value.message
    assert reader.good == [1]
    with pytest.raises(BadReportLine):
        reader.feed(encode_report(2))  # unusable after an error


def test_a_stream_that_ends_mid_line_is_refused() -> None:
    reader = ReportReader()
    assert reader.feed(encode_report(1) + b'{"seq":') == [1]
    with pytest.raises(BadReportLine, match="mid-line"):
        reader.end()


def test_ack_lines_round_trip_fed_whole_and_byte_by_byte() -> None:
    data = encode_ack(3, 42, 10**15) + encode_error(3, "unavailable", "db away", 1)
    whole = AckDecoder("t").feed(data)
    pieces: list[Any] = []
    decoder = AckDecoder("t")
    for i in range(len(data)):
        pieces += decoder.feed(data[i : i + 1])
    assert whole == pieces
    assert (whole[0].acked, whole[0].seq, whole[0].version) == (3, 42, 10**15)
    assert whole[1].error == ("unavailable", "db away")
    assert whole[1].retry_after_s == 1.0
    for bad in (b"nope\n", b'{"acked": true}\n', b'{"acked": 1, "seq": 2}\n', b"x" * 5000):
        with pytest.raises(CorruptData):
            AckDecoder("t").feed(bad)


async def test_a_stream_opened_with_a_rotated_token_takes_up_the_token_file(
    fleet: Fleet, tmp_path: Path
) -> None:
    admin(fleet.url, "POST", "/v1/regions", {"id": "west"})
    rotate = {"keep_previous_s": 0}
    old = admin(fleet.url, "POST", "/v1/regions/west/token", rotate)["token"]
    token_file = tmp_path / "token"
    token_file.write_text(old)
    async with MetadataClient(fleet.url, token_file=token_file, region="west") as c:
        stream = await c.open_head_stream()
        await stream.aclose()
        token_file.write_text(admin(fleet.url, "POST", "/v1/regions/west/token", rotate)["token"])
        stream = await c.open_head_stream()  # 401 with the old one: the file's is taken up
        try:
            assert await stream.report(3) == 3
        finally:
            await stream.aclose()
        assert c.token_reloads == 1


async def test_a_stopping_server_ends_its_streams(server: MetaServer) -> None:
    token = admin(server.url, "POST", "/v1/regions", {"id": "north"})["token"]
    async with MetadataClient(server.url, token=token, region="north", timeout_s=30) as c:
        stream = await c.open_head_stream()
        try:
            assert await stream.report(1) == 1
            assert server.stop() == 0  # SIGTERM: a clean stop with a stream open
            # The next report finds the stream ended (or the connection gone):
            # Unavailable, which the reporter retries with its backoff.
            with pytest.raises(Unavailable, match=r"ended the head stream|unreachable"):
                await stream.report(2)
        finally:
            await stream.aclose()
