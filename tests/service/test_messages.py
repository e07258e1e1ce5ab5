"""What the gateway says when it cannot do what is asked, as real processes:
the cause and what to do, not just a symptom (issue 41, item 8). The Kafka
frame limit's answer is in tests/kafka/test_kafka_clients.py."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from _serve import EDGEGW, Server, wait_until, write_config

from edge_gateway.testing.ports import closed_port, free_port

sys.path.insert(0, str(Path(__file__).parents[1] / "cli"))
from _cli_support import assert_one_line_failure, run_edgegw

#: Serve's exit codes (docs/operations.md).
EXIT_FATAL, EXIT_CONFIG = 1, 2


def _config(folder: Path, *, data_dir: str = "data", extra: str = "") -> Path:
    path = folder / "edgegw.toml"
    path.write_text(
        f'region = "north"\ndata_dir = "{data_dir}"\nshutdown_grace_s = 5.0\n{extra}\n'
        '[[topics]]\nname = "t"\nhome = "north"\npartitions = 1\n'
    )
    return path


def test_produce_during_a_first_start_says_what_it_waits_for(tmp_path: Path) -> None:
    # Before: {"code":"unavailable","message":"the gateway is shutting down or not
    # started"}, while /healthz said that a first start waits for the bucket.
    with closed_port() as away:
        _first_start_refuses_with_the_reason(tmp_path, away)


def _first_start_refuses_with_the_reason(tmp_path: Path, away: int) -> None:
    port = free_port()
    config = _config(
        tmp_path,
        extra=f'[api]\nlisten = "127.0.0.1:{port}"\n'
        '[bucket]\ntype = "s3"\nbucket = "edgegw-away"\n'
        f'endpoint_url = "http://127.0.0.1:{away}"\nregion = "us-east-1"\n'
        'path_style = true\naccess_key = "testing"\nsecret_key = "testing"\n'
        "connect_timeout = 1.0\nmax_attempts = 1\n",
    )
    log = tmp_path / "serve.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(EDGEGW), "serve", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    try:

        def refused() -> httpx.Response | None:
            try:
                r = httpx.post(
                    f"http://127.0.0.1:{port}/v1/topics/t/records",
                    json={"records": [{"value": "x"}]},
                    timeout=2,
                )
            except httpx.HTTPError:
                return None
            # Until the first attempt fails, it has nothing to say about it.
            return r if "last attempt" in r.text else None

        r = wait_until(refused, 30, "a produce refused with the bucket's error")
        assert r.status_code == 503
        err = r.json()["error"]
        assert err["code"] == "unavailable"
        message = err["message"]
        assert message.startswith("the gateway is starting: a first start learns"), message
        assert f"127.0.0.1:{away}" in message  # the bucket's own error
        assert "what to do: check the link to the bucket and [bucket] in the config" in message
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json()
        assert (
            health["error"]["message"].split(" (last attempt")[0]
            == message.split(" (last attempt")[0]
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()


def test_a_busy_kafka_listen_is_named(tmp_path: Path) -> None:
    # Before: "error: Address already in use" (a busy api.listen named its key).
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = _config(
            tmp_path, extra=f'[api]\nlisten = "127.0.0.1:0"\n[kafka]\nlisten = "127.0.0.1:{port}"'
        )
        res = run_edgegw("serve", "--config", config, timeout=60)
    line = assert_one_line_failure(res.returncode, res.stderr, "kafka.listen: cannot listen on")
    assert f"127.0.0.1:{port}" in line
    assert "already in use" in line
    assert "choose another port" in line
    assert res.returncode == EXIT_FATAL
    assert "Traceback" not in res.stderr


def test_a_data_dir_that_is_a_file_is_named_as_such(tmp_path: Path) -> None:
    # Before: "error: afile: File exists".
    (tmp_path / "afile").write_text("not a directory\n")
    config = _config(tmp_path, data_dir=str(tmp_path / "afile"))
    res = run_edgegw("serve", "--config", config, timeout=60)
    line = assert_one_line_failure(res.returncode, res.stderr, "afile is a file, not a directory")
    assert "point data_dir at a directory" in line
    assert res.returncode == EXIT_CONFIG
    # The same for the commands that open it, and for a path under the file.
    res = run_edgegw("sync", "--config", config, timeout=60)
    assert_one_line_failure(res.returncode, res.stderr, "afile is a file, not a directory")
    config = _config(tmp_path, data_dir=str(tmp_path / "afile" / "data"))
    res = run_edgegw("serve", "--config", config, timeout=60)
    line = assert_one_line_failure(res.returncode, res.stderr, "is inside")
    assert f"{tmp_path / 'afile'}, a file, not a directory" in line
    assert (tmp_path / "afile").read_text() == "not a directory\n"


def test_a_head_too_large_is_named_with_its_limit(tmp_path: Path) -> None:
    # Before: 431 {"code":"headers_too_large","message":"malformed HTTP request"}.
    server = Server(write_config(tmp_path))
    try:
        url = urlsplit(server.url)
        with socket.create_connection((url.hostname, url.port), timeout=10) as s:
            head = b"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Big: "
            s.sendall(head + b"a" * (16 * 1024 + 1 - len(head)))
            data = b""
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        top, _, body = data.partition(b"\r\n\r\n")
        assert top.startswith(b"HTTP/1.1 431 "), data
        err = json.loads(body)["error"]
        assert err["code"] == "headers_too_large"
        assert "request head (request line and headers) is over 16384 bytes" in err["message"]
        assert "send shorter headers and URL" in err["message"]
    finally:
        server.stop(signal.SIGTERM)
