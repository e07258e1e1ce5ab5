"""The client commands against a real `edgegw serve` speaking HTTPS.

How the CLI verifies (docs/security.md, "TLS"): ``--ca-file`` (or
``EDGEGW_CA_FILE``); without it, with ``--config``, the config's
``api.tls_ca`` or else the gateway's own certificate, pinned; else the
system's CAs, which know nothing of a test CA: a one-line refusal.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from _cli_support import assert_one_line_failure
from _serve import EDGEGW, Server
from edgegw_cli._api import TlsOptions, verify_for

from edge_gateway.config import load_config
from edge_gateway.testing.tls import TlsFiles, make_tls_files


@dataclass(frozen=True)
class Served:
    config: Path
    url: str
    certs: TlsFiles


def _config(root: Path, certs: TlsFiles, extra: str = "", *, chain: bool = False) -> Path:
    path = root / "edgegw.toml"
    path.write_text(
        f"""
region = "north"
data_dir = "data"
shutdown_grace_s = 10.0
[shipper]
flush_interval_ms = 50
[api]
listen = "127.0.0.1:0"
tls_cert = "certs/{"chain.pem" if chain else "server.pem"}"
tls_key = "certs/server-key.pem"
{extra}
[[topics]]
name = "t"
home = "north"
partitions = 1
"""
    )
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("tls-cli")
    # A CA-issued certificate (not self-signed), served with its chain as
    # deployments do: pinning it must still work, and pin the leaf alone.
    certs = make_tls_files(root / "certs", names=("127.0.0.1",))
    (root / "certs" / "chain.pem").write_text(certs.cert.read_text() + certs.ca.read_text())
    config = _config(root, certs, chain=True)
    server = Server(config)
    try:
        yield Served(config, server.url, certs)
    finally:
        server.stop(signal.SIGTERM)


def run(
    *args: str | Path, stdin: str | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EDGEGW), *(str(a) for a in args)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        # (PYTHONPATH kept: the command runs the code under test, not an installed copy)
        env={
            "COLUMNS": "200",
            "PATH": "/usr/bin:/bin",
            **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
            **(env or {}),
        },
    )


def test_with_the_config_the_gateways_own_certificate_is_trusted(served: Served) -> None:
    out = run("produce", "t", "-c", served.config, stdin="a\nb\n")
    assert out.returncode == 0, out.stderr
    assert "produced 2 records" in out.stdout
    assert f"gateway {served.url}" in out.stderr
    out = run("status", "-c", served.config)
    assert out.returncode == 0, out.stderr
    assert f"{served.url} (TLS)" in out.stdout
    out = run("topics", "list", "-c", served.config)
    assert out.returncode == 0, out.stderr


def test_the_pin_is_the_gateways_certificate_alone(served: Served) -> None:
    # The config's tls_cert holds the chain (leaf + CA): only the leaf is
    # trusted, since names are not checked under the pin; any other
    # certificate the CA issued must not pass.
    cfg = load_config(served.config, env={})
    ctx = verify_for(served.url, cfg, TlsOptions())
    assert ctx is not None
    # One certificate in the trust store, and not a CA.
    assert ctx.cert_store_stats() == {"x509": 1, "crl": 0, "x509_ca": 0}
    assert not ctx.check_hostname
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    # With tls_ca, names are checked and the CA is the anchor.
    with_ca = verify_for(
        served.url, replace(cfg, api=replace(cfg.api, tls_ca=str(served.certs.ca))), TlsOptions()
    )
    assert with_ca is not None
    assert with_ca.check_hostname
    assert with_ca.cert_store_stats()["x509_ca"] == 1


def test_with_a_url_the_ca_file_is_given(served: Served) -> None:
    out = run("consume", "t", "--from-beginning", "--max", "2", "--url", served.url,
              "--ca-file", served.certs.ca)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert [json.loads(line)["value"] for line in out.stdout.splitlines()][:2] == ["a", "b"]
    out = run("status", "--json", "--url", served.url, env={"EDGEGW_CA_FILE": str(served.certs.ca)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["api"]["tls"] is True


def test_without_a_ca_the_certificate_problem_is_named(served: Served) -> None:
    out = run("status", "--url", served.url)
    line = assert_one_line_failure(out.returncode, out.stderr, "does not verify")
    assert "certificate" in line
    # The wrong CA: the same, and a CA file that is missing is a usage error (2).
    out = run("status", "--url", served.url, "--ca-file", served.certs.self_signed)
    assert_one_line_failure(out.returncode, out.stderr, "does not verify")
    out = run("status", "--url", served.url, "--ca-file", served.certs.ca.parent / "no.pem")
    assert out.returncode == 2, out.stderr
    assert_one_line_failure(out.returncode, out.stderr, "no.pem")
    # Plain http on the TLS port.
    out = run("status", "--url", served.url.replace("https://", "http://"))
    assert_one_line_failure(out.returncode, out.stderr, "serves HTTPS")


def test_api_tls_ca_in_the_config_is_used(served: Served) -> None:
    # Configs beside the gateway's (same data dir, same certificate paths) with
    # tls_ca: the CLI verifies with that CA, and the name, instead of pinning.
    text = served.config.read_text()
    good = served.config.with_name("good-ca.toml")
    good.write_text(text.replace("[api]\n", f'[api]\ntls_ca = "{served.certs.ca}"\n', 1))
    out = run("status", "-c", good)
    assert out.returncode == 0, out.stderr
    bad = served.config.with_name("wrong-ca.toml")
    bad.write_text(text.replace("[api]\n", f'[api]\ntls_ca = "{served.certs.self_signed}"\n', 1))
    out = run("status", "-c", bad)
    assert_one_line_failure(out.returncode, out.stderr, "does not verify")


def test_sync_asks_the_running_gateway_over_tls(served: Served) -> None:
    out = run("produce", "t", "-c", served.config, stdin="to ship\n")
    assert out.returncode == 0, out.stderr
    out = run("sync", "-c", served.config)
    assert out.returncode == 0, out.stderr
    assert f"asking it at {served.url}" in out.stderr


def test_client_certificates_from_the_command_line(tmp_path: Path) -> None:
    certs = make_tls_files(tmp_path / "certs", names=("127.0.0.1",))
    assert certs.client_cert is not None
    assert certs.client_key is not None
    config = _config(tmp_path, certs, f'tls_client_ca = "{certs.ca}"')
    server = Server(config)
    try:
        out = run("status", "-c", config)
        assert_one_line_failure(out.returncode, out.stderr, "requires a client certificate")
        mine = ("--client-cert", certs.client_cert, "--client-key", certs.client_key)
        out = run("produce", "t", "-c", config, *mine, stdin="from a device\n")
        assert out.returncode == 0, out.stderr
        out = run("status", "-c", config, *mine)
        assert out.returncode == 0, out.stderr
        assert "client certificates required" in out.stdout
        # The same from the environment, and for sync asking the running gateway.
        env = {
            "EDGEGW_CLIENT_CERT": str(certs.client_cert),
            "EDGEGW_CLIENT_KEY": str(certs.client_key),
        }
        out = run("sync", "-c", config, env=env)
        assert out.returncode == 0, out.stderr
        assert "asking it" in out.stderr
    finally:
        server.stop(signal.SIGTERM)
