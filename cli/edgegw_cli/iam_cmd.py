"""``edgegw iam policy``: the IAM policy that confines one identity of the fleet."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from edgegw_cli._common import console, fail

app = typer.Typer(
    help="IAM policies for the fleet's bucket: one per region, the pipeline's, an admin's.",
    no_args_is_help=True,
)


@app.command()
def policy(
    role: str = typer.Option(
        "region", "--role", help="region (a site's gateways), pipeline (read-only) or admin."
    ),
    region: str = typer.Option("", "--region", "-r", help="The region (for --role region)."),
    bucket: str = typer.Option(..., "--bucket", help="The fleet's bucket name."),
    prefix: str = typer.Option("", "--prefix", help="The fleet's key prefix in the bucket."),
    partition: str = typer.Option("aws", "--partition", help="aws, aws-cn or aws-us-gov."),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Write the policy to this file instead of stdout."
    ),
) -> None:
    """Print the IAM policy of one identity: a region writes only its own keys.

    A region's gateways read the whole fleet but write and delete only under
    regions/<region>/ (and their own cursor in each source's folder), so a
    stolen device's key cannot touch another region's log (docs/security.md).

    Example: edgegw iam policy --region north --bucket fleet-data --prefix plant
    """
    from edge_gateway.errors import InvalidInput
    from edge_gateway.iam import ROLES
    from edge_gateway.iam import policy as make_policy

    if role not in ROLES:
        raise fail(f"unknown --role {role!r}: one of {', '.join(ROLES)}", 2)
    try:
        doc = make_policy(role, bucket, prefix, region, partition=partition)  # type: ignore[arg-type]
    except InvalidInput as exc:
        raise fail(str(exc), 2) from None
    text = json.dumps(doc, indent=2) + "\n"
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        output.write_text(text)
    except OSError as exc:
        raise fail(f"cannot write {output}: {exc.strerror or exc}") from None
    console.print(f"wrote the {role} policy to {output}", highlight=False)
