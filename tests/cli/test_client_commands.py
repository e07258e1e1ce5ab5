"""status / produce / consume / topics against a real `edgegw serve` process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from _serve import EDGEGW, Server, write_config


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    config = write_config(tmp_path_factory.mktemp("served"))
    server = Server(config)
    try:
        yield config
    finally:
        server.stop(signal.SIGTERM)


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EDGEGW), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        # (PYTHONPATH kept: the command runs the code under test, not an installed copy)
        env={
            "COLUMNS": "200",
            "PATH": "/usr/bin:/bin",
            **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
        },
    )


def test_produce_consume_round_trip(served: Path, tmp_path: Path) -> None:
    out = run("produce", "t", "--partition", "1", "-c", str(served), stdin="a\nb\n\nc\n")
    assert out.returncode == 0, out.stderr
    assert "produced 3 records" in out.stdout
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"line {i}\n" for i in range(1000)))
    out = run("produce", "t", "--file", str(lines), "--key", "k", "-c", str(served))
    assert out.returncode == 0, out.stderr
    assert "produced 1,000 records" in out.stdout
    out = run("consume", "t", "-p", "1", "--from-beginning", "-c", str(served))
    assert out.returncode == 0, out.stderr
    docs = [json.loads(line) for line in out.stdout.splitlines()]
    assert [d["value"] for d in docs[:3]] == ["a", "b", "c"]
    assert [d["offset"] for d in docs[:3]] == [0, 1, 2]
    out = run("consume", "t", "--from-beginning", "--raw", "--max", "5", "-c", str(served))
    assert len(out.stdout.splitlines()) == 5
    # a group resumes where it committed
    first = run(
        "consume", "t", "-p", "1", "--from-beginning", "-g", "g", "--max", "2", "-c", str(served)
    )
    assert [json.loads(x)["offset"] for x in first.stdout.splitlines()] == [0, 1]
    again = run("consume", "t", "-p", "1", "-g", "g", "--max", "1", "-c", str(served))
    assert [json.loads(x)["offset"] for x in again.stdout.splitlines()] == [2]


def test_consume_prints_null_values(served: Path) -> None:
    """A null value (a Kafka tombstone) prints as JSON null, an empty value as "",
    a null header value as null; --raw prints an empty line for a null value."""
    from edge_gateway.client import Client, read_addr_file

    data_dir = served.parent / "data"
    with Client(read_addr_file(data_dir)) as client:
        start = client.topic("t")["partitions"][2]["next_offset"]
        client.produce(
            "t",
            [{"value": None, "headers": {"h": None}}, {"value": ""}],
            partition=2,
        )
    out = run("consume", "t", "-p", "2", "--offset", str(start), "-c", str(served))
    assert out.returncode == 0, out.stderr
    docs = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(d["value"], d.get("headers")) for d in docs] == [(None, {"h": None}), ("", None)]
    out = run("consume", "t", "-p", "2", "--offset", str(start), "--raw", "-c", str(served))
    assert out.stdout == "\n\n"


def test_status_and_topics(served: Path) -> None:
    out = run("status", "-c", str(served))
    assert out.returncode == 0, out.stderr
    assert "region north" in out.stdout
    assert "topics" in out.stdout
    assert "RAM" in out.stdout  # the journal's index memory (the line may wrap)
    out = run("status", "--json", "-c", str(served))
    doc = json.loads(out.stdout)
    assert doc["region"] == "north"
    assert doc["journal"]["index_bytes"] > 0
    assert doc["journal"]["index_cache_capacity_bytes"] > 0
    out = run("topics", "list", "-c", str(served))
    assert out.returncode == 0, out.stderr
    assert " t " in out.stdout
    out = run("topics", "describe", "t", "-c", str(served))
    assert out.returncode == 0, out.stderr
    assert "partition" in out.stdout


def test_clear_errors(served: Path, tmp_path: Path) -> None:
    out = run("produce", "nope", "-c", str(served), stdin="x\n")
    assert out.returncode == 1
    assert "unknown topic" in out.stderr
    assert "Traceback" not in out.stderr
    out = run("status", "--url", "http://127.0.0.1:9")
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
