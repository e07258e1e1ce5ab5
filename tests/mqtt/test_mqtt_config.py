"""The MQTT bridge's sans-IO parts: topic filters, the publish template, and its config."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_gateway.config import parse_config
from edge_gateway.errors import ConfigError, InvalidInput
from edge_gateway.gateway import Gateway
from edge_gateway.mqtt import (
    attach_bridges,
    filter_matches,
    render_topic,
    topic_level,
    validate_filter,
    validate_template,
)

# ------------------------------------------------------------------ filters


@pytest.mark.parametrize(
    ("pattern", "topic", "match"),
    [
        ("a/b", "a/b", True),
        ("a/b", "a/b/c", False),
        ("a/+", "a/b", True),
        ("a/+", "a/b/c", False),
        ("a/+/c", "a/x/c", True),
        ("a/#", "a", True),  # '#' also matches the parent level
        ("a/#", "a/b/c", True),
        ("#", "anything/at/all", True),
        ("+/+", "/x", True),  # an empty level is a level
        ("#", "$SYS/broker/load", False),  # wildcards never match '$' topics first
        ("+/broker/load", "$SYS/broker/load", False),
        ("$SYS/#", "$SYS/broker/load", True),
        ("a/b", "A/b", False),
    ],
)
def test_filter_matches(pattern: str, topic: str, match: bool) -> None:
    validate_filter(pattern)
    assert filter_matches(pattern, topic) is match


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("", "empty"),
        ("a/#/b", "last"),
        ("a#", "whole level"),
        ("a/b+", "whole level"),
        ("a\0b", "U\\+0000"),
    ],
)
def test_bad_filters_are_refused(pattern: str, why: str) -> None:
    with pytest.raises(InvalidInput, match=why):
        validate_filter(pattern)


_level = st.text(st.characters(blacklist_characters="/+#\0", codec="utf-8"), max_size=5)


@given(st.lists(_level, min_size=1, max_size=6))
def test_a_topic_matches_itself_and_hash(levels: list[str]) -> None:
    topic = "/".join(levels)
    assert filter_matches(topic, topic)
    assert filter_matches("#", topic) is not topic.startswith("$")
    assert filter_matches("/".join("+" for _ in levels), topic) is not topic.startswith("$")
    assert not filter_matches(topic + "/x", topic)


# ------------------------------------------------------------------ template


def test_template_renders_and_keys_become_safe_levels() -> None:
    t = "edgegw/{region}/{topic}/{key}"
    validate_template(t)
    assert (
        render_topic(t, region="a", topic="telemetry", key=b"dev/1", partition=0, offset=5)
        == "edgegw/a/telemetry/dev/1"
    )
    assert topic_level(None) == "_"
    assert topic_level(b"a+b#c\0") == "a_b_c_"
    assert topic_level(b"\xff\x00") == "ff00"  # not UTF-8: hex
    validate_template("x/{partition}/{offset}")


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("", "empty"),
        ("a/{nope}", "unknown field"),
        ("a/#", "may not hold"),
        ("a/+/{key}", "may not hold"),
        ("a/{key!r}", "no format spec"),
        ("a/{offset:05d}", "no format spec"),
        ("a/{", "Single"),
    ],
)
def test_bad_templates_are_refused(template: str, why: str) -> None:
    with pytest.raises(InvalidInput, match=why):
        validate_template(template)


# ------------------------------------------------------------------ config


def _doc(**mqtt: Any) -> dict[str, Any]:
    return {
        "region": "a",
        "topics": [
            {"name": "telemetry", "home": "a"},
            {"name": "cmds", "home": "b", "subscribers": ["a"]},
            {"name": "other", "home": "b"},
        ],
        "mqtt": mqtt,
    }


def test_config_parses_both_kinds() -> None:
    cfg = parse_config(
        _doc(
            ingest=[
                {
                    "filters": "sensors/#",
                    "topic": "telemetry",
                    "password_env": "MQTT_PW",
                    "username": "gw",
                }
            ],
            publish=[
                {
                    "name": "out",
                    "topics": ["b.cmds", "telemetry"],
                    "port": 8883,
                    "ca_file": "/etc/ca.pem",
                }
            ],
        )
    )
    ing, pub = cfg.mqtt.ingest[0], cfg.mqtt.publish[0]
    assert ing.filters == ("sensors/#",)
    assert ing.bridge_name == "telemetry"
    assert pub.group_name == "mqtt-publish-out"
    assert pub.describe() == "mqtts://127.0.0.1:8883"
    assert cfg.mqtt.configured
    assert not parse_config({"region": "a"}).mqtt.configured


@pytest.mark.parametrize(
    ("mqtt", "message"),
    [
        ({"ingest": [{"topic": "telemetry"}]}, r"mqtt.ingest\[telemetry\].filters: required"),
        ({"ingest": [{"filters": ["a/#/b"], "topic": "telemetry"}]}, "'#' must be"),
        ({"ingest": [{"filters": ["a"]}]}, r"topic: required"),
        ({"ingest": [{"filters": ["a"], "topic": "telemetry", "qos": 2}]}, "only 1"),
        ({"ingest": [{"filters": ["a"], "topic": "nope"}]}, "unknown topic 'nope'"),
        ({"ingest": [{"filters": ["a"], "topic": "other"}]}, "homed in region 'b'"),
        ({"ingest": [{"filters": ["a"], "topic": "telemetry", "password": "x"}]}, "unknown key"),
        (
            {"ingest": [{"filters": ["a"], "topic": "telemetry", "password_env": "P"}]},
            "needs a username",
        ),
        (
            {
                "ingest": [
                    {
                        "filters": ["a"],
                        "topic": "telemetry",
                        "username": "u",
                        "password_env": "P",
                        "password_file": "/f",
                    }
                ]
            },
            "not both",
        ),
        (
            {
                "ingest": [
                    {
                        "filters": ["a"],
                        "topic": "telemetry",
                        "username": "u",
                        "password_env": "EDGEGW_X",
                    }
                ]
            },
            "config overrides",
        ),
        ({"ingest": [{"filters": ["a"], "topic": "telemetry", "cert_file": "/c"}]}, "go together"),
        ({"ingest": [{"filters": ["a"], "topic": "telemetry", "port": 0}]}, "1..65535"),
        (
            {
                "ingest": [
                    {"filters": ["a"], "topic": "telemetry"},
                    {"filters": ["b"], "topic": "telemetry"},
                ]
            },
            "two have the name",
        ),
        ({"publish": [{"topics": ["b.cmds"]}]}, r"name: required"),
        ({"publish": [{"name": "o", "topics": ["b.other"]}]}, "neither a topic homed here"),
        ({"publish": [{"name": "o", "topics": ["b.cmds"], "template": "x/{k}"}]}, "unknown field"),
        ({"publish": [{"name": "bad name", "topics": ["b.cmds"]}]}, "letters, digits"),
        (
            {
                "publish": [
                    {"name": "o", "topics": ["b.cmds"], "client_id": "same"},
                    {"name": "p", "topics": ["b.cmds"], "client_id": "same"},
                ]
            },
            "used twice",
        ),
        ({"subscribe": []}, r"mqtt.subscribe: unknown key"),
        ({"ingest": {"filters": ["a"]}}, r"array of tables"),
    ],
)
def test_config_errors_name_the_key(mqtt: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(_doc(**mqtt))


def test_password_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    cfg = parse_config(
        _doc(
            ingest=[
                {"filters": ["a"], "topic": "telemetry", "username": "u", "password_file": str(pw)}
            ]
        )
    )
    assert cfg.mqtt.ingest[0].password("w") == "s3cret"
    cfg = parse_config(
        _doc(
            ingest=[
                {
                    "filters": ["a"],
                    "topic": "telemetry",
                    "username": "u",
                    "password_env": "MQTT_TEST_PW",
                }
            ]
        )
    )
    monkeypatch.delenv("MQTT_TEST_PW", raising=False)
    with pytest.raises(ConfigError, match="MQTT_TEST_PW is not set"):
        cfg.mqtt.ingest[0].password("w")
    monkeypatch.setenv("MQTT_TEST_PW", "from-env")
    assert cfg.mqtt.ingest[0].password("w") == "from-env"
    cfg = parse_config(
        _doc(
            ingest=[
                {
                    "filters": ["a"],
                    "topic": "telemetry",
                    "username": "u",
                    "password_file": str(tmp_path / "missing"),
                }
            ]
        )
    )
    with pytest.raises(ConfigError, match="cannot read"):
        cfg.mqtt.ingest[0].password("w")


def test_missing_paho_is_a_config_error_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "paho.mqtt.client", None)  # import fails
    doc = _doc(ingest=[{"filters": ["a"], "topic": "telemetry"}])
    doc["data_dir"] = str(tmp_path / "data")
    gw = Gateway(parse_config(doc))
    with pytest.raises(ConfigError, match=r"pip install 'edgegw\[mqtt\]'"):
        attach_bridges(gw)  # what `edgegw serve` does before it runs the gateway
    assert not (tmp_path / "data").exists()  # refused before touching anything


def test_every_mqtt_key_is_documented() -> None:
    import dataclasses

    from edge_gateway.config import MqttIngestConfig, MqttPublishConfig

    doc = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    section = doc.split("## MQTT bridge", 1)[1].split("\n## ", 1)[0]
    missing = [
        f"{cls.__name__}.{f.name}"
        for cls in (MqttIngestConfig, MqttPublishConfig)
        for f in dataclasses.fields(cls)
        if f"`{f.name}`" not in section
    ]
    assert not missing, f"undocumented in docs/configuration.md, MQTT bridge: {missing}"
