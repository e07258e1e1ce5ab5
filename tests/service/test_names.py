"""The naming rules (edge_gateway/names.py): topics, mirror topics, groups."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from _serve import Server

from edge_gateway.client import Client
from edge_gateway.errors import InvalidInput, InvalidName, ReadOnlyTopic
from edge_gateway.names import (
    mirror_topic,
    split_mirror_topic,
    validate_group,
    validate_home_topic,
    validate_topic,
)


@pytest.mark.parametrize("name", ["telemetry", "t-1_2", "T9", "a" * 200])
def test_topics_that_may_be_homed_in_a_region(name: str) -> None:
    assert validate_home_topic(name) == name
    assert split_mirror_topic(name) is None


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("ok.name-1_2", "contains '.'"),
        ("east.telemetry", "contains '.'"),
        (".hidden", "must not start with '.'"),
        ("-x", "must not start with '-'"),
        ("../x", "has characters ['/']"),
        ("a..b", "must not be '.' or contain '..'"),
        ("", "must not be empty"),
    ],
)
def test_topics_that_may_not(name: str, message: str) -> None:
    with pytest.raises(InvalidName) as info:
        validate_home_topic(name)
    assert message in str(info.value)


def test_every_name_with_a_dot_is_a_mirror_name_and_reads_still_accept_it() -> None:
    # data already written (journals, bucket objects) is read with validate_topic
    for name in ("south.telemetry", "a.b.c", ".hidden", "-x"):
        assert validate_topic(name) == name
    assert split_mirror_topic("south.telemetry") == ("south", "telemetry")
    assert split_mirror_topic(mirror_topic("south", "t-1")) == ("south", "t-1")
    assert split_mirror_topic(".hidden") is None  # no region before the dot


@pytest.mark.parametrize("name", ["dashboards", "a b", "x.y", "%2F", "ü" * 200])
def test_group_names(name: str) -> None:
    assert validate_group(name) == name


@pytest.mark.parametrize("name", ["", "a/b", ".", "..", "tab\there", "x" * 201])
def test_group_names_that_would_change_the_url(name: str) -> None:
    with pytest.raises(InvalidInput) as info:
        validate_group(name)
    assert not isinstance(info.value, InvalidName)  # the API answers invalid_request


def test_a_dotted_topic_auto_created_before_the_rule_still_works(tmp_path: Path) -> None:
    """Valid data keeps working: a topic auto-created with a '.' by an earlier
    version (in <data_dir>/topics.json) is still served and writable."""
    config = tmp_path / "edgegw.toml"
    config.write_text(
        'region = "north"\ndata_dir = "data"\nauto_create = true\n[api]\nlisten = "127.0.0.1:0"\n'
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "topics.json").write_text(
        json.dumps({"auto_created": [{"name": "north.legacy", "partitions": 1}]})
    )
    server = Server(config)
    try:
        with Client(server.url) as client:
            assert client.produce("north.legacy", ["x"]).offsets == [0]
            assert [r.value for r in client.fetch("north.legacy", 0, 0).records] == [b"x"]
            with pytest.raises(ReadOnlyTopic, match="produce to 'other' here"):
                client.produce("north.other", ["x"])  # a new one is not created
    finally:
        code, log = server.stop(signal.SIGTERM)
    assert code == 0, log


def test_the_client_refuses_bad_names_and_urls_before_sending() -> None:
    # port 1: nothing listens, so anything sent would be Unavailable instead
    with Client("http://127.0.0.1:1") as client:
        with pytest.raises(InvalidName, match="has characters"):
            client.produce("../x", ["v"])
        with pytest.raises(InvalidName):
            client.fetch("..", 0, 0)
        with pytest.raises(InvalidInput, match="invalid consumer group 'a/b'"):
            client.fetch_offsets("a/b")
        with pytest.raises(InvalidInput, match=r"invalid consumer group '\.\.'"):
            client.commit_offsets("..", {("t", 0): 1})
    for url in ("notaurl", "ftp://host", "http://[::1"):
        with pytest.raises(InvalidInput):
            Client(url)
