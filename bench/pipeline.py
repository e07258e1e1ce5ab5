"""Pipeline benchmark: bucket -> committed Iceberg table, next to Spark on JSON-lines files.

N 200-byte JSON telemetry records (two regions, four partitions each) are
shipped into a local-directory bucket by the real journal and shipper. Then,
in one Spark session on local[2] (both sides warmed up on a small data set
first):

* **job**: ``run_job`` end to end — plan from manifests, write tasks that
  read the log objects (the ``edgegw`` data source's code), decode the JSON
  values with a schema and write Parquet partitioned by date and region,
  commit to Iceberg (SQLite catalog). Rows/s = N / wall time of the run.
* **baseline**: Spark reading the same values from JSON-lines files (schema
  given) and writing the same partitioned Parquet layout.
* **cold** (no target; ``--no-cold`` skips it): the same records through
  ``edgegw pipeline run`` in a new process, as a timer runs it — JVM and
  Python worker start included (``cold_cli_seconds``).

``--quick``: 200k records (≤ 60 s). Default: 2M. Last line: one JSON object
with ``rows_per_s``, ``json_baseline_rows_per_s``, ``ratio_vs_json``.
Targets on local[2]: rows_per_s ≥ 500,000; ratio_vs_json ≥ 1.0.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio
from _common import (
    EPOCH_MS,
    Row,
    emit_json,
    machine_info,
    progress,
    ratio,
    render_table,
    scratch_dir,
    verdict,
)

from edge_gateway.bucket import LocalBucket
from edge_gateway.format.batch import encode_batch
from edge_gateway.journal import Journal, JournalConfig
from edge_gateway.shipper import Shipper, ShipperConfig

DDL = (
    "sensor_id string, site string, ts bigint, temperature double, humidity double, "
    "vibration double, seq bigint, fw string, status string, note string"
)
REGIONS = ("north", "south")
PARTITIONS = 4
BATCH = 1000
SIZE = 200


def values(region: str, partition: int, start: int, n: int) -> list[bytes]:
    out = []
    for seq in range(start, start + n):
        s = (seq * 7 + partition) % 512
        head = (
            f'{{"sensor_id":"s-{s:05d}","site":"{region}","ts":{EPOCH_MS + seq},'
            f'"temperature":{17 + (seq % 800) / 100:.2f},"humidity":{40 + (seq % 300) / 10:.1f},'
            f'"vibration":{(seq % 97) / 1000:.3f},"seq":{seq},"fw":"edge-1.4.2","status":"ok",'
            '"note":"'
        )
        pad = SIZE - len(head) - 2
        out.append((head + "abcdefghijklmnopqrstuvwxyz0123456789"[seq % 36] * pad + '"}').encode())
    return out


async def ship(bucket_dir: Path, journal_root: Path, region: str, n: int) -> None:
    bucket = await LocalBucket.open(bucket_dir, create=True)
    cfg = JournalConfig(segment_bytes=64 << 20, max_bytes=8 << 30, retention_ms=0)
    j = Journal.open_sync(journal_root / region, cfg)
    shipper = Shipper(j, bucket, region, config=ShipperConfig())
    try:
        await shipper.claim()
        per_partition = n // PARTITIONS
        for p in range(PARTITIONS):
            for start in range(0, per_partition, BATCH):
                count = min(BATCH, per_partition - start)
                vals = values(region, p, start, count)
                stamps = [EPOCH_MS + start + i for i in range(count)]
                j.append_nowait("telemetry", p, encode_batch(vals, timestamps=stamps))
                if j.next_lsn % 200 == 0:
                    await shipper.ship_pending()
        await shipper.ship_pending()
    finally:
        j.close_sync()
        await bucket.aclose()


def prepare(root: Path, n: int) -> tuple[Path, Path]:
    bucket, jsonl = root / "bucket", root / "jsonl"
    jsonl.mkdir(parents=True, exist_ok=True)
    per_region = n // len(REGIONS)
    for region in REGIONS:
        trio.run(ship, bucket, root / "journal", region, per_region)
        # the same values as JSON lines, for the baseline
        with open(jsonl / f"{region}.json", "wb") as out:
            for p in range(PARTITIONS):
                for start in range(0, per_region // PARTITIONS, BATCH):
                    count = min(BATCH, per_region // PARTITIONS - start)
                    out.write(b"\n".join(values(region, p, start, count)) + b"\n")
    return bucket, jsonl


def run_pipeline(spark: object, bucket: Path, warehouse: Path) -> tuple[float, Any]:
    from edge_gateway.pipeline.bucketspec import BucketSpec
    from edge_gateway.pipeline.job import JobConfig, run_job
    from edge_gateway.pipeline.tables import Output

    cfg = JobConfig(BucketSpec(str(bucket)), Output(warehouse), json_topics={"telemetry": DDL})
    started = time.perf_counter()
    plan = run_job(spark, cfg)
    elapsed = time.perf_counter() - started
    res = plan.topics["telemetry"]
    assert res.committed, res
    assert res.rejects == 0, res
    return elapsed, res


def run_cold_cli(bucket: Path, warehouse: Path, master: str) -> float:
    """Wall time of ``edgegw pipeline run`` as an operator runs it: a new process and JVM."""
    argv = [
        sys.executable, "-m", "edgegw_cli", "pipeline", "run", "--bucket", str(bucket),
        "--warehouse", str(warehouse), "--master", master, "--json", f"telemetry={DDL}",
    ]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, timeout=600)
    return time.perf_counter() - started


def run_baseline(spark: object, jsonl: Path, out: Path) -> tuple[float, int]:
    from pyspark.sql import functions as F

    started = time.perf_counter()
    df = spark.read.schema(DDL).json(str(jsonl))  # type: ignore[attr-defined]
    df = df.withColumn("timestamp", F.timestamp_millis("ts")).withColumn(
        "date", F.to_date("timestamp")
    )
    df.write.mode("overwrite").partitionBy("date", "site").parquet(str(out))
    elapsed = time.perf_counter() - started
    import pyarrow.dataset as ds

    rows = ds.dataset(str(out), format="parquet", partitioning="hive").count_rows()
    return elapsed, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="200k records, <= 60 s")
    parser.add_argument("--records", type=int, default=None)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--no-cold",
        dest="cold",
        action="store_false",
        help="skip timing a cold `edgegw pipeline run` of the same records (~30 s more)",
    )
    args = parser.parse_args()
    n = args.records or (200_000 if args.quick else 2_000_000)
    started = time.perf_counter()
    fig: dict[str, object] = {"records": n, "record_bytes": SIZE, "master": args.master}
    with scratch_dir("pipeline-") as root:
        fig.update(machine_info(root))
        progress(f"shipping {n} records into a local-directory bucket ...")
        t = time.perf_counter()
        bucket, jsonl = prepare(root, n)
        small_bucket, small_jsonl = prepare(root / "warmup", 8_000)
        fig["ship_seconds"] = time.perf_counter() - t
        progress("starting Spark ...")
        from edge_gateway.pipeline.session import make_session

        t = time.perf_counter()
        spark = make_session(args.master, conf={"spark.sql.shuffle.partitions": "4"})
        fig["session_seconds"] = time.perf_counter() - t
        try:
            progress("warming up ...")
            run_pipeline(spark, small_bucket, root / "warmup" / "wh")
            run_baseline(spark, small_jsonl, root / "warmup" / "json-out")
            progress("pipeline job ...")
            job_s, job = run_pipeline(spark, bucket, root / "wh")
            progress("JSON-lines baseline ...")
            base_s, base_rows = run_baseline(spark, jsonl, root / "json-out")
        finally:
            spark.stop()
        cold_s = None
        if args.cold:
            progress("the same job as a cold `edgegw pipeline run` (new process, new JVM) ...")
            cold_s = run_cold_cli(bucket, root / "wh-cold", args.master)
    assert job.rows == n, (job.rows, n)
    assert base_rows == n, (base_rows, n)
    fig["job_seconds"] = job_s
    # where the job's time went: its write tasks (wall, and CPU summed over executors)
    fig["job_tasks"] = job.tasks
    fig["job_task_seconds"] = job.task_seconds
    fig["job_task_cpu_us_per_record"] = job.task_cpu_seconds / n * 1e6
    fig["json_baseline_seconds"] = base_s
    if cold_s is not None:
        # no target: what an operator's cron run costs, JVM and worker start included
        fig["cold_cli_seconds"] = cold_s
        fig["cold_cli_rows_per_s"] = n / cold_s
    fig["rows_per_s"] = n / job_s
    fig["json_baseline_rows_per_s"] = n / base_s
    fig["ratio_vs_json"] = ratio(n / job_s, n / base_s)
    targets = {
        "rows_per_s": n / job_s >= 500_000,
        "ratio_vs_json": (n / job_s) / (n / base_s) >= 1.0,
    }
    fig["targets"] = targets
    fig["targets_met"] = all(targets.values())
    fig["seconds"] = time.perf_counter() - started
    rows = [
        Row(
            "job: bucket -> Iceberg (JSON decoded)",
            n / job_s,
            "rows/s",
            "Spark JSON lines -> Parquet",
            n / base_s,
            ">= 500,000; >= 1.0x",
            targets["rows_per_s"] and targets["ratio_vs_json"],
        ),
    ]
    title = (
        f"edgegw pipeline bench ({n} records of {SIZE} B, {args.master}, "
        f"{os.cpu_count()} CPUs; {fig['seconds']:.0f} s)"
    )
    print(render_table(title, rows))
    print()
    print("targets: " + ", ".join(f"{k} {verdict(v)}" for k, v in targets.items()))
    emit_json(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
