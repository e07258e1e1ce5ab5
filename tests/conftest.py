"""Fixtures shared by the whole suite.

``moto_endpoint`` starts one moto S3 server for the session (lazily: only
tests that ask for it, directly or through ``s3_bucket_name``, pay for it);
``s3_bucket_name`` gives each test a fresh, empty bucket on it, so tests are
isolated without restarting the server; ``moto_server`` is that server itself,
for tests that count requests in its log (filtered by their bucket).
``moto_auth`` is a second server that enforces authentication (IAM users and
keys that a test can revoke).
``quirky_s3(quirks)`` starts (once per session and set of quirks) a moto
server behind the conditional-write quirks of another store -- Ceph RGW
16.2, s3rver -- see tests/_quirky_s3.py. ``rgw_endpoint`` starts a real
single-node Ceph cluster with RGW for the session (tests/_rgw.py), for the
tests marked ``rgw`` (``pytest -m rgw``, ``make test-stores``; deselected by
default); ``rgw_bucket_name`` gives each test a fresh bucket on it.
``azurite_endpoint`` and ``gcs_emulator_endpoint`` start Azurite (Azure Blob)
and gcp-storage-emulator (GCS) for the session (edge_gateway/testing/emulators.py; about a
second each); ``azure_container_name`` and ``gcs_bucket_name`` give each
test a fresh container / bucket.

Under pytest-xdist (``make pytest`` runs ``-n N --dist loadscope``) every
worker starts its own session servers, on ports of its own slice
(edge_gateway/testing/ports.py). The hooks below hand out whole modules, in
file order, so that a module's fixtures start once and its tests run as in a
plain run; all of tests/pipeline goes to one worker (one Spark JVM, not one
per worker); and the modules with tests marked ``slow`` go out first, so that
no long module starts last.
"""

from __future__ import annotations

import os

# An xdist worker is started with COLUMNS=80 and LINES=24 in its environment
# (the controller's terminal, or execnet's default), which a plain run does not
# have: the CLI's console (edgegw_cli._common) would then wrap its tables at 80
# columns and cut the cells that tests read. Drop them before anything imports
# the CLI, so that a worker sees what a plain run sees.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
from _moto_auth import AuthMoto
from _quirky_s3 import start_quirky_s3
from _rgw import ACCESS_KEY as RGW_ACCESS_KEY
from _rgw import PACKAGES as RGW_PACKAGES
from _rgw import SECRET_KEY as RGW_SECRET_KEY
from _rgw import missing_binaries, start_rgw

from edge_gateway.testing import emulators
from edge_gateway.testing.moto import MotoServer, s3_client, start_moto_server

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client


#: Folders whose tests all run on one xdist worker: the Spark session (a JVM)
#: is one per worker process.
_ONE_WORKER_FOLDERS = ("tests/pipeline/",)


