"""Hypothesis-generated requests against a real server: never a 5xx, errors always JSON.

(schemathesis was not added: hypothesis alone covers the document's routes
here, without a new test dependency.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from _meta_support import ADMIN_TOKEN, MetaServer, http, new_database
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROUTES = json.loads(
    (Path(__file__).parents[2] / "docs" / "metadata-openapi.json").read_text(encoding="utf-8")
)["paths"]


#: Both stores: PostgreSQL refuses what SQLite takes (a NUL in text, say).
STORES = ("sqlite", "postgres")


@pytest.fixture(scope="module")
def target(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, store_kind: str
) -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    directory = tmp_path_factory.mktemp("fuzz")
    db: Path | str = directory / "meta.sqlite"
    if store_kind == "postgres":
        db = new_database(request.getfixturevalue("postgres"))
    server = MetaServer(db, files=directory / "meta")
    try:
        with http(server.url) as c:
            tokens = {
                r: c.post("/v1/regions", json={"id": r}).json()["token"] for r in ("north", "south")
            }
            c.post("/v1/topics", json={"name": "t", "home": "north", "subscribers": ["south"]})
        with httpx.Client(base_url=server.url, timeout=30) as client:
            yield client, tokens
        with http(server.url) as c:  # still serving after everything
            assert c.get("/v1/routing").status_code == 200
    finally:
        assert server.stop() == 0


names = st.one_of(
    st.sampled_from(["north", "south", "t", "default", "mars", "..", ".", "a.b", "x" * 300]),
    st.text(min_size=1, max_size=30),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
field_names = st.sampled_from(
    [
        "name",
        "home",
        "partitions",
        "retention_ms",
        "subscribers",
        "id",
        "seq",
        "lag",
        "gateway_version",
        "head_seq",
        "type",
        "bucket",
        "path",
        "path_style",
        "prefix",
    ]
)
objects = st.dictionaries(field_names | st.text(max_size=8), json_values, max_size=6)
bodies = st.one_of(
    st.none(),
    objects.map(lambda d: json.dumps(d).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),
    st.just(b"{" * 3000),
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, dict[str, str], dict[str, Any], bytes | None]:
    template = draw(st.sampled_from(sorted(ROUTES)))
    documented = sorted(ROUTES[template])
    method = draw(
        st.sampled_from([m.upper() for m in documented])
        | st.sampled_from(["PUT", "POST", "PATCH", "DELETE", "GET"])
    )
    path = template
    for param in ("{topic}", "{region}", "{bucket}"):
        if param in path:
            path = path.replace(param, quote(draw(names), safe=""))
    query = draw(
        st.dictionaries(
            st.sampled_from(["since", "regions", "wait_ms", "x"]),
            st.sampled_from(
                ["0", "1", "-1", "99999999999999999999999", "a", "", "north,south", "50"]
            ),
            max_size=3,
        )
    )
    headers = {}
    content_type = draw(
        st.sampled_from([None, "application/json", "text/plain", "application/json; charset=utf-8"])
    )
    if content_type:
        headers["Content-Type"] = content_type
    etag = draw(st.sampled_from([None, '"1"', "*", "garbage", 'W/"3"']))
    if etag:
        headers["If-None-Match"] = etag
    return method, path, query, headers, draw(bodies)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(req=requests(), who=st.sampled_from(["admin", "north", "south", "none", "bad"]))
def test_no_5xx(target: tuple[httpx.Client, dict[str, str]], req: Any, who: str) -> None:
    client, tokens = target
    method, path, query, headers, body = req
    token = {"admin": ADMIN_TOKEN, "none": None, "bad": "bad-token-0123456789abc"}.get(
        who, tokens.get(who)
    )
    if token:
        headers = {**headers, "Authorization": f"Bearer {token}"}
    if "wait_ms" in query:
        query = {**query, "wait_ms": query["wait_ms"][:2]}  # keep long polls short
    r = client.request(method, path, params=query, headers=headers, content=body)
    assert r.status_code < 500, (method, path, query, body, r.text)
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["code"]
        assert err["message"]
