"""Helpers for tests of the ``edgegw`` command line: run it in-process
(typer's CliRunner) or as a real process (the installed console script)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from edgegw_cli.app import app
from typer.testing import CliRunner, Result

from edge_gateway.testing.moto import ACCESS_KEY, REGION, SECRET_KEY

#: The console script next to the interpreter running the tests (.venv/bin/edgegw).
EDGEGW = Path(sys.executable).parent / "edgegw"

#: Wide enough that rich never folds a value the tests look for.
COLUMNS = "250"


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a CLI run: wide output, moto's dummy AWS credentials,
    no AWS profile or config file of the machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    if "AWS_CA_BUNDLE" in os.environ:
        env["AWS_CA_BUNDLE"] = os.environ["AWS_CA_BUNDLE"]
    env.update(
        COLUMNS=COLUMNS,
        AWS_ACCESS_KEY_ID=ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_DEFAULT_REGION=REGION,
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
    )
    env.update(extra or {})
    return env


def invoke(*args: str | os.PathLike[str]) -> Result:
    """Run ``edgegw ARGS`` in-process; stdout and stderr come back separately."""
    env = cli_env()
    # CliRunner applies `env` on top of os.environ: unset what cli_env dropped.
    unset: dict[str, str | None] = {k: None for k in os.environ if k not in env}
    return CliRunner().invoke(app, [str(a) for a in args], env={**unset, **env})


def run_edgegw(
    *args: str | os.PathLike[str], timeout: float = 120, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``edgegw`` as a real process; output captured (fully drained)."""
    return subprocess.run(
        [str(EDGEGW), *(str(a) for a in args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(env),
        stdin=subprocess.DEVNULL,
        check=False,
    )


def error_lines(stderr: str) -> list[str]:
    """The lines of ``stderr`` that the CLI's ``fail`` printed."""
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def assert_one_line_failure(code: int, stderr: str, fragment: str) -> str:
    """A failed command: non-zero exit, exactly one ``error:`` line holding
    ``fragment``, and no traceback. Returns that line."""
    assert code != 0, stderr
    assert "Traceback" not in stderr, stderr
    lines = error_lines(stderr)
    assert len(lines) == 1, stderr
    assert fragment in lines[0], lines[0]
    return lines[0]
