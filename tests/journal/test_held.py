"""The read-only reader of a journal's held entries (``HeldLane``, for ``edgegw bucket verify``):
LSN ranges walked forward over several segments, the golden version 3 segment (block entries)
and its compressed twin giving the same entries, a torn active tail, a damaged sealed segment,
a segment deleted after the listing."""

from __future__ import annotations

import shutil
from pathlib import Path

from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry
from edge_gateway.format.batch import encode_batch
from edge_gateway.journal import MAIN_LANE, HeldLane, Journal, JournalConfig

GOLDEN = Path(__file__).resolve().parents[1] / "format" / "data"
SMALL = JournalConfig(segment_bytes=65536, max_bytes=8 << 20)


def _journal(path: Path, batches: int) -> list[tuple[int, str, int, int]]:
    """A closed journal of ``batches`` one-record batches over two partitions: what it holds,
    as (LSN, topic, partition, base offset)."""
    j = Journal.open_sync(path, SMALL)
    out = []
    for i in range(batches):
        got = j.append_nowait("t", i % 2, encode_batch([b"v%d" % i * 250], timestamps=1000 + i))
        out.append((got.lsn, "t", i % 2, got.base_offset))
    j.close_sync()
    return out


def _rows(entries: list[fentry.Entry]) -> list[tuple[int, str, int, int]]:
    return [(e.lsn, e.topic, e.partition, e.base_offset) for e in entries]


def test_ranges_walk_forward_across_segments(tmp_path: Path) -> None:
    held = _journal(tmp_path / "journal", 300)
    assert len(list((tmp_path / "journal").glob("*.wal"))) >= 3
    lane = HeldLane(tmp_path / "journal", MAIN_LANE)
    first = held[0][0]
    got = []
    for lo in range(first, held[-1][0] + 1, 17):
        r = lane.take(lo, lo + 16)
        assert (r.held_from, r.holes) == (lo, False)
        assert r.held_to == min(lo + 16, held[-1][0])
        got += _rows(r.data)
    assert got == held
    assert lane.problems == []
    # Past the end: nothing held.
    assert lane.take(held[-1][0] + 1, held[-1][0] + 5).held_from is None


def test_the_golden_v3_segment_and_its_compressed_twin(tmp_path: Path) -> None:
    for name in ("atrest_v1.wal", "atrest_v1.egwc"):
        d = tmp_path / name / "journal"
        d.mkdir(parents=True)
        shutil.copy(GOLDEN / name, d / f"{41:020d}.wal")
    plain = HeldLane(tmp_path / "atrest_v1.wal" / "journal", MAIN_LANE).take(41, 51)
    packed = HeldLane(tmp_path / "atrest_v1.egwc" / "journal", MAIN_LANE).take(41, 51)
    expected = [
        e
        for e in atrest.iter_wal_entries((GOLDEN / "atrest_v1.wal").read_bytes())
        if isinstance(e, fentry.Entry) and e.kind == fentry.KIND_DATA
    ]
    for r in (plain, packed):
        assert (r.held_from, r.held_to, r.holes) == (41, 51, False)
        assert [(e.lsn, bytes(e.payload)) for e in r.data] == [
            (e.lsn, bytes(e.payload)) for e in expected
        ]


def test_a_torn_active_tail_ends_what_is_held(tmp_path: Path) -> None:
    held = _journal(tmp_path / "journal", 300)
    active = sorted((tmp_path / "journal").glob("*.wal"))[-1]
    data = active.read_bytes().rstrip(b"\0")
    active.write_bytes(data[:-5])  # the last entry cut short: a write in progress
    lane = HeldLane(tmp_path / "journal", MAIN_LANE)
    r = lane.take(held[0][0], held[-1][0])
    assert r.held_to == held[-2][0]
    assert lane.problems == []


def test_a_damaged_sealed_segment_is_a_problem_and_a_hole(tmp_path: Path) -> None:
    held = _journal(tmp_path / "journal", 300)
    segs = sorted((tmp_path / "journal").glob("*.wal"))
    data = bytearray(segs[1].read_bytes())
    data[len(data) // 2] ^= 0xFF
    segs[1].write_bytes(data)
    lane = HeldLane(tmp_path / "journal", MAIN_LANE)
    r = lane.take(held[0][0], held[-1][0])
    assert r.holes
    assert [p.split(":")[0] for p in lane.problems] == [str(segs[1])]
    assert "edgegw journal verify" in lane.problems[0]


def test_a_segment_deleted_after_the_listing_is_no_longer_held(tmp_path: Path) -> None:
    held = _journal(tmp_path / "journal", 300)
    lane = HeldLane(tmp_path / "journal", MAIN_LANE)
    first = sorted((tmp_path / "journal").glob("*.wal"))[0]
    first.unlink()
    r = lane.take(held[0][0], held[-1][0])
    assert r.held_from == int(sorted((tmp_path / "journal").glob("*.wal"))[0].stem)
    assert not r.holes
    assert lane.problems == []
