"""Child process: ships a journal's backlog to S3 and dies (kill -9) before a completion.

Usage: python multipart_child.py JOURNAL_DIR ENDPOINT BUCKET

Claims region ``north`` and ships what the journal holds; the first
CompleteMultipartUpload of a log object is never sent: the process SIGKILLs
itself there, after every part of that upload is in -- what a power cut or
an OOM kill at that moment leaves behind.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import trio

from edge_gateway.bucket import S3Bucket, S3Config
from edge_gateway.journal import JournalConfig, open_journal
from edge_gateway.shipper import Shipper, ShipperConfig
from edge_gateway.testing.moto import ACCESS_KEY, REGION, SECRET_KEY

MIB = 1024 * 1024
CONFIG = ShipperConfig(max_object_bytes=16 * MIB, retry_base_s=0.05, retry_cap_s=0.5)
JOURNAL = JournalConfig(segment_bytes=1 * MIB, max_bytes=256 * MIB, retention_ms=0)


def s3_config(endpoint: str, bucket: str) -> S3Config:
    return S3Config.from_mapping(
        {
            "bucket": bucket,
            "endpoint_url": endpoint,
            "region": REGION,
            "path_style": True,
            "access_key": ACCESS_KEY,
            "secret_key": SECRET_KEY,
            "multipart_threshold": 5 * MIB,
            "part_size": 5 * MIB,
        }
    )


async def main(journal_dir: str, endpoint: str, bucket_name: str) -> None:
    bucket = await S3Bucket.open(s3_config(endpoint, bucket_name))
    client = bucket._client
    complete = client.complete_multipart_upload

    def die_before_log_completion(**kwargs: Any) -> Any:
        if "/log/" in kwargs["Key"]:  # not the store probe's upload
            os.kill(os.getpid(), signal.SIGKILL)
        return complete(**kwargs)

    client.complete_multipart_upload = die_before_log_completion  # type: ignore[method-assign]
    async with open_journal(Path(journal_dir), JOURNAL) as j:
        shipper = Shipper(j, bucket, "north", config=CONFIG)
        await shipper.claim()
        await shipper.ship_pending()
    sys.exit("shipped without reaching a completion")


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:4])
