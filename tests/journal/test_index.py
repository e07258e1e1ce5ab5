"""Index files of sealed segments: on disk, read through a bounded cache; old files still open.

* a journal written by the previous code (index file version 1, the
  fixture ``data/journal_v1_index.tar.gz``) opens, its index files are
  converted to version 2, and every record reads back;
* a torn index file is ignored and rebuilt;
* reads at every offset and the shipper's LSN reads are right through a
  cache of a few pages, across many segments, with mirror gaps;
* a real process filled with millions of one-record entries stays under
  the documented memory bound (RSS measured in the child), and reads at
  random offsets are right after a reopen in a fresh process.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import random
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from _journal_support import read_records

from edge_gateway.format.batch import decode_batch, encode_batch, encode_record
from edge_gateway.journal import Journal, JournalConfig, SourceCoords

HERE = Path(__file__).parent
FIXTURE = HERE / "data" / "journal_v1_index.tar.gz"
CHILD = HERE / "index_memory_child.py"
MiB = 1024 * 1024


def _records(j: Journal, topic: str, partition: int) -> list[tuple[int, bytes]]:
    return [(r.offset, r.value) for r in read_records(j, topic, partition)]


def _version(idx: Path) -> int:
    return idx.read_bytes()[4]


def test_a_journal_with_version_1_index_files_opens_and_converts_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with tarfile.open(FIXTURE) as tf:
        tf.extractall(tmp_path, filter="data")
    idx = sorted(tmp_path.glob("*.idx"))
    assert len(idx) == 2
    assert [_version(f) for f in idx] == [1, 1]
    cfg = JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * MiB, index_cache_bytes=0)
    caplog.set_level(logging.INFO, logger="edgegw.journal")
    j = Journal.open_sync(tmp_path, cfg)
    try:
        # converted, not rebuilt by a scan of the segment
        assert sum("converting the index" in r.message for r in caplog.records) == 2
        assert not [r for r in caplog.records if "rebuilding" in r.message]
        assert [_version(f) for f in idx] == [2, 2]
        assert j.statistics().segments == 3
        # written by the generator of the fixture (see the commit that added it)
        for topic in ("a", "bb"):
            for p in range(3):
                recs = _records(j, topic, p)
                n = j.next_offset(topic, p)
                assert n > 100
                assert recs == [(o, f"{topic}/{p}/{o}".encode()) for o in range(n)]
        assert _records(j, "south.t", 1) == [(7, b"m1"), (8, b"m2")]
        assert j.source_progress()["south"] == SourceCoords("south", 9, 1)
        shipped = j.read_entries(1, max_bytes=1 << 30, durable_only=False)
        assert [e.lsn for e in shipped] == [
            lsn for lsn in range(1, j.next_lsn) if lsn not in (1, 599, 1190)
        ]
    finally:
        j.close_sync()
    caplog.clear()
    j = Journal.open_sync(tmp_path, cfg)  # version 2 now: neither converted nor rebuilt
    try:
        assert not [r for r in caplog.records if "index" in r.message]
        assert _records(j, "a", 1)[-1][1] == f"a/1/{j.next_offset('a', 1) - 1}".encode()
    finally:
        j.close_sync()


@pytest.mark.parametrize("damage", ["torn", "short-directory", "version-9"])
def test_a_torn_or_unknown_index_file_is_rebuilt(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * MiB)
    j = Journal.open_sync(tmp_path, cfg)
    try:
        for i in range(3000):
            j.append_nowait("t", i % 3, encode_record(f"{i % 3}:{i // 3}".encode(), timestamp=1))
        expected = {p: _records(j, "t", p) for p in range(3)}
    finally:
        j.close_sync()
    idx = sorted(tmp_path.glob("*.idx"))
    assert len(idx) >= 3
    raw = idx[1].read_bytes()
    if damage == "torn":  # as if the rename had come before the data (it cannot: fsync first)
        idx[1].write_bytes(raw[: len(raw) // 2])
    elif damage == "short-directory":
        idx[1].write_bytes(raw[:40])
    else:
        idx[1].write_bytes(raw[:4] + b"\x09" + raw[5:])
    caplog.set_level(logging.INFO, logger="edgegw.journal")
    j = Journal.open_sync(tmp_path, cfg)
    try:
        rebuilt = [r.message for r in caplog.records if "rebuilding" in r.message]
        assert len(rebuilt) == 1
        assert idx[1].with_suffix(".wal").name in rebuilt[0]
        assert {p: _records(j, "t", p) for p in range(3)} == expected
    finally:
        j.close_sync()
    assert _version(idx[1]) == 2  # written again
    assert len(idx[1].read_bytes()) == len(raw)


async def test_reads_at_every_offset_through_a_cache_of_a_few_pages(tmp_path: Path) -> None:
    """Many sealed segments, batches of 1-7 records, a mirror partition with gaps."""
    cfg = JournalConfig(segment_bytes=64 * 1024, max_bytes=256 * MiB, index_cache_bytes=0)
    rnd = random.Random(5)
    j = Journal.open_sync(tmp_path, cfg)
    expected: dict[tuple[str, int], dict[int, bytes]] = {}
    try:
        mirror_next = 0
        for i in range(8000):
            if i % 50 == 0:  # a mirrored batch after a gap
                mirror_next += rnd.randrange(0, 5)
                values = [f"m{mirror_next + k}".encode() for k in range(3)]
                b = encode_batch(values, timestamps=1, base_offset=mirror_next)
                await j.append_mirror("south.t", 0, b, SourceCoords("south", i, 1), allow_gap=True)
                for k, v in enumerate(values):
                    expected.setdefault(("south.t", 0), {})[mirror_next + k] = v
                mirror_next += 3
                continue
            p = rnd.randrange(4)
            first = j.next_offset("t", p)
            n = rnd.randrange(1, 8)
            values = [f"{p}:{first + k}".encode() * (1 + (first + k) % 5) for k in range(n)]
            j.append_nowait("t", p, encode_batch(values, timestamps=1))
            for k, v in enumerate(values):
                expected.setdefault(("t", p), {})[first + k] = v
        assert j.statistics().segments > 20
        # one reopen, so sealed segments come from their files
        j.close_sync()
        j = Journal.open_sync(tmp_path, cfg)
        for (topic, p), recs in expected.items():
            present = sorted(recs)
            for offset in range(present[0], present[-1] + 2):
                got = j.read(topic, p, offset, max_records=4, max_bytes=1)
                if offset > present[-1]:
                    assert got == []
                    continue
                want = present[bisect.bisect_left(present, offset)]
                first_rec = next(
                    r for r in decode_batch(got[0].payload).records() if r.offset >= offset
                )
                assert (first_rec.offset, first_rec.value) == (want, recs[want])
        # the shipper's reads: every entry once, in LSN order, from any LSN
        everything = j.read_entries(1, max_bytes=1 << 30, durable_only=False)
        lsns = [e.lsn for e in everything]
        assert lsns == sorted(lsns)
        for start in rnd.sample(lsns, 200):
            got = j.read_entries(start, max_bytes=rnd.choice([1, 500, 5000]), durable_only=False)
            k = lsns.index(start)
            assert [e.lsn for e in got] == lsns[k : k + len(got)]
            assert got
        st = j.statistics()
        assert st.index_cache_bytes <= st.index_cache_capacity_bytes
        assert st.index_cache_misses > 0
    finally:
        j.close_sync()


def _child(*args: object) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, str(CHILD), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ},
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, int] = json.loads(out.stdout)
    return result


def test_millions_of_one_record_entries_stay_under_the_memory_bound(tmp_path: Path) -> None:
    """RSS of a real process: the journal's index memory does not grow with the backlog.

    Before the disk index, 3 M entries held ~72 MB of index in RAM (24
    bytes each); the bound here is a few MB. The slack covers the Python
    heap's own noise; the active segment's memory map counts in RSS too.
    """
    entries, segment_bytes, cache = 3_000_000, 1 * MiB, 1 * MiB
    cfg = JournalConfig(segment_bytes=segment_bytes, index_cache_bytes=cache)
    slack = 4 * MiB
    filled = _child("fill", tmp_path, entries, segment_bytes, cache)
    segments = filled["segments"]
    assert segments > 250  # many sealed segments, each with its index file
    bound = cfg.index_memory_bound(segments, filled["partitions"])
    assert bound < 10 * MiB  # (the figure the docs give for this shape)
    assert filled["index_memory_bytes"] <= bound
    assert filled["rss_after_fill"] - filled["rss_after_open"] <= bound + segment_bytes + slack

    reopened = _child("reopen", tmp_path, entries, segment_bytes, cache, 11)
    assert reopened["checks"] > 2000
    assert reopened["index_memory_bytes"] <= bound
    assert reopened["rss_after_reads"] - reopened["rss_before_open"] <= (
        bound + segment_bytes + slack
    )


def test_closing_releases_the_index_files(tmp_path: Path) -> None:
    cfg = JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * MiB)
    j = Journal.open_sync(tmp_path, cfg)
    for i in range(3000):
        j.append_nowait("t", 0, encode_record(f"{i}".encode(), timestamp=1))
    j.close_sync()
    j = Journal.open_sync(tmp_path, cfg)
    fds = set(os.listdir("/proc/self/fd"))
    assert _records(j, "t", 0)[1234] == (1234, b"1234")  # opens index files to read
    assert j.statistics().index_cache_misses > 0
    j.close_sync()
    assert set(os.listdir("/proc/self/fd")) <= fds


@pytest.mark.parametrize("fsync", ["interval", "never"])
def test_the_active_segments_written_pages_leave_the_rss(tmp_path: Path, fsync: str) -> None:
    """A real process: appending 40 MiB into one mapped 64 MiB segment adds a few MiB of RssFile.

    The active segment is written through a shared memory map, and mapped
    pages that were written count in the process's RSS until it hands them
    back: before ``Segment.release_written`` the 40 MiB were all resident
    (three lanes' active segments added up to 192 MiB to a gateway's RSS).
    Every entry reads back intact after a reopen (the kernel keeps a page
    handed back in the page cache).
    """
    out = subprocess.run(
        [sys.executable, str(HERE / "map_rss_child.py"), str(tmp_path), "40", fsync],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["segments"] == 1  # all of it in the active, mapped segment
    assert result["checked"] == result["entries"] > 80_000
    # At most a few release steps' worth of pages stay (4 MiB steps, 4 MiB fsyncs).
    assert result["after"] - result["before"] <= 12 * MiB
