"""The tailer over a slow link: entries are fetched several at a time, not one per round trip.

The source ships to moto's S3 server directly; the mirror reads through a TCP
proxy that delays every chunk (``LinkShape.latency_s``), as a satellite or a
congested uplink would. Fewer entries are waiting than ``catch_up_threshold``,
so this is the "following" path (no manifests), where a tailer used to ask for
one entry per round trip. What is checked is the count of fetches the tailer
had in flight at once (``fetches_in_flight_peak``), never a duration.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio
from _mirror_support import JCFG, log_records, mirror_of, open_bucket, produce

from edge_gateway.bucket import Bucket
from edge_gateway.journal import Journal
from edge_gateway.mirror import Tailer, TailerConfig
from edge_gateway.shipper import Shipper, ShipperConfig
from edge_gateway.testing.tcpproxy import LinkShape, TcpProxy

SHIP = ShipperConfig(flush_interval_ms=20, manifest_every=1000)
CFG = TailerConfig(
    poll_interval_s=0.01,
    max_poll_interval_s=0.05,
    catch_up_threshold=16,
    prefetch_objects=8,
    cursor_interval_s=0,
)
BEHIND = 10  # entries waiting: below catch_up_threshold


@pytest.fixture
async def source(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> AsyncIterator[tuple[Bucket, Shipper, Journal]]:
    bucket = await open_bucket("s3", tmp_path, moto_endpoint, s3_bucket_name)
    j = Journal.open_sync(tmp_path / "a", JCFG)
    try:
        s = Shipper(j, bucket, "a", config=SHIP)
        await s.claim()
        yield bucket, s, j
    finally:
        j.close_sync()
        await bucket.aclose()


@pytest.fixture
def slow_link(moto_endpoint: str) -> Iterator[str]:
    port = int(moto_endpoint.rsplit(":", 1)[1])
    with TcpProxy("127.0.0.1", port, shape=LinkShape(latency_s=0.1)) as proxy:
        yield f"http://127.0.0.1:{proxy.port}"


@pytest.fixture
async def mirror_bucket(
    tmp_path: Path, slow_link: str, s3_bucket_name: str
) -> AsyncIterator[Bucket]:
    bucket = await open_bucket("s3", tmp_path, slow_link, s3_bucket_name)
    try:
        yield bucket
    finally:
        await bucket.aclose()


async def ship(shipper: Shipper, j: Journal, entries: int) -> None:
    for _ in range(entries):
        produce(j, "t", 2, 1)
        await shipper.ship_pending()


async def test_entries_behind_are_fetched_several_at_once(
    source: tuple[Bucket, Shipper, Journal], mirror_bucket: Bucket, journal: Journal
) -> None:
    bucket, shipper, j = source
    await ship(shipper, j, BEHIND)
    tailer = Tailer(journal, mirror_bucket, "a", None, "b", CFG)
    with trio.fail_after(60):
        await tailer.catch_up()
    src = await log_records(bucket, "a")
    assert mirror_of(journal, "a", src) == src
    stats = tailer.statistics()
    assert stats.catch_ups == 0  # too few behind for manifests: the following path
    assert stats.entries == BEHIND + 1  # and the fence
    # The known head (found by the first pull) is asked for at once, up to the window.
    assert stats.fetches_in_flight_peak >= 4
    assert stats.fetches_in_flight_peak <= CFG.prefetch_objects
    assert stats.probe_misses <= CFG.prefetch_objects
    assert stats.fetches_in_flight == 0


async def test_a_following_tailer_asks_ahead_while_entries_keep_coming(
    source: tuple[Bucket, Shipper, Journal], mirror_bucket: Bucket, journal: Journal
) -> None:
    bucket, shipper, j = source
    tailer = Tailer(journal, mirror_bucket, "a", None, "b", CFG)
    with trio.fail_after(60):
        await tailer.catch_up()  # the fence: caught up, idle
        idle = tailer.statistics()
        assert idle.fetches_in_flight_peak <= 2
        # Entries arrive while it follows (no relay, no known head): each pull
        # asks past the last entry found, as many as were found.
        for _ in range(3):
            await ship(shipper, j, BEHIND)
            await tailer.catch_up()
    src = await log_records(bucket, "a")
    assert mirror_of(journal, "a", src) == src
    stats = tailer.statistics()
    assert stats.fetches_in_flight_peak >= 3
    # Probing past the end is bounded: at most the window per pull.
    assert stats.probe_misses <= 4 * CFG.prefetch_objects
