"""CPU per S3 GET of a log-object-sized body: botocore's client against its signer alone.

Usage::

    .venv/bin/python bench/s3_get_cpu.py [--quick] [--size BYTES]

Why: a mirror's catch-up spends ~1.8x the CPU per MB of a bare boto3 client
(docs/mirroring.md, "The same-run ceiling"), and most of a GET's CPU is
botocore's request path, not the bytes. This bench measures, against one
moto server on loopback and the same objects, interleaved round by round:

* ``boto3``: ``client.get_object(...)["Body"].read()`` (what the gateway's S3
  backend calls today, in a worker thread);
* ``signed_urllib3``: the same request signed by botocore's own
  ``S3SigV4Auth`` and sent with urllib3 (botocore's HTTP library), the body
  read whole -- what a lean GET path would cost;
* ``unsigned_urllib3``: the bare HTTP exchange (moto answers 403: no body,
  so a floor for the request alone);
* ``lean_path``: the S3 backend's own lean GET path (``LeanGet.get``, what
  its worker thread runs for a GET with ``lean_get`` on: the request shape
  learned from botocore, SigV4 with the client's credentials, the client's
  own HTTP session, Content-Length and CRC32 checked);
* ``bucket_lean`` and ``bucket_botocore``: ``await S3Bucket.get(key)`` as the
  tailer calls it (trio, a worker thread, the error boundary, statistics),
  with ``lean_get`` on and off.

CPU is the process's own (``time.process_time``), so a machine shared with
other work changes the wall figures much more than these. The last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
import urllib3
from _common import emit_json, median, scratch_dir
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest

from edge_gateway.bucket import S3Bucket, S3Config
from edge_gateway.testing.moto import ACCESS_KEY, REGION, SECRET_KEY, s3_client, start_moto_server

BUCKET = "bench-s3-get-cpu"
OBJECTS = 50


def cpu_ms_per_call(fn: Callable[[int], object], n: int) -> float:
    started = time.process_time()
    for i in range(n):
        fn(i % OBJECTS)
    return (time.process_time() - started) / n * 1e3


async def cpu_ms_per_acall(fn: Callable[[int], Awaitable[object]], n: int) -> float:
    started = time.process_time()
    for i in range(n):
        await fn(i % OBJECTS)
    return (time.process_time() - started) / n * 1e3


async def open_bucket(endpoint: str, *, lean_get: bool) -> S3Bucket:
    config = S3Config(
        bucket=BUCKET,
        endpoint_url=endpoint,
        region=REGION,
        path_style=True,
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        lean_get=lean_get,
    )
    bucket = await S3Bucket.open(config)
    await bucket.get("k0")  # the first GET goes through botocore: the lean path learns from it
    return bucket


async def measure(
    endpoint: str,
    client: Any,
    signer: S3SigV4Auth,
    pool: urllib3.PoolManager,
    size: int,
    calls: int,
    rounds: int,
) -> dict[str, list[float]]:
    lean_bucket = await open_bucket(endpoint, lean_get=True)
    plain_bucket = await open_bucket(endpoint, lean_get=False)
    lean = lean_bucket.lean_get
    if lean is None or not lean.ready:
        raise SystemExit("the S3 backend has no lean GET path (botocore changed?)")
    try:

        def boto3_get(i: int) -> bytes:
            return client.get_object(Bucket=BUCKET, Key=f"k{i}")["Body"].read()  # type: ignore[no-any-return]

        def signed_get(i: int) -> bytes:
            url = f"{endpoint}/{BUCKET}/k{i}"
            request = AWSRequest(method="GET", url=url, headers={})
            signer.add_auth(request)
            answer = pool.request("GET", url, headers=dict(request.headers.items()))
            if answer.status != 200 or len(answer.data) != size:
                raise SystemExit(f"signed GET answered {answer.status}")
            return answer.data

        def unsigned_get(i: int) -> bytes:
            return pool.request("GET", f"{endpoint}/{BUCKET}/k{i}").data

        def lean_path_get(i: int) -> bytes:
            answer = lean.get(f"k{i}", None)
            if answer is None or len(answer.body) != size:
                raise SystemExit("the lean path fell back to botocore")
            return answer.body

        async def bucket_lean_get(i: int) -> bytes:
            return (await lean_bucket.get(f"k{i}")).data

        async def bucket_botocore_get(i: int) -> bytes:
            return (await plain_bucket.get(f"k{i}")).data

        ways: dict[str, Callable[[int], object]] = {
            "boto3": boto3_get,
            "signed_urllib3": signed_get,
            "unsigned_urllib3": unsigned_get,
            "lean_path": lean_path_get,
        }
        async_ways: dict[str, Callable[[int], Awaitable[object]]] = {
            "bucket_lean": bucket_lean_get,
            "bucket_botocore": bucket_botocore_get,
        }
        names = [*ways, *async_ways]
        samples: dict[str, list[float]] = {name: [] for name in names}
        for r in range(rounds):
            for name in names if r % 2 == 0 else list(reversed(names)):
                if name in ways:
                    samples[name].append(cpu_ms_per_call(ways[name], calls))
                else:
                    samples[name].append(await cpu_ms_per_acall(async_ways[name], calls))
        if lean.fallbacks:
            raise SystemExit(f"the lean path fell back {lean.fallbacks} times")
        return samples
    finally:
        await lean_bucket.aclose()
        await plain_bucket.aclose()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls (about 20 s)")
    ap.add_argument(
        "--size", type=int, default=110_000, help="object size (a log object's ~110 KB)"
    )
    args = ap.parse_args()
    calls, rounds = (100, 3) if args.quick else (300, 5)
    with scratch_dir("s3getcpu-", None) as root:
        server = start_moto_server(Path(root) / "moto.log")
        try:
            endpoint = server.endpoint
            client = s3_client(endpoint)
            client.create_bucket(Bucket=BUCKET)
            body = os.urandom(args.size)
            for i in range(OBJECTS):
                client.put_object(Bucket=BUCKET, Key=f"k{i}", Body=body)
            creds = client._request_signer._credentials.get_frozen_credentials()
            signer = S3SigV4Auth(creds, "s3", client.meta.region_name)
            pool = urllib3.PoolManager()
            samples = trio.run(measure, endpoint, client, signer, pool, args.size, calls, rounds)
        finally:
            server.stop()
    figures: dict[str, object] = {"size": args.size, "calls": calls, "rounds": rounds}
    base = median(samples["boto3"])
    print(f"CPU per GET of {args.size:,} bytes (median of {rounds} rounds of {calls}):")
    for name, values in samples.items():
        m = median(values)
        figures[f"{name}_cpu_ms"] = round(m, 4)
        figures[f"{name}_vs_boto3"] = round(m / base, 3)
        each = [round(v, 3) for v in values]
        print(f"  {name:18s} {m:7.3f} ms  ({m / base:.2f}x boto3)  rounds {each}")
    lean_vs_botocore = median(samples["bucket_lean"]) / median(samples["bucket_botocore"])
    figures["bucket_lean_vs_botocore"] = round(lean_vs_botocore, 3)
    print(f"  S3Bucket.get, lean_get on / off: {lean_vs_botocore:.2f}x the CPU")
    emit_json(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
