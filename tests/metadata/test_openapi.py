"""The OpenAPI document: current on disk, and exactly the routes the server serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

from edge_gateway.metadata._db import MetadataStore
from edge_gateway.metadata._openapi import openapi_document, render
from edge_gateway.metadata.server import MetadataApp, MetadataServerConfig, served_routes

DOC = Path(__file__).parents[2] / "docs" / "metadata-openapi.json"


def test_docs_file_is_current() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), (
        "regenerate: python -m edge_gateway.metadata._openapi > docs/metadata-openapi.json"
    )


def test_every_route_is_documented_and_nothing_else(tmp_path: Path) -> None:
    store = MetadataStore(tmp_path / "m.sqlite")
    try:
        app = MetadataApp(store, MetadataServerConfig(db=tmp_path / "m.sqlite"))
        served = served_routes(app)
    finally:
        store.close()
    doc = json.loads(DOC.read_text(encoding="utf-8"))
    documented = {(path, method.upper()) for path, ops in doc["paths"].items() for method in ops}
    assert served == documented
    # The route table serves exactly that set: each documented path and method
    # reaches its route, and every other method on it is refused.
    for path, method in documented:
        concrete = re.sub(r"{[^}]+}", "x", path)
        match = app.router.match(method, concrete)
        assert match.route is not None, (path, method)
        assert match.route.path == path, (path, method)
        for other in {"GET", "POST", "PUT", "PATCH", "DELETE"} - {
            m for p, m in documented if p == path
        }:
            assert app.router.match(other, concrete).route is None, (path, other)


def test_document_is_well_formed() -> None:
    doc = openapi_document()
    schemas = doc["components"]["schemas"]
    refs: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "$ref":
                    refs.append(v)
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(doc)
    assert refs
    for ref in refs:
        assert ref.removeprefix("#/components/schemas/") in schemas, ref
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["responses"], (path, method)
            names = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert names == {seg[1:-1] for seg in path.split("/") if seg.startswith("{")}
