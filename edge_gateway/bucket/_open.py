"""Opening a bucket on a cloud store from its config, loading only that store's SDK."""

from __future__ import annotations

from edge_gateway.bucket._base import Bucket
from edge_gateway.bucket._cloudconfig import AzureConfig, GcsConfig
from edge_gateway.bucket._s3config import S3Config
from edge_gateway.errors import ConfigError

#: The ``[bucket] type`` of each cloud config, and the extra that brings its SDK.
_EXTRAS = {AzureConfig: ("azure", "azure-storage-blob"), GcsConfig: ("gcs", "google-cloud-storage")}


async def open_cloud_bucket(config: S3Config | AzureConfig | GcsConfig) -> Bucket:
    """Open the bucket ``config`` describes (no request yet: see ``Bucket.check_exists``).

    Imports the store's SDK here and only here (boto3 for S3 ...), so a
    gateway loads just the one it uses. A missing optional SDK is a
    :class:`ConfigError` naming the extra to install.
    """
    if isinstance(config, S3Config):
        from edge_gateway.bucket._s3 import S3Bucket

        return await S3Bucket.open(config)
    extra, package = _EXTRAS[type(config)]
    try:
        if isinstance(config, AzureConfig):
            from edge_gateway.bucket._azure import AzureBucket

            return await AzureBucket.open(config)
        from edge_gateway.bucket._gcs import GcsBucket

        return await GcsBucket.open(config)
    except ImportError as exc:
        raise ConfigError(
            f"bucket.type = {extra!r} needs the {package} package: "
            f"pip install 'edgegw[{extra}]' ({exc})"
        ) from None
