"""The journal's verifier (``edge_gateway/journal/_verify.py``): its pure checks over
bytes, and the rules that make it safe beside a running gateway (an active segment
being written, a segment deleted while the run goes on).

The end-to-end runs (a real ``edgegw serve``, damage on disk, the CLI's output and
exit codes) are in tests/cli/test_journal_verify.py.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from edge_gateway._crc import crc32c
from edge_gateway.format import entry as fentry
from edge_gateway.format.batch import Record, encode_records
from edge_gateway.format.entry import Checkpoint
from edge_gateway.journal import verify_journal
from edge_gateway.journal._index import SegmentIndex
from edge_gateway.journal._verify import Damage, check_index, check_segment

DATA = Path(__file__).resolve().parents[1] / "format" / "data"
T0 = 1_795_000_000_000


def _data(lsn: int, topic: str, partition: int, offset: int, n: int = 2) -> bytes:
    batch = encode_records([Record(offset + i, T0 + i, b"k", b"value %d" % i) for i in range(n)])
    return fentry.encode_entry(
        lsn=lsn,
        kind=fentry.KIND_DATA,
        topic=topic.encode(),
        partition=partition,
        base_offset=offset,
        count=n,
        append_time=T0 + lsn,
        payload=batch,
    )


def _checkpoint(lsn: int, offsets: dict[tuple[str, int], int]) -> bytes:
    return fentry.encode_entry(
        lsn=lsn,
        kind=fentry.KIND_CHECKPOINT,
        topic=b"",
        partition=0,
        base_offset=0,
        count=0,
        append_time=T0 + lsn,
        payload=Checkpoint(offsets, {}).encode(),
    )


def _segment(base: int, offset: int, entries: int) -> bytes:
    """A segment of a checkpoint and ``entries`` data entries of t/0 from ``offset``."""
    out = [fentry.encode_segment_header(base), _checkpoint(base, {("t", 0): offset})]
    for i in range(entries):
        out.append(_data(base + 1 + i, "t", 0, offset + 2 * i))
    return b"".join(out)


def _index(seg: bytes) -> bytes:
    facts = check_segment(seg, base_lsn=struct.unpack_from("<Q", seg, 8)[0])
    assert facts.damage is None
    return SegmentIndex(
        facts.base_lsn, len(seg), 0, facts.positions, dict(facts.partitions)
    ).encode()[0]


def test_the_golden_segments_verify() -> None:
    # A version 3 segment (block entries, nulls, producers, a marker) and its compressed form.
    for name, kind in (
        ("atrest_v1.wal", "journal v3"),
        ("atrest_v1.egwc", "compressed EGWC v1 (of journal v3)"),
    ):
        facts = check_segment((DATA / name).read_bytes(), base_lsn=41)
        assert (facts.kind, facts.damage, facts.base_lsn, facts.last_lsn) == (kind, None, 41, 51)
        assert facts.next_offsets[("south.t", 0)] == 109


def test_a_byte_flipped_anywhere_in_the_compressed_golden_file_is_damage() -> None:
    data = (DATA / "atrest_v1.egwc").read_bytes()
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x10
        facts = check_segment(bytes(bad), base_lsn=41)
        assert facts.damage is not None, f"byte {i}"
        assert 0 <= facts.damage.offset < len(data)


def test_damage_is_the_first_bad_entry_and_says_why() -> None:
    seg = _segment(1, 0, 5)
    facts = check_segment(seg, base_lsn=1)
    pos = facts.positions[3]
    bad = bytearray(seg)
    bad[pos + 60] ^= 1
    damaged = check_segment(bytes(bad), base_lsn=1)
    assert damaged.damage is not None
    assert damaged.damage.offset == pos
    assert "CRC" in damaged.damage.reason
    assert damaged.last_lsn == 3  # LSNs 1-3 were whole


def test_a_torn_tail_is_damage_in_a_sealed_segment_and_the_end_of_an_active_one() -> None:
    seg = _segment(1, 0, 5)
    torn = seg[:-7]
    sealed = check_segment(torn, base_lsn=1)
    assert sealed.damage is not None
    assert "truncated" in sealed.damage.reason
    active = check_segment(torn + bytes(4096), base_lsn=1, active=True)
    assert active.damage is None
    assert active.last_lsn == 5
    assert any("not yet complete" in n for n in active.notes)
    # A preallocated tail of zeros ends an active segment silently.
    clean = check_segment(seg + bytes(4096), base_lsn=1, active=True)
    assert (clean.damage, clean.notes, clean.last_lsn) == (None, [], 6)


def test_damage_followed_by_whole_entries_is_damage_in_the_active_segment_too() -> None:
    seg = bytearray(_segment(1, 0, 5))
    pos = check_segment(bytes(seg), base_lsn=1).positions[2]
    seg[pos + 50] ^= 1
    facts = check_segment(bytes(seg), base_lsn=1, active=True)
    assert facts.damage is not None
    assert facts.damage.offset == pos


def test_lsn_and_offsets_rules() -> None:
    header = fentry.encode_segment_header(1)
    # LSNs must follow on.
    skipped = header + _checkpoint(1, {}) + _data(2, "t", 0, 0) + _data(4, "t", 0, 2)
    facts = check_segment(skipped, base_lsn=1)
    assert facts.damage is not None
    assert "LSN 4 where 3 comes next" in facts.damage.reason
    # A partition's offsets never go back...
    back = header + _checkpoint(1, {}) + _data(2, "t", 0, 10) + _data(3, "t", 0, 5)
    facts = check_segment(back, base_lsn=1)
    assert facts.damage is not None
    assert "reached offset 12" in facts.damage.reason
    # ... not even behind what the checkpoint says.
    behind = header + _checkpoint(1, {("t", 0): 100}) + _data(2, "t", 0, 50)
    assert check_segment(behind, base_lsn=1).damage is not None
    # Nor across segments (next_offsets carries the lane's state).
    first = check_segment(_segment(1, 0, 3), base_lsn=1)
    second = _segment(5, 0, 1)
    facts = check_segment(second, base_lsn=5, next_offsets=first.next_offsets)
    assert facts.damage is not None
    assert "checkpoint" in facts.damage.reason
    # The file name and the header agree; the first entry is a checkpoint.
    assert check_segment(_segment(1, 0, 1), base_lsn=2).damage is not None
    no_cp = header + _data(1, "t", 0, 0)
    facts = check_segment(no_cp, base_lsn=1)
    assert facts.damage is not None
    assert "checkpoint" in facts.damage.reason


def test_an_index_is_checked_element_by_element_against_its_segment() -> None:
    seg = _segment(1, 0, 6)
    facts = check_segment(seg, base_lsn=1)
    idx = _index(seg)
    assert check_index(idx, facts, segment_size=len(seg)) == ("index v2", None)
    # The position of one entry changed, and the CRC made to match: still found.
    dir_len = struct.unpack_from("<I", idx, 44)[0]
    positions_at = 48 + dir_len + (-(48 + dir_len) % 8)
    forged = bytearray(idx[:-4])
    struct.pack_into("<q", forged, positions_at + 8 * 3, facts.positions[3] + 1)
    forged += struct.pack("<I", crc32c(bytes(forged)))
    damage = check_index(bytes(forged), facts, segment_size=len(seg))[1]
    assert damage is not None
    assert damage.offset == positions_at + 8 * 3
    assert f"LSN 4 is at byte {facts.positions[3] + 1}" in damage.reason
    # A flipped byte fails the CRC; an index of another size of segment is named as such.
    flipped = bytearray(idx)
    flipped[60] ^= 1
    damage = check_index(bytes(flipped), facts, segment_size=len(seg))[1]
    assert damage is not None
    assert "CRC" in damage.reason
    damage = check_index(idx, facts, segment_size=len(seg) + 1)[1]
    assert damage is not None
    assert damage.offset == 24


def _journal(root: Path, segments: int = 4) -> Path:
    main = root / "journal"
    main.mkdir()
    lsn, offset = 1, 0
    for _ in range(segments):
        seg = _segment(lsn, offset, 3)
        (main / f"{lsn:020d}.wal").write_bytes(seg)
        (main / f"{lsn:020d}.idx").write_bytes(_index(seg))
        lsn, offset = lsn + 4, offset + 6
    return main


def test_a_journal_with_a_missing_middle_segment_has_an_lsn_gap(tmp_path: Path) -> None:
    main = _journal(tmp_path)
    assert verify_journal(main).ok
    (main / f"{5:020d}.wal").unlink()
    (main / f"{5:020d}.idx").unlink()
    report = verify_journal(main)
    [bad] = report.damaged
    assert bad.path.name == f"{9:020d}.wal"
    assert bad.damage is not None
    assert bad.damage.offset == 8
    assert "LSNs 5..8 are missing" in bad.damage.reason


def test_a_segment_deleted_while_verifying_is_skipped_not_damaged(tmp_path: Path) -> None:
    main = _journal(tmp_path)
    seen: list[str] = []

    def progress(_done: int, _total: int, path: Path) -> None:
        # Retention deletes a segment (and its index) between the listing and its read.
        seen.append(path.name)
        if path.name == f"{1:020d}.idx":
            (main / f"{5:020d}.wal").unlink()
            (main / f"{5:020d}.idx").unlink()

    report = verify_journal(main, progress=progress)
    assert report.ok
    statuses = {f.path.name: f.status for f in report.files}
    assert statuses[f"{5:020d}.wal"] == "skipped"
    assert statuses[f"{9:020d}.wal"] == "ok"  # no gap is claimed across a skipped segment
    assert seen[-1] == f"{13:020d}.wal"


@pytest.mark.parametrize("still_torn", [False, True])
def test_an_active_segment_read_mid_write_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, still_torn: bool
) -> None:
    # A read that overtakes a write in progress sees zeros where an entry is being
    # written and whole entries after it: damage in the middle, at first sight.
    main = _journal(tmp_path, segments=1)
    path = main / f"{1:020d}.wal"
    (main / f"{1:020d}.idx").unlink()
    seg = path.read_bytes()
    pos = check_segment(seg, base_lsn=1).positions[2]
    torn = seg[:pos] + bytes(10) + seg[pos + 10 :]
    from edge_gateway.journal import _verify

    reads = [torn, torn if still_torn else seg, seg]
    monkeypatch.setattr(_verify, "read_whole", lambda _p: reads.pop(0))
    report = verify_journal(main, settle_s=0)
    [f] = report.files
    if still_torn:  # the same damage twice: reported
        assert f.status == "damaged"
        assert f.damage is not None
        assert f.damage.offset == pos
    else:  # the second read found the write done
        assert (f.status, f.last_lsn) == ("ok", 4)


def test_entry_kinds_and_segment_versions() -> None:
    def v1(seg: bytes) -> bytes:
        return seg[:4] + b"\x01" + seg[5:]

    header = fentry.encode_segment_header(1)
    assert check_segment(v1(_segment(1, 0, 2)), base_lsn=1).kind == "journal v1"
    producer = fentry.encode_entry(
        lsn=2,
        kind=fentry.KIND_DATA,
        topic=b"t",
        partition=0,
        base_offset=0,
        count=1,
        append_time=T0,
        payload=encode_records([Record(0, T0, None, b"v")]),
        producer=fentry.ProducerStamp(7, 0, 0),
    )
    seg = header + _checkpoint(1, {}) + producer
    assert check_segment(seg, base_lsn=1).damage is None  # version 2: fine
    damage = check_segment(v1(seg), base_lsn=1).damage
    assert damage is not None
    assert "producer" in damage.reason
    empty = fentry.encode_entry(
        lsn=2,
        kind=fentry.KIND_DATA,
        topic=b"t",
        partition=0,
        base_offset=0,
        count=0,
        append_time=T0,
        payload=b"",
    )
    damage = check_segment(header + _checkpoint(1, {}) + empty, base_lsn=1).damage
    assert damage is not None
    assert "without records" in damage.reason
    # The golden version 3 segment holds a block entry: in a version 2 segment, damage.
    golden = (DATA / "atrest_v1.wal").read_bytes()
    damage = check_segment(golden[:4] + b"\x02" + golden[5:], base_lsn=41).damage
    assert damage is not None
    assert "block entry in a version 2 segment" in damage.reason
    damage = check_segment(golden[:4] + b"\x04" + golden[5:], base_lsn=41).damage
    assert damage == Damage(4, "unsupported segment version 4")


def test_a_batch_whose_own_crc_fails_inside_a_valid_entry() -> None:
    # The entry's CRC covers the batch, so this is a batch written wrong, not rot;
    # the journal would find it only when a consumer decodes it.
    batch = bytearray(encode_records([Record(0, T0, b"k", b"v")]))
    batch[16] ^= 0xFF
    entry = fentry.encode_entry(
        lsn=2,
        kind=fentry.KIND_DATA,
        topic=b"t",
        partition=0,
        base_offset=0,
        count=1,
        append_time=T0,
        payload=bytes(batch),
    )
    header = fentry.encode_segment_header(1) + _checkpoint(1, {})
    damage = check_segment(header + entry, base_lsn=1).damage
    assert damage is not None
    assert damage.offset == len(header)
    assert damage.reason.startswith("batch CRC mismatch at LSN 2")


def test_a_compressed_segment_in_a_journal(tmp_path: Path) -> None:
    # A sealed compressed segment, then an entry log that continues its LSNs and offsets.
    main = tmp_path / "journal"
    main.mkdir()
    (main / f"{41:020d}.wal").write_bytes((DATA / "atrest_v1.egwc").read_bytes())
    (main / f"{41:020d}.idx").write_bytes(b"stale")
    (main / f"{52:020d}.wal").write_bytes(_segment(52, 3, 2))
    report = verify_journal(main)
    assert report.ok
    compressed, stale, active = report.files
    assert (compressed.role, compressed.kind, compressed.last_lsn) == (
        "sealed",
        "compressed EGWC v1 (of journal v3)",
        51,
    )
    assert stale.notes == ("stale: beside a compressed segment (the next open deletes it)",)
    assert (active.role, active.first_lsn, active.last_lsn, active.status) == (
        "active",
        52,
        54,
        "ok",
    )
    # Offsets carry over from the compressed segment: t/0 had reached 3.
    (main / f"{52:020d}.wal").write_bytes(_segment(52, 2, 2))
    [bad] = verify_journal(main).damaged
    assert bad.damage is not None
    assert "t/0 continues at offset 2" in bad.damage.reason
    # And LSNs: a gap after it is named.
    (main / f"{52:020d}.wal").unlink()
    (main / f"{53:020d}.wal").write_bytes(_segment(53, 3, 2))
    [bad] = verify_journal(main).damaged
    assert bad.damage is not None
    assert "LSNs 52..52 are missing" in bad.damage.reason
