"""LinkPolicy (sans-IO), LinkGate and HeldBucket: bulk windows and byte allowances.

Every question takes the time as an argument, and the time zone is given
(Europe/Berlin: DST starts 2026-03-29 02:00 -> 03:00 and ends 2026-10-25
03:00 -> 02:00), so nothing here depends on the machine's clock or zone.
The gate's waits run on trio's MockClock with a settable wall clock.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import trio
import trio.testing

from edge_gateway.bucket import (
    HeldBucket,
    LinkGate,
    LinkMeter,
    LinkPolicy,
    LocalBucket,
    Usage,
    Window,
    parse_window,
)
from edge_gateway.config import ConfigError, parse_config
from edge_gateway.errors import InvalidInput

BERLIN = ZoneInfo("Europe/Berlin")
MiB = 1 << 20


def at(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0, *, fold: int = 0) -> float:
    """Seconds since the epoch of a Berlin wall-clock time."""
    return datetime(y, mo, d, h, mi, s, tzinfo=BERLIN, fold=fold).timestamp()


def usage(day: str = "2026-06-10", day_bytes: int = 0, month_bytes: int = 0) -> Usage:
    return Usage(day, day_bytes, day[:7], month_bytes)


NONE = usage()


def windows(*texts: str) -> list[Window]:
    return [parse_window(t) for t in texts]


# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "start", "end"),
    [
        ("22:00-06:00", 22 * 60, 6 * 60),
        ("9:30-17:00", 9 * 60 + 30, 17 * 60),
        (" 00:00 - 01:00 ", 0, 60),
        ("22:00-24:00", 22 * 60, 0),
        ("00:00-23:59", 0, 23 * 60 + 59),
    ],
)
def test_windows_parse(text: str, start: int, end: int) -> None:
    assert parse_window(text) == Window(start, end)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("22-06", "is not a window"),
        ("22:00", "is not a window"),
        ("25:00-06:00", "not a time of day"),
        ("22:60-06:00", "not a time of day"),
        ("24:00-06:00", "23:59 at the latest"),
        ("06:00-06:00", "empty or the whole day"),
        ("00:00-24:00", "empty or the whole day"),
        ("24:30-01:00", "not a time of day"),
        (2200, "must be a string"),
    ],
)
def test_bad_windows_are_refused_by_name(text: object, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as info:
        parse_window(text, "link.bulk_windows[1]")
    assert str(info.value).startswith("link.bulk_windows[1]:")


def test_the_config_takes_allowances_as_sizes_and_refuses_nonsense() -> None:
    cfg = parse_config({"region": "r", "link": {"daily_bytes": "2GiB", "monthly_bytes": "40GiB"}})
    assert (cfg.link.daily_bytes, cfg.link.monthly_bytes) == (2 << 30, 40 << 30)
    for bad, says in [
        ({"daily_bytes": -1}, "daily_bytes must be >= 0"),
        ({"monthly_bytes": "12"}, "at least 1MiB"),
        ({"daily_bytes": "2 parsecs"}, "is not a size"),
        ({"daily_bytes": "2GiB", "monthly_bytes": "1GiB"}, "must not exceed"),
        ({"bulk_windows": ["22:00-06:00", "nonsense"]}, r"bulk_windows\[1\]"),
        ({"bulk_windows": "22:00-06:00"}, "must be a list"),
    ]:
        with pytest.raises(ConfigError, match=says):
            parse_config({"region": "r", "link": bad})


def test_bulk_windows_are_refused_while_no_topic_is_bulk() -> None:
    # A setting with no effect is not accepted silently: without a bulk
    # topic, windows would hold nothing.
    topic = {"name": "t", "home": "r"}
    with pytest.raises(ConfigError, match='no \\[\\[topics\\]\\] has priority = "bulk"'):
        parse_config({"region": "r", "link": {"bulk_windows": ["22:00-06:00"]}})
    with pytest.raises(ConfigError, match="bulk_windows"):
        parse_config(
            {
                "region": "r",
                "link": {"bulk_windows": ["22:00-06:00"]},
                "topics": [{**topic, "priority": "critical"}],
            }
        )
    cfg = parse_config(
        {
            "region": "r",
            "link": {"bulk_windows": ["22:00-06:00"]},
            "topics": [{**topic, "priority": "bulk"}],
        }
    )
    assert cfg.link.policy().restricts


# ---------------------------------------------------------------- windows


def test_no_restriction_allows_everything_always() -> None:
    p = LinkPolicy(tz=BERLIN)
    assert not p.restricts
    for prio in ("critical", "normal", "bulk"):
        assert p.allows(prio, at(2026, 6, 10, 3), usage(day_bytes=1 << 50))
        assert p.opens_in_s(prio, at(2026, 6, 10, 3), NONE) == 0
    assert p.next_window_change(at(2026, 6, 10)) is None


def test_a_window_wrapping_midnight() -> None:
    p = LinkPolicy(windows("22:00-06:00"), tz=BERLIN)
    inside = [
        at(2026, 6, 10, 22),
        at(2026, 6, 10, 23, 59, 59),
        at(2026, 6, 11, 0),
        at(2026, 6, 11, 5, 59, 59),
    ]
    outside = [at(2026, 6, 11, 6), at(2026, 6, 11, 12), at(2026, 6, 11, 21, 59, 59)]
    for t in inside:
        assert p.allows("bulk", t, NONE), datetime.fromtimestamp(t, BERLIN)
    for t in outside:
        assert not p.allows("bulk", t, NONE), datetime.fromtimestamp(t, BERLIN)
        # normal and critical ignore windows
        assert p.allows("normal", t, NONE)
        assert p.allows("critical", t, NONE)
    # From noon, bulk waits until 22:00 (10 h); at 23:00 the window closes at 06:00 (7 h).
    assert p.opens_in_s("bulk", at(2026, 6, 11, 12), NONE) == 10 * 3600
    assert p.next_window_change(at(2026, 6, 11, 12)) == at(2026, 6, 11, 22)
    assert p.next_window_change(at(2026, 6, 10, 23)) == at(2026, 6, 11, 6)
    assert p.decide("bulk", at(2026, 6, 11, 12), NONE).reason == "outside link.bulk_windows"


def test_several_windows_and_adjacent_ones_count_as_one() -> None:
    p = LinkPolicy(windows("01:00-03:00", "12:00-13:00", "03:00-04:00"), tz=BERLIN)
    assert p.allows("bulk", at(2026, 6, 10, 3, 30), NONE)
    # At 02:00 the next change is 04:00 (03:00 is no change: the next window starts).
    assert p.next_window_change(at(2026, 6, 10, 2)) == at(2026, 6, 10, 4)
    assert p.opens_in_s("bulk", at(2026, 6, 10, 5), NONE) == 7 * 3600
    # After the last window of the day, the first of tomorrow.
    assert p.opens_in_s("bulk", at(2026, 6, 10, 14), NONE) == 11 * 3600


def test_a_window_ending_at_midnight() -> None:
    p = LinkPolicy(windows("22:00-24:00"), tz=BERLIN)
    assert p.allows("bulk", at(2026, 6, 10, 23, 59), NONE)
    assert not p.allows("bulk", at(2026, 6, 11, 0), NONE)
    assert p.next_window_change(at(2026, 6, 10, 23)) == at(2026, 6, 11, 0)


def test_windows_follow_local_wall_time_across_dst() -> None:
    p = LinkPolicy(windows("22:00-06:00"), tz=BERLIN)
    # The night the clocks go forward (2026-03-29 02:00 -> 03:00) the window lasts 7 h ...
    opened = at(2026, 3, 28, 22)
    assert p.next_window_change(opened) - opened == 7 * 3600
    # ... and 9 h the night they go back (2026-10-25 03:00 -> 02:00).
    opened = at(2026, 10, 24, 22)
    assert p.next_window_change(opened) - opened == 9 * 3600
    # Both 02:30s of the night they go back are inside.
    assert p.allows("bulk", at(2026, 10, 25, 2, 30, fold=0), NONE)
    assert p.allows("bulk", at(2026, 10, 25, 2, 30, fold=1), NONE)


def test_a_window_boundary_skipped_by_dst_happens_at_the_jump() -> None:
    p = LinkPolicy(windows("02:30-05:00"), tz=BERLIN)
    before = at(2026, 3, 29, 1, 0)
    # 02:30 does not exist that night: the window opens at the jump (03:00 CEST).
    opens = before + p.opens_in_s("bulk", before, NONE)
    assert opens == at(2026, 3, 29, 3, 0)
    assert p.allows("bulk", opens, NONE)
    assert not p.allows("bulk", opens - 1, NONE)


def test_the_system_zone_is_used_without_tz(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        p = LinkPolicy(windows("22:00-06:00"))
        assert p.opens_in_s("bulk", at(2026, 3, 28, 12), NONE) == 10 * 3600
        assert p.next_window_change(at(2026, 3, 28, 22)) == at(2026, 3, 29, 6)
    finally:
        monkeypatch.undo()
        time.tzset()


# ---------------------------------------------------------------- allowances


def test_a_daily_allowance_holds_normal_and_bulk_until_local_midnight() -> None:
    p = LinkPolicy(daily_bytes=10 * MiB, tz=BERLIN)
    now = at(2026, 6, 10, 18)
    assert p.allows("normal", now, usage(day_bytes=10 * MiB - 1))
    assert p.remaining(now, usage(day_bytes=4 * MiB)) == (6 * MiB, None)
    used = usage(day_bytes=10 * MiB)
    assert not p.allows("normal", now, used)
    assert not p.allows("bulk", now, used)
    assert p.allows("critical", now, used)
    assert p.opens_in_s("normal", now, used) == 6 * 3600
    assert "daily allowance" in (p.decide("normal", now, used).reason or "")
    # Past it (an object in flight completed): still held, never negative.
    assert p.remaining(now, usage(day_bytes=11 * MiB)) == (0, None)
    # At midnight the usage recorded for the 10th is yesterday's.
    assert p.allows("normal", at(2026, 6, 11, 0), used)
    assert p.used(at(2026, 6, 11, 0), used) == (0, 0)


def test_the_day_ends_at_local_midnight_on_dst_days() -> None:
    p = LinkPolicy(daily_bytes=MiB, tz=BERLIN)
    used = usage("2026-03-29", day_bytes=MiB)
    # 2026-03-29 has 23 hours: from 00:00 to the next midnight is 23 h.
    assert p.opens_in_s("normal", at(2026, 3, 29, 0), used) == 23 * 3600
    used = usage("2026-10-25", day_bytes=MiB)
    assert p.opens_in_s("normal", at(2026, 10, 25, 0), used) == 25 * 3600


def test_a_monthly_allowance_holds_until_the_first_of_the_next_month() -> None:
    p = LinkPolicy(daily_bytes=MiB, monthly_bytes=5 * MiB, tz=BERLIN)
    now = at(2026, 12, 30, 12)
    used = Usage("2026-12-30", 0, "2026-12", 5 * MiB)
    assert not p.allows("normal", now, used)
    assert p.opens_in_s("normal", now, used) == at(2027, 1, 1) - now
    assert p.allows("normal", at(2027, 1, 1), used)
    # Both used: the later renewal wins.
    both = Usage("2026-12-30", MiB, "2026-12", 5 * MiB)
    assert p.opens_in_s("normal", now, both) == at(2027, 1, 1) - now
    reason = p.decide("normal", now, both).reason or ""
    assert "daily" in reason
    assert "monthly" in reason
    # Only the day used: tomorrow.
    day = Usage("2026-12-30", MiB, "2026-12", 2 * MiB)
    assert p.opens_in_s("normal", now, day) == 12 * 3600
    # Month boundaries are local: 2026-11-01 00:30 in Berlin is still October in UTC,
    # and October's usage no longer counts there.
    assert p.used(at(2026, 11, 1, 0, 30), Usage("2026-10-31", 0, "2026-10", 3)) == (0, 0)
    assert p.used(at(2026, 10, 31, 23, 30), Usage("2026-10-31", 0, "2026-10", 3)) == (0, 3)


def test_bulk_waits_for_both_the_allowance_and_its_window() -> None:
    p = LinkPolicy(windows("02:00-04:00"), daily_bytes=MiB, tz=BERLIN)
    now = at(2026, 6, 10, 20)
    used = usage(day_bytes=MiB)
    # The allowance renews at midnight, the window opens at 02:00: bulk waits 6 h.
    assert p.opens_in_s("bulk", now, used) == 6 * 3600
    assert p.opens_in_s("normal", now, used) == 4 * 3600
    p2 = LinkPolicy(windows("22:00-06:00"), daily_bytes=MiB, tz=BERLIN)
    # At midnight the window is open: bulk goes at the renewal.
    assert p2.opens_in_s("bulk", now, used) == 4 * 3600


def test_usage_of_a_later_day_counts_when_the_clock_went_back() -> None:
    p = LinkPolicy(daily_bytes=MiB, monthly_bytes=10 * MiB, tz=BERLIN)
    # The usage was recorded on the 11th; the clock now says the 10th.
    used = Usage("2026-06-11", MiB, "2026-07", 2 * MiB)
    now = at(2026, 6, 10, 23)
    assert p.used(now, used) == (MiB, 2 * MiB)
    assert not p.allows("normal", now, used)


def test_unknown_priorities_are_refused() -> None:
    with pytest.raises(InvalidInput, match="'urgent' is not one of critical, normal, bulk"):
        LinkPolicy(tz=BERLIN).allows("urgent", 0.0, NONE)


def test_every_minute_of_a_year_agrees_with_a_brute_force_rule() -> None:
    """allows/opens_in_s against the definition, every 37 minutes of 2026 in Berlin."""
    p = LinkPolicy(windows("22:30-05:15", "13:00-13:45"), daily_bytes=MiB, tz=BERLIN)

    def in_window(t: float) -> bool:
        d = datetime.fromtimestamp(t, BERLIN)
        m = d.hour * 60 + d.minute
        return m >= 22 * 60 + 30 or m < 5 * 60 + 15 or 13 * 60 <= m < 13 * 60 + 45

    t, end = at(2026, 1, 1), at(2027, 1, 1)
    checked = 0
    while t < end:
        assert p.allows("bulk", t, NONE) == in_window(t)
        wait = p.opens_in_s("bulk", t, NONE)
        if wait:
            assert not in_window(t + wait - 1)
            assert in_window(t + wait)
        local = datetime.fromtimestamp(t, BERLIN)
        used = Usage(local.strftime("%Y-%m-%d"), MiB, local.strftime("%Y-%m"), MiB)
        wait = p.opens_in_s("normal", t, used)
        assert datetime.fromtimestamp(t + wait, BERLIN).date() == local.date() + timedelta(days=1)
        assert datetime.fromtimestamp(t + wait - 1, BERLIN).date() == local.date()
        t += 37 * 60
        checked += 1
    assert checked > 14_000


# ---------------------------------------------------------------- the meter's periods


class Wall:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_the_meter_carries_usage_when_the_clock_is_set_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import time

    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        path = tmp_path / "link-usage.json"
        wall = Wall(at(2026, 7, 1, 0, 10))
        meter = LinkMeter(0, usage_path=path, wall=wall)
        meter._count(3 * MiB, up=True)
        # NTP sets the clock back over midnight and the month's end.
        wall.t = at(2026, 6, 30, 23, 50)
        u = meter.usage()
        assert (u.day, u.day_bytes, u.month, u.month_bytes) == (
            "2026-06-30",
            3 * MiB,
            "2026-06",
            3 * MiB,
        )
        meter.save()
        # A restart with the clock behind the usage file keeps it too.
        meter2 = LinkMeter(0, usage_path=path, wall=Wall(at(2026, 6, 30, 12)))
        assert meter2.usage().day_bytes == 3 * MiB
        # Passing midnight forward renews as usual.
        wall.t = at(2026, 7, 1, 0, 0, 1)
        u = meter.usage()
        assert (u.day_bytes, u.month_bytes) == (0, 0)
    finally:
        monkeypatch.undo()
        time.tzset()


# ---------------------------------------------------------------- the gate


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


class FakeUsage:
    def __init__(self) -> None:
        self.u = NONE

    def __call__(self) -> Usage:
        return self.u


async def test_the_gate_holds_until_the_allowance_renews_and_logs_once(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edgegw.link")
    wall = Wall(at(2026, 6, 10, 23, 59))
    meter = FakeUsage()
    gate = LinkGate(LinkPolicy(daily_bytes=MiB, tz=BERLIN), meter, wall=wall)
    assert gate.may_ship()
    meter.u = usage(day_bytes=MiB)
    assert not gate.may_ship()
    assert not gate.may_ship()
    assert gate.may_ship("critical")
    assert gate.opens_in_s() == 60
    used_up = [r for r in caplog.records if "is used up" in r.getMessage()]
    assert len(used_up) == 1

    done = trio.Event()

    async def ship() -> None:
        await gate.wait_may_ship("normal")
        done.set()

    async with trio.open_nursery() as n:
        n.start_soon(ship)
        await trio.sleep(30)
        assert not done.is_set()
        s = gate.statistics()
        assert s.holding["normal"]
        assert s.held["normal"] == 1
        assert s.day_remaining == 0
        # The wall clock moves past midnight (the monotonic wait is only a bound).
        wall.t = at(2026, 6, 11, 0, 0, 1)
        await trio.sleep(10)
        assert done.is_set()
    s = gate.statistics()
    assert not s.holding["normal"]
    assert s.day_remaining == MiB
    assert s.allowed == {"critical": True, "normal": True, "bulk": True}
    assert any("renewed" in r.getMessage() for r in caplog.records)
    # Nothing held means nothing counted.
    await gate.wait_may_ship("normal")
    assert gate.statistics().held["normal"] == 1


async def test_the_gate_rechecks_when_the_clock_is_set_forward(
    autojump_clock: trio.testing.MockClock,
) -> None:
    wall = Wall(at(2026, 6, 10, 8))
    gate = LinkGate(LinkPolicy(daily_bytes=MiB, tz=BERLIN), lambda: usage(day_bytes=MiB), wall=wall)
    with trio.move_on_after(3600):
        async with trio.open_nursery() as n:
            n.start_soon(gate.wait_may_ship, "normal")
            await trio.sleep(1)
            wall.t = at(2026, 6, 11, 8)  # NTP: it is tomorrow already
        start = trio.current_time()
    # Noticed within a recheck, not 16 hours later.
    assert trio.current_time() - start <= 6


def test_the_gate_logs_window_changes_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="edgegw.link")
    wall = Wall(at(2026, 6, 10, 21, 59))
    gate = LinkGate(LinkPolicy(windows("22:00-06:00"), tz=BERLIN), FakeUsage(), wall=wall)
    assert not gate.may_ship("bulk")
    wall.t = at(2026, 6, 10, 22, 0)
    for _ in range(3):
        assert gate.may_ship("bulk")
    wall.t = at(2026, 6, 11, 6, 0)
    assert not gate.may_ship("bulk")
    changes = [r.getMessage() for r in caplog.records if "bulk window" in r.getMessage()]
    assert len(changes) == 2
    assert "opened" in changes[0]
    assert "closed" in changes[1]
    assert gate.statistics().window_change_in_s == 16 * 3600


# ---------------------------------------------------------------- the held bucket


async def test_a_held_bucket_holds_reads_of_log_objects_only(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    wall = Wall(at(2026, 6, 11, 12))
    meter = FakeUsage()
    meter.u = usage("2026-06-11", day_bytes=MiB)
    gate = LinkGate(LinkPolicy(daily_bytes=MiB, tz=BERLIN), meter, wall=wall)
    inner = await LocalBucket.open(tmp_path / "b", create=True)
    data_key = "regions/r/log/00000000000000000008.eglog"
    await inner.put(data_key, b"not a header: treated as data", if_none_match=True)
    await inner.put("regions/r/manifest/00000000000000000007.json", b"{}", if_none_match=True)
    reader = HeldBucket(inner, gate)
    # Other keys never wait; a log object waits while the allowance is used.
    assert (await reader.get("regions/r/manifest/00000000000000000007.json")).data == b"{}"
    with trio.move_on_after(60) as scope:
        await reader.get(data_key)
    assert scope.cancelled_caught
    assert gate.statistics().held["normal"] == 1
    wall.t = at(2026, 6, 12, 0, 1)
    assert (await reader.get(data_key)).data.startswith(b"not a header")
    await reader.aclose()
    # The inner bucket is the gateway's: still open.
    assert (await inner.get(data_key)).size > 0
    await inner.aclose()
