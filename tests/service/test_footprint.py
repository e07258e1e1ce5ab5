"""A gateway imports only what its configuration uses (docs/operations.md, "Footprint").

Each test starts a real ``edgegw serve`` (the console script's entry point, in
a child process: :mod:`footprint_child`) and reads the modules it had
imported once it was ready. boto3 is for an S3 bucket, hypercorn for
``api.server = "hypercorn"``, httpx for a metadata server, typer, rich and
pydantic for the other commands, Starlette for the metadata server: a gateway
on a local-directory bucket loads none of them. The positive cases (hypercorn
when chosen, botocore with an S3 bucket) show that the list is read late
enough to see them; an Azure bucket loads the Azure SDK and not boto3.

Speed and memory are measured by ``bench/footprint.py``, not asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _serve import _toml_value

from edge_gateway.testing.emulators import azurite_connection_string
from edge_gateway.testing.moto import ACCESS_KEY, REGION, SECRET_KEY

CHILD = Path(__file__).with_name("footprint_child.py")

#: Top-level packages a gateway loads only when its configuration asks for them.
BY_CONFIG = {
    "s3 bucket": ("boto3", "botocore", "s3transfer", "urllib3"),
    "azure bucket": ("azure", "requests", "isodate"),
    "gcs bucket": ("google", "requests", "proto"),
    "hypercorn": ("hypercorn", "h2", "wsproto", "priority", "hpack"),
    "metadata server": ("httpx", "httpcore"),
    "mqtt bridge": ("paho",),
}
#: Never in a gateway: the command line's other commands, the pipeline, and
#: Starlette with anyio and asyncio (the metadata server's; the local API has
#: its own routing: edge_gateway.net.asgi).
NEVER = (
    *("typer", "click", "rich", "pydantic", "pydantic_core", "pyarrow", "pyspark", "moto"),
    *("starlette", "anyio", "asyncio"),
)


def _serve_modules(tmp_path: Path, sections: dict[str, dict[str, object]]) -> set[str]:
    data_dir = tmp_path / "data"
    lines = ['region = "north"', f"data_dir = {_toml_value(data_dir)}"]
    sections = {"api": {"listen": "127.0.0.1:0"}, **sections}
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    lines += ["[[topics]]", 'name = "telemetry"', 'home = "north"', "partitions = 4"]
    config = tmp_path / "edgegw.toml"
    config.write_text("\n".join(lines) + "\n")
    res = subprocess.run(
        [sys.executable, str(CHILD), str(data_dir), "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    modules: list[str] = json.loads(res.stdout.strip().splitlines()[-1])
    assert "edge_gateway.gateway" in modules  # read while the gateway ran
    return set(modules)


def _loaded(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in packages)


def test_a_local_bucket_gateway_loads_no_optional_package(tmp_path: Path) -> None:
    modules = _serve_modules(tmp_path, {"api": {"listen": "127.0.0.1:0", "server": "builtin"}})
    for what, packages in BY_CONFIG.items():
        assert not _loaded(modules, packages), f"loaded without a {what}"
    assert not _loaded(modules, NEVER)
    # Neither the typer application nor the S3 and metadata clients' modules.
    unused = ("edgegw_cli._typer_app", "edge_gateway.bucket._s3", "edge_gateway.metadata.client")
    assert not modules & set(unused)
    # crc32c's C function without the package (its __init__ loads these two).
    assert not modules & {"crc32c", "importlib.metadata", "argparse"}
    # prometheus_client loads at the first scrape of /metrics, not at start.
    assert not _loaded(modules, ("prometheus_client",))
    assert "edge_gateway.metrics" in modules


def test_hypercorn_loads_only_when_it_is_the_server(tmp_path: Path) -> None:
    modules = _serve_modules(tmp_path, {"api": {"listen": "127.0.0.1:0", "server": "hypercorn"}})
    assert "hypercorn.trio" in modules
    assert not _loaded(modules, BY_CONFIG["s3 bucket"] + BY_CONFIG["metadata server"] + NEVER)


def test_an_s3_bucket_loads_botocore(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    bucket = {
        "type": "s3",
        "bucket": s3_bucket_name,
        "endpoint_url": moto_endpoint,
        "region": REGION,
        "path_style": True,
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
    }
    modules = _serve_modules(tmp_path, {"bucket": bucket})
    assert "botocore" in modules  # the S3 bucket uses botocore directly
    assert "edge_gateway.bucket._s3" in modules
    assert not _loaded(modules, BY_CONFIG["metadata server"] + NEVER)
    assert not _loaded(modules, ("azure", "google"))


def test_an_azure_bucket_loads_its_sdk_and_not_boto3(
    tmp_path: Path, azurite_endpoint: str, azure_container_name: str
) -> None:
    bucket = {
        "type": "azure",
        "container": azure_container_name,
        "connection_string": azurite_connection_string(azurite_endpoint),
    }
    modules = _serve_modules(tmp_path, {"bucket": bucket})
    assert "azure.storage.blob" in modules
    assert "edge_gateway.bucket._azure" in modules
    assert not _loaded(modules, ("boto3", "botocore", "google", *BY_CONFIG["metadata server"]))
    # azure-core imports asyncio (unused: the SDK's sync client runs in trio's
    # worker threads); nothing else of NEVER.
    never = tuple(p for p in NEVER if p != "asyncio")
    assert not _loaded(modules, never), _loaded(modules, never)


@pytest.mark.parametrize(
    "argv",
    [["serve", "--config", "X"], ["serve", "-c", "X"], ["serve", "--config=X"], ["-v", "serve"]],
)
def test_plain_serve_command_lines_skip_typer(argv: list[str]) -> None:
    from edgegw_cli.app import serve_arguments

    verbose, config = serve_arguments(argv) or (None, None)
    assert config == ("edgegw.toml" if argv == ["-v", "serve"] else "X")
    assert verbose == (argv[0] == "-v")


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--help"],
        ["serve", "--config"],
        ["serve", "--config", "X", "--bogus"],
        ["serve", "-c", "--help"],
        ["serv"],
        ["status"],
        [],
    ],
)
def test_other_command_lines_go_through_typer(argv: list[str]) -> None:
    from edgegw_cli.app import serve_arguments

    assert serve_arguments(argv) is None
