"""The background scrub (``edge_gateway/journal/_scrub.py``): its pacing, and passes over a
journal directory on disk (damage found once, the active segment never reported, a
segment deleted mid-pass skipped).

The end-to-end run (a real ``edgegw serve`` whose status and metrics report a flipped
byte) is in tests/cli/test_journal_verify.py.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest
import trio
from test_verify import _journal

from edge_gateway.errors import ConfigError
from edge_gateway.journal import JournalConfig, Scrubber, _scrub, scrub_rate
from edge_gateway.journal._scrub import SCRUB_CEILING_BYTES_PER_S, SCRUB_FLOOR_BYTES_PER_S

MiB = 1024 * 1024


def _name(lsn: int, suffix: str = ".wal") -> str:
    return f"{lsn:020d}{suffix}"


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


def test_the_rate_spreads_the_journal_over_the_interval_within_floor_and_ceiling() -> None:
    day = 86_400.0
    assert scrub_rate(4096 * MiB, day) == pytest.approx(4096 * MiB / day)  # the default budget
    assert scrub_rate(0, day) == SCRUB_FLOOR_BYTES_PER_S  # new segments still get read soon
    assert scrub_rate(MiB, day) == SCRUB_FLOOR_BYTES_PER_S
    assert scrub_rate(4096 * MiB, 60.0) == SCRUB_CEILING_BYTES_PER_S  # never takes the disk
    assert scrub_rate(10, 1.0, floor=1.0, ceiling=100.0) == 10.0
    with pytest.raises(ValueError, match="> 0"):
        scrub_rate(MiB, 0.0)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("24h", 86_400.0), ("90min", 5_400.0), ("30s", 30.0), ("250ms", 0.25), ("1.5d", 129_600.0)],
)
def test_scrub_interval_is_a_duration(text: str, seconds: float) -> None:
    assert JournalConfig(scrub_interval=text).scrub_interval_s == seconds


@pytest.mark.parametrize("text", ["0", "off", "OFF", "0s"])
def test_scrub_interval_off(text: str) -> None:
    assert JournalConfig(scrub_interval=text).scrub_interval_s is None


@pytest.mark.parametrize("text", ["24", "a day", "-1h", "1w", ""])
def test_a_scrub_interval_that_is_not_a_duration_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match=r"journal\.scrub_interval"):
        JournalConfig(scrub_interval=text)


def test_the_default_is_a_pass_a_day() -> None:
    assert JournalConfig().scrub_interval_s == 86_400.0


async def test_a_clean_pass_reads_every_sealed_segment_and_index_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    main = _journal(tmp_path)  # segments at LSN 1, 5, 9 (sealed) and 13 (active)
    sealed = [main / _name(n, s) for n in (1, 5, 9) for s in (".wal", ".idx")]
    scrub = Scrubber(main, 60.0, wall_ms=lambda: 1234)
    await scrub.scrub_pass()
    st = scrub.statistics()
    assert st.passes == 1
    assert st.segments_checked == 3
    assert st.bytes_scrubbed == sum(p.stat().st_size for p in sealed)
    assert st.damaged == ()
    assert st.last_pass_ms == 1234
    assert (st.last_pass_bytes, st.last_pass_segments) == (st.bytes_scrubbed, 3)
    await scrub.scrub_pass()
    st = scrub.statistics()
    assert st.bytes_scrubbed == 2 * st.last_pass_bytes
    assert (st.passes, st.segments_checked, st.last_pass_segments) == (2, 6, 3)
    assert st.rate_bytes_per_s == SCRUB_FLOOR_BYTES_PER_S


async def test_a_flipped_byte_in_a_sealed_segment_is_found_and_said_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    main = _journal(tmp_path)
    bad = main / _name(5)
    _flip(bad, bad.stat().st_size - 3)  # inside the last entry's batch
    scrub = Scrubber(main, 60.0)
    with caplog.at_level(logging.WARNING, "edgegw.journal"):
        await scrub.scrub_pass()
        await scrub.scrub_pass()
    [found] = scrub.statistics().damaged
    assert found.path == bad
    assert found.lane == "normal"
    assert 0 < found.offset < bad.stat().st_size
    assert "CRC" in found.reason
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # two passes, one warning
    assert str(bad) in warnings[0]
    assert f"at byte {found.offset}" in warnings[0]
    assert "not repairable from the bucket now" in warnings[0]
    assert scrub.statistics().segments_checked == 6  # the damaged one is checked each pass
    # Restored from a copy: the next pass forgets it.
    _flip(bad, bad.stat().st_size - 3)
    await scrub.scrub_pass()
    assert scrub.statistics().damaged == ()


async def test_a_damaged_index_file_is_a_finding_of_its_own(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    main = _journal(tmp_path)
    idx = main / _name(9, ".idx")
    _flip(idx, 20)
    scrub = Scrubber(main, 60.0)
    await scrub.scrub_pass()
    [found] = scrub.statistics().damaged
    assert found.path == idx
    assert "CRC" in found.reason


async def test_a_read_error_is_damage_not_a_failure_of_the_scrub(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    main = _journal(tmp_path)
    bad = main / _name(5)
    bad_ino = bad.stat().st_ino
    pread = os.pread

    def failing_card(fd: int, n: int, offset: int) -> bytes:
        if os.fstat(fd).st_ino == bad_ino and offset >= 256:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return pread(fd, n, offset)

    monkeypatch.setattr(_scrub, "CHUNK_BYTES", 256)
    monkeypatch.setattr(os, "pread", failing_card)
    scrub = Scrubber(main, 60.0)
    await scrub.scrub_pass()
    st = scrub.statistics()
    [found] = st.damaged
    assert (found.path, found.offset) == (bad, 256)
    assert found.reason == f"read error: {os.strerror(errno.EIO)}"
    assert st.segments_checked == 3
    assert st.passes == 1


async def test_the_active_segment_is_never_read(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    main = _journal(tmp_path)
    active = main / _name(13)
    _flip(active, active.stat().st_size - 3)
    (main / _name(13, ".idx")).unlink()  # an active segment has no index file yet
    scrub = Scrubber(main, 60.0)
    await scrub.scrub_pass()
    st = scrub.statistics()
    assert st.damaged == ()
    assert st.segments_checked == 3
    # Sealed by a roll: the next pass reads it, and finds the damage.
    (main / _name(17)).write_bytes((main / _name(1)).read_bytes())
    await scrub.scrub_pass()
    assert [f.path for f in scrub.statistics().damaged][:1] == [active]


async def test_a_segment_deleted_during_a_pass_is_skipped_not_damage(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    main = _journal(tmp_path)
    _flip(main / _name(5), 30)  # damaged, then deleted by retention before its read
    listing = Scrubber._list

    def list_then_retention(self: Scrubber) -> list[tuple[str, list[tuple[int, Path, int]]]]:
        plan = listing(self)
        (main / _name(5)).unlink()
        (main / _name(5, ".idx")).unlink()
        return plan

    monkeypatch.setattr(Scrubber, "_list", list_then_retention)
    scrub = Scrubber(main, 60.0)
    await scrub.scrub_pass()
    st = scrub.statistics()
    assert st.damaged == ()
    assert st.segments_skipped == 1
    assert st.segments_checked == 2
    assert st.passes == 1


async def test_run_passes_again_and_again(tmp_path: Path) -> None:
    main = _journal(tmp_path)
    scrub = Scrubber(main, 0.05)  # a pass of ~4 KiB every 50 ms
    async with trio.open_nursery() as nursery:
        await nursery.start(scrub.run)
        for _ in range(6000):  # up to a minute
            if scrub.statistics().passes >= 3:
                break
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert scrub.statistics().passes >= 3
    st = scrub.statistics()
    assert st.segments_checked >= 9
    assert st.last_pass_s is not None
