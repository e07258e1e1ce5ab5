"""The metadata app answers the same on both HTTP servers it can run on.

``--server builtin`` (edgegw's own, the default) and ``--server hypercorn``
serve one plain ASGI app (routed by ``edge_gateway.net.asgi``): the same
statuses, error codes and headers for the routes, the refusals (404, 405 with
``Allow``, 413 closing the connection) and ``HEAD``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from edge_gateway.metadata.server import MetadataServerConfig, serve_metadata


def _probe(url: str) -> list[Any]:
    with httpx.Client(base_url=url, timeout=30) as c:
        out: list[Any] = [c.get("/healthz").status_code]
        r = c.get("/v1/nope")
        out.append((r.status_code, r.json()["error"]["code"]))
        r = c.put("/v1/topics", json={})
        out.append((r.status_code, r.json()["error"]["code"], r.headers.get("allow")))
        out.append(c.post("/v1/regions", json={"id": "north"}).status_code)
        r = c.post("/v1/regions/north/heartbeat", json={"gateway_version": "t"})
        out.append((r.status_code, sorted(r.json()), r.headers["content-type"]))
        r = c.post("/v1/regions/north/head", json={"seq": 3})
        out.append((r.status_code, r.json()))
        r = c.get("/v1/heads", params={"since": 0, "wait_ms": 10})
        out.append((r.status_code, r.json()["heads"]))
        r = c.head("/v1/routing")
        out.append((r.status_code, r.headers.get("etag"), r.content))
        big = b"x" * 70_000
        r = c.post("/v1/regions", content=big, headers={"content-type": "application/json"})
        out.append((r.status_code, r.json()["error"]["code"], r.headers.get("connection")))
        r = c.post("/v1/regions", content=b"[1]", headers={"content-type": "application/json"})
        out.append((r.status_code, r.json()["error"]["code"]))
        out.append(c.get("/v1/topics/").status_code)  # a trailing slash is no route
        return out


@pytest.mark.parametrize("server", ["builtin", "hypercorn"])
async def test_the_same_answers_on_both_servers(tmp_path: Path, server: str) -> None:
    config = MetadataServerConfig(db=tmp_path / "m.sqlite", listen="127.0.0.1:0", server=server)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_metadata, config)
        answers = await trio.to_thread.run_sync(_probe, url)
        nursery.cancel_scope.cancel()
    assert answers == [
        200,
        (404, "not_found"),
        (405, "method_not_allowed", "GET, HEAD, POST"),
        201,
        (200, ["routing_version", "server_ms"], "application/json"),
        (200, {"region": "north", "seq": 3, "version": answers[5][1]["version"]}),
        (200, {"north": 3}),
        (200, '"2"', b""),
        (413, "body_too_large", "close"),
        (400, "invalid_json"),
        404,
    ]
