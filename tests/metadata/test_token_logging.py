"""Bearer tokens never reach a log, even at DEBUG (docs/security.md, "Tokens").

Real processes: a metadata server over TLS (the gateways verify it with
``metadata.ca_file``), one gateway with the right region token
and one with a wrong one (it is refused and logs that), both at
``[log] level = "debug"`` (httpx and httpcore then log every request), their
local APIs with a token and TLS, clients sending the right token and a
wrong one. Every token, right or wrong, must be absent from every log.
"""

from __future__ import annotations

import signal
import ssl
from pathlib import Path

import httpx
import pytest
from _meta_support import ADMIN_TOKEN, MetaServer
from _serve import Server, wait_until

from edge_gateway.client import Client
from edge_gateway.errors import InvalidInput
from edge_gateway.testing.tls import make_tls_files

API_TOKEN = "api-token-never-logged-0123456789abcdef"
WRONG_API_TOKEN = "wrong-api-token-never-logged-0123456789"
WRONG_METADATA_TOKEN = "wrong-metadata-token-never-logged-0123456789"


def _gateway(root: Path, region: str, meta_url: str, meta_token: str, meta_ca: Path) -> Server:
    certs = make_tls_files(root / "certs", names=("127.0.0.1",), client=False)
    config = root / "edgegw.toml"
    config.write_text(
        f"""
region = "{region}"
data_dir = "{root / "data"}"
shutdown_grace_s = 10.0
[shipper]
flush_interval_ms = 50
[api]
listen = "127.0.0.1:0"
token = "{API_TOKEN}"
tls_cert = "{certs.cert}"
tls_key = "{certs.key}"
tls_ca = "{certs.ca}"
[metadata]
url = "{meta_url}"
token = "{meta_token}"
ca_file = "{meta_ca}"
poll_interval_ms = 200
heartbeat_interval_ms = 200
[log]
level = "debug"
"""
    )
    return Server(config)


def test_no_token_is_ever_logged(tmp_path: Path) -> None:
    meta_tls = make_tls_files(tmp_path / "meta-certs", names=("127.0.0.1",), client=False)
    meta = MetaServer(
        tmp_path / "meta.sqlite",
        extra=("--tls-cert", str(meta_tls.cert), "--tls-key", str(meta_tls.key)),
    )
    gateways: list[Server] = []
    try:
        assert meta.url.startswith("https://")
        tokens: dict[str, str] = {}
        with httpx.Client(
            base_url=meta.url,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            verify=ssl.create_default_context(cafile=str(meta_tls.ca)),
            timeout=30,
        ) as c:
            for region in ("north", "south"):
                r = c.post("/v1/regions", json={"id": region})
                assert r.status_code == 201, r.text
                tokens[region] = r.json()["token"]
            r = c.post("/v1/topics", json={"name": "t", "home": "north", "partitions": 1})
            assert r.status_code < 300, r.text
        north = _gateway(tmp_path / "north", "north", meta.url, tokens["north"], meta_tls.ca)
        gateways.append(north)
        south = _gateway(tmp_path / "south", "south", meta.url, WRONG_METADATA_TOKEN, meta_tls.ca)
        gateways.append(south)
        ca = tmp_path / "north" / "certs" / "ca.pem"

        # north takes up the topic and serves it; heartbeats go to the server.
        with Client(north.url, token=API_TOKEN, ca_file=ca, timeout=10) as c:

            def produced() -> bool:
                try:
                    return bool(c.produce("t", [b"x"]).offsets)
                except InvalidInput:
                    return False

            wait_until(produced, 30, "north to serve t from the routing table")
            assert c.fetch("t", 0, 0).records
            wait_until(lambda: c.status()["metadata"]["heartbeats"] >= 2, 30, "heartbeats")
        # A wrong token at the API is refused (and not logged either).
        with (
            pytest.raises(InvalidInput, match="bearer token"),
            Client(north.url, token=WRONG_API_TOKEN, ca_file=ca, timeout=10) as c,
        ):
            c.topics()
        r = httpx.get(
            f"{north.url}/v1/topics",
            headers={"Authorization": f"Bearer {WRONG_API_TOKEN}"},
            verify=ssl.create_default_context(cafile=str(ca)),
            timeout=10,
        )
        assert r.status_code == 401
        # south's token is refused by the server: it says so in its log.
        wait_until(
            lambda: "401 unauthorized" in south.log.read_text(),
            30,
            "south to log the refused token",
        )
    finally:
        for gw in gateways:
            gw.stop(signal.SIGTERM)
        meta.stop()

    logs = {gw.log: gw.log.read_text() for gw in gateways}
    logs[meta.log] = meta.log.read_text()
    # The logs are the ones wanted: at DEBUG, with httpx's request lines.
    assert "DEBUG" in logs[north.log]
    assert "HTTP Request" in logs[north.log]
    secrets = [API_TOKEN, WRONG_API_TOKEN, WRONG_METADATA_TOKEN, ADMIN_TOKEN, *tokens.values()]
    for path, text in logs.items():
        for secret in secrets:
            assert secret not in text, f"{path} holds a token"
