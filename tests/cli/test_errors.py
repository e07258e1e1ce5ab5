"""Bad input to the ``edgegw`` commands, as real processes: one ``error:`` line
that says what is wrong, the documented exit code, never a traceback; and
what the commands print around it (the gateway they talk to, units, widths)."""

from __future__ import annotations

import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cli_support import EDGEGW, assert_one_line_failure, cli_env, error_lines, run_edgegw
from _serve import Server

#: Serve's exit codes (docs/operations.md).
EXIT_FATAL, EXIT_CONFIG = 1, 2
#: A client command's exit code for a bad argument.
EXIT_USAGE = 2


def _config(folder: Path, *, listen: str = "127.0.0.1:0", extra: str = "") -> Path:
    path = folder / "edgegw.toml"
    path.write_text(
        f'region = "north"\ndata_dir = "data"\nauto_create = true\n{extra}\n'
        f'[api]\nlisten = "{listen}"\n'
        '[[topics]]\nname = "t"\nhome = "north"\npartitions = 3\n'
    )
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A running gateway (region north, auto_create on, topic t with 3 partitions)."""
    config = _config(tmp_path_factory.mktemp("served"))
    server = Server(config)
    try:
        yield config
    finally:
        server.stop(signal.SIGTERM)


def _serve(config: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # bounded: a serve that starts instead of refusing fails the test, not the run
    return run_edgegw("serve", "--config", config, timeout=60, env=env)


# ------------------------------------------------------------ files and paths


def test_produce_from_a_missing_file_or_a_directory(tmp_path: Path) -> None:
    res = run_edgegw("produce", "t", "--file", tmp_path / "missing.jsonl")
    line = assert_one_line_failure(res.returncode, res.stderr, "No such file or directory")
    assert str(tmp_path / "missing.jsonl") in line
    assert res.returncode == EXIT_USAGE
    res = run_edgegw("produce", "t", "--file", tmp_path)
    assert_one_line_failure(res.returncode, res.stderr, "Is a directory")
    assert res.returncode == EXIT_USAGE


def test_init_where_it_cannot_write(tmp_path: Path) -> None:
    res = run_edgegw("init", "--region", "x", "--config", "/proc/edgegw-test/x.toml")
    assert_one_line_failure(res.returncode, res.stderr, "cannot write /proc/edgegw-test/x.toml")
    res = run_edgegw("init", "--region", "x", "--config", tmp_path)
    assert_one_line_failure(res.returncode, res.stderr, "is a directory")
    assert list(tmp_path.iterdir()) == []


def test_a_config_file_error_names_the_file_once_and_keeps_brackets(tmp_path: Path) -> None:
    bad = tmp_path / "c.toml"
    bad.write_text('region = "north"\n[[topics]\n')
    res = _serve(bad)
    assert res.returncode == EXIT_CONFIG
    line = assert_one_line_failure(res.returncode, res.stderr, "not valid TOML")
    assert line.count("c.toml") == 1, line
    # "[[topics]]" in a message is text, not rich markup ("remove the [] tables")
    both = _config(tmp_path, extra='[metadata]\nurl = "http://127.0.0.1:1"')
    res = _serve(both)
    assert res.returncode == EXIT_CONFIG
    assert_one_line_failure(res.returncode, res.stderr, "remove the [[topics]] tables")
    for command in ("status", "sync"):
        res = run_edgegw(command, "--config", both)
        line = assert_one_line_failure(res.returncode, res.stderr, "[[topics]]")
        assert line.count("edgegw.toml") == 1, line


# ------------------------------------------------------------ serve's address


@pytest.mark.parametrize("server", ["hypercorn", "builtin"])
def test_serve_on_a_port_in_use(tmp_path: Path, server: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = _config(tmp_path, listen=f"127.0.0.1:{port}")
        res = _serve(config, env={"EDGEGW_API_SERVER": server})
        line = assert_one_line_failure(res.returncode, res.stderr, "api.listen")
        assert f"cannot listen on 127.0.0.1:{port}" in line
        assert "already in use" in line
        assert res.returncode == EXIT_FATAL
        # from the environment: the message says so
        res = _serve(
            _config(tmp_path),
            env={"EDGEGW_API_SERVER": server, "EDGEGW_API_LISTEN": f"127.0.0.1:{port}"},
        )
        assert_one_line_failure(res.returncode, res.stderr, "api.listen (from EDGEGW_API_LISTEN)")


@pytest.mark.parametrize("server", ["hypercorn", "builtin"])
def test_serve_on_an_address_of_another_machine(tmp_path: Path, server: str) -> None:
    # 192.0.2.0/24 is reserved for documentation (RFC 5737): no interface has it
    env = {"EDGEGW_API_SERVER": server, "EDGEGW_API_TOKEN": "t" * 20}
    res = _serve(_config(tmp_path, listen="192.0.2.1:8470"), env=env)
    line = assert_one_line_failure(res.returncode, res.stderr, "api.listen: cannot listen on")
    assert "no interface of this machine has that address" in line
    assert res.returncode == EXIT_FATAL


@pytest.mark.parametrize(
    ("listen", "fragment"),
    [
        ("256.1.1.1:8470", "'256.1.1.1' is not an IPv4 address"),
        ("127.0.0.1:99999", "the port must be a number 0..65535"),
        ("::1:8470", "an IPv6 address goes in brackets"),
        ("bad host:8470", "is not a host name or IP address"),
    ],
)
def test_serve_refuses_a_malformed_listen_address(
    tmp_path: Path, listen: str, fragment: str
) -> None:
    res = _serve(_config(tmp_path), env={"EDGEGW_API_LISTEN": listen})
    line = assert_one_line_failure(res.returncode, res.stderr, fragment)
    assert "api.listen (from EDGEGW_API_LISTEN)" in line
    assert res.returncode == EXIT_CONFIG
    res = _serve(_config(tmp_path, listen=listen))
    line = assert_one_line_failure(res.returncode, res.stderr, fragment)
    assert "api.listen: " in line
    assert not (tmp_path / "data").exists(), "a refused config must not touch the disk"


def test_serve_refuses_a_misspelt_environment_override(tmp_path: Path) -> None:
    res = _serve(_config(tmp_path), env={"EDGEGW_JOURNAL_FSNYC": "always"})
    line = assert_one_line_failure(res.returncode, res.stderr, "EDGEGW_JOURNAL_FSNYC")
    assert "did you mean EDGEGW_JOURNAL_FSYNC?" in line
    assert res.returncode == EXIT_CONFIG


# ------------------------------------------------------------ names


def test_names_are_checked_before_any_request(served: Path) -> None:
    res = run_edgegw("produce", "../x", "--config", served)
    assert_one_line_failure(res.returncode, res.stderr, "topic name '../x' has characters ['/']")
    assert res.returncode == EXIT_USAGE
    res = run_edgegw("consume", "t", "--group", "a/b", "--config", served)
    assert_one_line_failure(res.returncode, res.stderr, "invalid consumer group 'a/b'")
    assert res.returncode == EXIT_USAGE
    res = run_edgegw("topics", "describe", "x/../t", "--config", served)
    assert_one_line_failure(res.returncode, res.stderr, "has characters ['/']")


@pytest.mark.parametrize(
    ("topic", "fragment"),
    [
        # a dotted name is a mirror topic <region>.<topic>, even for this region
        ("ok.name-1_2", "produce to 'name-1_2' in region 'ok'"),
        ("north.telemetry", "produce to 'telemetry' here"),
        (".hidden", "must not start with '.'"),
        ("-x", "must not start with '-'"),
    ],
)
def test_auto_create_follows_the_naming_rule(
    served: Path, tmp_path: Path, topic: str, fragment: str
) -> None:
    lines = tmp_path / "one.txt"
    lines.write_text("x\n")
    res = run_edgegw("produce", "--file", lines, "--config", served, "--", topic)
    assert_one_line_failure(res.returncode, res.stderr, fragment)
    res = run_edgegw("topics", "list", "--config", served)
    assert res.returncode == 0, res.stderr
    assert topic not in res.stdout


def test_auto_create_still_creates_a_plain_name(served: Path, tmp_path: Path) -> None:
    lines = tmp_path / "one.txt"
    lines.write_text("x\n")
    res = run_edgegw("produce", "fresh_topic-1", "--file", lines, "--config", served)
    assert res.returncode == 0, res.stderr
    assert "produced 1 records to fresh_topic-1" in res.stdout


# ------------------------------------------------------------ consume


@pytest.mark.parametrize("follow", [False, True])
def test_consume_of_a_partition_the_topic_lacks(served: Path, follow: bool) -> None:
    args = ["consume", "t", "-p", "99", "--config", served] + (["--follow"] * follow)
    res = run_edgegw(*args, timeout=60)
    assert_one_line_failure(res.returncode, res.stderr, "has partitions 0..2, not 99")
    assert res.stdout == ""


# ------------------------------------------------------------ what commands print


def test_a_client_command_says_which_gateway_it_talks_to(served: Path) -> None:
    res = subprocess.run(
        [str(EDGEGW), "status"],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(),
        cwd=served.parent,  # ./edgegw.toml, picked up without --config
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    addr = (served.parent / "data" / "api.addr").read_text().strip()
    assert f"gateway http://{addr} (the gateway of edgegw.toml in this folder" in res.stderr
    assert not error_lines(res.stderr)


def test_status_shows_sizes_in_binary_units(served: Path) -> None:
    res = run_edgegw("status", "--config", served)
    assert res.returncode == 0, res.stderr
    assert "of 4.0 GiB" in res.stdout  # journal.max_bytes' default, 4 GiB
    assert " MB" not in res.stdout


def test_piped_tables_are_not_wrapped(served: Path, tmp_path: Path) -> None:
    name = "telemetry-of-the-long-named-sensor-array-on-line-7"
    lines = tmp_path / "one.txt"
    lines.write_text("x\n")
    res = run_edgegw("produce", name, "--file", lines, "--config", served)
    assert res.returncode == 0, res.stderr
    env = {k: v for k, v in cli_env().items() if k != "COLUMNS"}  # a pipe: no width
    res = subprocess.run(
        [str(EDGEGW), "topics", "list", "--config", str(served)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    row = next(line for line in res.stdout.splitlines() if name in line)
    assert len(row) > 80
    assert "local" in row  # the whole row on one line
