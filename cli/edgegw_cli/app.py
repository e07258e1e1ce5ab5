"""The ``edgegw`` typer application: registers one module per command."""

from __future__ import annotations

import typer

from edgegw_cli import (
    consume,
    demo,
    init_cmd,
    inspect_cmd,
    meta,
    pipeline,
    produce,
    reship,
    restore,
    scenario,
    serve,
    status,
    sync,
    topics,
)

app = typer.Typer(
    name="edgegw",
    help="Geo-replication gateway for often-disconnected edge clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("serve")(serve.serve)
app.command("init")(init_cmd.init)
app.command("status")(status.status)
app.command("produce")(produce.produce)
app.command("consume")(consume.consume)
app.add_typer(topics.app, name="topics")
app.command("demo")(demo.demo)
app.add_typer(scenario.app, name="scenario")
app.add_typer(inspect_cmd.app, name="inspect")
app.command("sync")(sync.sync)
app.command("restore")(restore.restore)
app.command("reship")(reship.reship)
app.add_typer(pipeline.app, name="pipeline")
app.add_typer(meta.serve_app, name="metadata")
app.add_typer(meta.regions_app, name="regions")


@app.callback()
def _main(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at DEBUG level."),
) -> None:
    from edge_gateway.logs import configure_logging

    configure_logging("debug" if verbose else "info", "text")


def main() -> None:
    app()
