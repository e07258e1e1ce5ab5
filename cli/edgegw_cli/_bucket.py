"""Opening the bucket a command names, and refusing one that is not edgegw's.

``edgegw restore``, ``sync`` and ``reship`` act on what the bucket holds for a
region. Pointed at the wrong place -- a mistyped directory, another bucket or
prefix -- they would find an empty log and carry on as if the region were
new: offsets would start again at 0. So they open the bucket without creating
anything and require an edgegw bucket (``edge_gateway.bucket_log.is_edgegw_bucket``:
its marker, or region logs written before markers existed), unless the
operator says ``--new-bucket``: then a missing local directory is made and
the marker written. S3 buckets are never created.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import typer

from edge_gateway.bucket import (
    AccessDenied,
    Bucket,
    LocalBucket,
    NoSuchBucket,
    S3Bucket,
    S3Config,
)
from edge_gateway.bucket_log import is_edgegw_bucket, mark_bucket
from edgegw_cli._common import note

#: Opens a bucket (``create``: a missing local bucket may be made) -> (bucket, key prefix).
Opener = Callable[[bool], Awaitable[tuple[Bucket, str]]]

NEW_BUCKET_HINT = "pass --new-bucket to use it as a new bucket"


async def open_bucket(
    bucket_dir: Path | None,
    s3_bucket: str | None,
    s3_endpoint: str | None,
    s3_prefix: str,
    s3_path_style: bool,
    *,
    create: bool = False,
) -> tuple[Bucket, str]:
    """The bucket the options name, and the key prefix to use in it.

    A local directory is made only with ``create``; a missing S3 bucket is
    :class:`NoSuchBucket` either way.
    """
    if s3_bucket:
        cfg = S3Config(
            bucket=s3_bucket, endpoint_url=s3_endpoint, path_style=s3_path_style, prefix=s3_prefix
        )
        bucket = await S3Bucket.open(cfg)
        try:
            await bucket.check_exists()
        except BaseException:
            await bucket.aclose()
            raise
        return bucket, ""
    if bucket_dir is None:
        raise typer.BadParameter("give --bucket-dir or --s3-bucket")
    return await LocalBucket.open(bucket_dir, create=create), ""


async def open_edgegw_bucket(
    opener: Opener, *, local: bool, region: str, new_bucket: bool
) -> tuple[Bucket, str]:
    """Open with ``opener`` and require an edgegw bucket, unless ``new_bucket``.

    With ``new_bucket`` a missing local directory is made and a bucket
    without edgegw data gets the marker; an existing edgegw bucket is used as
    it is. Raises :class:`NoSuchBucket` with a hint otherwise.
    """
    try:
        bucket, prefix = await opener(new_bucket)
    except NoSuchBucket as exc:
        if local and not new_bucket:
            raise NoSuchBucket(f"{exc}; check the name or path, or {NEW_BUCKET_HINT}") from None
        raise
    try:
        if not await is_edgegw_bucket(bucket, prefix):
            if not new_bucket:
                where = f"{bucket.describe()}" + (f" (key prefix {prefix!r})" if prefix else "")
                raise NoSuchBucket(
                    f"{where} is not an edgegw bucket: it has no valid edgegw-bucket.json and no "
                    "region logs under regions/ (a typo in the bucket, prefix or directory?); "
                    f"{NEW_BUCKET_HINT}"
                )
            try:
                await mark_bucket(bucket, prefix, region, time.time_ns() // 1_000_000)
            except AccessDenied as exc:
                # A region's policy does not grant the fleet marker: it is the
                # admin's (edgegw bucket mark). The region's log, once written,
                # makes the bucket recognisable anyway.
                note(
                    f"note: {bucket.describe()} has no fleet marker and this identity may not "
                    f"write it ({exc.code}): the admin "
                    "writes it once (edgegw bucket mark)"
                )
    except BaseException:
        await bucket.aclose()
        raise
    return bucket, prefix
