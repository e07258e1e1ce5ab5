"""The tailer in process: a real shipper writes region ``a``, a tailer in region ``b`` mirrors.

Buckets: a local directory and S3 over HTTP (moto's server) for the end-to-end
tests; the local directory (optionally behind ``FaultyBucket``) for the rest.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from _mirror_support import (
    JCFG,
    QUICK,
    HandLog,
    Key,
    eventually,
    log_records,
    mirror_of,
    produce,
)
from edgegw_cli._serve_run import settle_after_first_pulls

from edge_gateway.bucket import Bucket, FaultyBucket, GetResult, ObjectInfo
from edge_gateway.errors import Unavailable
from edge_gateway.format.manifest import Manifest, ManifestEntry, parse_manifest_key
from edge_gateway.journal import Journal
from edge_gateway.mirror import GapKind, GapPolicy, SourceGap, Tailer, TailerConfig
from edge_gateway.mirror.cursor import read_cursor
from edge_gateway.shipper import Shipper, ShipperConfig

SHIP = ShipperConfig(flush_interval_ms=20, manifest_every=4, retry_base_s=0.01, retry_cap_s=0.05)


def only(records: dict[Key, list], topic: str) -> dict[Key, list]:  # type: ignore[type-arg]
    return {k: v for k, v in records.items() if k[0] == topic}


async def ship_rounds(bucket: Bucket, path: Path, rounds: int, *, restarts: int = 1) -> None:
    """Region ``a`` ships topics t (3 partitions) and u (2); a new epoch per restart."""
    for _ in range(restarts):
        j = Journal.open_sync(path, JCFG)
        try:
            s = Shipper(j, bucket, "a", config=SHIP)
            await s.claim()
            for _ in range(rounds):
                produce(j, "t", 3, 2)
                produce(j, "u", 2, 1)
                await s.ship_pending()
        finally:
            j.close_sync()


# --------------------------------------------------------------------------
# end to end


async def test_mirror_equals_source_record_for_record(
    any_bucket: Bucket, journal: Journal, tmp_path: Path
) -> None:
    await ship_rounds(any_bucket, tmp_path / "a", 6, restarts=3)
    tailer = Tailer(journal, any_bucket, "a", ["t"], "b", QUICK)
    result = await tailer.catch_up()
    source = await log_records(any_bucket, "a")
    assert mirror_of(journal, "a", only(source, "t")) == only(source, "t")
    assert all(len(v) == 180 for v in only(source, "t").values())
    # u is not subscribed: no mirror partitions for it
    assert not [t for t, _ in journal.partitions() if t.startswith("a.u")]
    stats = tailer.statistics()
    assert stats.fences == 3
    assert stats.accepted_epoch == 3
    assert (stats.entries_behind, stats.seconds_behind) == (0, 0.0)
    assert result.next_seq == stats.known_head + 1
    progress = journal.source_progress()["a"]
    assert (progress.seq, progress.end_of_object) == (stats.known_head, True)
    cursor = await read_cursor(any_bucket, "", "a", "b")
    assert cursor is not None
    assert cursor.through_seq == stats.known_head
    # pulling again finds nothing and changes nothing
    assert (await tailer.catch_up()).entries == 0


async def test_follow_while_the_source_ships(
    any_bucket: Bucket, journal: Journal, tmp_path: Path
) -> None:
    src = Journal.open_sync(tmp_path / "a", JCFG)
    try:
        shipper = Shipper(src, any_bucket, "a", config=SHIP)
        tailer = Tailer(journal, any_bucket, "a", None, "b", QUICK)
        async with trio.open_nursery() as nursery:
            await nursery.start(shipper.run)
            await nursery.start(tailer.run)
            for _ in range(8):
                produce(src, "t", 3, 1)
                produce(src, "u", 2, 1)
                await trio.sleep(0.03)
            with trio.fail_after(30):
                await shipper.wait_shipped(src.next_lsn - 1)
                for t, p in src.partitions():
                    await journal.wait_for(f"a.{t}", p, src.next_offset(t, p) - 1)
            head = shipper.statistics().next_seq - 1
            await eventually(lambda: tailer.statistics().cursor_through_seq == head)
            nursery.cancel_scope.cancel()
        source = await log_records(any_bucket, "a")
        assert mirror_of(journal, "a", source) == source
        assert tailer.statistics().quarantined == ()
    finally:
        src.close_sync()


async def test_keys_under_a_prefix(bucket: FaultyBucket, journal: Journal, tmp_path: Path) -> None:
    src = Journal.open_sync(tmp_path / "a", JCFG)
    try:
        s = Shipper(src, bucket, "a", config=SHIP, prefix="deploy/x/")
        await s.claim()
        produce(src, "t", 2, 3)
        await s.ship_pending()
    finally:
        src.close_sync()
    tailer = Tailer(journal, bucket, "a", None, "b", QUICK, prefix="deploy/x/")
    await tailer.catch_up()
    source = await log_records(bucket, "a", prefix="deploy/x/")
    assert source
    assert mirror_of(journal, "a", source) == source
    assert await read_cursor(bucket, "deploy/x/", "a", "b") is not None
    assert await bucket.list("regions/") == []


# --------------------------------------------------------------------------
# exactly once across crashes


class Crash(Exception):
    pass


def crash_after(journal: Journal, n: int, *, blocks: bool = False) -> None:
    """Make the journal 'crash' after ``n`` mirrored batches (``blocks``: block entries)
    are written.

    Inside a source entry's group (``append_mirror_batches``,
    ``append_mirror_blocks``) the first ones are written and the rest not:
    what a kill -9 during the group's write leaves once the open has truncated
    the torn entry (tests/journal/test_mirror_groups.py checks that part on
    real files).
    """
    name = "append_mirror_blocks" if blocks else "append_mirror_batches"
    real = getattr(journal, name)
    written = 0

    async def append(items, source, last):  # type: ignore[no-untyped-def]
        nonlocal written
        left = n - written
        if left >= len(items):
            written += len(items)
            return await real(items, source, last)
        if left > 0:
            await real(items[:left], source, source)
            written += left
        raise Crash(f"crash after {n} appends")

    setattr(journal, name, append)


#: The per-batch path (before block entries, and for an entry resumed inside a block).
PER_BATCH = dataclasses.replace(QUICK, keep_blocks=False)


@pytest.mark.parametrize("keep_blocks", [False, True])
@pytest.mark.parametrize("crash_at", [1, 2, 4, 5, 7, 9])
async def test_crash_between_batches_resumes_inside_the_entry(
    bucket: FaultyBucket, tmp_path: Path, crash_at: int, keep_blocks: bool
) -> None:
    """A crash of the per-batch path inside an entry; the gateway that resumes it keeps
    blocks (an upgrade) or not: a block partly applied is picked out per batch."""
    log = HandLog(bucket, "a")
    await log.fence()
    await log.entry({("t", 0): [2, 3, 1], ("t", 1): [4, 4], ("u", 0): [5]})
    await log.entry({("t", 0): [1, 1], ("t", 2): [3, 2, 2]})
    await log.entry({("u", 0): [1]})
    path = tmp_path / "mj"
    j = Journal.open_sync(path, JCFG)
    crash_after(j, crash_at)
    with pytest.raises(Crash):
        await Tailer(j, bucket, "a", ["t"], "b", PER_BATCH).catch_up()
    j.close_sync()
    j = Journal.open_sync(path, JCFG)
    try:
        cfg = dataclasses.replace(QUICK, keep_blocks=keep_blocks)
        tailer = Tailer(j, bucket, "a", ["t"], "b", cfg)
        await tailer.catch_up()
        source = await log_records(bucket, "a")
        assert mirror_of(j, "a", only(source, "t")) == only(source, "t")
        assert j.source_progress()["a"].seq == 4
        # entry 2 ends after 5 appends: a clean boundary; otherwise the entry is
        # resumed and the batches applied before the crash dropped by offset
        stats = tailer.statistics()
        assert stats.entries_resumed == (crash_at != 5)
        assert stats.duplicates_dropped == {1: 1, 2: 2, 4: 1, 5: 0, 7: 0, 9: 2}[crash_at]
        # blocks not started before the crash are block entries (entry 3's t/0 and t/2,
        # after entry 2's 5 batches; a crash after 7 left t/0 whole, after 9 t/2 half)
        blocks = {1: 2, 2: 2, 4: 2, 5: 2, 7: 1, 9: 0}[crash_at]
        assert stats.blocks == (blocks if keep_blocks else 0)
    finally:
        j.close_sync()


@pytest.mark.parametrize("crash_at", [0, 1, 2, 3])
async def test_crash_between_block_entries_resumes_at_the_next_block(
    bucket: FaultyBucket, tmp_path: Path, crash_at: int
) -> None:
    """Block entries: a block is in the mirror whole or not at all, so a resumed entry
    appends its blocks not yet there, and drops nothing."""
    log = HandLog(bucket, "a")
    await log.fence()
    await log.entry({("t", 0): [2, 3, 1], ("t", 1): [4, 4], ("u", 0): [5]})
    await log.entry({("t", 0): [1, 1], ("t", 2): [3, 2, 2]})
    await log.entry({("u", 0): [1]})
    path = tmp_path / "mj"
    j = Journal.open_sync(path, JCFG)
    crash_after(j, crash_at, blocks=True)
    with pytest.raises(Crash):
        await Tailer(j, bucket, "a", ["t"], "b", QUICK).catch_up()
    j.close_sync()
    j = Journal.open_sync(path, JCFG)
    try:
        tailer = Tailer(j, bucket, "a", ["t"], "b", QUICK)
        await tailer.catch_up()
        source = await log_records(bucket, "a")
        assert mirror_of(j, "a", only(source, "t")) == only(source, "t")
        assert j.source_progress()["a"].seq == 4
        stats = tailer.statistics()
        # entry 2 holds t/0 and t/1 blocks (2), entry 3 t/0 and t/2 (2)
        assert stats.entries_resumed == (crash_at in (1, 3))
        assert (stats.duplicates_dropped, stats.batches) == (0, 0)
    finally:
        j.close_sync()


async def test_retry_after_a_failed_append_in_the_same_process(
    bucket: FaultyBucket, journal: Journal
) -> None:
    log = HandLog(bucket, "a")
    await log.fence()
    await log.entry({("t", 0): [2, 3, 1], ("t", 1): [4, 4]})
    real = journal.append_mirror_batches
    crash_after(journal, 4)
    tailer = Tailer(journal, bucket, "a", None, "b", PER_BATCH)
    with pytest.raises(Crash):
        await tailer.catch_up()
    journal.append_mirror_batches = real  # type: ignore[method-assign]
    await tailer.catch_up()
    source = await log_records(bucket, "a")
    assert mirror_of(journal, "a", source) == source
    stats = tailer.statistics()
    assert (stats.entries_resumed, stats.duplicates_dropped) == (1, 1)


# --------------------------------------------------------------------------
# epochs and fences


async def test_fences_epochs_and_a_zombie_entry(bucket: FaultyBucket, journal: Journal) -> None:
    log = HandLog(bucket, "a")
    await log.fence()  # epoch 1
    await log.entry({("t", 0): [3]})
    await log.fence()  # epoch 2
    await log.entry({("t", 0): [2]})
    saved = dict(log.next_offsets)
    await log.entry({("t", 0): [9]}, epoch=1)  # a zombie of epoch 1 got a seq in
    log.next_offsets = saved
    await log.entry({("t", 0): [4]})
    tailer = Tailer(journal, bucket, "a", None, "b", QUICK)
    await tailer.catch_up()
    stats = tailer.statistics()
    assert (stats.fences, stats.stale_skipped, stats.accepted_epoch) == (2, 1, 2)
    offsets = [r.offset for r in mirror_of(journal, "a", [("t", 0)])[("t", 0)]]
    assert offsets == list(range(9))
    # a restart keeps the accepted epoch: a later zombie entry is skipped too
    saved = dict(log.next_offsets)
    await log.entry({("t", 0): [1]}, epoch=1)
    log.next_offsets = saved
    again = Tailer(journal, bucket, "a", None, "b", QUICK)
    await again.catch_up()
    assert again.statistics().stale_skipped == 1
    assert journal.source_progress()["a"].epoch == 2


# --------------------------------------------------------------------------
# corrupt and hostile entries


def _flip(data: bytes, pos: int) -> bytes:
    return data[:pos] + bytes([data[pos] ^ 0xFF]) + data[pos + 1 :]


CORRUPTIONS = [
    "block-crc",
    "header-crc",
    "truncated",
    "oversized-header",
    "header-longer-than-object",
    "garbage",
    "empty",
    "wrong-region",
    "wrong-seq",
    "offsets-backwards",
    "offsets-overlap",
    "impossible-epoch",
]


async def _bad_entry(kind: str, log: HandLog, good: bytes) -> bytes:
    from edge_gateway.format import logobject

    header = logobject.decode_header(good, where="x")
    saved = dict(log.next_offsets)
    try:
        if kind == "block-crc":
            return _flip(good, header.blocks[-1].offset + 1)
        if kind == "header-crc":
            return _flip(good, header.header_length - 10)
        if kind == "truncated":
            return good[:-7]
        if kind == "oversized-header":
            return good[:8] + (logobject.MAX_HEADER_BYTES + 1).to_bytes(4, "little") + good[12:]
        if kind == "header-longer-than-object":
            return good[:8] + (1 << 20).to_bytes(4, "little") + good[12:]
        if kind == "garbage":
            return bytes(range(256)) * 3
        if kind == "empty":
            return b""
        # valid objects that cannot be the next entry (the mirror holds 0..2)
        if kind == "wrong-region":
            other = HandLog(log.bucket, "zz", next_offsets=dict(saved), epoch=log.epoch)
            other.seq = log.seq
            return other.build({("t", 0): [2], ("t", 1): [2]})
        if kind == "wrong-seq":
            return log.build({("t", 0): [2], ("t", 1): [2]}, seq=log.seq + 5)
        if kind == "offsets-backwards":
            log.next_offsets = dict.fromkeys(saved, 0)
            return log.build({("t", 0): [2], ("t", 1): [2]})
        if kind == "offsets-overlap":
            log.next_offsets = dict.fromkeys(saved, 2)
            return log.build({("t", 0): [12], ("t", 1): [12]})
        if kind == "impossible-epoch":
            return log.build({("t", 0): [2], ("t", 1): [2]}, epoch=log.epoch + 1)
        raise AssertionError(kind)
    finally:
        log.next_offsets = saved


@pytest.mark.parametrize("kind", CORRUPTIONS)
async def test_corrupt_entry_is_quarantined_retried_and_never_half_applied(
    bucket: FaultyBucket, journal: Journal, kind: str
) -> None:
    log = HandLog(bucket, "a")
    await log.fence()
    await log.entry({("t", 0): [3], ("t", 1): [3]})
    good = log.build({("t", 0): [2, 2], ("t", 1): [2]})  # seq 3, not stored yet
    await log.put(3, await _bad_entry(kind, log, good))
    tailer = Tailer(journal, bucket, "a", None, "b", QUICK)
    async with trio.open_nursery() as nursery:
        await nursery.start(tailer.run)
        await eventually(lambda: bool(tailer.statistics().quarantined))
        await eventually(lambda: tailer.statistics().quarantined[0].attempts >= 2)
        stats = tailer.statistics()
        q = stats.quarantined[0]
        assert q.seq == 3, q
        assert q.key.endswith("00000000000000000003.egw"), q
        assert stats.state in ("quarantined", "following")
        # nothing of entry 3 was applied; entry 2 was
        assert journal.next_offset("a.t", 0) == 3
        assert journal.next_offset("a.t", 1) == 3
        assert journal.source_progress()["a"].seq == 2
        # the entry is repaired (or was only misread): the tailer goes on by itself
        log.seq = 3
        await log.put(3, good)
        await log.entry({("t", 0): [1]})
        with trio.fail_after(10):
            await journal.wait_for("a.t", 0, 7)
        nursery.cancel_scope.cancel()
    source = await log_records(bucket, "a")
    assert mirror_of(journal, "a", source) == source
    stats = tailer.statistics()
    assert stats.quarantined == ()
    assert stats.quarantine_events >= 2


async def test_catch_up_raises_on_a_corrupt_entry(bucket: FaultyBucket, journal: Journal) -> None:
    from edge_gateway.errors import CorruptData

    log = HandLog(bucket, "a")
    await log.fence()
    await log.put(2, b"EGWL" + b"\x00" * 100)
    tailer = Tailer(journal, bucket, "a", None, "b", QUICK)
    with pytest.raises(CorruptData):
        await tailer.catch_up()
    assert tailer.statistics().quarantined[0].seq == 2


# --------------------------------------------------------------------------
# gaps


async def _log_with_gap(bucket: Bucket, journal: Journal) -> Tailer:
    log = HandLog(bucket, "a")
    await log.fence()
    await log.entry({("t", 0): [3], ("t", 1): [2]})  # 2
    await log.entry({("t", 0): [3]})  # 3
    await Tailer(journal, bucket, "a", None, "b", QUICK).catch_up()
    await log.entry({("t", 0): [4], ("t", 1): [5]})  # 4: t/0 6..9, t/1 2..6
    await log.entry({("t", 0): [1]})  # 5: t/0 10
    await log.entry({("t", 1): [1]})  # 6: t/1 7
    await log.entry({("t", 0): [2], ("t", 1): [2]})  # 7: t/0 11..12, t/1 8..9
    await log.delete_through(5)
    return Tailer(journal, bucket, "a", None, "b", QUICK)


async def test_gap_with_policy_fail_stops_the_source_loudly(
    bucket: FaultyBucket, journal: Journal
) -> None:
    tailer = await _log_with_gap(bucket, journal)
    with pytest.raises(SourceGap) as info:
        await tailer.run()
    gap = info.value.gap
    assert (gap.kind, gap.first_seq, gap.last_seq) == (GapKind.LOG, 4, 5)
    assert "entries 4..5" in str(info.value)
    stats = tailer.statistics()
    assert stats.state == "stopped"
    assert stats.stopped_by
    assert journal.source_progress()["a"].seq == 3  # nothing after the gap applied


async def test_gap_with_policy_skip_records_exact_ranges(
    bucket: FaultyBucket, journal: Journal
) -> None:
    await _log_with_gap(bucket, journal)
    skip = TailerConfig(gap_policy=GapPolicy.SKIP, poll_interval_s=0.01)
    tailer = Tailer(journal, bucket, "a", None, "b", skip)
    await tailer.catch_up()
    gaps = [
        (g.kind, g.first_seq, g.last_seq, g.topic, g.partition, g.first_offset, g.end_offset)
        for g in tailer.statistics().gaps
    ]
    assert gaps == [
        (GapKind.LOG, 4, 5, None, None, None, None),
        (GapKind.PARTITION, 6, 6, "t", 1, 2, 7),
        (GapKind.PARTITION, 7, 7, "t", 0, 6, 11),
    ]
    t0 = [r.offset for r in mirror_of(journal, "a", [("t", 0)])[("t", 0)]]
    assert t0 == [*range(6), 11, 12]
    # a restart neither meets the gap again nor loses its place
    again = Tailer(journal, bucket, "a", None, "b", skip)
    assert (await again.catch_up()).entries == 0
    assert again.statistics().gaps == ()


async def test_fresh_mirror_of_a_collected_log_starts_at_the_oldest_entry(
    bucket: FaultyBucket, journal: Journal
) -> None:
    log = HandLog(bucket, "a")
    await log.fence()
    await log.entry({("t", 0): [3]})
    await log.entry({("t", 0): [3], ("t", 1): [1]})
    await log.delete_through(2)
    tailer = Tailer(journal, bucket, "a", None, "b", QUICK)  # policy fail: a start is no gap
    await tailer.catch_up()
    kinds = [(g.kind, g.topic, g.first_offset, g.end_offset) for g in tailer.statistics().gaps]
    assert kinds == [(GapKind.START, None, None, None), (GapKind.START, "t", 0, 3)]
    t0 = [r.offset for r in mirror_of(journal, "a", [("t", 0)])[("t", 0)]]
    assert t0 == [3, 4, 5]


# --------------------------------------------------------------------------
# catch-up


class Tracking(FaultyBucket):
    """Counts concurrent GETs of log entries (with some latency, so prefetching shows).

    Manifests are fetched a few ahead of the entries (``_ManifestsAhead``), apart.
    """

    def __init__(self, inner: Bucket) -> None:
        super().__init__(inner, close_inner=False)
        self.in_flight = 0
        self.max_in_flight = 0
        self.keys: list[str] = []

    async def _get(self, key: str, start: int, end: int | None) -> GetResult:
        entry = "/log/" in key
        self.in_flight += entry
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.keys.append(key)
        try:
            await trio.sleep(0.002)
            return await super()._get(key, start, end)
        finally:
            self.in_flight -= entry

    async def _list(
        self, prefix: str, *, start_after: str | None, limit: int | None
    ) -> builtins.list[ObjectInfo]:
        self.keys.append(f"LIST {prefix}")
        return await super()._list(prefix, start_after=start_after, limit=limit)


async def test_far_behind_plans_from_manifests_and_prefetches_in_bounds(
    bucket: FaultyBucket, journal: Journal, tmp_path: Path
) -> None:
    await ship_rounds(bucket, tmp_path / "a", 45)  # 46 entries, manifests every 4
    tracking = Tracking(bucket)
    cfg = TailerConfig(prefetch_objects=4, prefetch_bytes=64 * 1024, catch_up_threshold=8)
    tailer = Tailer(journal, tracking, "a", ["t"], "b", cfg)
    await tailer.catch_up()
    source = await log_records(bucket, "a")
    assert mirror_of(journal, "a", only(source, "t")) == only(source, "t")
    stats = tailer.statistics()
    assert stats.catch_ups == 1
    assert stats.planned_entries >= 40  # no header read for those
    assert stats.header_reads <= 46 - stats.planned_entries + 1
    assert 1 < tracking.max_in_flight <= 4
    assert 1 < stats.prefetch_peak_objects <= 4
    assert stats.prefetch_peak_bytes <= 64 * 1024
    # one LIST of the manifests, one of the packs (format/pack.py)
    lists = sorted(k for k in tracking.keys if k.startswith("LIST"))
    assert lists == ["LIST regions/a/manifest/", "LIST regions/a/pack/"]


async def test_the_next_fetch_starts_while_an_entry_is_appended(
    bucket: FaultyBucket, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A window of one: the next entry's GET starts when this entry's turn
    # comes, not once its journal write has returned (a GET of the window
    # stood idle for every append, one after the other).
    log = HandLog(bucket, "a")
    await log.fence()
    for _ in range(8):
        await log.entry({("t", 0): [300], ("t", 1): [300]})
    await log.manifest()
    events: list[str] = []
    tracking = Tracking(bucket)
    get = tracking._get

    async def logged_get(key: str, start: int, end: int | None) -> GetResult:
        if "/log/" in key:
            events.append(f"get {parse_seq(key)}")
        return await get(key, start, end)

    append = journal.append_mirror_blocks

    async def logged_append(blocks, source, last):  # type: ignore[no-untyped-def]
        events.append(f"append {last.seq}")
        await trio.sleep(0.01)  # a write that takes a while
        out = await append(blocks, source, last)
        events.append(f"appended {last.seq}")
        return out

    monkeypatch.setattr(tracking, "_get", logged_get)
    monkeypatch.setattr(journal, "append_mirror_blocks", logged_append)
    config = TailerConfig(catch_up_threshold=4, prefetch_objects=1)
    tailer = Tailer(journal, tracking, "a", None, "b", config)
    await tailer.catch_up()
    source = await log_records(bucket, "a")
    assert mirror_of(journal, "a", source) == source
    for seq in range(2, 9):
        # the GET of the next entry comes before this one's append has returned
        assert events.index(f"get {seq + 1}") < events.index(f"appended {seq}"), events
    assert tailer.statistics().prefetch_peak_objects == 1


def parse_seq(key: str) -> int:
    return int(key.rsplit("/", 1)[1].split(".", maxsplit=1)[0])


class SlowHeads(Tracking):
    """HEADs (the head search) slower than GETs, and logged with them in order;
    with ``fail_heads`` each HEAD fails as an unavailable store would.

    A HEAD answers only once a log entry's GET has begun (or after 10 s): a
    search that runs beside the fetches is then never done before them,
    however slow the machine, and one that waits for them shows it.
    """

    def __init__(self, inner: Bucket) -> None:
        super().__init__(inner)
        self.fail_heads = False
        self.entry_fetched = trio.Event()

    async def _get(self, key: str, start: int, end: int | None) -> GetResult:
        if "/log/" in key:
            self.entry_fetched.set()
        return await super()._get(key, start, end)

    async def _head(self, key: str) -> ObjectInfo:
        with trio.move_on_after(10):
            await self.entry_fetched.wait()
        await trio.sleep(0.02)
        self.keys.append(f"HEAD {key}")
        if self.fail_heads:
            raise Unavailable("HEAD refused (test)")
        return await super()._head(key)


async def test_the_head_search_runs_beside_the_fetches_of_a_far_catch_up(
    bucket: FaultyBucket, journal: Journal, tmp_path: Path
) -> None:
    # The manifests say the mirror is far behind: entries are fetched while the
    # galloping HEADs look for the entries written after the newest manifest,
    # and the catch-up still ends at the head (not at the manifest's seq).
    await ship_rounds(bucket, tmp_path / "a", 45)  # 46 entries, manifests every 4
    slow = SlowHeads(bucket)
    cfg = TailerConfig(prefetch_objects=4, catch_up_threshold=8)
    tailer = Tailer(journal, slow, "a", ["t"], "b", cfg)
    result = await tailer.catch_up()
    source = await log_records(bucket, "a")
    assert mirror_of(journal, "a", only(source, "t")) == only(source, "t")
    stats = tailer.statistics()
    assert stats.catch_ups == 1
    assert stats.known_head == 46
    assert result.next_seq == 47
    heads = [i for i, k in enumerate(slow.keys) if k.startswith("HEAD")]
    first_entry = next(i for i, k in enumerate(slow.keys) if "/log/" in k and "HEAD" not in k)
    assert heads
    assert first_entry < heads[-1]  # fetching began before the search ended


async def test_a_failed_head_search_fails_the_catch_up_after_the_entries_before(
    bucket: FaultyBucket, journal: Journal, tmp_path: Path
) -> None:
    # The head search fails while the manifests' entries are fetched: those are
    # applied in order, then the catch-up raises the search's error (a retry
    # resumes after them).
    await ship_rounds(bucket, tmp_path / "a", 45)
    slow = SlowHeads(bucket)
    slow.fail_heads = True
    tailer = Tailer(journal, slow, "a", None, "b", TailerConfig(catch_up_threshold=8))
    with pytest.raises(Unavailable, match="HEAD refused"):
        await tailer.catch_up()
    known = parse_manifest_key((await bucket.list("regions/a/manifest/"))[-1].key)[1]
    progress = journal.source_progress()["a"]
    assert (progress.seq, progress.end_of_object) == (known, True)
    slow.fail_heads = False
    await tailer.catch_up()
    source = await log_records(bucket, "a")
    assert mirror_of(journal, "a", source) == source


async def test_a_catch_up_gets_an_unplanned_object_whole_in_one_request(
    bucket: FaultyBucket, journal: Journal
) -> None:
    # No manifest covers these entries (a backlog shorter than manifest_every):
    # an object up to 256 KiB comes whole with the first GET of a catch-up,
    # not its first 64 KiB and then the rest (two round trips in a row).
    log = HandLog(bucket, "a")
    await log.fence()
    for _ in range(10):
        await log.entry({("t", 0): [700], ("t", 1): [700]})
    sizes = [(await bucket.head(f"regions/a/log/{seq:020d}.egw")).size for seq in range(2, 12)]
    assert all(64 * 1024 < n < 256 * 1024 for n in sizes)
    tracking = Tracking(bucket)
    tailer = Tailer(journal, tracking, "a", None, "b", TailerConfig(catch_up_threshold=4))
    await tailer.catch_up()
    source = await log_records(bucket, "a")
    assert mirror_of(journal, "a", source) == source
    entries = [f"regions/a/log/{seq:020d}.egw" for seq in range(1, 12)]
    log_gets = [k for k in tracking.keys if k in entries]
    assert sorted(log_gets) == entries  # one GET each (then a probe of seq 12)
    assert tailer.statistics().catch_ups == 1


async def test_a_catch_up_sizes_its_first_gets_from_the_entries_it_planned(
    bucket: FaultyBucket, journal: Journal
) -> None:
    # A busier source: objects over 256 KiB. The entries after the newest
    # manifest come whole with their first GET too, sized from the planned ones.
    log = HandLog(bucket, "a")
    await log.fence()
    for _ in range(6):
        await log.entry({("t", 0): [2500], ("t", 1): [2500]})
    await log.manifest()
    for _ in range(4):
        await log.entry({("t", 0): [2500], ("t", 1): [2500]})
    sizes = [(await bucket.head(f"regions/a/log/{seq:020d}.egw")).size for seq in range(2, 12)]
    assert all(256 * 1024 < n < 1024 * 1024 for n in sizes)
    tracking = Tracking(bucket)
    # A window of 2: the entries past the manifest are launched after planned ones.
    config = TailerConfig(catch_up_threshold=4, prefetch_objects=2)
    tailer = Tailer(journal, tracking, "a", None, "b", config)
    await tailer.catch_up()
    source = await log_records(bucket, "a")
    assert mirror_of(journal, "a", source) == source
    unplanned = [f"regions/a/log/{seq:020d}.egw" for seq in range(8, 12)]
    assert [k for k in tracking.keys if k in unplanned] == unplanned  # one GET each
    assert tailer.statistics().header_reads == 4


async def test_unusable_manifest_falls_back_to_header_reads(
    bucket: FaultyBucket, journal: Journal, tmp_path: Path
) -> None:
    await ship_rounds(bucket, tmp_path / "a", 20)
    infos = await bucket.list("regions/a/manifest/")
    covered = parse_manifest_key(infos[2].key)[1] - parse_manifest_key(infos[1].key)[1]
    await bucket.put(infos[2].key, b'{"format": "edgegw-manifest", "version": 1}')
    tailer = Tailer(journal, bucket, "a", None, "b", TailerConfig(catch_up_threshold=4))
    await tailer.catch_up()
    source = await log_records(bucket, "a")
    assert mirror_of(journal, "a", source) == source
    stats = tailer.statistics()
    assert stats.header_reads == covered  # only the entries of the bad manifest
    assert stats.planned_entries == 21 - covered


async def test_a_manifest_that_disagrees_with_the_log_is_checked_against_headers(
    bucket: FaultyBucket, journal: Journal, tmp_path: Path
) -> None:
    await ship_rounds(bucket, tmp_path / "a", 20, restarts=2)  # epochs 1 and 2

    async def tamper(key: str, change: Callable[[ManifestEntry], ManifestEntry]) -> None:
        m = Manifest.decode((await bucket.get(key)).data, where=key)
        assert m.entries[-1].epoch == 2
        m = dataclasses.replace(m, entries=(*m.entries[:-1], change(m.entries[-1])))
        await bucket.put(key, m.encode())

    infos = await bucket.list("regions/a/manifest/")
    # would make the entry look like a zombie's, to be skipped
    await tamper(infos[-3].key, lambda e: dataclasses.replace(e, epoch=1))
    # would make the fetched block fail its check
    await tamper(
        infos[-5].key,
        lambda e: dataclasses.replace(
            e, blocks=(dataclasses.replace(e.blocks[0], crc=e.blocks[0].crc ^ 1), *e.blocks[1:])
        ),
    )
    tailer = Tailer(journal, bucket, "a", None, "b", TailerConfig(catch_up_threshold=4))
    await tailer.catch_up()
    source = await log_records(bucket, "a")
    assert mirror_of(journal, "a", source) == source
    stats = tailer.statistics()
    assert stats.stale_skipped == 0
    assert stats.quarantined == ()
    assert stats.header_reads == 2


async def test_progress_figures_while_catching_up(
    bucket: FaultyBucket, journal: Journal, tmp_path: Path
) -> None:
    await ship_rounds(bucket, tmp_path / "a", 30)
    bucket.latency = 0.005
    tailer = Tailer(journal, bucket, "a", None, "b", TailerConfig(prefetch_objects=2))
    seen = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tailer.catch_up)
        while True:
            await trio.sleep(0.02)
            s = tailer.statistics()
            if s.state == "catching-up" and s.entries > 3:
                seen.append(s)
            if s.next_seq > 31:
                break
    assert seen, "never observed the catch-up"
    s = seen[0]
    assert s.entries_behind > 0
    assert s.bytes_behind > 0
    assert s.eta_s is not None
    assert s.eta_s > 0
    assert tailer.statistics().entries_behind == 0


# --------------------------------------------------------------------------
# polling, waking, outages


async def test_idle_tailer_backs_off_and_never_lists(
    bucket: FaultyBucket, journal: Journal
) -> None:
    log = HandLog(bucket, "a")
    await log.fence()
    await log.entry({("t", 0): [3]})
    cfg = TailerConfig(poll_interval_s=0.01, max_poll_interval_s=0.08, cursor_interval_s=0)
    tailer = Tailer(journal, bucket, "a", None, "b", cfg)
    async with trio.open_nursery() as nursery:
        await nursery.start(tailer.run)
        with trio.fail_after(10):
            await journal.wait_for("a.t", 0, 2)
        await trio.sleep(0.3)
        before = bucket.statistics()
        await trio.sleep(0.5)
        after = bucket.statistics()
        nursery.cancel_scope.cancel()
    assert after.lists == before.lists
    assert after.heads == before.heads
    assert after.puts == before.puts
    assert 1 <= after.gets - before.gets <= 12  # one 404 per poll, backed off to 80 ms
    assert tailer.statistics().poll_interval_s == pytest.approx(0.08)


async def test_wake_polls_at_once(bucket: FaultyBucket, journal: Journal) -> None:
    log = HandLog(bucket, "a")
    await log.fence()
    cfg = TailerConfig(poll_interval_s=30, max_poll_interval_s=60, cursor_interval_s=0)
    tailer = Tailer(journal, bucket, "a", None, "b", cfg)
    async with trio.open_nursery() as nursery:
        await nursery.start(tailer.run)
        await eventually(lambda: tailer.statistics().state == "idle")
        await log.entry({("t", 0): [3]})
        tailer.wake(head_seq=2)
        with trio.fail_after(10):  # far below the 30 s poll interval
            await journal.wait_for("a.t", 0, 2)
        nursery.cancel_scope.cancel()


async def test_bucket_outage_is_retried_and_nothing_is_lost(
    bucket: FaultyBucket, journal: Journal
) -> None:
    log = HandLog(bucket, "a")
    await log.fence()
    await log.entry({("t", 0): [3]})
    tailer = Tailer(journal, bucket, "a", None, "b", QUICK)
    async with trio.open_nursery() as nursery:
        await nursery.start(tailer.run)
        with trio.fail_after(10):
            await journal.wait_for("a.t", 0, 2)
        bucket.outage = True
        await trio.sleep(0.2)
        assert tailer.statistics().retries > 0
        assert tailer.statistics().state == "retrying"
        bucket.outage = False
        await log.entry({("t", 0): [2], ("t", 1): [1]})
        with trio.fail_after(10):
            await journal.wait_for("a.t", 0, 4)
            await journal.wait_for("a.t", 1, 0)
        nursery.cancel_scope.cancel()
    source = await log_records(bucket, "a")
    assert mirror_of(journal, "a", source) == source


async def test_lost_and_failing_reads_never_duplicate(
    bucket: FaultyBucket, journal: Journal
) -> None:
    log = HandLog(bucket, "a")
    await log.fence()
    for _ in range(30):
        await log.entry({("t", 0): [2], ("t", 1): [1]})
    bucket.error_rate = 0.3
    bucket.operations = {"get", "list", "head"}
    tailer = Tailer(journal, bucket, "a", None, "b", QUICK)
    async with trio.open_nursery() as nursery:
        await nursery.start(tailer.run)
        with trio.fail_after(30):
            await journal.wait_for("a.t", 0, 59)
            await journal.wait_for("a.t", 1, 29)
        nursery.cancel_scope.cancel()
    bucket.error_rate = 0
    source = await log_records(bucket, "a")
    assert mirror_of(journal, "a", source) == source
    assert tailer.statistics().retries > 0


async def test_the_first_pull_ends_once_the_start_up_backlog_is_applied(
    bucket: FaultyBucket, journal: Journal
) -> None:
    """``edgegw serve`` settles the collector only then (``settle_after_first_pulls``):
    not in the middle of a start-up catch-up's fetches."""
    log = HandLog(bucket, "a")
    await log.fence()
    for _ in range(20):
        await log.entry({("t", 0): [2]})
    tailer = Tailer(journal, bucket, "a", None, "b", QUICK)
    assert not tailer.first_pull_ended
    # The mirror's next offset when settle() runs: the whole backlog is in by then.
    settled_at: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            settle_after_first_pulls,
            [tailer],
            lambda: settled_at.append(journal.next_offset("a.t", 0)),
        )
        await nursery.start(tailer.run)
        with trio.fail_after(30):
            await tailer.wait_first_pull()
        assert tailer.first_pull_ended
        assert journal.next_offset("a.t", 0) == 40
        await eventually(lambda: bool(settled_at))
        nursery.cancel_scope.cancel()
    assert settled_at == [40]


