"""moto's S3 server for the test suite: re-exported from :mod:`edge_gateway.testing.moto`."""

from edge_gateway.testing.moto import (
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    LoggedRequest,
    MotoServer,
    free_port,
    start_moto_server,
)

__all__ = [
    "ACCESS_KEY",
    "REGION",
    "SECRET_KEY",
    "LoggedRequest",
    "MotoServer",
    "free_port",
    "start_moto_server",
]
