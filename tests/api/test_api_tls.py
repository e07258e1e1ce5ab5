"""The local API over TLS: real `edgegw serve` processes with certificates made here.

Covers docs/security.md, "TLS": produce/consume with the CA (keep-alive, long
polls, disconnects, the fast path), refusals that name the certificate
problem, a plain-HTTP client on the TLS port, a stalled handshake that must
not hold up anyone else, hypercorn with the same files, client certificates
(mutual TLS), and the config errors at start.
"""

from __future__ import annotations

import json
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from _serve import EDGEGW, Server, wait_until

from edge_gateway.client import Client
from edge_gateway.config import parse_config
from edge_gateway.errors import ConfigError, Denied, InvalidInput
from edge_gateway.testing.tls import TlsFiles, make_tls_files

TOKEN = "api-token-for-tls-tests-0123456789"


def write_tls_config(root: Path, files: TlsFiles, **api: object) -> Path:
    lines = "".join(
        f"{k} = {json.dumps(str(v) if isinstance(v, Path) else v)}\n" for k, v in api.items()
    )
    path = root / "edgegw.toml"
    path.write_text(
        f"""
region = "north"
data_dir = "{root / "data"}"
shutdown_grace_s = 10.0
[shipper]
flush_interval_ms = 50
[api]
listen = "127.0.0.1:0"
token = "{TOKEN}"
tls_cert = "{files.cert}"
tls_key = "{files.key}"
{lines}
[[topics]]
name = "t"
home = "north"
partitions = 2
"""
    )
    return path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    # Only the IP address: "localhost" is a name the certificate does not hold.
    return make_tls_files(tmp_path_factory.mktemp("certs"), names=("127.0.0.1",))


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, certs: TlsFiles) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("tls")
    server = Server(write_tls_config(root, certs, tls_handshake_timeout_s=3.0))
    try:
        yield server
    finally:
        server.stop(signal.SIGTERM)


def client(server: Server, certs: TlsFiles, **kwargs: object) -> Client:
    return Client(server.url, token=TOKEN, ca_file=certs.ca, timeout=10.0, **kwargs)  # type: ignore[arg-type]


def tls_socket(server: Server, certs: TlsFiles) -> ssl.SSLSocket:
    host, port = server.url.removeprefix("https://").rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    raw = socket.create_connection((host, int(port)), timeout=10)
    return ctx.wrap_socket(raw, server_hostname=host)


def _request(path: str) -> bytes:
    return (f"GET {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {TOKEN}\r\n\r\n").encode()


