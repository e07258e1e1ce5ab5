"""`edgegw serve` on the emulated cloud stores, as operated: a real process.

On Azurite, `edgegw sync` refuses a container that is not an edgegw bucket
until told ``--new-bucket``, then claims the region there (its fence entry is
the log's first object) and recognises the bucket on the next run (two
gateways mirroring through Azurite: tests/system/test_fleet.py). On
gcp-storage-emulator,
which ignores ``ifGenerationMatch``, it refuses to start, naming the store and
why, as it refuses s3rver.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from _serve import EDGEGW

from edge_gateway.testing.emulators import azurite_connection_string


def _config(tmp_path: Path, bucket: str) -> Path:
    config = tmp_path / "edgegw.toml"
    config.write_text(
        f'region = "north"\ndata_dir = "{tmp_path / "data"}"\n\n{bucket}\n'
        '[api]\nlisten = "127.0.0.1:0"\n\n'
        '[[topics]]\nname = "t"\nhome = "north"\npartitions = 1\n'
    )
    return config


def test_serve_refuses_the_gcs_emulator(
    tmp_path: Path, gcs_emulator_endpoint: str, gcs_bucket_name: str
) -> None:
    config = _config(
        tmp_path,
        f'[bucket]\ntype = "gcs"\nbucket = "{gcs_bucket_name}"\n'
        f'endpoint_url = "{gcs_emulator_endpoint}"\nanonymous = true\n',
    )
    proc = subprocess.run(
        [str(EDGEGW), "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert f"GCS bucket {gcs_bucket_name!r}" in errors[0]
    assert "ifGenerationMatch=0 on GCS" in errors[0]
    assert "refuses to run unfenced" in errors[0]


def test_sync_ships_to_an_azure_container(
    tmp_path: Path, azurite_endpoint: str, azure_container_name: str
) -> None:
    (tmp_path / "conn").write_text(azurite_connection_string(azurite_endpoint))
    config = _config(
        tmp_path,
        f'[bucket]\ntype = "azure"\ncontainer = "{azure_container_name}"\n'
        f'connection_string_file = "{tmp_path / "conn"}"\n',
    )

    def sync(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(EDGEGW), "sync", "--config", str(config), *extra],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            check=False,
        )

    refused = sync()
    assert refused.returncode == 1
    assert "is not an edgegw bucket" in refused.stderr
    assert f"Azure container {azure_container_name!r}" in refused.stderr
    proc = sync("--new-bucket")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = sync()
    assert again.returncode == 0, again.stdout + again.stderr
    from azure.storage.blob import ContainerClient

    with ContainerClient.from_connection_string(
        azurite_connection_string(azurite_endpoint), azure_container_name
    ) as container:
        names = [b.name for b in container.list_blobs()]
    # The fence entry that claims the region is the log's first object.
    assert any(n.startswith("regions/north/log/") for n in names), names
