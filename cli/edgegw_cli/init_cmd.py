"""``edgegw init``: write a commented starter config."""

from __future__ import annotations

from pathlib import Path

import typer

from edgegw_cli._common import console, fail


def init(
    region: str = typer.Option(..., "--region", "-r", help="This site's region name."),
    path: Path = typer.Option(Path("edgegw.toml"), "--config", "-c", help="File to write."),
    data_dir: str = typer.Option("edgegw-data", "--data-dir", help="Data directory to set."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Write a commented starter config with every key at its default.

    Example: edgegw init --region factory-7 --config /etc/edgegw/edgegw.toml
    """
    import tomllib

    from edge_gateway.config import parse_config, starter_config
    from edge_gateway.errors import InvalidInput

    try:
        text = starter_config(region, data_dir)
        parse_config(tomllib.loads(text))  # the starter must always be valid
    except (InvalidInput, tomllib.TOMLDecodeError) as exc:
        raise fail(str(exc), 2) from None
    if path.is_dir():
        raise fail(f"{path} is a directory: give the config file's path", 2)
    if path.exists() and not force:
        raise fail(f"{path} exists (use --force to overwrite)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise fail(f"cannot write {path}: {exc.strerror or exc}") from None
    console.print(
        f"wrote {path}; start the gateway with: edgegw serve --config {path}", highlight=False
    )
