"""net.tls.server_context: the context it builds, and errors that name the setting at fault."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import pytest

from edge_gateway.errors import ConfigError
from edge_gateway.net.tls import TLS_HANDSHAKE_RECORD, server_context
from edge_gateway.testing.tls import make_tls_files


@dataclass(frozen=True)
class Settings:
    tls_cert: str
    tls_key: str
    tls_client_ca: str = ""


def test_a_server_context_with_and_without_client_certificates(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    plain = server_context(Settings(str(files.cert), str(files.key)))
    assert plain.minimum_version == ssl.TLSVersion.TLSv1_2
    assert plain.verify_mode == ssl.CERT_NONE
    mutual = server_context(Settings(str(files.cert), str(files.key), str(files.ca)))
    # Optional in the handshake: the server answers a missing one with a 403.
    assert mutual.verify_mode == ssl.CERT_OPTIONAL
    assert TLS_HANDSHAKE_RECORD == 0x16


def test_errors_name_the_api_settings_by_default(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(
        ConfigError, match=r"^api\.tls_cert / api\.tls_key: cannot load .*nope\.pem"
    ):
        server_context(Settings(str(missing), str(missing)))


def test_errors_name_the_settings_they_are_given(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    names = ("--tls-cert", "--tls-key", "--tls-client-ca")
    with pytest.raises(ConfigError, match=r"^--tls-cert / --tls-key: cannot load .*: not PEM"):
        server_context(Settings(str(files.ca), str(files.ca)), names=names)
    with pytest.raises(ConfigError, match=r"^--tls-client-ca: cannot load .*absent\.pem"):
        server_context(
            Settings(str(files.cert), str(files.key), str(tmp_path / "absent.pem")), names=names
        )
