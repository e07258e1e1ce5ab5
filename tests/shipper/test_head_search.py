"""Finding a log's head with HEADs in rounds (``HeadSearch.next_probes``, ``find_head``).

Probing one seq at a time took ~2·log2(k) round trips for ``k`` entries past
the newest manifest: ~0.8 s on a 60 ms link before a claim or a mirror's
catch-up could start. A round of up to ``HEAD_PROBES`` HEADs at once must
find the same head, and never a seq past a missing one.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio

from edge_gateway.bucket import Bucket, FaultyBucket, LocalBucket, ObjectInfo
from edge_gateway.format.manifest import log_key
from edge_gateway.protocol.log import HeadSearch
from edge_gateway.regionlog import HEAD_PROBES, find_head


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


class _CountingHeads(FaultyBucket):
    """Counts HEAD requests and how many were in flight at once (each takes 10 ms)."""

    def __init__(self, inner: Bucket) -> None:
        super().__init__(inner, close_inner=False)
        self.heads = 0
        self.in_flight = 0
        self.most = 0

    async def _head(self, key: str) -> ObjectInfo:
        self.heads += 1
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await trio.sleep(0.01)
            return await super()._head(key)
        finally:
            self.in_flight -= 1


async def test_find_head_probes_in_rounds(tmp_path: Path) -> None:
    inner = await LocalBucket.open(tmp_path / "b", create=True)
    for seq in range(1, 36):
        await inner.put(log_key("", "north", seq), b"x", if_none_match=True)
    bucket = _CountingHeads(inner)
    assert await find_head(bucket, "", "north", 0) == 35
    assert 1 < bucket.most <= HEAD_PROBES
    assert await find_head(bucket, "", "north", 35) == 35
    empty = _CountingHeads(inner)
    assert await find_head(empty, "", "south", 0) == 0