async def test_a_failed_first_pull_ends_it_too(bucket: FaultyBucket, journal: Journal) -> None:
    """A bucket that does not answer: the gateway is idle, settling need not wait for it."""
    log = HandLog(bucket, "a")
    await log.fence()
    await log.entry({("t", 0): [2]})
    bucket.outage = True
    tailer = Tailer(journal, bucket, "a", None, "b", QUICK)
    settled: list[bool] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(settle_after_first_pulls, [tailer], lambda: settled.append(True))
        await nursery.start(tailer.run)
        await eventually(lambda: bool(settled))
        assert tailer.first_pull_ended
        assert tailer.statistics().state == "retrying"
        nursery.cancel_scope.cancel()


async def test_settling_waits_no_longer_than_its_bound(journal: Journal) -> None:
    """A tailer whose first pull never ends (here: never run) delays settling ``wait_s`` at most."""
    tailer = Tailer(journal, None, "a", None, "b", QUICK)  # type: ignore[arg-type]
    settled: list[bool] = []
    await settle_after_first_pulls([tailer], lambda: settled.append(True), wait_s=0.05)
    assert settled == [True]
    assert not tailer.first_pull_ended


def test_a_region_cannot_mirror_itself(journal: Journal) -> None:
    from edge_gateway.errors import InvalidInput

    with pytest.raises(InvalidInput):
        Tailer(journal, None, "a", None, "a")  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# gap markers (drop-oldest at the source)


