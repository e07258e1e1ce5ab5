"""The gateway's retries against an overloaded or absent metadata server.

The pure part, :class:`edge_gateway.backoff.Backoff` (the shipper's
backoff, which the metadata client and agent share): full jitter, a cap, and
``delay_after`` honouring a server's ``Retry-After`` (never sooner, spread
after). Then the client: a 503 or 429 with ``Retry-After`` is
:class:`MetadataOverloaded` carrying it, and the head reporter waits at
least that long before sending again (virtual clock).
"""

from __future__ import annotations

import email.utils
import itertools
import random
import time

import httpx
import pytest
import trio
import trio.testing

from edge_gateway.backoff import Backoff
from edge_gateway.errors import Unavailable
from edge_gateway.metadata import HeadReporter, MetadataClient, MetadataRefused
from edge_gateway.metadata.client import (
    MAX_RETRY_AFTER_S,
    MetadataOverloaded,
    parse_retry_after,
    retry_after_of,
)


def test_backoff_grows_to_its_cap_with_full_jitter() -> None:
    b = Backoff(0.5, 20.0)
    ceilings = []
    for _ in range(12):
        ceilings.append(b.next_delay(0.999999))
    assert ceilings[0] == pytest.approx(0.5, rel=1e-3)
    assert ceilings[1] == pytest.approx(1.0, rel=1e-3)
    assert max(ceilings) <= 20.0
    assert ceilings[-1] == pytest.approx(20.0, rel=1e-3)
    b.reset()
    assert b.next_delay(0.5) == pytest.approx(0.25)
    # Full jitter: anywhere from 0 to the ceiling.
    assert Backoff(1.0, 8.0).next_delay(0.0) == 0.0
    many = Backoff(1.0, 8.0, attempt=200)  # no overflow after very many attempts
    assert many.next_delay(0.5) == pytest.approx(4.0)


def test_delay_after_is_never_sooner_than_retry_after_and_is_spread() -> None:
    rng = random.Random(1)
    delays = []
    for _ in range(2000):
        b = Backoff(0.5, 20.0, attempt=3)  # the 4th failure: window up to 4 s
        d = b.delay_after(5.0, rng.random())
        assert 5.0 <= d < 5.0 + 4.0
        delays.append(d)
    # A fleet told "5 s" comes back over the next 4 s, not all at 5 s.
    assert max(delays) - min(delays) > 3.5
    buckets = [sum(1 for d in delays if 5 + i <= d < 6 + i) for i in range(4)]
    assert min(buckets) > 350  # roughly uniform: ~500 each
    # Without Retry-After it is the plain backoff; a negative one is now.
    assert Backoff(0.5, 20.0).delay_after(None, 0.5) == pytest.approx(0.25)
    assert Backoff(0.5, 20.0).delay_after(-3.0, 0.0) == 0.0
    # Each call is an attempt: the window grows.
    b = Backoff(0.5, 20.0)
    assert [b.delay_after(1.0, 0.999999) for _ in range(3)] == pytest.approx(
        [1.5, 2.0, 3.0], rel=1e-3
    )


def test_parse_retry_after() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(" 0 ") == 0.0
    assert parse_retry_after("999999") == MAX_RETRY_AFTER_S
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-3") is None
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    got = parse_retry_after(when)
    assert got is not None
    assert 25 <= got <= 31
    past = email.utils.formatdate(time.time() - 30, usegmt=True)
    assert parse_retry_after(past) == 0.0


def _answers(*responses: httpx.Response) -> tuple[httpx.MockTransport, list[float]]:
    """A transport answering ``responses`` in turn (the last one for ever); the times asked."""
    times: list[float] = []
    queue = list(responses)

    def handle(request: httpx.Request) -> httpx.Response:
        times.append(trio.current_time())
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return httpx.MockTransport(handle), times


def _overloaded(status: int = 503, after: str = "3") -> httpx.Response:
    body = {"error": {"code": "overloaded", "message": "busy"}}
    return httpx.Response(status, json=body, headers={"Retry-After": after})


async def test_503_and_429_with_retry_after_are_overloaded() -> None:
    for status in (503, 429):
        transport, _ = _answers(_overloaded(status, "4"))
        async with MetadataClient("http://meta", region="north", transport=transport) as c:
            with pytest.raises(MetadataOverloaded) as info:
                await c.report_head(3)
        assert info.value.retry_after_s == 4.0
        assert isinstance(info.value, Unavailable)  # every caller already retries these
        assert retry_after_of(info.value) == 4.0
    # A 503 without Retry-After stays plain Unavailable; a 429 without it a refusal.
    transport, _ = _answers(httpx.Response(503))
    async with MetadataClient("http://meta", region="north", transport=transport) as c:
        with pytest.raises(Unavailable) as plain:
            await c.report_head(3)
    assert retry_after_of(plain.value) is None
    transport, _ = _answers(httpx.Response(429, json={"error": {"code": "x", "message": "y"}}))
    async with MetadataClient("http://meta", region="north", transport=transport) as c:
        with pytest.raises(MetadataRefused):
            await c.report_head(3)


async def test_the_head_reporter_waits_out_retry_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ok = httpx.Response(200, json={"region": "north", "seq": 9, "version": 1})
    transport, times = _answers(_overloaded(after="3"), _overloaded(after="3"), ok)
    async with MetadataClient("http://meta", region="north", transport=transport) as c:
        reporter = HeadReporter(c, retry_cap_s=60.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(reporter.run)
            reporter.report_nowait(7)
            await trio.sleep(0.01)
            reporter.report_nowait(9)  # while it waits: the retry sends the latest
            # The virtual clock jumps over every wait: read the figures after a minute.
            await trio.sleep(60)
            nursery.cancel_scope.cancel()
    assert len(times) == 3
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(g >= 3.0 for g in gaps), gaps  # never sooner than the server asked
    s = reporter.statistics()
    assert (s.failures, s.reports, s.sent) == (2, 1, 9)


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)
