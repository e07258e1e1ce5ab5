"""The site's link to the bucket as one gateway uses it (``[link]``).

Three things of ``[link]`` (docs/operations.md, "A metered or scheduled link"):

* the **meter** (:class:`~edge_gateway.bucket.LinkMeter`): the cap in bytes
  per second and the bytes used today and this month, kept in
  ``link-usage.json``;
* the **gate** (:class:`~edge_gateway.bucket.LinkGate`): the policy over the
  meter's usage -- bulk windows, daily and monthly allowances -- that says
  whether data of a priority may go on the link now, and when it may;
* the **watch**: the policy is asked when something ships, so a lane it held
  is looked at again only when told; :meth:`SiteLink.watch` tells the shipper
  when the policy's answer changes (a window opens, a new day).

The gateway owns one :class:`SiteLink`; the shipper asks :meth:`may_ship`
per lane, and the tailers read log objects through :meth:`hold`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import trio

from edge_gateway.bucket import PRIORITIES, Bucket, HeldBucket, LinkGate, LinkMeter
from edge_gateway.config import LinkConfig
from edge_gateway.statefile import StateFiles

__all__ = ["USAGE_FILE", "SiteLink"]

#: The meter's usage (bytes today, this month), under the data directory.
USAGE_FILE = "link-usage.json"

#: The longest the watch sleeps between two looks at the policy.
_WATCH_S = 5.0


class SiteLink:
    """``[link]``'s meter, policy gate and watch for one gateway (module docstring)."""

    def __init__(
        self, config: LinkConfig, data_dir: Path, *, state_files: StateFiles | None = None
    ) -> None:
        self._config = config
        self._usage_path = data_dir / USAGE_FILE
        #: Where a damaged usage file is reported (``edge_gateway.statefile``).
        self._state_files = state_files
        self._meter: LinkMeter | None = None
        self._gate: LinkGate | None = None

    @property
    def meter(self) -> LinkMeter:
        """The cap and the bytes per day and month (made on first use: it reads its file)."""
        if self._meter is None:
            self._meter = LinkMeter(
                self._config.max_bytes_per_s,
                usage_path=self._usage_path,
                state_files=self._state_files,
            )
        return self._meter

    @property
    def gate(self) -> LinkGate:
        """The bulk windows and allowances applied to :attr:`meter`'s usage."""
        if self._gate is None:
            self._gate = LinkGate(self._config.policy(), self.meter.usage)
        return self._gate

    @property
    def restricts(self) -> bool:
        """Whether the policy may ever hold anything back (else nothing needs asking)."""
        return self.gate.restricts

    def may_ship(self, priority: str = "normal") -> bool:
        """Whether data of ``priority`` (critical, normal, bulk) may go on the link now."""
        return self.gate.may_ship(priority)

    def opens_in_s(self, priority: str = "normal") -> float:
        """Seconds until data of ``priority`` may go on the link (0: now)."""
        return self.gate.opens_in_s(priority)

    def held(self, waiting: Iterable[str]) -> list[str]:
        """Of the priorities with data ``waiting`` to ship, those the policy holds now."""
        return sorted({p for p in waiting if not self.may_ship(p)})

    def describe_hold(self, held: list[str]) -> str:
        """What the policy holds (``held``: :meth:`held`) and until when."""
        return (
            f"the link policy holds {' and '.join(held)} data (link.bulk_windows, "
            f"daily_bytes / monthly_bytes); it ships in "
            f"{max(self.opens_in_s(p) for p in held):.0f} s"
        )

    def hold(self, bucket: Bucket) -> Bucket:
        """``bucket``, its reads made to wait for the policy if it restricts anything."""
        return HeldBucket(bucket, self.gate) if self.restricts else bucket

    async def watch(self, held: Callable[[], list[str]], changed: Callable[[], None]) -> None:
        """Call ``changed`` each time the policy's answer for a priority changes.

        ``held`` is what the gateway holds now (:meth:`held` of its waiting
        lanes), noted on the gate for status, metrics and one log line per
        hold. Looks every few seconds at most, and exactly when the policy
        says the next change is due.
        """
        gate = self.gate
        last = {p: self.may_ship(p) for p in PRIORITIES}
        while True:
            now_held = held()
            for p in PRIORITIES:
                gate.note_holding(p, p in now_held)
            waits = [self.opens_in_s(p) for p, ok in last.items() if not ok]
            await trio.sleep(min([_WATCH_S, *(w for w in waits if w > 0)]))
            now = {p: self.may_ship(p) for p in PRIORITIES}
            if now != last:
                last = now
                changed()
