"""Object storage behind one small async interface (see ``docs/bucket.md``).

:class:`Bucket` is the interface: ``put`` (with atomic create-only and
compare-and-swap), ranged ``get``, ``head``, sorted ``list`` and idempotent
``delete``. Backends:

* :class:`S3Bucket` — any S3-compatible store through boto3 (AWS, MinIO, R2,
  Ceph, moto's server), configured by :class:`S3Config`;
* :class:`AzureBucket` — an Azure Blob Storage container (``edgegw[azure]``),
  configured by :class:`AzureConfig`;
* :class:`GcsBucket` — a Google Cloud Storage bucket through its JSON API
  (``edgegw[gcs]``), configured by :class:`GcsConfig`;
* :class:`LocalBucket` — a local or shared-mount directory, the embedded default;
* :class:`FaultyBucket` — wraps either and injects outages, latency, errors
  and lost responses, for tests;
* :class:`MeteredBucket` — wraps either with the site's :class:`LinkMeter`
  (a bandwidth cap, bytes per day and month);
* :class:`HeldBucket` — holds the mirrors' reads of log objects while the site's
  :class:`LinkPolicy` (bulk windows, byte allowances) says wait.

:func:`verify_conditional_create` refuses stores that ignore create-only puts,
because fencing depends on them; :func:`check_store` (``edgegw bucket check``)
runs the whole contract against a store and measures it. :class:`DenialTracker` keeps (and logs) a
component's refusal by the store, which callers retry like an outage.

:class:`SyncBucket` is a blocking facade for code that is not trio (the PySpark
pipeline's driver and workers): it opens a backend from its config
(:class:`LocalConfig`, :class:`S3Config`, :class:`AzureConfig`, :class:`GcsConfig`;
:func:`open_bucket` does the same for async code) in a loop thread of its own.

:class:`S3Bucket` loads on first use (with boto3 and botocore: ~100 ms and
~15 MB), so a gateway on a local-directory bucket never imports them;
:class:`S3Config` does not need them. Likewise :class:`AzureBucket` and
:class:`GcsBucket` load their SDKs on first use; ``docs/stores.md`` says
which stores were tested and how.
"""

from typing import TYPE_CHECKING

from edge_gateway._lazy import lazy_attributes
from edge_gateway.bucket._base import (
    MAX_KEY_BYTES,
    OPERATIONS,
    Bucket,
    BucketStatistics,
    GetResult,
    ObjectInfo,
    validate_key,
    validate_prefix,
)
from edge_gateway.bucket._check import (
    FAIL,
    INFO,
    PASS,
    WORKAROUND,
    CheckResult,
    StoreReport,
    check_store,
)
from edge_gateway.bucket._cloudconfig import AzureConfig, GcsConfig
from edge_gateway.bucket._denied import Denial, DenialTracker
from edge_gateway.bucket._errors import (
    AccessDenied,
    BucketError,
    BucketGone,
    BucketUnavailable,
    InvalidRequest,
    NoSuchBucket,
    NotFound,
    PreconditionFailed,
    UnsupportedStore,
    denied_action,
)
from edge_gateway.bucket._faulty import FaultyBucket
from edge_gateway.bucket._link import LinkMeter, LinkStatistics, MeteredBucket
from edge_gateway.bucket._linkpolicy import (
    PRIORITIES,
    HeldBucket,
    LinkGate,
    LinkPolicy,
    LinkPolicyStats,
    Priority,
    Usage,
    Window,
    parse_window,
)
from edge_gateway.bucket._local import LocalBucket
from edge_gateway.bucket._open import open_cloud_bucket
from edge_gateway.bucket._probe import probe_key, verify_conditional_create
from edge_gateway.bucket._s3config import S3Config
from edge_gateway.bucket._sync import LocalConfig, StoreConfig, SyncBucket, open_bucket

if TYPE_CHECKING:
    from edge_gateway.bucket._azure import AzureBucket
    from edge_gateway.bucket._gcs import GcsBucket
    from edge_gateway.bucket._s3 import S3Bucket

__all__ = [
    "FAIL",
    "INFO",
    "MAX_KEY_BYTES",
    "OPERATIONS",
    "PASS",
    "PRIORITIES",
    "WORKAROUND",
    "AccessDenied",
    "AzureBucket",
    "AzureConfig",
    "Bucket",
    "BucketError",
    "BucketGone",
    "BucketStatistics",
    "BucketUnavailable",
    "CheckResult",
    "Denial",
    "DenialTracker",
    "FaultyBucket",
    "GcsBucket",
    "GcsConfig",
    "GetResult",
    "HeldBucket",
    "InvalidRequest",
    "LinkGate",
    "LinkMeter",
    "LinkPolicy",
    "LinkPolicyStats",
    "LinkStatistics",
    "LocalBucket",
    "LocalConfig",
    "MeteredBucket",
    "NoSuchBucket",
    "NotFound",
    "ObjectInfo",
    "PreconditionFailed",
    "Priority",
    "S3Bucket",
    "S3Config",
    "StoreConfig",
    "StoreReport",
    "SyncBucket",
    "UnsupportedStore",
    "Usage",
    "Window",
    "check_store",
    "denied_action",
    "open_bucket",
    "open_cloud_bucket",
    "parse_window",
    "probe_key",
    "verify_conditional_create",
    "validate_key",
    "validate_prefix",
]

__getattr__ = lazy_attributes(
    __name__,
    {
        "S3Bucket": "edge_gateway.bucket._s3",
        "AzureBucket": "edge_gateway.bucket._azure",
        "GcsBucket": "edge_gateway.bucket._gcs",
    },
)