async def test_gap_marker_then_restart_then_data_is_a_dropped_gap(
    bucket: FaultyBucket, journal: Journal
) -> None:
    """A source's gap marker alone in an entry, the mirror restarts, the data after
    the gap comes in a later entry: still the declared DROPPED gap (policy fail
    does not stop), and the records land at their source offsets."""
    from _mirror_support import make_batch

    from edge_gateway.format.logobject import GapRange, LaneRange, LogObjectBuilder

    log = HandLog(bucket, "a")
    await log.fence()
    await log.entry({("t", 0): [5]})  # 2: t/0 0..4
    await Tailer(journal, bucket, "a", None, "b", QUICK).catch_up()
    gap = GapRange(5, "t", 0, 5, 44, 40, 4000)
    marker = LogObjectBuilder().build("a", 1, 3, 1, 0, 0, lanes=(LaneRange(5, 1, 9),), gaps=(gap,))
    await log.put(3, marker)
    b = LogObjectBuilder()
    b.add_batch("t", 0, make_batch("t", 0, 45, 3))
    await log.put(4, b.build("a", 1, 4, 1, 0, 0, lanes=(LaneRange(5, 10, 12),)))
    log.seq = 4
    first = Tailer(journal, bucket, "a", None, "b", QUICK)
    await first.catch_up()  # applies up to 4 in one go: the jump is known in memory
    assert [(g.kind, g.first_offset, g.end_offset) for g in first.statistics().gaps] == [
        (GapKind.DROPPED, 5, 45)
    ]
    assert first.statistics().dropped_gap_records == (("t", 40),)
    t0 = [r.offset for r in mirror_of(journal, "a", [("t", 0)])[("t", 0)]]
    assert t0 == [0, 1, 2, 3, 4, 45, 46, 47]


