"""``edgegw topics|regions`` against a real server (the CLI runs in-process)."""

from __future__ import annotations

import os
import uuid

from _meta_support import ADMIN_TOKEN, Fleet
from edgegw_cli.app import app
from typer.testing import CliRunner, Result

#: The API contract is the same on every store (conftest.py runs these on each).
STORES = ("sqlite", "postgres")


def run(fleet: Fleet, *args: str, token: str | None = ADMIN_TOKEN) -> Result:
    env = {"COLUMNS": "250", "EDGEGW_METADATA_URL": fleet.url}
    if token is not None:
        env["EDGEGW_METADATA_TOKEN"] = token
    unset = {k: None for k in os.environ if k.startswith("EDGEGW_")}
    return CliRunner().invoke(app, list(args), env={**unset, **env})


def test_topics_lifecycle(fleet: Fleet) -> None:
    name = f"cli-{uuid.uuid4().hex[:6]}"
    r = run(fleet, "topics", "create", name, "--home", "north", "-p", "2", "-s", "south")
    assert r.exit_code == 0, r.output
    assert name in r.stdout
    r = run(fleet, "topics", "list")
    assert r.exit_code == 0, r.output
    row = next(line for line in r.stdout.splitlines() if name in line)
    assert "north" in row
    assert "south" in row
    r = run(fleet, "topics", "alter", name, "-p", "5", "-s", "*", "--retention-ms", "60000")
    assert r.exit_code == 0, r.output
    r = run(fleet, "topics", "describe", name)
    assert r.exit_code == 0, r.output
    row = next(line for line in r.stdout.splitlines() if name in line and "north" in line)
    assert "5" in row
    assert "60,000" in row
    assert "* (all)" in row

    r = run(fleet, "topics", "alter", name, "-p", "3")
    assert r.exit_code == 1
    assert "partitions can only grow" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run(fleet, "topics", "create", name, "--home", "north")
    assert r.exit_code == 1
    assert "already exists" in r.stderr
    assert "409 topic_exists" in r.stderr
    r = run(fleet, "topics", "create", "x" + name, "--home", "mars")
    assert r.exit_code == 1
    assert "unknown region 'mars'" in r.stderr
    r = run(fleet, "topics", "alter", name)
    assert r.exit_code == 1
    assert "nothing to change" in r.stderr

    r = run(fleet, "topics", "delete", name, "--yes")
    assert r.exit_code == 0, r.output
    r = run(fleet, "topics", "describe", name)
    assert r.exit_code == 1
    assert "unknown topic" in r.stderr


def test_regions(fleet: Fleet) -> None:
    region = f"r-{uuid.uuid4().hex[:6]}"
    r = run(fleet, "regions", "add", region)
    assert r.exit_code == 0, r.output
    token = r.stdout.strip()
    assert token.startswith("egw_")
    assert "shown once" in r.stderr
    # The new token works for its region, and cannot change topics.
    r = run(fleet, "topics", "list", token=token)
    assert r.exit_code == 0, r.output
    r = run(fleet, "topics", "create", "nope", "--home", region, token=token)
    assert r.exit_code == 1
    assert "403 forbidden" in r.stderr
    r = run(fleet, "regions", "list")
    assert r.exit_code == 0, r.output
    assert any(region in line and "active" in line for line in r.stdout.splitlines())
    r = run(fleet, "regions", "revoke", region)
    assert r.exit_code == 0, r.output
    r = run(fleet, "regions", "list")
    assert any(region in line and "revoked" in line for line in r.stdout.splitlines())
    r = run(fleet, "topics", "list", token=token)
    assert r.exit_code == 1
    assert "unknown or revoked token" in r.stderr
    r = run(fleet, "regions", "revoke", "mars")
    assert r.exit_code == 1
    assert "unknown region" in r.stderr


def test_regions_rotate(fleet: Fleet) -> None:
    region = f"r-{uuid.uuid4().hex[:6]}"
    old = run(fleet, "regions", "add", region).stdout.strip()
    r = run(fleet, "regions", "rotate", region, "--keep-old-hours", "1")
    assert r.exit_code == 0, r.output
    new = r.stdout.strip()
    assert new.startswith("egw_")
    assert new != old
    assert "the previous token stays valid until" in r.stderr
    for token in (old, new):  # both, during the grace period
        assert run(fleet, "topics", "list", token=token).exit_code == 0
    r = run(fleet, "regions", "rotate", region, "--keep-old-hours", "0")
    assert r.exit_code == 0, r.output
    newest = r.stdout.strip()
    assert "the previous token is no longer valid" in r.stderr
    for token in (old, new):  # a rotation with no grace ends both older tokens
        r = run(fleet, "topics", "list", token=token)
        assert r.exit_code == 1
        assert "unknown or revoked token" in r.stderr
    assert run(fleet, "topics", "list", token=newest).exit_code == 0
    r = run(fleet, "regions", "rotate", region, "--keep-old-hours", "1000")
    assert r.exit_code == 1
    assert "--keep-old-hours" in r.stderr
    r = run(fleet, "regions", "rotate", "mars")
    assert r.exit_code == 1
    assert "unknown region" in r.stderr
    r = run(fleet, "regions", "rotate", region, token=newest)  # a region cannot
    assert r.exit_code == 1
    assert "403 forbidden" in r.stderr


def test_unreachable_and_missing_options(fleet: Fleet) -> None:
    r = CliRunner().invoke(
        app, ["topics", "list", "--metadata", "http://127.0.0.1:9", "--metadata-token", "x"]
    )
    assert r.exit_code == 1
    assert "unreachable" in r.stderr
    r = CliRunner().invoke(
        app, ["topics", "create", "t", "--home", "a"], env={"EDGEGW_METADATA_URL": None}
    )
    assert r.exit_code == 2
    assert "--metadata" in r.stderr
