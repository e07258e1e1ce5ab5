"""``edgegw encryption keygen``: a new key file for ``[encryption]``."""

from __future__ import annotations

from pathlib import Path

import typer

from edgegw_cli._common import console, fail

app = typer.Typer(
    help="Keys for client-side encryption of log objects (AES-256-GCM).",
    no_args_is_help=True,
)


@app.command()
def keygen(
    path: Path = typer.Option(
        ...,
        "--output",
        "-o",
        help="The key file to create, named <key id>.key (e.g. north-2026-11.key); "
        "never overwritten.",
    ),
) -> None:
    """Write a new random 32-byte key to a file of mode 0600; its id is the file name.

    Give it to the region's gateways as encryption.key_file, and to every
    reader of that region (mirrors: encryption.sources.REGION.key_files;
    the pipeline: --key-file REGION=PATH). docs/operations.md, "Encryption
    keys and rotation", says how to roll a new key out.

    Example: edgegw encryption keygen -o /etc/edgegw/keys/north-2026-11.key
    """
    from edge_gateway.encryption import key_id_of, write_key_file
    from edge_gateway.errors import ConfigError
    from edge_gateway.format.crypt import generate_key

    try:
        key_id = key_id_of(path, str(path))
    except ConfigError as exc:
        raise fail(str(exc), 2) from None
    try:
        write_key_file(path, generate_key())
    except FileExistsError:
        raise fail(f"{path} exists; a key file is never overwritten") from None
    except OSError as exc:
        raise fail(f"cannot write {path}: {exc.strerror or exc}") from None
    console.print(f"wrote key {key_id} to {path} (mode 0600)", highlight=False)
