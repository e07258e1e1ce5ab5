"""Plant a bad object where a region's next log entry goes (the scenario runner's bucket faults).

What a bit flip, a buggy tool or a leaked credential leaves in the bucket:
``garbage`` (random bytes), ``truncated`` (the region's newest entry cut
short) or ``foreign`` (another region's newest entry, valid bytes under the
wrong key). The region's gateway must set it aside and go on
(docs/protocol.md, "A corrupt object where the next entry goes"); its
mirrors must apply nothing of it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import trio

from edge_gateway.bucket import (
    Bucket,
    LocalBucket,
    NotFound,
    PreconditionFailed,
    S3Bucket,
    S3Config,
)
from edge_gateway.bucket_log import find_head
from edge_gateway.format.manifest import log_key

#: The bucket faults: ``plant_<kind>``.
KINDS: Final = ("garbage", "truncated", "foreign")


@dataclass(frozen=True)
class Planted:
    region: str
    kind: str
    key: str
    data: bytes


async def _open(bucket_dir: Path | None, s3: tuple[str, str] | None) -> Bucket:
    if s3 is not None:
        endpoint, name = s3
        return await S3Bucket.open(
            S3Config(
                bucket=name,
                endpoint_url=endpoint,
                path_style=True,
                region="us-east-1",
                access_key="testing",
                secret_key="testing",  # noqa: S106 (the scenario's own moto)
            )
        )
    assert bucket_dir is not None
    return await LocalBucket.open(bucket_dir)


async def _newest(bucket: Bucket, region: str) -> tuple[int, bytes]:
    head = await find_head(bucket, "", region)
    return head, (await bucket.get(log_key("", region, head))).data if head else b""


async def _plant(
    kind: str,
    region: str,
    others: list[str],
    seed: int,
    bucket_dir: Path | None,
    s3: tuple[str, str] | None,
) -> Planted | None:
    rnd = random.Random(seed)
    bucket = await _open(bucket_dir, s3)
    try:
        for _ in range(50):  # the gateway may take the seq first: aim at the next one
            head, newest = await _newest(bucket, region)
            if kind == "garbage" or not newest:
                data = rnd.randbytes(rnd.randrange(1, 4096))
            elif kind == "truncated":
                data = newest[: rnd.randrange(1, len(newest))]
            else:
                data = b""
                for other in others:
                    _, data = await _newest(bucket, other)
                    if data:
                        break
                data = data or rnd.randbytes(64)
            key = log_key("", region, head + 1)
            try:
                await bucket.put(key, data, if_none_match=True)
            except PreconditionFailed:
                continue
            return Planted(region, kind, key, data)
        return None
    finally:
        await bucket.aclose()


def plant(
    kind: str,
    region: str,
    others: list[str],
    *,
    seed: int,
    bucket_dir: Path | None = None,
    s3: tuple[str, str] | None = None,
) -> Planted | None:
    """Create a ``kind`` object at ``region``'s next seq; None if the gateway always won the seq."""
    return trio.run(_plant, kind, region, others, seed, bucket_dir, s3)


def still_there(p: Planted, *, bucket_dir: Path | None, s3: tuple[str, str] | None) -> bool:
    """Whether the planted bytes are still at their key (the gateway did not set them aside)."""

    async def check() -> bool:
        bucket = await _open(bucket_dir, s3)
        try:
            return (await bucket.get(p.key)).data == p.data
        except NotFound:  # set aside; the gateway had nothing to ship since
            return False
        finally:
            await bucket.aclose()

    return trio.run(check)
