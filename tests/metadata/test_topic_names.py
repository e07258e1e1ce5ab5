"""The metadata server creates topics under the rule for topics homed in a
region (edge_gateway/names.py): no '.', which separates region and topic in
mirror topic names, and no leading '-' or '.'."""

from __future__ import annotations

import pytest
from _meta_support import Fleet, http

#: The API contract is the same on every store (conftest.py runs these on each).
STORES = ("sqlite", "postgres")


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("south.telemetry", "contains '.'"),
        ("a.b", "contains '.'"),
        (".hidden", "must not start with '.'"),
        ("-x", "must not start with '-'"),
    ],
)
def test_a_topic_homed_in_a_region_has_no_dot(fleet: Fleet, name: str, fragment: str) -> None:
    with http(fleet.url) as c:
        r = c.post("/v1/topics", json={"name": name, "home": "north"})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "invalid_name"
        assert fragment in err["message"]
        assert all(t["name"] != name for t in c.get("/v1/routing").json()["topics"])


def test_dashes_and_underscores_inside_a_name_are_fine(fleet: Fleet) -> None:
    with http(fleet.url) as c:
        r = c.post("/v1/topics", json={"name": "ok_name-1", "home": "north"})
        assert r.status_code == 201, r.text
