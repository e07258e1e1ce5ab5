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
  so a floor for the request alone).

CPU is the process's own (``time.process_time``), so a machine shared with
other work changes the wall figures much more than these. The last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

import urllib3
from _common import emit_json, median, scratch_dir
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest

from edge_gateway.testing.moto import s3_client, start_moto_server

BUCKET = "bench-s3-get-cpu"
OBJECTS = 50


def cpu_ms_per_call(fn: Callable[[int], object], n: int) -> float:
    started = time.process_time()
    for i in range(n):
        fn(i % OBJECTS)
    return (time.process_time() - started) / n * 1e3


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

            def boto3_get(i: int) -> bytes:
                return client.get_object(Bucket=BUCKET, Key=f"k{i}")["Body"].read()

            def signed_get(i: int) -> bytes:
                url = f"{endpoint}/{BUCKET}/k{i}"
                request = AWSRequest(method="GET", url=url, headers={})
                signer.add_auth(request)
                answer = pool.request("GET", url, headers=dict(request.headers.items()))
                if answer.status != 200 or len(answer.data) != args.size:
                    raise SystemExit(f"signed GET answered {answer.status}")
                return answer.data

            def unsigned_get(i: int) -> bytes:
                return pool.request("GET", f"{endpoint}/{BUCKET}/k{i}").data

            ways = {
                "boto3": boto3_get,
                "signed_urllib3": signed_get,
                "unsigned_urllib3": unsigned_get,
            }
            samples: dict[str, list[float]] = {name: [] for name in ways}
            for r in range(rounds):
                order = list(ways) if r % 2 == 0 else list(reversed(ways))
                for name in order:
                    samples[name].append(cpu_ms_per_call(ways[name], calls))
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
    emit_json(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
