"""LinkMeter / MeteredBucket: the cap paces transfers; usage per day and month survives restarts.

Time is trio's MockClock (autojump): the meter's clock is ``trio.current_time``,
so these tests measure virtual seconds, exactly, and take none.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
import trio.testing

from edge_gateway.bucket import LinkMeter, LocalBucket, MeteredBucket
from edge_gateway.config import ConfigError, parse_config


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


class Wall:
    """A settable wall clock (seconds since the epoch)."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


async def test_uploads_are_paced_at_the_cap(autojump_clock: trio.testing.MockClock) -> None:
    meter = LinkMeter(1_000_000, clock=trio.current_time)
    start = trio.current_time()
    for _ in range(60):
        await meter.before_upload(500_000)
    # 60 x 0.5 MB at 1 MB/s: the last upload's slot starts at 29.5 s.
    assert trio.current_time() - start == pytest.approx(29.5)
    assert meter.statistics().up_bytes == 30_000_000


async def test_uploads_and_downloads_share_the_cap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    meter = LinkMeter(2_000_000, clock=trio.current_time)
    start = trio.current_time()

    async def up() -> None:
        for _ in range(20):
            await meter.before_upload(1_000_000)

    async def down() -> None:
        for _ in range(20):
            await meter.after_download(1_000_000)

    async with trio.open_nursery() as n:
        n.start_soon(up)
        n.start_soon(down)
    # 40 MB at 2 MB/s: 20 s of slots, whatever the interleaving.
    assert trio.current_time() - start == pytest.approx(20.0, abs=0.5)
    k = meter.statistics()
    assert (k.up_bytes, k.down_bytes) == (20_000_000, 20_000_000)
    assert k.waited_s > 0


async def test_an_idle_link_lets_the_next_transfer_go_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    meter = LinkMeter(1_000_000, clock=trio.current_time)
    await meter.before_upload(1_000_000)
    await trio.sleep(5)  # idle: unused time is not saved up as a burst
    t = trio.current_time()
    await meter.before_upload(1_000_000)
    assert trio.current_time() == t
    await meter.before_upload(1_000_000)  # but the one after waits its slot
    assert trio.current_time() == pytest.approx(t + 1.0)


async def test_no_cap_never_waits(autojump_clock: trio.testing.MockClock) -> None:
    meter = LinkMeter(0, clock=trio.current_time)
    t = trio.current_time()
    for _ in range(10):
        await meter.before_upload(100 << 20)
        await meter.after_download(100 << 20)
    assert trio.current_time() == t
    assert meter.statistics().waited_s == 0


def test_usage_rolls_over_at_local_midnight_and_month(tmp_path: Path) -> None:
    wall = Wall(1_798_000_000.0)  # 2026-12-23 (UTC)
    meter = LinkMeter(0, wall=wall)
    meter._count(1000, up=True)
    k = meter.statistics()
    assert (k.day_bytes, k.month_bytes) == (1000, 1000)
    wall.t += 86_400  # the next day, same month
    k = meter.statistics()
    assert (k.day_bytes, k.month_bytes) == (0, 1000)
    meter._count(10, up=False)
    assert (meter.statistics().day_bytes, meter.statistics().month_bytes) == (10, 1010)
    wall.t += 20 * 86_400  # next month
    assert (meter.statistics().day_bytes, meter.statistics().month_bytes) == (0, 0)


def test_usage_survives_a_restart_within_the_period(tmp_path: Path) -> None:
    path = tmp_path / "link-usage.json"
    wall = Wall(1_798_000_000.0)
    meter = LinkMeter(0, usage_path=path, wall=wall)
    meter._count(4096, up=True)
    meter.save()
    again = LinkMeter(0, usage_path=path, wall=wall)
    assert (again.statistics().day_bytes, again.statistics().month_bytes) == (4096, 4096)
    assert again.statistics().up_bytes == 0  # since start, not persisted
    wall.t += 86_400
    tomorrow = LinkMeter(0, usage_path=path, wall=wall)
    assert (tomorrow.statistics().day_bytes, tomorrow.statistics().month_bytes) == (0, 4096)


@pytest.mark.parametrize(
    "content",
    [b"", b"{not json", b"[]", json.dumps({"version": 99}).encode(), b"\xff\xfe"],
)
def test_an_unreadable_usage_file_is_ignored_not_fatal(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "link-usage.json"
    path.write_bytes(content)
    meter = LinkMeter(0, usage_path=path)
    assert meter.statistics().month_bytes == 0
    meter._count(1, up=True)
    meter.save()
    assert json.loads(path.read_text())["month_bytes"] == 1


def test_a_failed_save_keeps_counting(tmp_path: Path) -> None:
    path = tmp_path / "gone" / "link-usage.json"  # its directory does not exist
    meter = LinkMeter(0, usage_path=path)
    meter._count(7, up=True)
    meter.save()  # logged, not raised
    assert meter.statistics().month_bytes == 7


async def test_a_metered_bucket_counts_object_payloads(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    meter = LinkMeter(100_000, clock=trio.current_time)
    async with await LocalBucket.open(tmp_path / "b", create=True) as inner:
        bucket = MeteredBucket(inner, meter)
        t = trio.current_time()
        await bucket.put("a", b"x" * 50_000, if_none_match=True)
        await bucket.put("b", b"y" * 50_000, if_none_match=True)
        got = await bucket.get("a", start=10_000, end=20_000)
        assert got.data == b"x" * 10_000
        await bucket.head("a")
        assert [o.key for o in await bucket.list("")] == ["a", "b"]
        await bucket.delete("b")
        k = meter.statistics()
        assert (k.up_bytes, k.down_bytes) == (100_000, 10_000)
        # 110 kB at 100 kB/s: the download's slot ends 1.1 s after the first upload
        assert trio.current_time() - t == pytest.approx(1.1)
        assert "capped at 100000 B/s" in bucket.describe()
        await bucket.aclose()
        assert inner.closed


def test_link_config_takes_sizes_and_refuses_nonsense() -> None:
    cfg = parse_config({"region": "r", "link": {"max_bytes_per_s": "4MB"}})
    assert cfg.link.max_bytes_per_s == 4_000_000
    assert parse_config({"region": "r"}).link.max_bytes_per_s == 0
    for bad in (-1, 10, "fast"):
        with pytest.raises(ConfigError, match=r"link\.max_bytes_per_s"):
            parse_config({"region": "r", "link": {"max_bytes_per_s": bad}})
    env = {"EDGEGW_LINK_MAX_BYTES_PER_S": '"512KiB"'}
    assert parse_config({"region": "r"}, env=env).link.max_bytes_per_s == 512 * 1024
