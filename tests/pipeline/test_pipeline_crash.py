"""kill -9 of ``edgegw pipeline run`` (a real process, its JVM included) at random points.

Every re-run after a kill must leave the tables equal to exactly what was
shipped: no duplicates (a commit that happened before the kill is not
repeated) and no gaps (a commit that did not happen is redone).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _pipeline_support import local_site, merge
from test_pipeline_job import iceberg_rows, iceberg_table


class Job:
    """``edgegw pipeline run`` in its own process group, stdout drained by a thread."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self._err = open(log, "a")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            start_new_session=True,  # the JVM it starts is killed with it
            env={**os.environ, "COLUMNS": "200"},
        )
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float = 120) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return True
            if self.proc.poll() is not None:
                return any(text in line for line in self.lines)
            time.sleep(0.05)
        return False

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.finish()

    def finish(self, timeout: float = 300) -> int:
        code = self.proc.wait(timeout=timeout)
        self._thread.join(timeout=30)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self._err.close()
        return code


@pytest.mark.slow
def test_kill_9_at_random_points_then_rerun(tmp_path: Path) -> None:
    bucket, wh = tmp_path / "bucket", tmp_path / "wh"
    north = local_site("north", tmp_path, bucket)
    south = local_site("south", tmp_path, bucket)
    for topic in ("a", "b", "c"):
        north.ship(topic, 2, 20, size=50)
        south.ship(topic, 1, 20, size=50)
    argv = [
        sys.executable, "-m", "edgegw_cli", "pipeline", "run",
        "--bucket", str(bucket), "--warehouse", str(wh), "--master", "local[2]",
        "--conf", "spark.sql.shuffle.partitions=2", "--max-partition-mb", "1",
    ]  # fmt: skip
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    log = tmp_path / "job.log"
    killed_after_commit = 0
    # kill points: while reading/writing a topic, or just after a commit;
    # topics are done in order a, b, c (and a topic already committed is
    # skipped by the next run, so later points may not be reached)
    triggers = ["a: reading", "a: committed", "b: reading", "b: committed", "c: reading"]
    for attempt in range(3):
        job = Job(argv, log)
        trigger = rng.choice(triggers)
        if not job.wait_for(trigger):
            assert job.wait_for("reading") or job.proc.poll() is not None, (
                f"seed {seed}: {job.lines} {log.read_text()[-3000:]}"
            )
        time.sleep(rng.uniform(0.0, 1.5))
        job.kill()
        killed_after_commit += any("committed" in line for line in job.lines)
        if attempt == 1:
            north.ship("a", 2, 2, size=50)  # new data between crashes
    final = Job(argv, log)
    code = final.finish()
    assert code == 0, f"seed {seed}: {''.join(final.lines)} {log.read_text()[-3000:]}"
    expected = merge(north, south)
    for topic in ("a", "b", "c"):
        want = {k: v for k, v in expected.items() if k[1] == topic}
        assert iceberg_rows(wh, topic) == want, f"seed {seed}, topic {topic}"
        # files of the killed runs that never committed were removed
        with iceberg_table(wh, topic) as table:
            files = table.scan().plan_files()
            referenced = {t.file.file_path.removeprefix("file://") for t in files}
        on_disk = {str(p) for p in (wh / "edgegw" / topic / "data").rglob("*.parquet")}
        assert on_disk == referenced, f"seed {seed}: orphan files {on_disk - referenced}"
    # nothing new: the next run plans, finds nothing to read and starts no Spark
    prom = tmp_path / "pipeline.prom"
    idle = Job([*argv, "--metrics-file", str(prom)], log)
    assert idle.finish() == 0, f"{''.join(idle.lines)} {log.read_text()[-3000:]}"
    metrics = prom.read_text()
    assert "edgegw_pipeline_last_run_success 1.0" in metrics
    for topic in ("a", "b", "c"):
        assert f'edgegw_pipeline_lag_entries{{region="north",topic="{topic}"}} 0.0' in metrics
    assert not any("starting Spark" in line for line in idle.lines), idle.lines
    assert any("pipeline run" in line for line in idle.lines), idle.lines  # its summary
    for topic in ("a", "b", "c"):
        want = {k: v for k, v in expected.items() if k[1] == topic}
        assert iceberg_rows(wh, topic) == want, f"idle run changed topic {topic}"
    print(f"seed {seed}: {killed_after_commit} kills after at least one commit")
