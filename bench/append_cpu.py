"""The journal's append path in CPU time per append, for A/B runs on a loaded machine.

Usage::

    .venv/bin/python bench/append_cpu.py [--quick] [--baseline-commit COMMIT [--rounds N]]

``bench/journal.py`` times appends by the wall clock, which on a shared
machine measures the other processes as much as the journal. This bench times
the same calls in the process's CPU time (``time.process_time_ns``), which a
process waiting for a core does not accumulate: the figure to compare across
code versions. Per shape it runs blocks of appends and keeps the fastest
block's CPU time per append (the least disturbed one).

Shapes: ``Journal.append_nowait`` of pre-encoded batches of 1, 100 and 1000
records of 100 bytes (8 partitions round robin, ``fsync = "never"``: no fsync
in the loop, so only the append path is timed; the writes go to the page
cache), and ``append_mirror_batches`` of groups of 16 one-record batches
(the tailer's path). Beside them, in the same process, the same block timing
of a bare loop (``crc32c`` of each batch and one ``bytearray`` copy): its
figure moves with the machine (CPU frequency, caches), not with the code, so
the ratio of a shape to it is the figure a run reports as ``*_vs_bare``.

With ``--baseline-commit`` the same bench runs on this tree and on the code at
COMMIT, interleaved (``bench/_common.py``, ``run_baseline_ab``). The last line
of output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import crc32c
import trio
from _common import (
    Row,
    add_baseline_args,
    emit_json,
    fixed_size_values,
    progress,
    render_table,
    run_baseline_ab,
    scratch_dir,
    without_baseline_args,
)

from edge_gateway.format.batch import encode_batch
from edge_gateway.format.entry import SourceCoords
from edge_gateway.journal import FsyncPolicy, Journal, JournalConfig, MirrorBatch

TOPIC = "bench.cpu"
PARTITIONS = 8
VALUE_SIZE = 100
MIRROR_GROUP = 16


def _config() -> JournalConfig:
    return JournalConfig(fsync=FsyncPolicy.NEVER, max_bytes=64 << 30)


def best_ns_per_op(fn: Callable[[int], None], ops: int, blocks: int) -> float:
    """The fastest of ``blocks`` timings of ``fn(ops)``, in CPU ns per op."""
    best = float("inf")
    for _ in range(blocks):
        t = time.process_time_ns()
        fn(ops)
        best = min(best, (time.process_time_ns() - t) / ops)
    return best


def bare_loop(batches: list[bytes]) -> Callable[[int], None]:
    """CRC and copy of each batch: the work of an append without the journal."""
    n = len(batches)
    crc = crc32c.crc32c
    buf = bytearray()

    def run(ops: int) -> None:
        del buf[:]
        for i in range(ops):
            b = batches[i % n]
            crc(b)
            buf.extend(b)
            if len(buf) > 1 << 24:
                del buf[:]

    return run


def appends(j: Journal, batches: list[bytes]) -> Callable[[int], None]:
    n = len(batches)
    append = j.append_nowait

    def run(ops: int) -> None:
        for i in range(ops):
            append(TOPIC, i % PARTITIONS, batches[i % n])

    return run


def measure_shape(root: Path, name: str, batches: list[bytes], ops: int, blocks: int) -> float:
    j = Journal.open_sync(root / name, _config())
    try:
        return best_ns_per_op(appends(j, batches), ops, blocks)
    finally:
        j.close_sync()


def measure_mirror(root: Path, values: list[bytes], groups: int, blocks: int) -> float:
    """CPU ns per mirrored batch through ``append_mirror_batches`` (one-record batches,
    encoded before the timing)."""
    planned: list[tuple[list[MirrorBatch], SourceCoords, SourceCoords]] = []
    next_offset = [0] * PARTITIONS
    for seq in range(1, blocks * groups + 1):
        group = []
        for k in range(MIRROR_GROUP):
            p = k % PARTITIONS
            value = values[(seq * MIRROR_GROUP + k) % len(values)]
            batch = encode_batch([value], timestamps=1_700_000_000_000, base_offset=next_offset[p])
            next_offset[p] += 1
            group.append(MirrorBatch(TOPIC, p, batch))
        planned.append(
            (group, SourceCoords("src", seq, 1, False), SourceCoords("src", seq, 1, True))
        )

    async def run() -> float:
        j = Journal.open_sync(root / "mirror", _config())
        try:
            best = float("inf")
            for b in range(blocks):
                t = time.process_time_ns()
                for group, src, last in planned[b * groups : (b + 1) * groups]:
                    await j.append_mirror_batches(group, src, last)
                best = min(best, (time.process_time_ns() - t) / (groups * MIRROR_GROUP))
            return best
        finally:
            j.close_sync()

    return trio.run(run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run (~10 s)")
    add_baseline_args(parser)
    args = parser.parse_args(argv)
    if args.baseline_commit:
        passed = without_baseline_args(sys.argv[1:] if argv is None else argv)
        run_baseline_ab(Path(__file__).resolve(), passed, args.baseline_commit, args.rounds)
        return 0
    ops, blocks = (20_000, 7) if args.quick else (100_000, 15)
    values = fixed_size_values(4096, VALUE_SIZE)
    fig: dict[str, object] = {"quick": args.quick}
    with scratch_dir("append-cpu-") as root:
        for n in (1, 100, 1000):
            batches = [
                encode_batch(
                    [values[(i * n + k) % len(values)] for k in range(n)],
                    timestamps=1_700_000_000_000,
                )
                for i in range(64)
            ]
            shape_ops = max(200, ops // n)
            progress(f"append_nowait, batches of {n} x {VALUE_SIZE} B ...")
            fig[f"bare_ns_b{n}"] = best_ns_per_op(bare_loop(batches), shape_ops, blocks)
            fig[f"append_ns_b{n}"] = measure_shape(root, f"b{n}", batches, shape_ops, blocks)
            fig[f"append_vs_bare_b{n}"] = fig[f"append_ns_b{n}"] / fig[f"bare_ns_b{n}"]  # type: ignore[operator]
        progress(f"append_mirror_batches, groups of {MIRROR_GROUP} one-record batches ...")
        fig["mirror_ns_per_batch"] = measure_mirror(root, values, max(50, ops // 200), blocks)
    rows: list[Row | str] = [
        "CPU time per call (fastest block); baseline: CRC + copy of the same batches",
        *(
            Row(
                f"append_nowait, {n} x {VALUE_SIZE} B",
                fig[f"append_ns_b{n}"],  # type: ignore[arg-type]
                "ns",
                "bare CRC + copy",
                fig[f"bare_ns_b{n}"],  # type: ignore[arg-type]
            )
            for n in (1, 100, 1000)
        ),
        Row(
            f"append_mirror_batches, per batch (groups of {MIRROR_GROUP})",
            fig["mirror_ns_per_batch"],  # type: ignore[arg-type]
            "ns",
        ),
    ]
    print(render_table("edgegw journal append path, CPU time", rows))
    emit_json(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
