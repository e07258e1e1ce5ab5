"""Timeline of one mirror catch-up: where its time goes, beside raw GETs of the same objects.

Gateway ``a`` ships a backlog of reference telemetry (bench/replication.py's
``TelemetryBacklog``) to a moto server and stops; then a ``Tailer`` in this
process catches a fresh journal up through a TCP proxy (as gateway ``b`` of
bench/replication.py does), with every bucket GET, HEAD and LIST and every
journal append timed. Printed per catch-up, each beside the same run's
baseline (8 threads of boto3 GETs of the same objects, direct and through the
same proxy, measured just before it):

- ``catchup_s`` and ``ratio_vs_raw`` (raw GET seconds / catch-up seconds:
  bench/replication.py's ``catchup_ratio``, with no gateway start nor HTTP
  polling in it);
- ``start_ms``: from the start to the first GET of a log entry (the manifest
  LIST, the head search's HEADs, the first manifest);
- ``gets_per_object``, GET latency p50/p90, the appends' total time;
- a strip of GETs in flight per 5 ms (``--strip``), to see the window fill.

``--prefetch 8,16`` runs one catch-up per value (``mirror.prefetch_objects``)
on the same objects. The tailer shares this process's CPU with the proxy's
threads: compare the ratios of one run, not across machines or days.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
from _common import MB, emit_json, machine_info, percentile, progress, scratch_dir
from edgegw_cli._fleet import Site
from replication import (
    BUCKET,
    TelemetryBacklog,
    log_objects,
    post_batches,
    wait_shipped,
    write_config,
)

from edge_gateway.bucket._s3 import S3Bucket
from edge_gateway.bucket._s3config import S3Config
from edge_gateway.journal import Journal, JournalConfig
from edge_gateway.mirror import Tailer, TailerConfig
from edge_gateway.testing.moto import s3_client, start_moto_server
from edge_gateway.testing.tcpproxy import TcpProxy

Event = tuple[str, float, float, str]


def raw_seconds(client: Any, keys: list[str]) -> float:
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: client.get_object(Bucket=BUCKET, Key=k)["Body"].read(), keys))
    return time.perf_counter() - t0


def timed(obj: object, name: str, events: list[Event], t0: float) -> None:
    """Wrap ``obj.name`` (a coroutine method) to log (name, start, end, first argument)."""
    fn: Callable[..., Awaitable[Any]] = getattr(obj, name)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter() - t0
        try:
            return await fn(*args, **kwargs)
        finally:
            events.append((name, start, time.perf_counter() - t0, str(args[0]) if args else ""))

    setattr(obj, name, wrapper)


async def catch_up(proxy_url: str, root: Path, prefetch: int, events: list[Event]) -> float:
    cfg = S3Config(
        bucket=BUCKET,
        endpoint_url=proxy_url,
        region="us-east-1",
        path_style=True,
        access_key="testing",
        secret_key="testing",
    )
    bucket = await S3Bucket.open(cfg)
    journal = Journal.open_sync(Path(tempfile.mkdtemp(prefix="mirror-", dir=root)), JournalConfig())
    try:
        tailer = Tailer(journal, bucket, "a", None, "b", TailerConfig(prefetch_objects=prefetch))
        t0 = time.perf_counter()
        for name in ("get", "head", "list"):
            timed(bucket, name, events, t0)
        timed(journal, "append_mirror_blocks", events, t0)
        timed(journal, "append_mirror_batches", events, t0)
        await tailer.catch_up()
        return time.perf_counter() - t0
    finally:
        await bucket.aclose()
        journal.close_sync()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--backlog-mb", type=float, default=64.0, help="records produced at a (MiB)")
    ap.add_argument("--prefetch", default="8", help="prefetch_objects per catch-up: 8,16,...")
    ap.add_argument("--strip", action="store_true", help="print GETs in flight per 5 ms")
    ap.add_argument("--dir", type=Path, default=None, help="scratch parent directory")
    args = ap.parse_args()
    figures: dict[str, Any] = {"backlog_mib": args.backlog_mb}
    with scratch_dir("catchup-profile-", args.dir) as root:
        figures["machine"] = machine_info(root)
        moto = start_moto_server(root / "moto.log")
        s3 = s3_client(moto.endpoint)
        s3.create_bucket(Bucket=BUCKET)
        proxy_a = TcpProxy("127.0.0.1", moto.port).start()
        proxy_b = TcpProxy("127.0.0.1", moto.port).start()
        a = Site("a", (root / "a").resolve())
        write_config(a, proxy_a)
        try:
            a.start()
            a.wait_ready()
            progress(f"producing {args.backlog_mb:.0f} MiB at a ...")
            records = TelemetryBacklog(root / "backlog.spool")
            post_batches(a, records.batches(), int(args.backlog_mb * 1024 * 1024))
            records.close()
            wait_shipped(a)
            assert a.stop() == 0
            objects = log_objects(s3, 0)
            keys = [k for k, _ in objects]
            wire = sum(size for _, size in objects)
            figures.update(objects=len(objects), wire_mb=wire / MB)
            print(f"{len(objects)} log objects, {wire / MB:.1f} MB")
            s3_proxy = s3_client(proxy_b.url)
            for i, prefetch in enumerate(int(x) for x in args.prefetch.split(",")):
                raw_direct = raw_seconds(s3, keys)
                raw_proxy = raw_seconds(s3_proxy, keys)
                events: list[Event] = []
                progress(f"catch-up {i + 1}: prefetch_objects = {prefetch} ...")
                elapsed = trio.run(catch_up, proxy_b.url, root, prefetch, events)
                gets = [e for e in events if e[0] == "get"]
                log_gets = [e for e in gets if "/log/" in e[3]]
                appends = [e for e in events if e[0].startswith("append")]
                lat = [(e[2] - e[1]) * 1000 for e in log_gets]
                raw = min(raw_direct, raw_proxy)
                f = {
                    "prefetch_objects": prefetch,
                    "catchup_s": elapsed,
                    "raw_direct_s": raw_direct,
                    "raw_proxy_s": raw_proxy,
                    "ratio_vs_raw": raw / elapsed,
                    "start_ms": min(e[1] for e in log_gets) * 1000 if log_gets else None,
                    "heads": sum(1 for e in events if e[0] == "head"),
                    "lists": sum(1 for e in events if e[0] == "list"),
                    "gets_per_object": len(log_gets) / max(1, len(objects)),
                    "manifest_gets": sum(1 for e in gets if "/manifest/" in e[3]),
                    "get_p50_ms": percentile(lat, 50) if lat else None,
                    "get_p90_ms": percentile(lat, 90) if lat else None,
                    "append_total_ms": sum(e[2] - e[1] for e in appends) * 1000,
                    "append_max_ms": max((e[2] - e[1] for e in appends), default=0) * 1000,
                }
                figures[f"run{i + 1}"] = f
                mb_s = wire / MB / elapsed
                print(
                    f"prefetch {prefetch}: catch-up {elapsed:.3f} s ({mb_s:.1f} MB/s)"
                    f"  raw GETs {raw:.3f} s (direct {raw_direct:.3f}, proxy {raw_proxy:.3f})"
                    f"  ratio {f['ratio_vs_raw']:.2f}x"
                )
                print(
                    f"  first entry GET at {f['start_ms']:.0f} ms ({f['lists']} LISTs,"
                    f" {f['heads']} HEADs, {f['manifest_gets']} manifest GETs);"
                    f" {f['gets_per_object']:.2f} GETs per object, p50 {f['get_p50_ms']:.1f}"
                    f" p90 {f['get_p90_ms']:.1f} ms; appends {f['append_total_ms']:.0f} ms"
                    f" (max {f['append_max_ms']:.1f})"
                )
                if args.strip:
                    strip = "".join(
                        str(min(9, sum(1 for e in gets if e[1] <= ms / 1000 < e[2])))
                        for ms in range(0, int(elapsed * 1000), 5)
                    )
                    print(f"  GETs in flight per 5 ms: {strip}")
        finally:
            if a.running:
                a.stop()
            proxy_a.stop()
            proxy_b.stop()
            moto.stop()
    emit_json(figures)


if __name__ == "__main__":
    sys.exit(main())
