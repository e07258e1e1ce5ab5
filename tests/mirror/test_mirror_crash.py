"""Real processes: kill -9 a mirroring gateway at random points while the source ships.

Region ``a`` (``source_child.py``) journals and ships, and is itself killed
and restarted now and then (new epochs, fence entries). Region ``b``
(``mirror_child.py``) mirrors topic ``ship`` and is killed with SIGKILL at
random moments, at least 12 times, until at least one kill has landed between
two batches of one source object. After every kill the mirror journal is
reopened and checked: what the child reported is there, offsets are gap-free
and unique. At the end the mirror equals the source log record for record.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import pytest
import trio
from _child import ChildProcess
from _mirror_support import journal_records, log_records

from edge_gateway.bucket import LocalBucket
from edge_gateway.bucket_log import find_head
from edge_gateway.journal import Journal, JournalConfig

HERE = Path(__file__).parent
PARTITIONS = 3


class Child(ChildProcess):
    """A source or mirror child; remembers the highest offset it reported per partition."""

    def __init__(self, script: str, *args: str) -> None:
        self.reported: dict[int, int] = {}
        super().__init__([sys.executable, str(HERE / script), *args])

    def on_line(self, line: str) -> None:
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            p, n = int(parts[0]), int(parts[1])
            self.reported[p] = max(self.reported.get(p, 0), n)


def check_mirror(path: Path, reported: dict[int, int]) -> tuple[bool, dict[int, int]]:
    """Reopen the killed mirror's journal: nothing reported lost, no gap, no duplicate.

    Returns whether the kill landed inside a source object, and the next offsets.
    """
    j = Journal.open_sync(path, JournalConfig(fsync="always"))  # type: ignore[arg-type]
    try:
        nexts = {}
        for p in range(PARTITIONS):
            offsets = [r.offset for r in journal_records(j, "a.ship", p)]
            assert offsets == list(range(len(offsets))), f"partition {p}: gap or duplicate"
            assert len(offsets) >= reported.get(p, 0), f"partition {p}: reported data lost"
            nexts[p] = len(offsets)
        progress = j.source_progress().get("a")
        return (progress is not None and not progress.end_of_object), nexts
    finally:
        j.close_sync()


@pytest.mark.slow
def test_kill_9_while_mirroring_no_duplicate_no_gap(tmp_path: Path) -> None:
    bucket, mirror = tmp_path / "bucket", tmp_path / "b"
    rnd = random.Random(11)
    source_seed = 0
    source = Child("source_child.py", str(tmp_path / "a"), str(bucket), str(source_seed))
    source.wait_for_output(timeout=2)  # the source prints nothing: just let it ship a while
    time.sleep(1.0)  # a backlog: the first mirror starts far behind (catch-up path)
    kills = inside = 0
    before: dict[int, int] = {}
    try:
        while kills < 12 or (inside == 0 and kills < 40):
            child = Child("mirror_child.py", str(mirror), str(bucket))
            child.wait_for_output()
            time.sleep(rnd.uniform(0.02, 0.4))
            err = child.stop()
            assert "Traceback" not in err, err
            kills += 1
            landed_inside, nexts = check_mirror(mirror / "journal", child.reported)
            inside += landed_inside
            for p, n in nexts.items():
                assert n >= before.get(p, 0), "the mirror went backwards"
            before = nexts
            if kills % 4 == 0:  # the source restarts too: a new epoch and a fence
                assert "Traceback" not in source.stop()
                source_seed += 1
                source = Child(
                    "source_child.py", str(tmp_path / "a"), str(bucket), str(source_seed)
                )
    finally:
        err = source.stop()
    assert "Traceback" not in err, err
    print(f"{kills} kills, {inside} inside a source object")
    assert inside >= 1, f"no kill landed inside a source object in {kills} kills"
    sync = Child("source_child.py", str(tmp_path / "a"), str(bucket), "99", "--sync-only")
    assert sync.proc.wait(timeout=60) == 0, sync.stop()
    sync.stop()
    final = Child("mirror_child.py", str(mirror), str(bucket), "--catch-up")
    assert final.proc.wait(timeout=120) == 0, final.stop()
    final.stop()

    async def compare() -> None:
        b = await LocalBucket.open(bucket, create=True)
        try:
            source_log = await log_records(b, "a")
            head = await find_head(b, "", "a")
        finally:
            await b.aclose()
        j = Journal.open_sync(mirror / "journal", JournalConfig())
        try:
            for p in range(PARTITIONS):
                assert journal_records(j, "a.ship", p) == source_log.get(("ship", p), [])
            assert not [t for t, _ in j.partitions() if t == "a.other"]
            progress = j.source_progress()["a"]
            assert (progress.seq, progress.end_of_object) == (head, True)
        finally:
            j.close_sync()
        assert sum(len(v) for k, v in source_log.items() if k[0] == "ship") > 1000

    trio.run(compare)
