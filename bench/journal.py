"""Journal benchmark: append throughput and latency, group commit and reopen time.

Usage::

    .venv/bin/python bench/journal.py [--quick] [--only PHASE,...] [--dir PATH]

Every figure is printed next to a baseline measured in the same run on the
same disk (a plain ``os.write`` + ``os.fdatasync`` loop, a bare Python
"encode + crc32c + os.write" loop, a read + CRC of the same files), so a slow
machine shows up as a slow baseline, not as a slow journal. The last line of
output is one JSON object with every figure.

Phases, in the order they run (each bounded by time *and* size, so
``--quick`` stays under ~45 s; the ``raw`` baselines run right before the
phase they are compared with):

* ``cpu``      the bare Python encode + crc32c + write loop (no journal);
* ``raw``      sequential 64 KiB writes with an fdatasync every 5 ms (the
               interval policy's cadence; also with the fdatasync in a thread),
               and ``write(100 B) + fdatasync`` latency;
* ``interval`` append throughput with ``fsync=interval``: 100-byte records in
               batches of 1, 100 and 1000, and ~64 KiB batches of telemetry;
* ``always``   the same with ``fsync=always`` and one appender awaiting each
               append (the 1-record run gives the append latency percentiles;
               it alternates in 4 rounds with ``write(100 B) + fdatasync``, the
               baseline of the p99 target, so both see the same disk weather);
* ``group``    8 appender tasks with ``fsync=always``: group commit;
* ``reopen``   a journal of >= 1 GiB (256 MiB with --quick): clean reopen,
               reopen after a crash (active segment with its preallocated zero
               tail), the cost of scanning the active segment, a reopen
               without index files.

Timed loops include encoding the batch from Python ``bytes`` (what a producer
pays); the values are prepared before timing. Appends go round-robin to 8
partitions of one topic. Scratch data lives under ``bench/out/`` and is removed.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import struct
import sys
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c
import trio
from _common import (
    MB,
    GiB,
    KiB,
    MiB,
    Row,
    add_baseline_args,
    emit_json,
    fixed_size_values,
    machine_info,
    median,
    percentile,
    progress,
    read_crc_seconds,
    render_table,
    run_baseline_ab,
    scratch_dir,
    telemetry,
    without_baseline_args,
)

from edge_gateway.format.batch import encode_batch, encode_record
from edge_gateway.journal import FsyncPolicy, Journal, JournalConfig, open_journal

TOPIC = "bench.telemetry"
PARTITIONS = 8
VALUE_SIZE = 100
BATCH_64K = 64 * KiB
SEGMENT_BYTES = 64 * MiB  # the journal's default
RAW_SYNC_EVERY_S = 0.005  # JournalConfig().fsync_interval_ms
GROUP_TASKS = 8
PAIR_ROUNDS = 4  # rounds of raw-fsync/journal alternation for the p99 target
PHASES = ("raw", "cpu", "interval", "always", "group", "reopen")

# targets
TARGET_B1000 = 3_000_000
TARGET_B1 = 150_000
TARGET_DISK_RATIO = 0.7
TARGET_P99_FACTOR = 2.0
TARGET_REOPEN_S_PER_GIB = 2.0


@dataclass(frozen=True, slots=True)
class Plan:
    """How long and how big each phase may be."""

    quick: bool
    raw_s: float  # raw sequential write
    fsync_s: float  # raw write + fdatasync latency
    fsync_max_ops: int
    cpu_s: float  # per batch size
    interval_s: float  # per shape
    always_s: float  # per shape (batches of 100, 1000, 64 KiB)
    latency_s: float  # always, one record per append
    latency_max_ops: int
    group_s: float  # per variant
    phase_max_bytes: int  # any append phase stops after this many batch bytes
    reopen_bytes: int  # size of the journal that is reopened
    fill_max_s: float  # ... but writing it stops after this long
    scan_b1_bytes: int  # journal of 1-record entries whose scan is timed
    reopen_repeats: int


QUICK = Plan(
    quick=True,
    raw_s=1.5,
    fsync_s=1.5,
    fsync_max_ops=3000,
    cpu_s=0.4,
    interval_s=1.5,
    always_s=0.8,
    latency_s=1.5,
    latency_max_ops=3000,
    group_s=1.2,
    phase_max_bytes=512 * MiB,
    reopen_bytes=256 * MiB,
    fill_max_s=6.0,
    scan_b1_bytes=16 * MiB,
    reopen_repeats=3,
)
FULL = Plan(
    quick=False,
    raw_s=5.0,
    fsync_s=4.0,
    fsync_max_ops=20_000,
    cpu_s=1.5,
    interval_s=5.0,
    always_s=2.5,
    latency_s=5.0,
    latency_max_ops=20_000,
    group_s=4.0,
    phase_max_bytes=4 * GiB,
    reopen_bytes=GiB + 64 * MiB,  # a little over 1 GiB, index files included
    fill_max_s=60.0,
    scan_b1_bytes=64 * MiB,
    reopen_repeats=5,
)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# ----------------------------------------------------------------- workload


@dataclass(slots=True)
class Shape:
    """Prepared inputs of one append shape and how to encode batch ``k`` of them."""

    name: str
    label: str
    #: the run's 100-byte values (the group-commit phase appends them one by one)
    values: list[bytes]
    #: records in batch k
    records: list[int]
    #: encode batch k stamped with a timestamp (ms); the part of the timed loop a producer pays
    encode: Callable[[int, int], bytes]
    #: encoded size of batch k (sizes do not depend on the timestamp)
    sizes: list[int] = field(default_factory=list)
    #: appends between two clock checks in untimed loops
    block: int = 1

    def __post_init__(self) -> None:
        self.sizes = [len(self.encode(k, 0)) for k in range(len(self.records))]


def make_shapes(values: list[bytes]) -> dict[str, Shape]:
    """The four append shapes; ``values`` are the 100-byte values (a power of two of them)."""
    shapes = {
        "b1": Shape(
            "b1",
            "100 B x 1",
            values,
            [1] * len(values),
            lambda k, ts: encode_record(values[k], timestamp=ts),
            block=128,
        )
    }
    for n, block in ((100, 16), (1000, 2)):
        groups = [values[i : i + n] for i in range(0, len(values) - n + 1, n)]
        shapes[f"b{n}"] = Shape(
            f"b{n}",
            f"100 B x {n}",
            values,
            [len(g) for g in groups],
            lambda k, ts, groups=groups: encode_batch(groups[k], timestamps=ts),
            block=block,
        )
    # ~64 KiB batches of reference telemetry (keyed by sensor id, own timestamps)
    batches: list[tuple[list[bytes], list[bytes], list[int]]] = []
    vals: list[bytes] = []
    keys: list[bytes] = []
    tss: list[int] = []
    size = 40  # batch header
    for t in telemetry(16_000):  # ~40 distinct batches, 2.6 MB
        cost = 16 + len(t.key) + len(t.value)  # ts + key length + value length columns
        if size + cost > BATCH_64K:
            batches.append((vals, keys, tss))
            vals, keys, tss, size = [], [], [], 40
        vals.append(t.value)
        keys.append(t.key)
        tss.append(t.timestamp)
        size += cost
    shapes["64k"] = Shape(
        "64k",
        "telemetry, 64 KiB",
        values,
        [len(b[0]) for b in batches],
        lambda k, ts: encode_batch(batches[k][0], keys=batches[k][1], timestamps=batches[k][2]),
    )
    return shapes


# --------------------------------------------------------------- baselines


def _raw_write_loop(directory: Path, seconds: float, max_bytes: int) -> tuple[int, float, int]:
    """64 KiB ``os.write`` calls with an ``os.fdatasync`` every 5 ms: (bytes, seconds, syncs)."""
    path = directory / "raw-write.bin"
    buf = os.urandom(BATCH_64K)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        written = syncs = 0
        t0 = last_sync = time.perf_counter()
        deadline = t0 + seconds
        while True:
            written += os.write(fd, buf)
            now = time.perf_counter()
            if now - last_sync >= RAW_SYNC_EVERY_S:
                os.fdatasync(fd)
                syncs += 1
                last_sync = now = time.perf_counter()
            if now >= deadline or written >= max_bytes:
                break
        os.fdatasync(fd)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    return written, elapsed, syncs


def raw_disk_write(directory: Path, plan: Plan) -> dict[str, float]:
    """MB/s of 64 KiB ``os.write`` calls with an ``os.fdatasync`` every 5 ms."""
    written, elapsed, syncs = _raw_write_loop(directory, plan.raw_s, plan.phase_max_bytes)
    return {"raw_disk_mb_per_s": written / elapsed / MB, "raw_disk_syncs_per_s": syncs / elapsed}


def raw_disk_write_threaded(directory: Path, plan: Plan) -> dict[str, float]:
    """Like :func:`raw_disk_write`, but the fdatasync runs in another thread.

    That is how the journal's interval policy works (writes go on while the
    disk flushes), so this is the disk's ceiling for it; the serial loop above
    is the baseline ``disk_ratio`` is defined against.
    """
    path = directory / "raw-write-threaded.bin"
    buf = os.urandom(BATCH_64K)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    stop = threading.Event()

    def syncer() -> None:
        while not stop.wait(RAW_SYNC_EVERY_S):
            os.fdatasync(fd)

    thread = threading.Thread(target=syncer, daemon=True)
    try:
        written = 0
        t0 = time.perf_counter()
        deadline = t0 + plan.raw_s
        thread.start()
        while time.perf_counter() < deadline and written < plan.phase_max_bytes:
            for _ in range(16):
                written += os.write(fd, buf)
        stop.set()
        thread.join()
        os.fdatasync(fd)
        elapsed = time.perf_counter() - t0
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        os.close(fd)
        path.unlink()
    return {"raw_disk_threaded_mb_per_s": written / elapsed / MB}


def _raw_fsync_loop(directory: Path, seconds: float, max_ops: int) -> tuple[list[float], float]:
    """Latencies (us) of ``os.write(100 bytes) + os.fdatasync`` on a growing file, and seconds."""
    path = directory / "raw-fsync.bin"
    rec = os.urandom(VALUE_SIZE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    lat: list[float] = []
    try:
        for _ in range(20):  # warm-up: allocate the first blocks
            os.write(fd, rec)
            os.fdatasync(fd)
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while len(lat) < max_ops:
            t = time.perf_counter_ns()
            os.write(fd, rec)
            os.fdatasync(fd)
            lat.append((time.perf_counter_ns() - t) / 1000)
            if time.perf_counter() >= deadline:
                break
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    return lat, elapsed


def raw_fsync_latency(directory: Path, plan: Plan) -> dict[str, float]:
    """Latency of ``os.write(100 bytes) + os.fdatasync`` on a growing file."""
    lat, elapsed = _raw_fsync_loop(directory, plan.fsync_s, plan.fsync_max_ops)
    return {
        "raw_fsync_p50_us": percentile(lat, 50),
        "raw_fsync_p99_us": percentile(lat, 99),
        "raw_fsync_per_s": len(lat) / elapsed,
        "raw_fsync_ops": len(lat),
    }


_CPU_HEAD = struct.Struct("<IIIq")  # length, crc, count, timestamp
_CPU_ONE = struct.Struct("<qi")  # timestamp, value length


def cpu_baseline(directory: Path, values: list[bytes], batch: int, seconds: float) -> float:
    """Records/s of a bare loop: encode (lengths + values) + crc32c + ``os.write``.

    Writes go to the page cache (no fsync): the floor a Python journal without
    any bookkeeping would pay. The file is truncated every 64 MiB so the loop
    measures CPU, not writeback.
    """
    path = directory / f"cpu-b{batch}.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    crc = crc32c.crc32c
    write = os.write
    records = size = 0
    try:
        t0 = time.perf_counter()
        deadline = t0 + seconds
        if batch == 1:
            mask = len(values) - 1
            assert len(values) & mask == 0
            i = 0
            while time.perf_counter() < deadline:
                ts = _now_ms()
                for _ in range(256):
                    v = values[i & mask]
                    body = _CPU_ONE.pack(ts, len(v)) + v
                    size += write(fd, _CPU_HEAD.pack(len(body) + 20, crc(body), 1, ts) + body)
                    i += 1
                records = i
                if size > 64 * MiB:
                    os.ftruncate(fd, 0)
                    size = 0
        else:
            groups = [values[i : i + batch] for i in range(0, len(values) - batch + 1, batch)]
            k = 0
            while time.perf_counter() < deadline:
                ts = _now_ms()
                for _ in range(max(1, 256 // batch)):
                    vals = groups[k % len(groups)]
                    body = array("i", map(len, vals)).tobytes() + b"".join(vals)
                    head = _CPU_HEAD.pack(len(body) + 20, crc(body), len(vals), ts)
                    size += write(fd, head + body)
                    records += len(vals)
                    k += 1
                if size > 64 * MiB:
                    os.ftruncate(fd, 0)
                    size = 0
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    return records / elapsed


# ------------------------------------------------------------------ appends


@dataclass(slots=True)
class AppendRun:
    records: int
    appends: int
    batch_bytes: int
    seconds: float
    fsyncs: int
    journal_appends: int
    latencies_us: list[float] = field(default_factory=list)
    per_task: list[int] = field(default_factory=list)

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.batch_bytes / self.seconds / MB

    @property
    def fsyncs_per_append(self) -> float:
        return self.fsyncs / self.journal_appends if self.journal_appends else math.nan


#: ``--no-at-rest``: sealed segments left as written (no background rewrite),
#: as in code from before ``journal.at_rest``, so that an A/B run against such
#: code compares the journal alone.
_CONFIG_DEFAULTS: dict[str, Any] = {}


def _config(fsync: str, **kw: Any) -> JournalConfig:
    # A budget large enough that no phase ever hits JournalFull.
    kw = {**_CONFIG_DEFAULTS, **kw}
    return JournalConfig(fsync=FsyncPolicy(fsync), max_bytes=256 * GiB, **kw)


async def append_run(
    path: Path,
    cfg: JournalConfig,
    shape: Shape,
    *,
    seconds: float,
    max_bytes: int,
    max_ops: int = 1 << 62,
    timed: bool = False,
) -> AppendRun:
    """One appender: encode + append in a loop until ``seconds`` or ``max_bytes``.

    ``timed`` records each append's latency (encode included) and checks the
    clock after every append; otherwise the clock is read once per
    ``shape.block`` appends. The run ends with a flush, so the figure covers
    the data reaching the disk, not only the page cache.
    """
    enc, recs, sizes, n = shape.encode, shape.records, shape.sizes, len(shape.records)
    lat: list[float] = []
    async with open_journal(path, cfg) as j:
        append = j.append
        s0 = j.statistics()
        i = records = nbytes = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        if timed:
            while True:
                t = time.perf_counter_ns()
                await append(TOPIC, i % PARTITIONS, enc(i % n, _now_ms()))
                lat.append((time.perf_counter_ns() - t) / 1000)
                k = i % n
                records += recs[k]
                nbytes += sizes[k]
                i += 1
                if time.perf_counter() >= deadline or nbytes >= max_bytes or i >= max_ops:
                    break
        elif shape.name == "b1":
            # the one-record loop, kept free of per-append bookkeeping
            mask = n - 1
            assert n & mask == 0
            block = shape.block
            size = sizes[0]
            while True:
                ts = _now_ms()
                for _ in range(block):
                    await append(TOPIC, i % PARTITIONS, enc(i & mask, ts))
                    i += 1
                if time.perf_counter() >= deadline or i * size >= max_bytes:
                    break
            records, nbytes = i, i * size
        else:
            block = shape.block
            while True:
                ts = _now_ms()
                for _ in range(block):
                    k = i % n
                    await append(TOPIC, i % PARTITIONS, enc(k, ts))
                    records += recs[k]
                    nbytes += sizes[k]
                    i += 1
                if time.perf_counter() >= deadline or nbytes >= max_bytes:
                    break
        await j.flush()
        elapsed = time.perf_counter() - t0
        s1 = j.statistics()
    shutil.rmtree(path)
    return AppendRun(
        records, i, nbytes, elapsed, s1.fsyncs - s0.fsyncs, s1.appends - s0.appends, lat
    )


async def group_commit(
    path: Path, cfg: JournalConfig, values: list[bytes], *, seconds: float, tasks: int = GROUP_TASKS
) -> AppendRun:
    """``tasks`` appenders, each awaiting one-record appends to its own partition."""
    lat: list[float] = []
    per_task = [0] * tasks
    async with open_journal(path, cfg) as j:
        s0 = j.statistics()
        t0 = time.perf_counter()
        deadline = t0 + seconds

        async def appender(task: int) -> None:
            i = task
            while time.perf_counter() < deadline:
                t = time.perf_counter_ns()
                data = encode_record(values[i % len(values)], timestamp=_now_ms())
                await j.append(TOPIC, task % PARTITIONS, data)
                lat.append((time.perf_counter_ns() - t) / 1000)
                per_task[task] += 1
                i += tasks

        async with trio.open_nursery() as nursery:
            for task in range(tasks):
                nursery.start_soon(appender, task)
        elapsed = time.perf_counter() - t0
        s1 = j.statistics()
    shutil.rmtree(path)
    n = sum(per_task)
    return AppendRun(
        n,
        n,
        n * len(values[0]),
        elapsed,
        s1.fsyncs - s0.fsyncs,
        s1.appends - s0.appends,
        lat,
        per_task,
    )


async def paired_latency_run(root: Path, plan: Plan, shape: Shape) -> dict[str, object]:
    """``fsync=always`` one-record appends in rounds that alternate with raw write + fdatasync.

    This disk's latency drifts within a minute (a VM on a shared host): a
    baseline measured in its own phase can see other weather than the run,
    which made the p99 ratio flip between 0.6 and 2.9. Alternating short
    rounds of both (4 x 1/4 of each phase's time, order alternating) puts
    both latency distributions in the same minute, so the p99 target
    compares like with like. The separate ``raw`` phase still reports
    ``raw_fsync_p99_us`` for the table.
    """
    lat: list[float] = []
    raw_lat: list[float] = []
    records = fsyncs = journal_appends = 0
    seconds = 0.0
    for r in range(PAIR_ROUNDS):
        for which in ("raw", "journal") if r % 2 == 0 else ("journal", "raw"):
            if which == "raw":
                more, _ = _raw_fsync_loop(
                    root, plan.fsync_s / PAIR_ROUNDS, plan.fsync_max_ops // PAIR_ROUNDS
                )
                raw_lat += more
            else:
                run = await append_run(
                    root / f"always-{shape.name}-{r}",
                    _config("always"),
                    shape,
                    seconds=plan.latency_s / PAIR_ROUNDS,
                    max_bytes=plan.phase_max_bytes // PAIR_ROUNDS,
                    max_ops=plan.latency_max_ops // PAIR_ROUNDS,
                    timed=True,
                )
                lat += run.latencies_us
                records += run.records
                seconds += run.seconds
                fsyncs += run.fsyncs
                journal_appends += run.journal_appends
    return {
        "append_always_p50_us": percentile(lat, 50),
        "append_always_p99_us": percentile(lat, 99),
        "append_always_max_us": max(lat),
        "always_records_per_s_100b_b1": records / seconds,
        "always_fsyncs_per_append_b1": fsyncs / journal_appends,
        "raw_fsync_p50_us_paired": percentile(raw_lat, 50),
        "raw_fsync_p99_us_paired": percentile(raw_lat, 99),
    }


async def journal_phases(
    root: Path, plan: Plan, phases: set[str], shapes: dict[str, Shape]
) -> dict[str, object]:
    fig: dict[str, object] = {}
    # Each disk baseline runs right before the phase compared with it: this
    # disk's speed drifts over minutes (a VM's host cache), and adjacent
    # measurements see the same weather.
    if "raw" in phases:
        fig.update(raw_disk_write(root, plan))
        fig.update(raw_disk_write_threaded(root, plan))
        progress(
            f"  raw disk {fig['raw_disk_mb_per_s']:.0f} MB/s "
            f"({fig['raw_disk_threaded_mb_per_s']:.0f} MB/s with fdatasync in a thread)"
        )
    if "interval" in phases:
        for name, shape in shapes.items():
            r = await append_run(
                root / f"interval-{name}",
                _config("interval"),
                shape,
                seconds=plan.interval_s,
                max_bytes=plan.phase_max_bytes,
            )
            progress(
                f"  interval {shape.label:>18}: {r.records_per_s:>12,.0f} records/s "
                f"{r.mb_per_s:8.1f} MB/s  ({r.appends:,} appends, {r.fsyncs} fsyncs)"
            )
            if name == "64k":
                fig["mb_per_s_64k"] = r.mb_per_s
                fig["records_per_s_64k"] = r.records_per_s
                fig["records_per_batch_64k"] = r.records / r.appends
            else:
                fig[f"records_per_s_100b_{name}"] = r.records_per_s
                fig[f"mb_per_s_100b_{name}"] = r.mb_per_s
            fig[f"interval_fsyncs_per_s_{name}"] = r.fsyncs / r.seconds
    if "raw" in phases:
        fig.update(raw_fsync_latency(root, plan))
        progress(
            f"  raw write(100 B)+fdatasync p50 {fig['raw_fsync_p50_us']:.0f} us "
            f"p99 {fig['raw_fsync_p99_us']:.0f} us"
        )
    if "always" in phases:
        fig.update(await paired_latency_run(root, plan, shapes["b1"]))
        progress(
            f"  always   {'100 B x 1':>18}: {fig['always_records_per_s_100b_b1']:>12,.0f} "
            f"records/s  p50 {fig['append_always_p50_us']:.0f} us  "
            f"p99 {fig['append_always_p99_us']:.0f} us (raw in the same rounds: "
            f"p50 {fig['raw_fsync_p50_us_paired']:.0f} p99 {fig['raw_fsync_p99_us_paired']:.0f})"
        )
        for name in ("b100", "b1000", "64k"):
            shape = shapes[name]
            r = await append_run(
                root / f"always-{name}",
                _config("always"),
                shape,
                seconds=plan.always_s,
                max_bytes=plan.phase_max_bytes,
                timed=True,
            )
            progress(
                f"  always   {shape.label:>18}: {r.records_per_s:>12,.0f} records/s "
                f"{r.mb_per_s:8.1f} MB/s  p99 {percentile(r.latencies_us, 99):.0f} us"
            )
            if name == "64k":
                fig["always_mb_per_s_64k"] = r.mb_per_s
                fig["always_records_per_s_64k"] = r.records_per_s
            else:
                fig[f"always_records_per_s_100b_{name}"] = r.records_per_s
            fig[f"always_p99_us_{name}"] = percentile(r.latencies_us, 99)
    if "group" in phases:
        values = shapes["b1"].values
        for prefix, inline in (("group8", None), ("group8_thread", False)):
            r = await group_commit(
                root / prefix, _config("always", inline_fsync=inline), values, seconds=plan.group_s
            )
            fig[f"{prefix}_records_per_s"] = r.records_per_s
            fig[f"{prefix}_fsyncs_per_append"] = r.fsyncs_per_append
            fig[f"{prefix}_p50_us"] = percentile(r.latencies_us, 50)
            fig[f"{prefix}_p99_us"] = percentile(r.latencies_us, 99)
            fig[f"{prefix}_task_appends_min"] = min(r.per_task)
            fig[f"{prefix}_task_appends_max"] = max(r.per_task)
            progress(
                f"  {prefix:>14} (inline_fsync={inline}): {r.records_per_s:>9,.0f} records/s "
                f"{r.fsyncs_per_append:.2f} fsyncs/append  appends per task "
                f"{min(r.per_task)}..{max(r.per_task)}"
            )
    return fig


# ------------------------------------------------------------------- reopen


def _timed_open(path: Path, cfg: JournalConfig) -> float:
    t0 = time.perf_counter()
    j = Journal.open_sync(path, cfg)
    dt = time.perf_counter() - t0
    j.close_sync()
    return dt


def _dir_bytes(path: Path, pattern: str = "*") -> int:
    return sum(f.stat().st_size for f in path.glob(pattern))


def _active_segment(path: Path) -> Path:
    return max(path.glob("*.wal"))


def reopen_phase(root: Path, plan: Plan, shapes: dict[str, Shape]) -> dict[str, object]:
    """Write a large journal, then time reopening it in several states.

    * clean: index files present, active segment nearly full (64 KiB entries);
    * index only: the same after a roll, so the active segment is almost empty;
      the difference is the cost of scanning a full active segment;
    * 1-record entries: a journal that is one active segment of small entries
      (the worst case per byte);
    * no index files: every segment is scanned (and its index rewritten).

    Reopens run with the files in the page cache (dropping it needs root and
    disturbs other work on the machine), as after a process restart.
    """
    fig: dict[str, object] = {}
    reps = plan.reopen_repeats
    path = root / "reopen"
    cfg = _config("never", segment_bytes=SEGMENT_BYTES)
    shape = shapes["64k"]
    encoded = [shape.encode(k, 0) for k in range(len(shape.records))]
    biggest = max(len(b) for b in encoded) + 256

    # fill: >= reopen_bytes in total, and the active segment nearly full
    j = Journal.open_sync(path, cfg)
    t0 = time.perf_counter()
    i = 0
    try:
        while time.perf_counter() - t0 < plan.fill_max_s:
            for _ in range(64):
                j.append_nowait(TOPIC, i % PARTITIONS, encoded[i % len(encoded)])
                i += 1
            # (the active segment's file is preallocated: its size says nothing)
            st = j.statistics()
            if (
                st.bytes >= plan.reopen_bytes
                and st.active_segment_bytes + 64 * biggest >= SEGMENT_BYTES
            ):
                while j.statistics().active_segment_bytes + biggest < SEGMENT_BYTES:
                    j.append_nowait(TOPIC, i % PARTITIONS, encoded[i % len(encoded)])
                    i += 1
                break
    finally:
        j.close_sync()
    fill_s = time.perf_counter() - t0
    size = _dir_bytes(path)
    active = _active_segment(path)
    active_bytes = active.stat().st_size
    segments = len(list(path.glob("*.wal")))
    progress(
        f"  wrote {size / GiB:.2f} GiB in {segments} segments ({fill_s:.1f} s), "
        f"active segment {active_bytes / MiB:.1f} MiB"
    )

    journal_gib = size / GiB
    clean = [_timed_open(path, cfg) for _ in range(reps)]
    clean_s = median(clean)
    touched = [*path.glob("*.idx"), active]
    clean_base_s = median([read_crc_seconds(touched) for _ in range(reps)])
    fig.update(
        reopen_gib=journal_gib,
        reopen_segments=segments,
        reopen_active_mib=active_bytes / MiB,
        reopen_s=clean_s,
        reopen_s_per_gib=clean_s / journal_gib,
        reopen_first_s=clean[0],
        reopen_read_crc_s=clean_base_s,
    )

    # after a crash: the active segment still has its preallocated zero tail
    crashed = []
    for _ in range(reps):
        os.truncate(active, max(SEGMENT_BYTES, active_bytes))
        crashed.append(_timed_open(path, cfg))
    fig["reopen_after_crash_s"] = median(crashed)

    # roll, so the active segment holds one checkpoint and one entry
    j = Journal.open_sync(path, cfg)
    try:
        before = j.statistics().segments
        while j.statistics().segments == before:
            j.append_nowait(TOPIC, i % PARTITIONS, encoded[i % len(encoded)])
            i += 1
    finally:
        j.close_sync()
    index_only_s = median([_timed_open(path, cfg) for _ in range(reps)])
    scan_s = max(clean_s - index_only_s, 0.0)
    seg_read_s = median([read_crc_seconds([active]) for _ in range(reps)])
    fig.update(
        reopen_index_only_s=index_only_s,
        active_scan_s_64k=scan_s,
        active_scan_s_per_gib_64k=scan_s / (active_bytes / GiB),
        read_crc_s_per_gib=seg_read_s / (active_bytes / GiB),
    )

    # no index files: every segment is scanned and its index rebuilt
    size = _dir_bytes(path)
    for idx in path.glob("*.idx"):
        idx.unlink()
    fig["reopen_noindex_s_per_gib"] = _timed_open(path, cfg) / (size / GiB)
    shutil.rmtree(path)

    # one active segment of 1-record entries (100-byte values)
    path = root / "scan-b1"
    seg_bytes = max(2 * plan.scan_b1_bytes, SEGMENT_BYTES)
    cfg_b1 = _config("never", segment_bytes=seg_bytes)
    ones = [shapes["b1"].encode(k, _now_ms()) for k in range(len(shapes["b1"].records))]
    j = Journal.open_sync(path, cfg_b1)
    t0 = time.perf_counter()
    try:
        while (
            j.statistics().bytes < plan.scan_b1_bytes and time.perf_counter() - t0 < plan.fill_max_s
        ):
            for _ in range(1024):
                j.append_nowait(TOPIC, i % PARTITIONS, ones[i % len(ones)])
                i += 1
        entries_b1 = j.statistics().appends
    finally:
        j.close_sync()
    b1_bytes = _dir_bytes(path, "*.wal")
    b1_s = median([_timed_open(path, cfg_b1) for _ in range(reps)])
    b1_read_s = median([read_crc_seconds(list(path.glob("*.wal"))) for _ in range(reps)])
    shutil.rmtree(path)
    fig.update(
        active_scan_s_per_gib_b1=b1_s / (b1_bytes / GiB),
        active_scan_us_per_entry_b1=b1_s / entries_b1 * 1e6,
        active_scan_s_full_segment_b1=b1_s / b1_bytes * SEGMENT_BYTES,
        read_crc_s_per_gib_b1=b1_read_s / (b1_bytes / GiB),
        # A 1 GiB journal whose active segment is full of 1-record entries:
        # loading its indexes (scaled from the measured journal) + that scan.
        reopen_1gib_small_entries_est_s=index_only_s / journal_gib
        + b1_s / b1_bytes * SEGMENT_BYTES,
    )
    progress(
        f"  clean reopen {clean_s:.3f} s ({fig['reopen_s_per_gib']:.3f} s/GiB), "
        f"index only {index_only_s:.3f} s, 1-record scan "
        f"{fig['active_scan_s_per_gib_b1']:.2f} s/GiB"
    )
    return fig


# ------------------------------------------------------------------ report


def _get(fig: dict[str, object], key: str) -> float | None:
    v = fig.get(key)
    return float(v) if isinstance(v, int | float) else None


def _times(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a * b


def build_report(fig: dict[str, object]) -> tuple[list[Row | str], dict[str, bool]]:
    def g(key: str) -> float | None:
        return _get(fig, key)

    targets: dict[str, bool] = {}

    def check(name: str, value: float | None, ok: Callable[[float], bool]) -> bool | None:
        if value is None:
            return None
        targets[name] = ok(value)
        return targets[name]

    raw_mb, raw_fsync_s = g("raw_disk_mb_per_s"), g("raw_fsync_per_s")
    raw_p50, raw_p99 = g("raw_fsync_p50_us"), g("raw_fsync_p99_us")
    paired_p99 = g("raw_fsync_p99_us_paired")
    b1, b1000 = g("records_per_s_100b_b1"), g("records_per_s_100b_b1000")
    mb64, disk_ratio = g("mb_per_s_64k"), g("disk_ratio")
    p99 = g("append_always_p99_us")
    reopen = g("reopen_s_per_gib")
    worst = g("reopen_1gib_small_entries_est_s")
    rows: list[Row | str] = [
        "baselines (plain Python loops, same disk)",
        Row("raw write 64 KiB + fdatasync/5 ms", raw_mb, "MB/s"),
        Row("  the same, fdatasync in a thread", g("raw_disk_threaded_mb_per_s"), "MB/s"),
        Row("raw write 100 B + fdatasync p50", raw_p50, "us"),
        Row("raw write 100 B + fdatasync p99", raw_p99, "us"),
        Row("raw write 100 B + fdatasync rate", raw_fsync_s, "ops/s"),
        Row("encode+crc32c+write, 100 B x 1", g("cpu_records_per_s_b1"), "rec/s"),
        Row("encode+crc32c+write, 100 B x 100", g("cpu_records_per_s_b100"), "rec/s"),
        Row("encode+crc32c+write, 100 B x 1000", g("cpu_records_per_s_b1000"), "rec/s"),
        "append throughput, fsync=interval (encode included, 8 partitions)",
        Row(
            "100 B x 1 per append",
            b1,
            "rec/s",
            "bare loop x1",
            g("cpu_records_per_s_b1"),
            f">= {TARGET_B1:,}",
            check("b1_records_per_s", b1, lambda v: v >= TARGET_B1),
        ),
        Row(
            "100 B x 100 per append",
            g("records_per_s_100b_b100"),
            "rec/s",
            "bare loop x100",
            g("cpu_records_per_s_b100"),
        ),
        Row(
            "100 B x 1000 per append",
            b1000,
            "rec/s",
            "bare loop x1000",
            g("cpu_records_per_s_b1000"),
            f">= {TARGET_B1000:,}",
            check("b1000_records_per_s", b1000, lambda v: v >= TARGET_B1000),
        ),
        Row("100 B x 1000 per append", g("mb_per_s_100b_b1000"), "MB/s", "raw disk", raw_mb),
        Row(
            "telemetry 64 KiB per append",
            mb64,
            "MB/s",
            "raw disk",
            raw_mb,
            f">= {TARGET_DISK_RATIO}x disk",
            check("disk_ratio", disk_ratio, lambda v: v >= TARGET_DISK_RATIO),
        ),
        Row(
            "telemetry 64 KiB per append",
            mb64,
            "MB/s",
            "raw, fsync thread",
            g("raw_disk_threaded_mb_per_s"),
        ),
        Row("telemetry 64 KiB per append", g("records_per_s_64k"), "rec/s"),
        "fsync=always, one appender awaiting each append",
        Row(
            "1 record: latency p50",
            g("append_always_p50_us"),
            "us",
            "raw p50, same rounds",
            g("raw_fsync_p50_us_paired"),
        ),
        Row(
            "1 record: latency p99",
            p99,
            "us",
            "raw p99, same rounds",
            paired_p99,
            f"<= {TARGET_P99_FACTOR:g}x raw p99",
            check(
                "always_p99",
                p99,
                lambda v: paired_p99 is not None and v <= TARGET_P99_FACTOR * paired_p99,
            ),
        ),
        Row(
            "100 B x 1 per append",
            g("always_records_per_s_100b_b1"),
            "rec/s",
            "raw fsync ops/s",
            raw_fsync_s,
        ),
        Row(
            "100 B x 100 per append",
            g("always_records_per_s_100b_b100"),
            "rec/s",
            "100 x raw fsync/s",
            _times(raw_fsync_s, 100),
        ),
        Row(
            "100 B x 1000 per append",
            g("always_records_per_s_100b_b1000"),
            "rec/s",
            "1000 x raw fsync/s",
            _times(raw_fsync_s, 1000),
        ),
        Row("telemetry 64 KiB per append", g("always_mb_per_s_64k"), "MB/s", "raw disk", raw_mb),
        f"group commit: fsync=always, {GROUP_TASKS} tasks each awaiting 1-record appends",
        Row(
            "default (inline fsync): throughput",
            g("group8_records_per_s"),
            "rec/s",
            "1 appender",
            g("always_records_per_s_100b_b1"),
        ),
        Row(
            "default (inline fsync): fsyncs/append",
            g("group8_fsyncs_per_append"),
            "",
            "no grouping",
            1.0,
        ),
        Row(
            "default (inline fsync): latency p99",
            g("group8_p99_us"),
            "us",
            "raw fsync p99",
            raw_p99,
        ),
        Row(
            "default: appends of slowest task",
            g("group8_task_appends_min"),
            "",
            "fastest task",
            g("group8_task_appends_max"),
        ),
        Row(
            "inline_fsync=False: throughput",
            g("group8_thread_records_per_s"),
            "rec/s",
            "1 appender",
            g("always_records_per_s_100b_b1"),
        ),
        Row(
            "inline_fsync=False: fsyncs/append",
            g("group8_thread_fsyncs_per_append"),
            "",
            "no grouping",
            1.0,
        ),
        Row(
            "inline_fsync=False: latency p99",
            g("group8_thread_p99_us"),
            "us",
            "raw fsync p99",
            raw_p99,
        ),
        "reopen (files in page cache)",
        Row(
            f"clean reopen, {fmt(g('reopen_gib'))} GiB",
            g("reopen_s"),
            "s",
            "read+crc idx+active",
            g("reopen_read_crc_s"),
        ),
        Row(
            "clean reopen per GiB",
            reopen,
            "s/GiB",
            "",
            None,
            f"<= {TARGET_REOPEN_S_PER_GIB:g}",
            check("reopen", reopen, lambda v: v <= TARGET_REOPEN_S_PER_GIB),
        ),
        Row(
            "reopen after a crash (zero tail)",
            g("reopen_after_crash_s"),
            "s",
            "clean reopen",
            g("reopen_s"),
        ),
        Row("reopen, active segment ~empty", g("reopen_index_only_s"), "s"),
        Row(
            "active segment scan, 64 KiB entries",
            g("active_scan_s_per_gib_64k"),
            "s/GiB",
            "read+crc32c",
            g("read_crc_s_per_gib"),
        ),
        Row(
            "active segment scan, 1-record entries",
            g("active_scan_s_per_gib_b1"),
            "s/GiB",
            "read+crc32c",
            g("read_crc_s_per_gib_b1"),
        ),
        Row("  = a full 64 MiB active segment", g("active_scan_s_full_segment_b1"), "s"),
        Row("  = per entry", g("active_scan_us_per_entry_b1"), "us"),
        Row(
            "1 GiB, active segment of 1-record entries",
            worst,
            "s",
            "clean reopen",
            _times(reopen, 1.0),
            f"(<= {TARGET_REOPEN_S_PER_GIB:g}, est.)",
            None if worst is None else worst <= TARGET_REOPEN_S_PER_GIB,
        ),
        Row(
            "reopen without index files",
            g("reopen_noindex_s_per_gib"),
            "s/GiB",
            "read+crc32c",
            g("read_crc_s_per_gib"),
        ),
    ]
    # drop rows of phases that did not run
    rows = [r for r in rows if isinstance(r, str) or r.value is not None]
    rows = [
        r
        for k, r in enumerate(rows)
        if not isinstance(r, str) or (k + 1 < len(rows) and not isinstance(rows[k + 1], str))
    ]
    return rows, targets


def fmt(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}"


# -------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run (<= 45 s), for CI")
    parser.add_argument(
        "--only",
        default=",".join(PHASES),
        help=f"comma-separated phases to run (default all: {','.join(PHASES)})",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="parent of the scratch directory (default bench/out; not tmpfs)",
    )
    parser.add_argument(
        "--no-at-rest",
        action="store_true",
        help="journal.at_rest off: no background rewrite of sealed segments (for A/B runs "
        "against code from before it)",
    )
    add_baseline_args(parser)
    args = parser.parse_args(argv)
    if args.no_at_rest and "at_rest" in JournalConfig.__dataclass_fields__:
        _CONFIG_DEFAULTS["at_rest"] = "off"
    if args.baseline_commit:
        passed = without_baseline_args(sys.argv[1:] if argv is None else argv)
        run_baseline_ab(Path(__file__).resolve(), passed, args.baseline_commit, args.rounds)
        return 0
    phases = {p.strip() for p in args.only.split(",") if p.strip()}
    if unknown := phases - set(PHASES):
        parser.error(f"unknown phase(s) {', '.join(sorted(unknown))}; known: {', '.join(PHASES)}")
    plan = QUICK if args.quick else FULL

    started = time.perf_counter()
    progress(f"journal bench ({'quick' if plan.quick else 'full'}): preparing data")
    values = fixed_size_values(8192, VALUE_SIZE)
    shapes = make_shapes(values)
    fig: dict[str, object] = {"quick": plan.quick}
    with scratch_dir("journal-", args.dir) as root:
        fig.update(machine_info(root))
        if "cpu" in phases:
            for n in (1, 100, 1000):
                fig[f"cpu_records_per_s_b{n}"] = cpu_baseline(root, values, n, plan.cpu_s)
            progress(
                f"  bare loop {fig['cpu_records_per_s_b1']:,.0f} / "
                f"{fig['cpu_records_per_s_b100']:,.0f} / "
                f"{fig['cpu_records_per_s_b1000']:,.0f} records/s (x1 / x100 / x1000)"
            )
        fig.update(trio.run(journal_phases, root, plan, phases, shapes))
        if "reopen" in phases:
            fig.update(reopen_phase(root, plan, shapes))
    mb64, raw_mb = _get(fig, "mb_per_s_64k"), _get(fig, "raw_disk_mb_per_s")
    if mb64 is not None and raw_mb:
        fig["disk_ratio"] = mb64 / raw_mb
    fig["seconds"] = time.perf_counter() - started

    rows, targets = build_report(fig)
    fig["targets"] = targets
    fig["targets_met"] = all(targets.values()) if targets else None
    title = (
        f"edgegw journal bench ({'quick' if plan.quick else 'full'}; "
        f"{fig['fs']} on {fig['device']}, {fig['cpus']} CPUs, Python {fig['python']}; "
        f"MB = 10^6 bytes; {fig['seconds']:.0f} s)"
    )
    print(render_table(title, rows))
    print()
    verdicts = ", ".join(f"{k} {'PASS' if v else 'SHORT'}" for k, v in targets.items())
    print(f"targets: {verdicts or 'none measured (phases skipped)'}")
    emit_json(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
