"""The catch-up order across sources (``PriorityGate``): who waits for whom."""

from __future__ import annotations

import trio
import trio.testing

from edge_gateway.journal import Priority
from edge_gateway.mirror import PriorityGate


def test_held_only_by_a_strictly_higher_priority() -> None:
    gate = PriorityGate()
    assert not gate.held("a")
    gate.announce("a", Priority.BULK)
    assert not gate.held("a")  # alone
    gate.announce("b", Priority.BULK)
    assert not gate.held("a")  # equal priorities go side by side
    assert not gate.held("b")
    gate.announce("c", Priority.CRITICAL)
    assert gate.held("a")
    assert gate.held("b")
    assert not gate.held("c")  # the highest is never held
    assert not gate.held("d")  # one that does not catch up is never held
    gate.announce("b", Priority.NORMAL)
    assert gate.held("b")
    assert gate.announced() == {
        "a": Priority.BULK,
        "b": Priority.NORMAL,
        "c": Priority.CRITICAL,
    }
    gate.announce("c", None)
    assert gate.held("a")  # by b now
    assert not gate.held("b")
    gate.announce("b", None)
    assert not gate.held("a")
    gate.announce("a", None)
    gate.announce("a", None)  # withdrawing twice is harmless
    assert gate.announced() == {}


async def test_wait_turn_wakes_when_the_higher_priority_withdraws() -> None:
    gate = PriorityGate()
    gate.announce("crit", Priority.CRITICAL)
    gate.announce("bulk", Priority.BULK)
    order: list[str] = []

    async def bulk() -> None:
        assert await gate.wait_turn("bulk")
        order.append("bulk")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(bulk)
        await trio.testing.wait_all_tasks_blocked()
        assert order == []
        gate.announce("crit", Priority.NORMAL)  # still higher than bulk
        await trio.testing.wait_all_tasks_blocked()
        assert order == []
        order.append("crit done")
        gate.announce("crit", None)
    assert order == ["crit done", "bulk"]
    assert not await gate.wait_turn("bulk")  # not held: no wait
