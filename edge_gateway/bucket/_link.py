"""The site's link to the bucket: a bandwidth cap and a byte meter.

Edge sites reach the bucket over links they pay for or share: a cellular
modem billed per gigabyte, a satellite terminal, a shop's DSL that the tills
need too. :class:`LinkMeter` is one gateway's view of that link: every byte
of object data it uploads or downloads (the shipper's creates, the tailers'
reads, GC's lists are not payload) passes through it, and

* with a cap (``link.max_bytes_per_s``) it paces transfers so their sum
  stays at the cap: each transfer takes a slot of ``size / cap`` seconds on a
  virtual timeline and waits for its slot. Uploads wait before the PUT (their
  size is known); downloads are charged when they arrive and the next
  transfer waits for the debt. Over any minute the bytes moved stay within
  one object of ``60 * cap``; a gateway with a cap keeps its objects to
  about one second of it (``GatewayWiring.shipper_config``) so the link is used
  evenly rather than in multi-second bursts.
* it counts bytes per direction and per local day and month (for metered
  plans), persisted in ``<data_dir>/link-usage.json`` so a restart does not
  reset the month. A new day (month) starts at 0 when the clock passes
  midnight; a clock set back carries the bytes counted so far (it never
  frees an allowance: ``_linkpolicy``).

:class:`MeteredBucket` wraps any bucket with a meter. Both are sans-policy:
which data may move when is :mod:`edge_gateway.bucket._linkpolicy`'s rule.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from edge_gateway.bucket._base import Bucket, GetResult, ObjectInfo
from edge_gateway.bucket._delegating import DelegatingBucket
from edge_gateway.bucket._linkpolicy import Usage
from edge_gateway.errors import CorruptData
from edge_gateway.statefile import StateFiles, seal, unseal

log = logging.getLogger("edgegw.link")

#: Usage is written at most this often (and when the meter closes).
_SAVE_EVERY_S = 10.0
_USAGE_VERSION = 1
#: The fields of the usage file as written before it had a checksum.
_USAGE_KEYS = frozenset({"version", "day", "day_bytes", "month", "month_bytes"})


@dataclass(frozen=True, slots=True)
class LinkStatistics:
    """What the meter saw, for metrics and ``edgegw status``."""

    cap_bytes_per_s: int
    up_bytes: int
    down_bytes: int
    waited_s: float
    day: str
    day_bytes: int
    month: str
    month_bytes: int


class LinkMeter:
    """Paces and counts one gateway's bucket traffic (see the module docstring).

    ``clock`` (monotonic seconds) and ``local_time`` (``time.localtime``-like)
    are injectable for tests; ``usage_path`` ``None`` keeps usage in memory.
    A damaged usage file is reported to ``state_files`` (copied to quarantine,
    a WARNING) and the day's and month's counts start again from 0: they only
    pace the link (a harmless loss).
    """

    def __init__(
        self,
        cap_bytes_per_s: int = 0,
        *,
        usage_path: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        state_files: StateFiles | None = None,
    ) -> None:
        if cap_bytes_per_s < 0:
            raise ValueError("cap_bytes_per_s must be >= 0")
        self.cap = cap_bytes_per_s
        self._clock = clock
        self._wall = wall
        self._usage_path = usage_path
        self._state_files = state_files
        #: Monotonic time at which the link is free again (the end of the last slot).
        self._free_at = 0.0
        self._up = 0
        self._down = 0
        self._waited = 0.0
        self._day, self._month = self._periods()
        self._day_bytes = 0
        self._month_bytes = 0
        self._saved_at = clock()
        self._dirty = False
        self._load()

    # ------------------------------------------------------------ pacing

    def _slot(self, n: int) -> float:
        """Book ``n`` bytes on the timeline; seconds to wait before they may go."""
        if self.cap <= 0 or n <= 0:
            return 0.0
        now = self._clock()
        start = max(now, self._free_at)
        self._free_at = start + n / self.cap
        return start - now

    async def _wait(self, delay: float) -> None:
        if delay > 0:
            self._waited += delay
            await trio.sleep(delay)

    async def before_upload(self, n: int) -> None:
        """Wait for the slot of an upload of ``n`` bytes, then count them."""
        await self._wait(self._slot(n))
        self._count(n, up=True)

    async def after_download(self, n: int) -> None:
        """Count a download of ``n`` bytes; wait if it ran ahead of the cap."""
        self._count(n, up=False)
        if self.cap <= 0 or n <= 0:
            return
        # The bytes already came: book their slot and wait until it ends, so
        # the caller's next transfer (and everyone else's) keeps to the cap.
        self._slot(n)
        await self._wait(self._free_at - self._clock())

    # ------------------------------------------------------------ usage

    def _periods(self) -> tuple[str, str]:
        t = time.localtime(self._wall())
        return time.strftime("%Y-%m-%d", t), time.strftime("%Y-%m", t)

    def _count(self, n: int, *, up: bool) -> None:
        if up:
            self._up += n
        else:
            self._down += n
        self._roll()
        self._day_bytes += n
        self._month_bytes += n
        self._dirty = True
        if self._clock() - self._saved_at >= _SAVE_EVERY_S:
            self.save()

    def _roll(self) -> None:
        """Move the day and month to the wall clock's.

        Forward (midnight passed), the new period starts at 0. Backward (the
        clock was set back), the bytes are carried into the earlier period:
        a clock set back must never free an allowance (``_linkpolicy``).
        """
        day, month = self._periods()
        if day != self._day:
            if day < self._day:
                log.warning(
                    "link: the clock went back from %s to %s; today's usage (%d B) is carried",
                    self._day,
                    day,
                    self._day_bytes,
                )
            else:
                self._day_bytes = 0
            self._day = day
            self._dirty = True
        if month != self._month:
            if month > self._month:
                self._month_bytes = 0
            self._month = month
            self._dirty = True

    def usage(self) -> Usage:
        """Bytes of the current local day and month (for :class:`LinkPolicy`)."""
        self._roll()
        return Usage(self._day, self._day_bytes, self._month, self._month_bytes)

    def _load(self) -> None:
        if self._usage_path is None:
            return
        try:
            doc = unseal(
                self._usage_path.read_bytes(), where=str(self._usage_path), legacy_keys=_USAGE_KEYS
            )
        except FileNotFoundError:
            return
        except OSError as exc:
            self._damaged(f"unreadable: {exc}")
            return
        except CorruptData as exc:
            self._damaged(exc.reason)
            return
        if doc.get("version") != _USAGE_VERSION:
            self._damaged("not a usage file of this version")
            return
        day, month = doc.get("day"), doc.get("month")
        day_bytes, month_bytes = doc.get("day_bytes"), doc.get("month_bytes")
        if not (
            isinstance(day, str)
            and isinstance(month, str)
            and type(day_bytes) is int
            and type(month_bytes) is int
        ):
            self._damaged("a field of the wrong type")
            return
        # Usage of today (or of a later day: the clock is behind the file's,
        # set back) counts; an earlier period's has renewed.
        if day >= self._day:
            self._day_bytes = max(0, day_bytes)
        if month >= self._month:
            self._month_bytes = max(0, month_bytes)

    def _damaged(self, reason: str) -> None:
        assert self._usage_path is not None
        action = "the day's and month's usage start again from 0"
        if self._state_files is not None:
            self._state_files.damaged(self._usage_path, reason, action)
        else:
            log.warning("link: ignoring %s (%s): %s", self._usage_path, reason, action)

    def save(self) -> None:
        """Write the day's and month's usage (atomically; best effort: a full disk skips it)."""
        self._saved_at = self._clock()
        if self._usage_path is None or not self._dirty:
            return
        doc = {
            "version": _USAGE_VERSION,
            "day": self._day,
            "day_bytes": self._day_bytes,
            "month": self._month,
            "month_bytes": self._month_bytes,
        }
        tmp = self._usage_path.with_suffix(".tmp")
        try:
            tmp.write_bytes(seal(doc))
            os.replace(tmp, self._usage_path)
        except OSError as exc:
            log.info("link: usage not saved (%s); the next save retries", exc)
            with contextlib.suppress(OSError):
                tmp.unlink()
            return
        self._dirty = False

    def statistics(self) -> LinkStatistics:
        self._roll()
        day, month = self._day, self._month
        return LinkStatistics(
            cap_bytes_per_s=self.cap,
            up_bytes=self._up,
            down_bytes=self._down,
            waited_s=self._waited,
            day=day,
            day_bytes=self._day_bytes,
            month=month,
            month_bytes=self._month_bytes,
        )


class MeteredBucket(DelegatingBucket):
    """A :class:`Bucket` whose object payloads pass through a :class:`LinkMeter`."""

    def __init__(self, inner: Bucket, meter: LinkMeter) -> None:
        super().__init__(inner)
        self.meter = meter

    def describe(self) -> str:
        cap = f", capped at {self.meter.cap} B/s" if self.meter.cap else ""
        return f"{self.inner.describe()}{cap}"

    async def _put(
        self, key: str, data: bytes, *, if_none_match: bool, if_match: str | None
    ) -> ObjectInfo:
        await self.meter.before_upload(len(data))
        return await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    async def _get(self, key: str, start: int, end: int | None) -> GetResult:
        result = await self.inner.get(key, start=start, end=end)
        await self.meter.after_download(len(result.data))
        return result

    async def _aclose(self) -> None:
        self.meter.save()
        await super()._aclose()