async def test_gap_marker_applied_before_a_restart_explains_the_jump_after_it(
    bucket: FaultyBucket, journal: Journal
) -> None:
    from _mirror_support import make_batch

    from edge_gateway.format.logobject import GapRange, LaneRange, LogObjectBuilder

    log = HandLog(bucket, "a")
    await log.fence()
    await log.entry({("t", 0): [5]})  # 2: t/0 0..4
    gap = GapRange(5, "t", 0, 5, 44, 40, 4000)
    marker = LogObjectBuilder().build("a", 1, 3, 1, 0, 0, lanes=(LaneRange(5, 1, 9),), gaps=(gap,))
    await log.put(3, marker)
    log.seq = 3
    first = Tailer(journal, bucket, "a", None, "b", QUICK)
    await first.catch_up()  # up to the marker; then "restart"
    assert [g.kind for g in first.statistics().gaps] == [GapKind.DROPPED]
    b = LogObjectBuilder()
    b.add_batch("t", 0, make_batch("t", 0, 45, 3))
    await log.put(4, b.build("a", 1, 4, 1, 0, 0, lanes=(LaneRange(5, 10, 12),)))
    again = Tailer(journal, bucket, "a", None, "b", QUICK)  # policy fail
    await again.catch_up()
    assert [
        (g.kind, g.first_seq, g.first_offset, g.end_offset) for g in again.statistics().gaps
    ] == [(GapKind.DROPPED, 3, 5, 45)]
    t0 = [r.offset for r in mirror_of(journal, "a", [("t", 0)])[("t", 0)]]
    assert t0 == [0, 1, 2, 3, 4, 45, 46, 47]
