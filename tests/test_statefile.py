"""edge_gateway.statefile: the checksum of JSON state files and the quarantine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge_gateway.errors import CorruptData
from edge_gateway.statefile import StateFiles, seal, unseal

LEGACY = frozenset({"v", "id_limit", "epochs"})
DOC = {"v": 1, "id_limit": 1026, "epochs": [[7, 2, 1764000000000]], "name": "nörd"}


def test_a_sealed_document_reads_back() -> None:
    data = seal(DOC)
    assert unseal(data, where="f", legacy_keys=LEGACY) == DOC
    assert seal(json.loads(data)) == data  # sealing again: the same bytes (the field is replaced)


def test_every_single_bit_flip_is_found() -> None:
    """Whatever byte of the file flips, the reader refuses it (never returns other values)."""
    data = seal(DOC)
    for i in range(len(data)):
        for bit in range(8):
            bad = bytearray(data)
            bad[i] ^= 1 << bit
            try:
                doc = unseal(bytes(bad), where="f", legacy_keys=LEGACY)
            except CorruptData:
                continue
            # Only a flip that decodes to the same values may pass (the case of a
            # hex digit in the escape of 'ö'): harmless.
            assert doc == DOC, (i, bit, bytes(bad))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "not JSON"),
        (bytes(4096), "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"v": 1, "id_limit": 3, "epochs": [], "crc32": 5}', "no checksum and unknown fields"),
        (b'{"v": 1, "crc32c": "x"}', "checksum mismatch"),
        (b'{"v": NaN, "crc32c": 1}', "not a state document"),
    ],
)
def test_damage_is_refused_with_its_reason(data: bytes, reason: str) -> None:
    with pytest.raises(CorruptData, match=reason) as refused:
        unseal(data, where="the/file", legacy_keys=LEGACY)
    assert refused.value.where == "the/file"


def test_the_form_written_before_the_checksum_opens() -> None:
    old = {"v": 1, "id_limit": 1026, "epochs": []}
    assert unseal(json.dumps(old).encode(), where="f", legacy_keys=LEGACY) == old


def test_a_damaged_file_is_copied_to_quarantine_removed_and_recorded(tmp_path: Path) -> None:
    files = StateFiles(tmp_path)
    for n in range(3):  # within one second: each kept under its own name
        (tmp_path / "topics.json").write_bytes(b"bad %d" % n)
        files.damaged(tmp_path / "topics.json", f"reason {n}", "rebuilt")
    assert not (tmp_path / "topics.json").exists()
    found = files.statistics()
    assert [d.reason for d in found] == ["reason 0", "reason 1", "reason 2"]
    moved = [Path(d.quarantined) for d in found if d.quarantined]
    assert [p.read_bytes() for p in moved] == [b"bad 0", b"bad 1", b"bad 2"]
    assert {p.parent for p in moved} == {tmp_path / "quarantine"}
    assert found[0].to_json()["file"] == "topics.json"


def test_a_file_already_gone_is_still_recorded(tmp_path: Path) -> None:
    files = StateFiles(tmp_path)
    record = files.damaged(tmp_path / "gone.json", "unreadable", "rebuilt")
    assert record.quarantined is None
    assert files.statistics() == (record,)


def test_a_file_its_owner_rebuilds_stays_until_written_over(tmp_path: Path) -> None:
    files = StateFiles(tmp_path)
    (tmp_path / "producers.json").write_bytes(b"bad")
    record = files.damaged(tmp_path / "producers.json", "not JSON", "rebuilt", remove=False)
    assert (tmp_path / "producers.json").read_bytes() == b"bad"
    assert record.quarantined is not None
    assert Path(record.quarantined).read_bytes() == b"bad"
