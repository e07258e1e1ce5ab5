"""The ingest's thread-to-trio hand-off: batches, order, backpressure, close."""

from __future__ import annotations

import threading

import pytest
import trio

from edge_gateway.mqtt._handoff import Handoff


def _one(_item: int) -> int:
    return 1


async def _until_full(h: Handoff[int]) -> None:
    """Until the putting thread waits for room (at most ~5 s: the caller asserts)."""
    for _ in range(500):
        if h.full_waits:
            return
        await trio.sleep(0.01)


async def test_items_from_a_thread_arrive_in_order_in_batches() -> None:
    h = Handoff[int](100, trio.lowlevel.current_trio_token())
    n = 5000

    def produce() -> None:
        for i in range(n):
            assert h.put(i)

    got: list[int] = []
    batches = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, produce)
        while len(got) < n:
            batch = await h.get_batch(64, _one, 1 << 30)
            assert 1 <= len(batch) <= 64
            got += batch
            batches += 1
            await trio.lowlevel.checkpoint()
    assert got == list(range(n))
    assert batches < n  # more than one item per batch when the consumer is behind


async def test_a_full_handoff_blocks_the_thread_until_items_are_taken() -> None:
    h = Handoff[int](3, trio.lowlevel.current_trio_token())
    fourth_in = threading.Event()

    def produce() -> None:
        for i in range(4):
            h.put(i)
            if i == 3:
                fourth_in.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, produce)
        await _until_full(h)
        assert h.full_waits == 1
        assert len(h) == 3
        assert not fourth_in.is_set()  # waits for room: no item dropped, none beyond the bound
        assert await h.get_batch(2, _one, 100) == [0, 1]
        await trio.to_thread.run_sync(fourth_in.wait, 5)
        assert fourth_in.is_set()
        assert await h.get_batch(10, _one, 100) == [2, 3]


async def test_weight_bounds_a_batch_and_one_heavy_item_still_goes() -> None:
    h = Handoff[bytes](10, trio.lowlevel.current_trio_token())
    for item in (b"x" * 100, b"y" * 10, b"z" * 10):
        h.put(item)
    assert await h.get_batch(10, len, 50) == [b"x" * 100]
    assert await h.get_batch(10, len, 15) == [b"y" * 10, b"z" * 10]


async def test_close_releases_a_blocked_thread_and_refuses_more() -> None:
    h = Handoff[int](1, trio.lowlevel.current_trio_token())
    assert h.put(0)
    result: list[bool] = []

    def blocked_put() -> None:
        result.append(h.put(1))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, blocked_put)
        await _until_full(h)
        h.close()
    assert result == [False]
    assert not h.put(2)
    with pytest.raises(trio.ClosedResourceError):
        await h.get_batch(1, _one, 1)
