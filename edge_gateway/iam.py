"""IAM policies that confine each identity of a fleet to the keys it must write.

What each region does in the bucket (docs/protocol.md, "Bucket layout") and
so what its policy grants:

* **reads** everything under the fleet's prefix (GET, LIST): the logs,
  manifests and GC boundaries of the regions it mirrors, the cursors of its
  own readers, its own log (claim, reconciliation);
* **writes and deletes only under its own** ``regions/<region>/``: log
  entries and manifests (create-only PUTs, multipart for large ones, which
  S3 authorizes as ``s3:PutObject``), the GC boundary (compare-and-swap),
  the store probe at claim, and the deletions of its bucket GC;
* **writes its own cursor** in every source's folder,
  ``regions/*/cursors/<region>.json`` (it never deletes one).

The fleet marker ``edgegw-bucket.json`` is the admin's to write (``edgegw
bucket mark``): IAM cannot tell a create from an overwrite, and a region
allowed to create it could replace it. (AWS's ``s3:if-none-match``
condition key would confine a grant to creates, but moto does not evaluate
it -- it lets a plain overwrite through -- so that design could not be
tested here; tests/system/test_iam.py.)

So a stolen device's key can rewrite or delete its own region's log, and
its own cursors, and nothing of any other region nor of the fleet. The
pipeline reads only; the admin may do everything under the prefix
(docs/security.md).

The policies are plain data (sans-IO); ``edgegw iam policy`` prints them.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from edge_gateway.errors import InvalidInput
from edge_gateway.format.manifest import region_prefix
from edge_gateway.mirror.cursor import cursor_key
from edge_gateway.names import validate_region

Role = Literal["region", "pipeline", "admin"]

ROLES: Final[tuple[Role, ...]] = ("region", "pipeline", "admin")

_VERSION: Final = "2012-10-17"


def _arn(partition: str, bucket: str, key: str = "") -> str:
    return f"arn:{partition}:s3:::{bucket}" + (f"/{key}" if key else "")


def _check(bucket: str, prefix: str, partition: str) -> str:
    """The prefix as the key layout uses it ("" or ending in "/"); refuses wildcards."""
    if not bucket or any(c in bucket for c in "*?/ "):
        raise InvalidInput(f"bad bucket name {bucket!r}: a bucket name, without s3:// or '/'")
    if any(c in prefix for c in "*?$"):
        raise InvalidInput(f"bad key prefix {prefix!r}: '*', '?' and '$' are IAM wildcards")
    if partition not in ("aws", "aws-cn", "aws-us-gov"):
        raise InvalidInput(f"unknown AWS partition {partition!r} (aws, aws-cn, aws-us-gov)")
    return f"{prefix.strip('/')}/" if prefix.strip("/") else ""


def _read_statements(bucket: str, base: str, partition: str) -> list[dict[str, Any]]:
    listing: dict[str, Any] = {
        "Sid": "EdgegwListFleet",
        "Effect": "Allow",
        "Action": ["s3:ListBucket"],
        "Resource": _arn(partition, bucket),
    }
    if base:
        listing["Condition"] = {"StringLike": {"s3:prefix": [f"{base}*"]}}
    return [
        {
            "Sid": "EdgegwReadFleet",
            "Effect": "Allow",
            "Action": ["s3:GetObject"],
            "Resource": _arn(partition, bucket, f"{base}*"),
        },
        listing,
    ]


def region_policy(
    bucket: str, prefix: str, region: str, *, partition: str = "aws"
) -> dict[str, Any]:
    """The policy of one region's gateways: read the fleet, write only its own keys."""
    base = _check(bucket, prefix, partition)
    validate_region(region)
    return {
        "Version": _VERSION,
        "Statement": [
            *_read_statements(bucket, base, partition),
            {
                "Sid": "EdgegwWriteOwnRegion",
                "Effect": "Allow",
                "Action": ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                "Resource": _arn(partition, bucket, f"{region_prefix(base, region)}*"),
            },
            {
                # A claim aborts the unfinished multipart uploads of its own
                # log (crash leftovers); listing them is a bucket-level
                # action that AWS cannot narrow by prefix. It shows the keys
                # and ids of uploads in progress, nothing of their data.
                "Sid": "EdgegwListUploads",
                "Effect": "Allow",
                "Action": ["s3:ListBucketMultipartUploads"],
                "Resource": _arn(partition, bucket),
            },
            {
                "Sid": "EdgegwWriteOwnCursors",
                "Effect": "Allow",
                "Action": ["s3:PutObject"],
                # cursor_key's layout, with every source: regions/*/cursors/<region>.json.
                "Resource": _arn(
                    partition, bucket, cursor_key(base, "SOURCE", region).replace("SOURCE", "*", 1)
                ),
            },
        ],
    }


def pipeline_policy(bucket: str, prefix: str, *, partition: str = "aws") -> dict[str, Any]:
    """The analytics pipeline's policy: read-only (its tables are written elsewhere)."""
    base = _check(bucket, prefix, partition)
    return {"Version": _VERSION, "Statement": _read_statements(bucket, base, partition)}


def admin_policy(bucket: str, prefix: str, *, partition: str = "aws") -> dict[str, Any]:
    """An operator's policy: everything under the fleet's prefix (restore, reship, cleanup)."""
    base = _check(bucket, prefix, partition)
    return {
        "Version": _VERSION,
        "Statement": [
            *_read_statements(bucket, base, partition),
            {
                "Sid": "EdgegwAdminObjects",
                "Effect": "Allow",
                "Action": [
                    "s3:GetObject",
                    "s3:PutObject",
                    "s3:DeleteObject",
                    "s3:AbortMultipartUpload",
                    "s3:ListMultipartUploadParts",
                ],
                "Resource": _arn(partition, bucket, f"{base}*"),
            },
            {
                "Sid": "EdgegwAdminUploads",
                "Effect": "Allow",
                "Action": ["s3:ListBucketMultipartUploads"],
                "Resource": _arn(partition, bucket),
            },
        ],
    }


def policy(
    role: Role, bucket: str, prefix: str, region: str = "", *, partition: str = "aws"
) -> dict[str, Any]:
    """The policy of ``role`` (``region`` needs the region's name)."""
    if role == "region":
        if not region:
            raise InvalidInput("a region's policy needs --region NAME")
        return region_policy(bucket, prefix, region, partition=partition)
    if region:
        raise InvalidInput(f"--region is for a region's policy, not the {role}'s")
    if role == "pipeline":
        return pipeline_policy(bucket, prefix, partition=partition)
    if role == "admin":
        return admin_policy(bucket, prefix, partition=partition)
    raise InvalidInput(f"unknown role {role!r} (one of: {', '.join(ROLES)})")
