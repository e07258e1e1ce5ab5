"""One Spark session (local[2]) shared by the local-mode pipeline tests.

Starting a JVM costs seconds; every local-mode test takes the same session.
Without Java the tests fail with a clear message: they never skip silently.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest


def _require_java() -> None:
    from edge_gateway.errors import ConfigError
    from edge_gateway.pipeline.session import check_java

    try:
        check_java()
    except ConfigError as exc:
        pytest.fail(f"pipeline tests need Java: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    _require_java()
    from edge_gateway.pipeline.session import make_session

    session = make_session(
        "local[2]",
        app_name="edgegw-tests",
        conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
    )
    try:
        yield session
    finally:
        session.stop()
        os.environ.pop("PYSPARK_GATEWAY_PORT", None)
