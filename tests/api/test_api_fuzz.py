"""Random bodies, parameters and headers at the produce routes: never a 5xx.

The gateway runs in its own thread and trio loop for the whole module (one
gateway, many Hypothesis examples); requests go through a sync httpx client.
Also checks the sync :class:`edge_gateway.client.Client` end to end.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from _api_support import GatewayThread, make_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_gateway.api.wire import BATCH_MEDIA_TYPE, ERROR_CODES
from edge_gateway.client import Client
from edge_gateway.errors import InvalidInput, InvalidName, UnknownTopic
from edge_gateway.format.batch import encode_batch


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    cfg = make_config(
        tmp_path_factory.mktemp("fuzz"),
        api={"max_body_bytes": 64 * 1024},
        auto_create=True,
        default_partitions=2,
    )
    g = GatewayThread(cfg).start()
    try:
        yield g
    finally:
        g.stop()


@pytest.fixture(scope="module")
def http(gateway: GatewayThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        yield client


json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
field_names = st.sampled_from(
    ["value", "value_b64", "key", "key_b64", "headers", "headers_b64", "timestamp", "partition"]
)
b64_text = st.binary(max_size=30).map(lambda b: base64.b64encode(b).decode())
field_values = json_values | b64_text | st.integers(min_value=-(2**70), max_value=2**70)
records = st.dictionaries(field_names, field_values, max_size=5) | json_values
bodies = st.one_of(
    st.builds(lambda rs: {"records": rs}, st.lists(records, max_size=5)),
    st.dictionaries(st.sampled_from(["records", "x"]), json_values, max_size=2),
    json_values,
)
topics = st.sampled_from(
    ["t", "south.s", "fresh-topic", "b$d", "a..b", "%2F", "x" * 201]
) | st.text(alphabet="abcxyz.-_~%!", min_size=1, max_size=10)
params = st.dictionaries(
    st.sampled_from(["ack", "offset", "x"]),
    st.sampled_from(["local", "shipped", "", "1", "-1", "maybe"]) | st.text(max_size=5),
    max_size=2,
)
content_types = st.sampled_from(
    [
        None,
        "application/json",
        "application/json; charset=utf-8",
        "text/plain",
        BATCH_MEDIA_TYPE,
        "",
    ]
)


def flip_bit(values: list[bytes], position: int) -> bytes:
    """A valid batch of ``values`` with one bit flipped at ``position`` (if inside it)."""
    b = encode_batch(values, timestamps=7)
    if position >= len(b):
        return b
    return b[:position] + bytes([b[position] ^ 1]) + b[position + 1 :]


def check(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text)
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["code"] in ERROR_CODES
        assert ERROR_CODES[err["code"]][0] == r.status_code


def headers_for(content_type: str | None) -> dict[str, str]:
    return {} if content_type is None else {"content-type": content_type}


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(topic=topics, body=bodies, query=params, content_type=content_types)
def test_json_produce_never_5xx(
    http: httpx.Client, topic: str, body: Any, query: dict[str, str], content_type: str | None
) -> None:
    content = json.dumps(body).encode()
    r = http.post(
        f"/v1/topics/{topic}/records",
        params=query,
        content=content,
        headers=headers_for(content_type),
    )
    check(r)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    topic=topics,
    partition=st.sampled_from(["0", "1", "2", "3", "-1", "x", "99999999999999999999"]),
    raw=st.binary(max_size=200)
    | st.builds(
        flip_bit,
        st.lists(st.binary(max_size=20), min_size=1, max_size=5),
        st.integers(min_value=0, max_value=300),
    ),
    query=params,
    content_type=content_types,
)
def test_batch_produce_never_5xx(
    http: httpx.Client,
    topic: str,
    partition: str,
    raw: bytes,
    query: dict[str, str],
    content_type: str | None,
) -> None:
    r = http.post(
        f"/v1/topics/{topic}/partitions/{partition}/batches",
        params=query,
        content=raw,
        headers=headers_for(content_type),
    )
    check(r)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=st.binary(max_size=300))
def test_raw_bytes_never_5xx(http: httpx.Client, raw: bytes) -> None:
    check(
        http.post("/v1/topics/t/records", content=raw, headers={"content-type": "application/json"})
    )


def test_sync_client(gateway: GatewayThread) -> None:
    cfg_dir = gateway.cfg.data_dir
    with Client.from_data_dir(cfg_dir) as client:
        assert client.healthy()
        res = client.produce("t", [b"one", b"two"], partition=1)
        assert res.partitions == [1, 1]
        page = client.fetch("t", 1, res.offsets[0])
        assert [r.value for r in page.records][:2] == [b"one", b"two"]
        res = client.produce_batch("t", 0, encode_batch([b"b1", b"b2"], timestamps=3))
        assert len(res.offsets) == 2
        page = client.fetch("t", 0, res.offsets[0], binary=True)
        assert [r.value for r in page.records][:2] == [b"b1", b"b2"]
        assert {t["name"] for t in client.topics()} >= {"t", "south.s"}
        assert client.topic("t")["kind"] == "local"
        assert client.status()["region"] == "north"
        assert client.commit_offsets("g", {("t", 1): res.offsets[0]}) == 1
        assert [o.offset for o in client.fetch_offsets("g", "t")] == [res.offsets[0]]
        with pytest.raises(InvalidName):
            client.produce("b$d", ["x"])
        with pytest.raises(InvalidInput, match="partitions"):
            client.produce("t", ["x"], partition=7)
        with pytest.raises(UnknownTopic):
            client.topic("not-there")
