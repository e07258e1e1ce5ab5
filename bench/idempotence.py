"""What idempotent produce costs (docs/api.md, "Idempotent produce").

Three layers, each against a plain baseline in the same run (interleaved
rounds, best of 3, so drift of the machine hits both alike; the in-process
layers are timed in CPU seconds of this process, which other work on a
shared machine does not inflate):

* journal: ``Journal.append_nowait`` of one-record entries, plain vs with
  a producer stamp (the entry's 16 extra bytes, built off the hot path's
  precomputed struct), ``fsync = "never"``: the CPU cost of the path;
* gateway: ``Gateway.produce_batch`` in process, plain vs idempotent (the
  producers' table check and record), batches of 1 and of 100 records;
* HTTP: a real ``edgegw serve`` process and the Python ``Client`` producing
  one record per request to one partition, ``idempotent=False`` vs the
  default (headers, the table, the answer), requests/s on one connection
  each, the two clients taking turns in chunks.

Usage: ``python bench/idempotence.py [--quick]``; the last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import trio
from _common import Row, emit_json, machine_info, progress, render_table, scratch_dir

from edge_gateway.client import Client, read_addr_file
from edge_gateway.config import parse_config
from edge_gateway.format.batch import encode_batch, encode_record
from edge_gateway.format.entry import ProducerStamp
from edge_gateway.gateway import Gateway
from edge_gateway.idempotence import ProducerSeq
from edge_gateway.journal import FsyncPolicy, Journal, JournalConfig

CFG = JournalConfig(fsync=FsyncPolicy.NEVER, segment_bytes=64 << 20, max_bytes=8 << 30)


def bench_journal(root: Path, batches: list[bytes], *, idempotent: bool) -> float:
    j = Journal.open_sync(root, CFG)
    try:
        stamps = [ProducerStamp(1, 0, i) for i in range(len(batches))]  # the caller's input
        t0 = time.process_time()
        if idempotent:
            for b, stamp in zip(batches, stamps, strict=True):
                j.append_nowait("t", 0, b, stamp)
        else:
            for b in batches:
                j.append_nowait("t", 0, b)
        return len(batches) / (time.process_time() - t0)
    finally:
        j.close_sync()


def bench_gateway(root: Path, batches: list[bytes], per_batch: int, *, idempotent: bool) -> float:
    cfg = parse_config(
        {
            "region": "north",
            "data_dir": str(root),
            "journal": {"fsync": "never"},
            # no shipping while measuring: it would move the figures, not the path
            "shipper": {"flush_interval_ms": 600_000},
            "topics": [{"name": "t", "home": "north", "partitions": 1}],
        }
    )
    out: list[float] = []

    async def main() -> None:
        gw = Gateway(cfg)
        async with trio.open_nursery() as nursery:
            await nursery.start(gw.run)
            pid, epoch = await gw.init_producer()
            t0 = time.process_time()
            if idempotent:
                seq = 0
                for b in batches:
                    await gw.produce_batch("t", 0, b, producer=ProducerSeq(pid, epoch, seq))
                    seq += per_batch
            else:
                for b in batches:
                    await gw.produce_batch("t", 0, b)
            out.append(len(batches) * per_batch / (time.process_time() - t0))
            gw.request_shutdown()

    trio.run(main)
    return out[0]


def _serve(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    config = root / "edgegw.toml"
    config.write_text(
        f'region = "north"\ndata_dir = "{root / "data"}"\n'
        '[api]\nlisten = "127.0.0.1:0"\n'
        '[[topics]]\nname = "t"\nhome = "north"\npartitions = 1\n'
    )
    edgegw = Path(sys.executable).parent / "edgegw"
    proc = subprocess.Popen(
        [str(edgegw), "serve", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    addr = root / "data" / "api.addr"
    deadline = time.monotonic() + 60
    while not addr.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("edgegw serve did not start")
        time.sleep(0.05)
    return proc, read_addr_file(root / "data")


def bench_http(url: str, n: int) -> tuple[float, float]:
    """Requests/s (plain, idempotent): two clients taking turns in chunks, so that both
    see the same machine (other work on it moves both alike)."""
    with Client(url, idempotent=False) as plain, Client(url) as idem:
        value = b"x" * 100
        spent = {False: 0.0, True: 0.0}
        for client in (plain, idem):
            client.produce("t", [b"warm"], partition=0)
        chunk = max(1, n // 10)
        for _ in range(10):
            for is_idem, client in ((False, plain), (True, idem)):
                t0 = time.perf_counter()
                for _ in range(chunk):
                    client.produce("t", [value], partition=0)
                spent[is_idem] += time.perf_counter() - t0
        return 10 * chunk / spent[False], 10 * chunk / spent[True]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer appends and requests")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the scratch directory")
    args = parser.parse_args(argv)
    n_journal = 100_000 if args.quick else 500_000
    n_gateway = 20_000 if args.quick else 100_000
    n_http = 2_000 if args.quick else 10_000
    ones = [encode_record(b"%099d" % i, timestamp=1_795_380_000_000 + i) for i in range(n_journal)]
    hundreds = [
        encode_batch([b"%099d" % k for k in range(100)], timestamps=1_795_380_000_000)
        for _ in range(n_gateway // 100)
    ]
    runs: dict[str, list[float]] = {
        k: []
        for k in (
            "journal_plain",
            "journal_idem",
            "gw1_plain",
            "gw1_idem",
            "gw100_plain",
            "gw100_idem",
            "http_plain",
            "http_idem",
        )
    }
    fig: dict[str, object] = {"quick": args.quick}
    with scratch_dir("idempotence-", args.dir) as root:
        fig.update(machine_info(root))
        proc, url = _serve(root)
        try:
            for r in range(3):
                progress(f"idempotence bench: round {r + 1}/3")
                for idem in (False, True):
                    tag = "idem" if idem else "plain"
                    d = root / f"j-{tag}-{r}"
                    d.mkdir()
                    runs[f"journal_{tag}"].append(bench_journal(d, ones, idempotent=idem))
                    runs[f"gw1_{tag}"].append(
                        bench_gateway(root / f"g1-{tag}-{r}", ones[:n_gateway], 1, idempotent=idem)
                    )
                    runs[f"gw100_{tag}"].append(
                        bench_gateway(root / f"g100-{tag}-{r}", hundreds, 100, idempotent=idem)
                    )
                plain_rps, idem_rps = bench_http(url, n_http)
                runs["http_plain"].append(plain_rps)
                runs["http_idem"].append(idem_rps)
        finally:
            proc.terminate()
            proc.wait(60)
    best = {k: max(v) for k, v in runs.items()}
    rows = [
        "best of 3; fsync never (journal, gateway); the serve process: defaults",
        Row("journal append, plain", best["journal_plain"], "appends/s"),
        Row(
            "journal append, producer stamp",
            best["journal_idem"],
            "appends/s",
            "plain",
            best["journal_plain"],
        ),
        Row("gateway produce_batch x1, plain", best["gw1_plain"], "records/s"),
        Row(
            "gateway produce_batch x1, idem",
            best["gw1_idem"],
            "records/s",
            "plain",
            best["gw1_plain"],
        ),
        Row("gateway produce_batch x100, plain", best["gw100_plain"], "records/s"),
        Row(
            "gateway produce_batch x100, idem",
            best["gw100_idem"],
            "records/s",
            "plain",
            best["gw100_plain"],
        ),
        Row("HTTP Client, 1 record/request, plain", best["http_plain"], "requests/s"),
        Row(
            "HTTP Client, 1 record/request, idem",
            best["http_idem"],
            "requests/s",
            "plain",
            best["http_plain"],
        ),
    ]
    print(render_table(f"edgegw idempotence bench ({'quick' if args.quick else 'full'})", rows))
    fig.update(
        journal_plain_appends_per_s=best["journal_plain"],
        journal_idem_appends_per_s=best["journal_idem"],
        journal_idem_ratio=best["journal_idem"] / best["journal_plain"],
        gateway1_idem_ratio=best["gw1_idem"] / best["gw1_plain"],
        gateway100_idem_ratio=best["gw100_idem"] / best["gw100_plain"],
        gateway1_plain_rec_per_s=best["gw1_plain"],
        gateway100_plain_rec_per_s=best["gw100_plain"],
        http_plain_req_per_s=best["http_plain"],
        http_idem_req_per_s=best["http_idem"],
        http_idem_ratio=best["http_idem"] / best["http_plain"],
    )
    emit_json(fig)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
