"""``[kafka]``: off by default, every bad value refused naming its key."""

from __future__ import annotations

from typing import Any

import pytest

from edge_gateway.config import parse_config
from edge_gateway.errors import ConfigError


def _cfg(kafka: dict[str, Any], **top: Any) -> Any:
    return parse_config({"region": "north", "kafka": kafka, **top}, env={})


def test_off_by_default() -> None:
    assert not parse_config({"region": "north"}, env={}).kafka.enabled


def test_on_with_defaults() -> None:
    k = _cfg({"listen": "127.0.0.1:9092"}).kafka
    assert (k.enabled, k.host, k.port, k.acks_all) == (True, "127.0.0.1", 9092, "local")
    assert k.max_request_bytes == 16 << 20


def test_from_the_environment() -> None:
    cfg = parse_config({"region": "north"}, env={"EDGEGW_KAFKA_LISTEN": "127.0.0.1:0"})
    assert cfg.kafka.listen == "127.0.0.1:0"


@pytest.mark.parametrize(
    ("kafka", "match"),
    [
        ({"listen": "9092"}, "kafka.listen"),
        ({"listen": "127.0.0.1:99999"}, "kafka.listen"),
        ({"listen": "127.0.0.1:9092", "advertised": "gw.example:0"}, "kafka.advertised"),
        ({"listen": "127.0.0.1:9092", "max_request_bytes": 10}, "kafka.max_request_bytes"),
        ({"listen": "127.0.0.1:9092", "max_fetch_bytes": 2**31}, "kafka.max_fetch_bytes"),
        ({"listen": "127.0.0.1:9092", "max_wait_ms": -1}, "kafka.max_wait_ms"),
        ({"listen": "127.0.0.1:9092", "idle_timeout_s": 0}, "kafka.idle_timeout_s"),
        ({"listen": "127.0.0.1:9092", "max_connections": 0}, "kafka.max_connections"),
        ({"listen": "127.0.0.1:9092", "acks_all": "bucket"}, "kafka.acks_all"),
        ({"listen": "127.0.0.1:9092", "lissten": 1}, "kafka.lissten"),
    ],
)
def test_bad_values_name_the_key(kafka: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _cfg(kafka)


def test_not_loopback_needs_the_api_token() -> None:
    with pytest.raises(ConfigError, match=r"api\.token: required when kafka\.listen"):
        _cfg({"listen": "0.0.0.0:9092"})
    cfg = _cfg({"listen": "0.0.0.0:9092"}, api={"token": "t0ken"})
    assert not cfg.kafka.is_loopback