def _work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: its module, or one of ``_ONE_WORKER_FOLDERS``."""
    module = nodeid.split("::", 1)[0]
    return next((f for f in _ONE_WORKER_FOLDERS if module.startswith(f)), module)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope``, by module (not by class), with ``_ONE_WORKER_FOLDERS``.

    (Not ``--dist loadgroup`` with ``xdist_group`` marks: pytest-xdist 3.8
    renames the marked tests' ``item._nodeid``, which pytest 9.2 no longer
    reads, so the marks are silently ignored there.)
    """
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """On xdist workers: the work units with ``slow`` tests first (a stable sort).

    With ``--no-loadscope-reorder`` the controller hands out the units in
    this order (by default it sorts them by their number of tests). A plain
    run keeps pytest's order.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow = {_work_unit(item.nodeid) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: _work_unit(item.nodeid) not in slow)


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """The session's moto S3 server (its request log: ``requests(since=log_position())``)."""
    server = start_moto_server(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto_endpoint(moto_server: MotoServer) -> str:
    """``http://127.0.0.1:PORT`` of a moto S3 server running for the session."""
    return moto_server.endpoint


@pytest.fixture(scope="session")
def s3_admin(moto_endpoint: str) -> Iterator[S3Client]:
    """A plain boto3 client on the moto server, for setting up and inspecting buckets."""
    client = s3_client(moto_endpoint)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def s3_bucket_name(s3_admin: S3Client) -> str:
    """A new, empty bucket on the moto server, unique to the test."""
    name = f"edgegw-test-{uuid.uuid4().hex[:16]}"
    s3_admin.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def moto_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthMoto]:
    """A moto server that checks signatures and IAM (see ``tests/_moto_auth.py``)."""
    server = AuthMoto.start(tmp_path_factory.mktemp("moto-auth") / "moto.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def quirky_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., str]]:
    """``quirky_s3("bare-if-match", ...)``: the endpoint of a moto server with those quirks.

    One server per set of quirks for the session; each test makes its own
    bucket on it (``_quirky_s3.new_bucket_on``).
    """
    servers: dict[frozenset[str], MotoServer] = {}

    def endpoint(*quirks: str) -> str:
        key = frozenset(quirks)
        if key not in servers:
            log = tmp_path_factory.mktemp("quirky-s3") / "server.log"
            servers[key] = start_quirky_s3(log, key)
        return servers[key].endpoint

    try:
        yield endpoint
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture(scope="session")
def rgw_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a Ceph RGW (one mon, one memstore OSD) for the session."""
    missing = missing_binaries()
    if missing:
        pytest.skip(
            f"Ceph is not installed ({', '.join(missing)} missing): "
            f"apt-get install -y {' '.join(RGW_PACKAGES)}, or run make test-stores"
        )
    cluster = start_rgw(tmp_path_factory.mktemp("rgw"))
    try:
        yield cluster.endpoint
    finally:
        cluster.stop()


@pytest.fixture
def rgw_bucket_name(rgw_endpoint: str) -> str:
    """A new, empty bucket on the session's RGW, unique to the test."""
    import boto3
    import botocore.config

    name = f"edgegw-test-{uuid.uuid4().hex[:16]}"
    client = boto3.client(
        "s3",
        endpoint_url=rgw_endpoint,
        region_name="us-east-1",
        aws_access_key_id=RGW_ACCESS_KEY,
        aws_secret_access_key=RGW_SECRET_KEY,
        config=botocore.config.Config(s3={"addressing_style": "path"}),
    )
    try:
        client.create_bucket(Bucket=name)
    finally:
        client.close()
    return name


@pytest.fixture(scope="session")
def azurite_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``http://127.0.0.1:PORT/devstoreaccount1``: Azurite's blob service for the session."""
    reason = emulators.azurite_missing_reason()
    if reason is not None:
        pytest.skip(reason)
    server = emulators.start_azurite(tmp_path_factory.mktemp("azurite"))
    try:
        yield server.endpoint
    finally:
        server.stop()


@pytest.fixture
def azure_container_name(azurite_endpoint: str) -> str:
    """A new, empty container on the session's Azurite, unique to the test."""
    from azure.storage.blob import BlobServiceClient

    name = f"edgegw-test-{uuid.uuid4().hex[:16]}"
    connection = emulators.azurite_connection_string(azurite_endpoint)
    with BlobServiceClient.from_connection_string(connection) as service:
        service.create_container(name)
    return name


@pytest.fixture(scope="session")
def gcs_emulator_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of gcp-storage-emulator (in memory) for the session."""
    server = emulators.start_gcs_emulator(tmp_path_factory.mktemp("gcs"))
    try:
        yield server.endpoint
    finally:
        server.stop()


@pytest.fixture
def gcs_bucket_name(gcs_emulator_endpoint: str) -> str:
    """A new, empty bucket on the session's GCS emulator, unique to the test."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    name = f"edgegw-test-{uuid.uuid4().hex[:16]}"
    client = storage.Client(
        project="edgegw",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": gcs_emulator_endpoint},
    )
    try:
        client.create_bucket(name)
    finally:
        client.close()
    return name
