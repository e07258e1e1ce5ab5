"""Real processes: kill -9 a shipping gateway at random points; two writers for one region."""

from __future__ import annotations

import random
import signal
import sys
import time
from pathlib import Path

import pytest
import trio
from _child import ChildProcess

from edge_gateway.bucket import LocalBucket
from edge_gateway.bucket_log import find_head
from edge_gateway.format import logobject
from edge_gateway.format.manifest import log_key

sys.path.insert(0, str(Path(__file__).parent))
from ship_child import PARTITIONS, record_value

CHILD = Path(__file__).parent / "ship_child.py"


class Child(ChildProcess):
    """A shipping child; remembers the acknowledged offsets per partition."""

    def __init__(self, data: Path, bucket: Path, region: str, seed: int, *extra: str) -> None:
        self.acked: dict[int, int] = {}
        super().__init__(
            [sys.executable, str(CHILD), str(data), str(bucket), region, str(seed), *extra]
        )

    def on_line(self, line: str) -> None:
        p, first, count = map(int, line.split())
        self.acked[p] = max(self.acked.get(p, 0), first + count)

    def run_for(self, seconds: float) -> None:
        """Wait until the first acknowledgement, then ``seconds`` more."""
        self.wait_for_output()
        time.sleep(seconds)


async def bucket_records(bucket_dir: Path, region: str) -> dict[int, list[int]]:
    """Offsets per partition in log order; checks content, epochs and contiguity."""
    bucket = await LocalBucket.open(bucket_dir, create=True)
    try:
        head = await find_head(bucket, "", region)
        out: dict[int, list[int]] = {}
        max_epoch = 0
        for seq in range(1, head + 1):
            key = log_key("", region, seq)
            data = (await bucket.get(key)).data
            h = logobject.decode_header(
                data[: logobject.header_length_hint(data[:12], where=key)], where=key
            )
            assert h.epoch >= max_epoch, f"{key}: epoch went down"
            max_epoch = h.epoch
            for b in h.blocks:
                raw = logobject.decode_block(
                    b, data[b.offset : b.offset + b.stored_length], where=key
                )
                for batch in logobject.iter_block_batches(b, raw, where=key):
                    for r in batch.records():
                        assert r.value == record_value(region, b.partition, r.offset)
                        out.setdefault(b.partition, []).append(r.offset)
        return out
    finally:
        await bucket.aclose()


@pytest.mark.slow
def test_kill_9_while_shipping_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    data, bucket = tmp_path / "data", tmp_path / "bucket"
    rnd = random.Random(7)
    acked: dict[int, int] = {}
    for i in range(10):
        child = Child(data, bucket, "north", i)
        child.run_for(rnd.uniform(0.05, 0.5))
        err = child.stop()
        assert "Traceback" not in err, err
        for p, n in child.acked.items():
            acked[p] = max(acked.get(p, 0), n)
    final = Child(data, bucket, "north", 99, "--sync-only")
    assert final.proc.wait(timeout=60) == 0, final.stop()
    final.stop()
    records = trio.run(bucket_records, bucket, "north")
    for p in range(PARTITIONS):
        offsets = records.get(p, [])
        assert offsets == list(range(len(offsets))), f"partition {p}: gap or duplicate"
        assert len(offsets) >= acked.get(p, 0)
    assert sum(acked.values()) > 0


@pytest.mark.slow
def test_two_writers_one_region_exactly_one_keeps_writing(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    a = Child(tmp_path / "a", bucket, "north", 1)
    a.run_for(0.5)
    b = Child(tmp_path / "b", bucket, "north", 2)  # a second gateway claims the region
    b.run_for(0.5)
    # a is fenced at its next commit: within a couple of flush intervals
    assert a.proc.wait(timeout=10) == 3
    err = a.stop()
    assert "FENCED" in err
    assert b.proc.poll() is None, "the new writer must keep writing"
    b.stop(signal.SIGTERM)
    records = trio.run(bucket_records, bucket, "north")
    for p, offsets in records.items():
        assert offsets == list(range(len(offsets))), f"partition {p}: overlap or gap"
