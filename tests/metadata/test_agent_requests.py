"""How many requests a gateway's agent sends: heartbeats stand in for the routing poll.

Every heartbeat answer names the server's routing version, so while heartbeats
succeed and name the table's version the agent does not poll ``GET
/v1/routing`` (only a slow safety refresh); a heartbeat naming another version
fetches at once, and a failed heartbeat hands back to the poll (unless it was
merely late, once: timed out or shed). Against a real
server process; the counts compare heartbeats with fetches, so a slow machine
slows both alike.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from _meta_support import MetaServer, admin

from edge_gateway.config import MetadataSettings
from edge_gateway.errors import ClosedError, CorruptData, Unavailable
from edge_gateway.metadata.agent import (
    ROUTING_SAFETY_REFRESH_S,
    AgentHooks,
    MetadataAgent,
    late_beat_keeps_table,
)
from edge_gateway.metadata.client import MetadataOverloaded, MetadataRefused, MetadataTimedOut
from edge_gateway.metadata.routing import RoutingTable


async def _until(predicate: Callable[[], object], what: str, timeout_s: float = 60.0) -> None:
    with trio.move_on_after(timeout_s):
        while not predicate():  # noqa: ASYNC110 - polls the agent's counters
            await trio.sleep(0.02)
        return
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _agent(url: str, token: str, data_dir: Path, applied: list[RoutingTable]) -> MetadataAgent:
    async def apply_routing(table: RoutingTable) -> None:
        applied.append(table)

    def shipper_statistics() -> Any:
        raise ClosedError("no shipper")

    hooks = AgentHooks(
        region="north",
        data_dir=data_dir,
        apply_routing=apply_routing,
        shipper_statistics=shipper_statistics,
        tailers=dict,
    )
    settings = MetadataSettings(
        url=url,
        token=token,
        head_relay=False,
        poll_interval_ms=100,  # the poll would run 3x per heartbeat interval
        heartbeat_interval_ms=300,
    )
    return MetadataAgent(hooks, settings)


async def test_heartbeats_stand_in_for_the_routing_poll(server: MetaServer, tmp_path: Path) -> None:
    assert ROUTING_SAFETY_REFRESH_S > 10  # the safety refresh does not run during this test
    token = admin(server.url, "POST", "/v1/regions", {"id": "north"})["token"]
    admin(server.url, "POST", "/v1/regions", {"id": "south"})
    applied: list[RoutingTable] = []
    agent = _agent(server.url, token, tmp_path, applied)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(agent.run)
            await _until(lambda: agent.status()["heartbeats"] >= 10, "10 heartbeats")
            status = agent.status()
            # The first fetch, and at most one more if the first heartbeat's
            # answer arrived before the table (then it asked for it). The
            # poll alone would have sent ~3 per heartbeat.
            assert status["fetches"] <= 2, status
            assert status["routing_by_heartbeat"]
            assert status["mode"] == "live"
            assert status["confirmed_age_s"] < 30  # heartbeats keep confirming the table

            # A change: the next heartbeat names the new version, which is fetched at once.
            fetches = status["fetches"]
            admin(server.url, "POST", "/v1/topics", {"name": "t", "home": "south"})
            await _until(
                lambda: agent.table is not None and agent.table.topic("t") is not None,
                "the new topic",
            )
            assert applied[-1] == agent.table
            beats = agent.status()["heartbeats"]
            await _until(lambda: agent.status()["heartbeats"] >= beats + 5, "5 more heartbeats")
            assert agent.status()["fetches"] - fetches <= 2

            # The server goes away: the first failed heartbeat hands back to the
            # poll, which finds it away (long before any safety refresh).
            server.stop()
            await _until(lambda: not agent.live, "the agent to notice the server is away")
            status = agent.status()
            assert status["mode"] == "cached"
            assert not status["routing_by_heartbeat"]
            nursery.cancel_scope.cancel()
    finally:
        await agent.aclose()


async def test_without_heartbeat_answers_the_poll_runs_at_its_interval(
    server: MetaServer, tmp_path: Path
) -> None:
    """An agent whose heartbeats are refused (another region's token) keeps polling."""
    admin(server.url, "POST", "/v1/regions", {"id": "north"})
    south = admin(server.url, "POST", "/v1/regions", {"id": "south"})["token"]
    agent = _agent(server.url, south, tmp_path, [])  # reads: yes; heartbeats as north: 403
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(agent.run)
            await _until(lambda: agent.status()["heartbeat_failures"] >= 3, "3 heartbeats")
            await _until(lambda: agent.status()["fetches"] >= 10, "10 routing polls")
            assert not agent.status()["routing_by_heartbeat"]
            nursery.cancel_scope.cancel()
    finally:
        await agent.aclose()


def test_a_heartbeat_merely_late_once_keeps_the_table_confirmed() -> None:
    """Timed out or shed (503) right after a success: its retry confirms the table."""
    late = [MetadataTimedOut("timed out"), MetadataOverloaded("busy", 2.0)]
    away = [
        Unavailable("metadata server x is unreachable: connection refused"),
        MetadataRefused(403, "forbidden", "no"),
        CorruptData("heartbeat answer without routing_version", where="x"),
    ]
    for exc in late:
        assert late_beat_keeps_table(exc, 1)
        assert not late_beat_keeps_table(exc, 2)  # late twice: the poll takes over
    for exc in away:
        assert not late_beat_keeps_table(exc, 1)
