"""A claim reads the log's tail (every entry after the newest manifest) in parallel.

A claim, a restore and a reship read the header of each entry after the
newest manifest: up to a manifest interval of them. One after another they
cost a round trip each -- on the soak's 60 ms link, ~3 s before a restored
gateway could claim (and start mirroring). ``read_headers`` keeps up to
``TAIL_READS`` in flight and still answers in seq order, and a failure is
the first one in seq order, as reading them one by one would have raised.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from edge_gateway.bucket import Bucket, FaultyBucket, GetResult, LocalBucket, NotFound
from edge_gateway.errors import CorruptData
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.manifest import log_key
from edge_gateway.journal import Journal, JournalConfig
from edge_gateway.regionlog import TAIL_READS, load_log_state
from edge_gateway.shipper import Shipper, ShipperConfig

JCFG = JournalConfig(segment_bytes=256 * 1024, max_bytes=64 * 1024 * 1024, retention_ms=0)
ENTRIES = 40


class _SlowGets(FaultyBucket):
    """Every GET takes 20 ms; counts how many were in flight at once."""

    def __init__(self, inner: Bucket) -> None:
        super().__init__(inner, close_inner=False)
        self.in_flight = 0
        self.most = 0
        self.gets = 0

    async def _get(self, key: str, start: int, end: int | None) -> GetResult:
        self.in_flight += 1
        self.gets += 1
        self.most = max(self.most, self.in_flight)
        try:
            await trio.sleep(0.02)
            return await super()._get(key, start, end)
        finally:
            self.in_flight -= 1


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
    slow = _SlowGets(inner)
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
        await load_log_state(_SlowGets(bucket), "", "north")
    assert log_key("", "north", 12) in str(info.value)
