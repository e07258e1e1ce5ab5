"""The nesting limit of JSON request bodies: the same answer on every Python version.

``json`` alone refuses deep nesting at a depth that follows the interpreter's
recursion limit (3.11: near 1,000 levels; 3.13 parses far deeper), so the API
checks the raw body first: a record value may nest ``MAX_VALUE_DEPTH`` levels.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _api_support import make_config, running, url_of
from hypothesis import example, given, settings
from hypothesis import strategies as st

from edge_gateway.api._codec import MAX_BODY_DEPTH, MAX_VALUE_DEPTH, nesting_refusal

JSON = {"content-type": "application/json"}


def depth(v: Any) -> int:
    if isinstance(v, list):
        return 1 + max((depth(x) for x in v), default=0)
    if isinstance(v, dict):
        return 1 + max((depth(x) for x in v.values()), default=0)
    return 0


def nested(levels: int, leaf: Any = 1) -> Any:
    """``levels`` levels of arrays and objects, alternating, around ``leaf``."""
    v = leaf
    for i in range(levels):
        v = [v] if i % 2 else {"k": v}
    return v


def nested_text(levels: int) -> bytes:
    """The JSON text of ``nested(levels)``, built without recursion (``json.dumps`` would)."""
    opens = [b"[" if i % 2 else b'{"k":' for i in range(levels)]
    closes = [b"]" if i % 2 else b"}" for i in range(levels)]
    return b"".join(reversed(opens)) + b"1" + b"".join(closes)


# strings full of what a naive scan would count: brackets, quotes, escapes
TRICKY = st.text(alphabet='[]{}"\\:, ab\n\u00e9', max_size=8)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | TRICKY,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(TRICKY, kids, max_size=3),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(VALUES, st.integers(0, 6), st.booleans())
@example("[", 0, False)  # brackets only inside a string, limit 0
def test_the_scan_counts_depth_exactly(value: Any, limit: int, ascii_only: bool) -> None:
    for text in (
        json.dumps(value, ensure_ascii=ascii_only),
        json.dumps(value, ensure_ascii=ascii_only, indent=1),
        json.dumps(value, ensure_ascii=ascii_only, separators=(",", ":")),
    ):
        refusal = nesting_refusal(text.encode(), limit)
        if depth(value) <= limit:
            assert refusal is None, (text, limit)
        else:
            assert refusal is not None
            assert f"more than {limit} levels" in refusal


def test_the_scan_at_the_limit_and_on_broken_text() -> None:
    assert json.loads(nested_text(7)) == nested(7)
    for levels in (MAX_BODY_DEPTH - 1, MAX_BODY_DEPTH):
        assert nesting_refusal(json.dumps(nested(levels)).encode(), MAX_BODY_DEPTH) is None
    deep = json.dumps(nested(MAX_BODY_DEPTH + 1)).encode()
    assert "more than" in str(nesting_refusal(deep, MAX_BODY_DEPTH))
    for broken in (b"[" * 5000, b"[{" * 100 + b"]}" * 100, b'["' + b"[" * 200):
        assert "do not pair up" in str(nesting_refusal(broken, MAX_BODY_DEPTH))
    # too few openers to nest deep: left to the parser (which cannot recurse far)
    assert nesting_refusal(b"]" * 5000, MAX_BODY_DEPTH) is None
    # a shallow body with many brackets, some in strings, passes
    wide = json.dumps([{"a": ["[[[{{{", {"b": '"]]'}]}] * 1000).encode()
    assert nesting_refusal(wide, MAX_BODY_DEPTH) is None


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    cfg = make_config(tmp_path, api={"max_body_bytes": 1 << 20})
    async with running(cfg) as gw, httpx.AsyncClient(base_url=url_of(gw)) as client:
        yield client


async def test_a_value_nests_at_most_the_limit_on_every_version(
    http: httpx.AsyncClient,
) -> None:
    deepest = nested(MAX_VALUE_DEPTH, 'leaf [ { " ] }')
    assert depth(deepest) == MAX_VALUE_DEPTH
    r = await http.post(
        "/v1/topics/t/records?ack=local",
        json={"records": [{"value": deepest, "key": "k", "partition": 1}]},
    )
    assert r.status_code == 200, r.text
    offset = r.json()["offsets"][0]["offset"]
    r = await http.get(f"/v1/topics/t/partitions/1/records?offset={offset}")
    stored = r.json()["records"][0]["value"]
    assert json.loads(stored) == deepest
    assert stored == json.dumps(deepest, separators=(",", ":"), ensure_ascii=False)

    # one level more, and far more (3.11's parser gives up near 1,000, 3.13's does not)
    for levels in (MAX_VALUE_DEPTH + 1, 1_800, 100_000):
        body = b'{"records": [{"value": ' + nested_text(levels) + b"}]}"
        r = await http.post("/v1/topics/t/records", content=body, headers=JSON)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "invalid_request"
        assert f"more than {MAX_BODY_DEPTH} levels deep" in err["message"]
        assert f"a record value may nest at most {MAX_VALUE_DEPTH} levels" in err["message"]
    # headers are strings: a nested header value is refused, shallow or deep
    for levels in (1, 1_800):
        body = b'{"records": [{"value": "x", "headers": {"h": ' + nested_text(levels) + b"}}]}"
        r = await http.post("/v1/topics/t/records", content=body, headers=JSON)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid_request"
    # an unbalanced deep body is refused before the parser recurses
    r = await http.post(
        "/v1/topics/t/records", content=b'{"records": [{"value": ' + b"[" * 50_000, headers=JSON
    )
    assert r.status_code == 400
    assert "do not pair up" in r.json()["error"]["message"]
    # nothing refused reached the journal
    r = await http.get("/v1/topics/t")
    assert sum(p["next_offset"] for p in r.json()["partitions"]) == 1
