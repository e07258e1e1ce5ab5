"""``edgegw encryption keygen`` and ``edgegw inspect object`` of an encrypted object."""

from __future__ import annotations

from pathlib import Path

from _cli_support import invoke

from edge_gateway.encryption import read_key_file
from edge_gateway.format.batch import Record, encode_records
from edge_gateway.format.crypt import WriteKey
from edge_gateway.format.logobject import LogObjectBuilder

MARKER = b"inspect-me-7731"


def test_keygen_writes_a_private_key_file_once(tmp_path: Path) -> None:
    path = tmp_path / "north-2026-11.key"
    res = invoke("encryption", "keygen", "-o", path)
    assert res.exit_code == 0, res.stderr
    assert "wrote key north-2026-11" in res.stdout
    assert path.stat().st_mode & 0o777 == 0o600
    key = read_key_file(path, "test")
    assert len(key) == 32
    again = invoke("encryption", "keygen", "-o", path)
    assert again.exit_code == 1
    assert "never overwritten" in again.stderr
    assert read_key_file(path, "test") == key
    bad = invoke("encryption", "keygen", "-o", tmp_path / "no good.key")
    assert bad.exit_code == 2
    assert "key id" in bad.stderr


def test_inspect_shows_the_key_id_and_opens_with_the_key(tmp_path: Path) -> None:
    key_path = tmp_path / "north-1.key"
    assert invoke("encryption", "keygen", "-o", key_path).exit_code == 0
    b = LogObjectBuilder()
    b.add_batch("t", 0, encode_records([Record(0, 1_700_000_000_000, None, MARKER)]))
    obj = b.build("north", 1, 2, 1, 1, 0, key=WriteKey("north-1", read_key_file(key_path, "k")))
    path = tmp_path / "00000000000000000002.egw"
    path.write_bytes(obj)
    res = invoke("inspect", "object", path)
    assert res.exit_code == 0, res.stderr
    assert "AES-256-GCM blocks, key id north-1" in res.stdout
    without = invoke("inspect", "object", path, "--records")
    assert without.exit_code == 1
    assert "no decryption key 'north-1' for region 'north'" in without.stderr
    with_key = invoke("inspect", "object", path, "--records", "--key-file", key_path)
    assert with_key.exit_code == 0, with_key.stderr
    assert MARKER.decode() in with_key.stdout