def _read_response(sock: ssl.SSLSocket) -> tuple[bytes, bytes]:
    """(head, body) of one response with a Content-Length."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection mid-body"
        body += chunk
    assert len(body) == length  # no pipelining here: nothing beyond this response
    return head, body


def test_the_address_file_and_status_say_https(gateway: Server, certs: TlsFiles) -> None:
    assert gateway.url.startswith("https://127.0.0.1:")
    assert gateway.addr_file.read_text().strip() == gateway.url
    with client(gateway, certs) as c:
        api = c.status()["api"]
    assert api["url"] == gateway.url
    assert api["tls"] is True
    assert api["client_certificates"] is False


def test_produce_and_fetch_with_the_ca(gateway: Server, certs: TlsFiles) -> None:
    with client(gateway, certs) as c:
        res = c.produce("t", [b"one", "two", {"value": "three", "key": "k"}], partition=0)
        batch = c.produce_batch("t", 0, [b"four", b"five"])
        page = c.fetch("t", 0, res.offsets[0], max_records=10)
    assert [r.value for r in page.records][:5] == [b"one", b"two", b"three", b"four", b"five"]
    assert batch.offsets == [res.offsets[-1] + 1, res.offsets[-1] + 2]


def test_keep_alive_and_the_fast_path_over_tls(gateway: Server, certs: TlsFiles) -> None:
    # Several requests on one TLS connection, each answered in full.
    with tls_socket(gateway, certs) as sock:
        for _ in range(5):
            sock.sendall(_request("/v1/topics/t"))
            head, body = _read_response(sock)
            assert head.startswith(b"HTTP/1.1 200"), head
            assert json.loads(body)["name"] == "t"
        # Two requests in one write (pipelined) are both answered, in order.
        sock.sendall(_request("/v1/topics/t") + _request("/healthz"))
        buf = b""
        deadline = time.monotonic() + 10
        while buf.count(b"HTTP/1.1 200") < 2 and time.monotonic() < deadline:
            buf += sock.recv(65536)
        assert buf.count(b"HTTP/1.1 200") == 2, buf


def test_a_long_poll_over_tls_wakes_on_new_records(gateway: Server, certs: TlsFiles) -> None:
    with client(gateway, certs) as c:
        start = c.fetch("t", 1, 0, max_records=1).high_watermark
    with tls_socket(gateway, certs) as sock:
        sock.sendall(_request(f"/v1/topics/t/partitions/1/records?offset={start}&wait_ms=30000"))
        with client(gateway, certs) as c:
            c.produce("t", [b"wake up"], partition=1)
        head, body = _read_response(sock)  # bounded by the socket's 10 s timeout
    assert head.startswith(b"HTTP/1.1 200"), head
    assert json.loads(body)["records"][0]["value"] == "wake up"


def _metric(server: Server, certs: TlsFiles, name: str) -> float:
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    r = httpx.get(f"{server.url}/metrics", verify=ctx, timeout=10)
    for line in r.text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def test_a_client_that_leaves_a_long_poll_is_noticed(gateway: Server, certs: TlsFiles) -> None:
    before = _metric(gateway, certs, "edgegw_api_waits_abandoned_total")
    with client(gateway, certs) as c:
        end = c.fetch("t", 1, 0, max_records=1).high_watermark
    sock = tls_socket(gateway, certs)
    sock.sendall(_request(f"/v1/topics/t/partitions/1/records?offset={end + 100}&wait_ms=60000"))
    time.sleep(0.2)  # let the request reach the wait (not asserted on: any order works)
    sock.close()
    wait_until(
        lambda: _metric(gateway, certs, "edgegw_api_waits_abandoned_total") > before,
        20,
        "the server to notice the client left its long poll",
    )


def test_without_the_ca_the_certificate_is_refused_by_name(
    gateway: Server, certs: TlsFiles
) -> None:
    with pytest.raises(Denied, match="certificate that does not verify") as err:
        Client(gateway.url, token=TOKEN, timeout=10).topics()
    assert err.value.code == "certificate_verify_failed"
    # Another CA (here: a self-signed certificate) does not vouch for it either.
    with pytest.raises(Denied, match="does not verify"):
        Client(gateway.url, token=TOKEN, ca_file=certs.self_signed, timeout=10).topics()
    # A name the certificate does not hold.
    port = gateway.url.rsplit(":", 1)[1]
    with pytest.raises(Denied, match=r"(?i)mismatch|match"):
        Client(f"https://localhost:{port}", token=TOKEN, ca_file=certs.ca, timeout=10).topics()
    # A CA file that is not there: refused when the client is made.
    with pytest.raises(InvalidInput, match=r"nope\.pem"):
        Client(gateway.url, ca_file=certs.ca.parent / "nope.pem")


def test_a_plain_http_client_gets_a_clear_error_and_others_go_on(
    gateway: Server, certs: TlsFiles
) -> None:
    plain = gateway.url.replace("https://", "http://")
    with pytest.raises(InvalidInput, match="serves HTTPS"), Client(plain, token=TOKEN) as c:
        c.topics()
    r = httpx.get(f"{plain}/healthz", timeout=10)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "tls_required"
    with client(gateway, certs) as c:
        assert c.healthy()
        assert c.produce("t", [b"after plain"]).offsets


def test_stalled_handshakes_do_not_hold_up_others_and_are_closed(
    gateway: Server, certs: TlsFiles
) -> None:
    host, port = gateway.url.removeprefix("https://").rsplit(":", 1)
    with client(gateway, certs) as c:
        failures = c.status()["api"]["tls_handshake_failures"]
    stalled = []
    for i in range(8):
        s = socket.create_connection((host, int(port)), timeout=10)
        if i % 2:
            s.sendall(b"\x16\x03\x01\x02\x00")  # the start of a ClientHello, then nothing
        stalled.append(s)
    try:
        # Others are served meanwhile: new TLS connections, one after another.
        for _ in range(3):
            with client(gateway, certs) as c:
                assert c.produce("t", [b"while stalled"]).offsets
        # The server closes each stalled connection after its handshake
        # deadline (3 s here); the 10 s socket timeout bounds the wait.
        for s in stalled:
            assert s.recv(100) == b""
    finally:
        for s in stalled:
            s.close()
    with client(gateway, certs) as c:
        assert c.status()["api"]["tls_handshake_failures"] >= failures + len(stalled)


def test_hypercorn_serves_the_same_tls(tmp_path: Path, certs: TlsFiles) -> None:
    server = Server(write_tls_config(tmp_path, certs, server="hypercorn"))
    try:
        assert server.url.startswith("https://")
        with client(server, certs) as c:
            assert c.produce("t", [b"via hypercorn"], partition=0).offsets == [0]
            assert c.fetch("t", 0, 0).records[0].value == b"via hypercorn"
        with pytest.raises(Denied, match="does not verify"):
            Client(server.url, token=TOKEN, timeout=10).topics()
    finally:
        server.stop(signal.SIGTERM)


def test_client_certificates_when_required(tmp_path: Path, certs: TlsFiles) -> None:
    assert certs.client_cert is not None
    assert certs.client_key is not None
    server = Server(write_tls_config(tmp_path, certs, tls_client_ca=certs.ca))
    try:
        with client(server, certs, client_cert=(certs.client_cert, certs.client_key)) as c:
            assert c.produce("t", [b"from a device"]).offsets
            assert c.status()["api"]["client_certificates"] is True
        # No certificate: a 403 over TLS that says what is missing.
        with pytest.raises(InvalidInput, match="requires a client certificate"):
            client(server, certs).topics()
        # One from another issuer fails the handshake; the server's alert says why.
        with pytest.raises(Denied, match="refused the TLS connection") as refused:
            client(server, certs, client_cert=(certs.self_signed, certs.self_signed_key)).topics()
        assert refused.value.code == "client_certificate_refused"
        with client(server, certs, client_cert=(certs.client_cert, certs.client_key)) as c:
            assert c.status()["api"]["tls_handshake_failures"] >= 2
    finally:
        server.stop(signal.SIGTERM)


# ----------------------------------------------------------------- config


def test_tls_settings_are_checked() -> None:
    base = {"region": "north", "data_dir": "/tmp/x"}
    with pytest.raises(ConfigError, match=r"api\.tls_cert and api\.tls_key: set both"):
        parse_config({**base, "api": {"tls_cert": "c.pem"}}, env={})
    with pytest.raises(ConfigError, match=r"api\.tls_cert and api\.tls_key: set both"):
        parse_config({**base, "api": {"tls_key": "k.pem"}}, env={})
    with pytest.raises(ConfigError, match=r"api\.tls_client_ca: needs api\.tls_cert"):
        parse_config({**base, "api": {"tls_client_ca": "ca.pem"}}, env={})
    with pytest.raises(ConfigError, match="tls_handshake_timeout_s"):
        parse_config({**base, "api": {"tls_handshake_timeout_s": 0}}, env={})
    # Relative files are relative to the config file's folder.
    cfg = parse_config(
        {**base, "api": {"tls_cert": "c.pem", "tls_key": "/abs/k.pem"}},
        env={},
        base_dir=Path("/etc/edgegw"),
    )
    assert (cfg.api.tls_cert, cfg.api.tls_key) == ("/etc/edgegw/c.pem", "/abs/k.pem")
    assert cfg.api.scheme == "https"


@pytest.mark.parametrize("problem", ["missing", "garbage", "wrong key"])
def test_a_bad_certificate_file_stops_serve_with_one_line(
    tmp_path: Path, certs: TlsFiles, problem: str
) -> None:
    files = certs
    if problem == "missing":
        files = TlsFiles(**{**_fields(certs), "cert": tmp_path / "absent.pem"})
    elif problem == "garbage":
        bad = tmp_path / "garbage.pem"
        bad.write_text("not a certificate\n")
        files = TlsFiles(**{**_fields(certs), "cert": bad})
    else:
        files = TlsFiles(**{**_fields(certs), "key": certs.self_signed_key})
    config = write_tls_config(tmp_path, files)
    r = subprocess.run(
        [str(EDGEGW), "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, r.stderr
    assert "api.tls_cert" in errors[0]
    expect = {"missing": "No such file", "garbage": "not PEM", "wrong key": "mismatch"}[problem]
    assert expect in errors[0], errors[0]
    assert not (tmp_path / "data" / "api.addr").exists()


def _fields(files: TlsFiles) -> dict[str, Path | None]:
    return {name: getattr(files, name) for name in TlsFiles.__dataclass_fields__}
