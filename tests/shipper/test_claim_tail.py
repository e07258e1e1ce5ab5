"""A claim finds the log's head in rounds and reads its tail (every entry after
the newest manifest) in parallel.

A claim, a restore and a reship read the header of each entry after the
newest manifest: up to a manifest interval of them. One after another they
cost a round trip each -- on the soak's 60 ms link, ~3 s before a restored
gateway could claim (and start mirroring). ``read_headers`` keeps up to
``TAIL_READS`` in flight and still answers in seq order, and a failure is
the first one in seq order, as reading them one by one would have raised.

Finding the head took ~2·log2(k) HEADs one after another for ``k`` entries
past the newest manifest (~0.8 s on a 60 ms link); a round of up to
``HEAD_PROBES`` HEADs at once must find the same head, and never a seq past
a missing one.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
import trio

from edge_gateway.bucket import (
    Bucket,
    FaultyBucket,
    GetResult,
    LocalBucket,
    NotFound,
    ObjectInfo,
)
from edge_gateway.bucket_log import HEAD_PROBES, TAIL_READS, find_head, load_log_state
from edge_gateway.errors import CorruptData
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.manifest import log_key
from edge_gateway.journal import Journal, JournalConfig
from edge_gateway.protocol.log_decisions import HeadSearch
from edge_gateway.shipper import Shipper, ShipperConfig

JCFG = JournalConfig(segment_bytes=256 * 1024, max_bytes=64 * 1024 * 1024, retention_ms=0)
ENTRIES = 40
_T = TypeVar("_T")


class _Slow(FaultyBucket):
    """Every GET and HEAD takes 10 ms; counts them and how many were in flight at once."""

    def __init__(self, inner: Bucket) -> None:
        super().__init__(inner, close_inner=False)
        self.in_flight = 0
        self.most = 0
        self.calls = 0

    async def _timed(self, call: Callable[[], Awaitable[_T]]) -> _T:
        self.in_flight += 1
        self.calls += 1
        self.most = max(self.most, self.in_flight)
        try:
            await trio.sleep(0.01)
            return await call()
        finally:
            self.in_flight -= 1

    async def _get(self, key: str, start: int, end: int | None) -> GetResult:
        return await self._timed(lambda: super(_Slow, self)._get(key, start, end))

    async def _head(self, key: str) -> ObjectInfo:
        return await self._timed(lambda: super(_Slow, self)._head(key))


async def _log_without_manifest(tmp_path: Path) -> LocalBucket:
    """Region north's log: a fence and ``ENTRIES`` entries of data, no manifest
    (as when every manifest write was refused: the whole log is the tail)."""
    bucket = await LocalBucket.open(tmp_path / "b", create=True)
    j = Journal.open_sync(tmp_path / "j", JCFG)
    shipper = Shipper(j, bucket, "north", config=ShipperConfig(manifest_every=10_000))
    await shipper.claim()
    for i in range(ENTRIES):
        j.append_nowait("t", i % 3, encode_batch([f"r{i}".encode()], timestamps=i))
        await shipper.ship_pending()
    j.close_sync()
    for manifest in (tmp_path / "b" / "objects" / "regions" / "north" / "manifest").iterdir():
        manifest.unlink()
    return bucket


async def test_the_tail_is_read_in_parallel_and_in_seq_order(tmp_path: Path) -> None:
    inner = await _log_without_manifest(tmp_path)
    slow = _Slow(inner)
    state = await load_log_state(slow, "", "north")
    assert state.head == ENTRIES + 1  # the fence at seq 1, then the entries
    assert [h.seq for h, _ in state.tail] == list(range(1, ENTRIES + 2))
    assert state.head_header is not None
    assert state.head_header.seq == ENTRIES + 1
    # Offsets continue from the last entry of each partition, as one by one.
    assert state.next_offsets == {("t", 0): 14, ("t", 1): 13, ("t", 2): 13}
    assert 1 < slow.most <= TAIL_READS


@pytest.mark.parametrize("damage", ["missing", "corrupt"], ids=["missing entry", "corrupt entry"])
async def test_a_bad_tail_entry_fails_the_read_at_the_first_bad_seq(
    tmp_path: Path, damage: str
) -> None:
    bucket = await _log_without_manifest(tmp_path)
    for seq in (12, 30):
        path = tmp_path / "b" / "objects" / log_key("", "north", seq)
        if damage == "missing":
            path.unlink()
        else:
            path.write_bytes(b"EGWX not a log object" + b"\0" * 64)
    # A missing entry below the head reads as NotFound, a corrupt one as
    # CorruptData; either names seq 12, the first bad one.
    expected: type[Exception] = NotFound if damage == "missing" else CorruptData
    with pytest.raises(expected) as info:
        await load_log_state(_Slow(bucket), "", "north")
    assert log_key("", "north", 12) in str(info.value)


# ---------------------------------------------------------------- the head


def _one_at_a_time(head: int, known: int) -> int:
    search = HeadSearch(known)
    while (seq := search.next_probe()) is not None:
        search.record(seq, seq <= head)
    return search.head


def _in_rounds(head: int, known: int, width: int) -> tuple[int, int]:
    """(head found, rounds) with ``width`` probes per round."""
    search = HeadSearch(known)
    rounds = 0
    while probes := search.next_probes(width):
        assert probes == sorted(set(probes))
        search.record_batch([(seq, seq <= head) for seq in probes])
        rounds += 1
    return search.head, rounds


@pytest.mark.parametrize("width", [1, 2, 8])
def test_rounds_find_the_head_probing_one_at_a_time_finds(width: int) -> None:
    rng = random.Random(7)
    cases = [(0, 0), (1, 0), (5, 5), (35, 0), (1_000, 970), (70_000, 3)]
    cases += [(h, rng.randint(0, h)) for h in (rng.randint(0, 5_000) for _ in range(300))]
    for head, known in cases:
        assert _in_rounds(head, known, width)[0] == _one_at_a_time(head, known) == head


def test_a_manifest_interval_takes_a_few_rounds() -> None:
    # ~35 entries past the newest manifest (the soak's tail): 12 probes one
    # after another, 4 rounds of at most 8.
    assert _in_rounds(1_035, 1_000, HEAD_PROBES)[1] <= 4
    assert _in_rounds(1_035, 1_000, 1)[1] >= 10


def test_a_seq_found_past_a_missing_one_is_not_the_head() -> None:
    """The log grew while a round was in flight (or has a hole): the head
    stays the contiguous prefix the round saw."""
    search = HeadSearch(10)
    probes = search.next_probes(4)  # 11, 12, 14, 18
    assert probes == [11, 12, 14, 18]
    search.record_batch([(11, True), (12, False), (14, True), (18, True)])
    assert search.next_probes(4) == []
    assert search.head == 11


async def test_find_head_probes_in_rounds(tmp_path: Path) -> None:
    inner = await LocalBucket.open(tmp_path / "b", create=True)
    for seq in range(1, 36):
        await inner.put(log_key("", "north", seq), b"x", if_none_match=True)
    bucket = _Slow(inner)
    assert await find_head(bucket, "", "north", 0) == 35
    assert 1 < bucket.most <= HEAD_PROBES
    assert await find_head(bucket, "", "north", 35) == 35
    empty = _Slow(inner)
    assert await find_head(empty, "", "south", 0) == 0


# ---------------------------------------------------------------- the probe


class _Overlap(FaultyBucket):
    """Every call takes 10 ms; notes whether the probe and a read of the log overlapped."""

    def __init__(self, inner: Bucket) -> None:
        super().__init__(inner, close_inner=False)
        self.latency = 0.01
        self.probes = 0
        self.log_reads = 0
        self.overlapped = False

    async def _around(
        self, operation: str, key: str | None, call: Callable[[], Awaitable[_T]]
    ) -> _T:
        probe = key is not None and "_edgegw-probe/" in key
        log_read = operation in ("get", "head", "list") and not probe
        self.probes += probe
        self.log_reads += log_read
        self.overlapped = self.overlapped or bool(self.probes and self.log_reads)
        try:
            return await super()._around(operation, key, call)
        finally:
            self.probes -= probe
            self.log_reads -= log_read


async def test_a_claim_reads_the_log_while_it_probes_the_bucket(tmp_path: Path) -> None:
    """The probe's ~4 round trips and the log's read no longer add up at every start."""
    inner = await _log_without_manifest(tmp_path)
    bucket = _Overlap(inner)
    j = Journal.open_sync(tmp_path / "j2", JCFG)
    try:
        shipper = Shipper(j, bucket, "north")
        await shipper.claim()
        assert shipper.statistics().epoch == 2
        assert shipper.statistics().next_seq == ENTRIES + 3  # after the new fence
    finally:
        j.close_sync()
    assert bucket.overlapped


async def test_the_probes_error_wins_over_the_reads(tmp_path: Path) -> None:
    """A store without conditional creates is named, whatever the read met meanwhile."""
    from edge_gateway.bucket import UnsupportedStore

    inner = await _log_without_manifest(tmp_path)
    bucket = FaultyBucket(inner, close_inner=False)
    bucket.honor_conditions = False
    # The log's read fails too: a corrupt entry in its tail.
    path = tmp_path / "b" / "objects" / log_key("", "north", 5)
    path.write_bytes(b"EGWX not a log object" + b"\0" * 64)
    j = Journal.open_sync(tmp_path / "j2", JCFG)
    try:
        with pytest.raises(UnsupportedStore, match="cannot be fenced"):
            await Shipper(j, bucket, "north").claim()
    finally:
        j.close_sync()
