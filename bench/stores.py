"""What `edgegw bucket check` measures on each emulated store, next to moto in the same run.

Starts moto's S3 server (the baseline), Azurite (Azure Blob) and
gcp-storage-emulator (GCS) on loopback, runs ``check_store`` -- the contract
and the figures of ``edgegw bucket check`` -- against each in turn, rounds
alternating so that a busy machine hurts all alike, and prints per store the
median over rounds of small conditional PUT and GET latency (p50/p99) and the
throughput of 4 MiB objects four at a time, each as a ratio to moto's. Also
whether the store passed the contract (the GCS emulator does not: it ignores
``ifGenerationMatch``). Emulators on loopback: these are planning figures for
the test tiers, not for the real services.

    python bench/stores.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    Row,
    emit_json,
    machine_info,
    median,
    progress,
    render_table,
    scratch_dir,
)

from edge_gateway.bucket import AzureConfig, Bucket, GcsConfig, S3Bucket, S3Config, check_store
from edge_gateway.testing.emulators import (
    azurite_connection_string,
    azurite_missing_reason,
    start_azurite,
    start_gcs_emulator,
)
from edge_gateway.testing.moto import (
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    s3_client,
    start_moto_server,
)

FIGURES = ("put_p50_ms", "put_p99_ms", "get_p50_ms", "get_p99_ms", "write_mb_s", "read_mb_s")
UNITS = {"ms": "ms", "s": "MB/s"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 round, 10 samples, 8 MiB")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rounds = 1 if args.quick else args.rounds
    samples = 10 if args.quick else 50
    throughput = (8 if args.quick else 32) << 20

    with scratch_dir("stores") as root:
        servers = []
        try:
            moto = start_moto_server(root / "moto.log")
            servers.append(moto)
            s3_client(moto.endpoint).create_bucket(Bucket="fleet")
            openers: dict[str, Callable[[], Awaitable[Bucket]]] = {
                "moto (S3)": lambda: S3Bucket.open(
                    S3Config(
                        bucket="fleet",
                        endpoint_url=moto.endpoint,
                        region=REGION,
                        path_style=True,
                        access_key=ACCESS_KEY,
                        secret_key=SECRET_KEY,
                    )
                ),
            }
            if azurite_missing_reason() is None:
                from azure.storage.blob import BlobServiceClient

                from edge_gateway.bucket._azure import AzureBucket

                (root / "azurite").mkdir()
                azurite = start_azurite(root / "azurite")
                servers.append(azurite)
                conn = azurite_connection_string(azurite.endpoint)
                with BlobServiceClient.from_connection_string(conn) as svc:
                    svc.create_container("fleet")
                azure = AzureConfig(container="fleet", connection_string=conn)
                openers["Azurite (Azure Blob)"] = lambda: AzureBucket.open(azure)
            else:
                progress(f"skipping Azurite: {azurite_missing_reason()}")
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage

            from edge_gateway.bucket._gcs import GcsBucket

            gcs_server = start_gcs_emulator(root)
            servers.append(gcs_server)
            client = storage.Client(
                project="edgegw",
                credentials=AnonymousCredentials(),
                client_options={"api_endpoint": gcs_server.endpoint},
            )
            client.create_bucket("fleet")
            client.close()
            gcs = GcsConfig(bucket="fleet", endpoint_url=gcs_server.endpoint, anonymous=True)
            openers["gcp-storage-emulator (GCS)"] = lambda: GcsBucket.open(gcs)

            results: dict[str, list[dict[str, float]]] = {name: [] for name in openers}
            verdicts: dict[str, bool] = {}

            async def one(name: str) -> None:
                async with await openers[name]() as bucket:
                    report = await check_store(
                        bucket, "bench", samples=samples, throughput_bytes=throughput
                    )
                results[name].append(dict(report.figures))
                verdicts[name] = verdicts.get(name, True) and report.ok
                if not report.ok:
                    progress(f"  {name}: {'; '.join(c.name for c in report.failures)}")

            for r in range(rounds):
                for name in openers:
                    progress(f"round {r + 1}/{rounds}: {name} ...")
                    trio.run(one, name)
        finally:
            for server in servers:
                server.stop()

    base_name = "moto (S3)"
    base = {f: median([x[f] for x in results[base_name]]) for f in FIGURES}
    rows: list[Row | str] = []
    out: dict[str, object] = {"rounds": rounds, "samples": samples, "throughput_bytes": throughput}
    for name, runs in results.items():
        rows.append(f"{name}: contract {'holds' if verdicts[name] else 'FAILS'}")
        figures = {f: median([x[f] for x in runs]) for f in FIGURES}
        for f in FIGURES:
            unit = UNITS[f.rsplit("_", 1)[1]]
            rows.append(Row(f, figures[f], unit, f"moto {f}", base[f]))
        key = name.split(" ")[0].lower()
        out[key] = {**figures, "contract_ok": verdicts[name]}
    print(render_table("bucket check figures per store (medians over rounds)", rows))
    out["machine"] = machine_info(Path(__file__).resolve().parent)
    emit_json(out)


if __name__ == "__main__":
    main()
