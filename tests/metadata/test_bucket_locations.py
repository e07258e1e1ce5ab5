"""Bucket locations on the metadata server name every store type, without credentials."""

from __future__ import annotations

import pytest

from edge_gateway.errors import InvalidInput
from edge_gateway.metadata.routing import parse_bucket_settings

#: The API contract is the same on every store (conftest.py runs these on each).
STORES = ("sqlite", "postgres")


@pytest.mark.parametrize(
    "doc",
    [
        {"type": "s3", "bucket": "fleet", "endpoint_url": "https://minio.example:9000"},
        {"type": "local", "path": "/srv/bucket"},
        {"type": "azure", "container": "fleet", "prefix": "edge"},
        {"type": "gcs", "bucket": "fleet"},
    ],
)
def test_each_store_type_is_a_location(doc: dict[str, object]) -> None:
    assert parse_bucket_settings(doc) == doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"type": "azure", "bucket": "fleet"}, "'container' is required when type is 'azure'"),
        ({"type": "gcs"}, "'bucket' is required when type is 'gcs'"),
        ({"type": "ftp"}, "type must be 's3', 'local', 'azure' or 'gcs'"),
        ({"type": "azure", "container": "c", "connection_string": "x"}, "connection_string"),
    ],
)
def test_bad_locations_are_refused(doc: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput) as excinfo:
        parse_bucket_settings(doc)
    assert message in str(excinfo.value)
