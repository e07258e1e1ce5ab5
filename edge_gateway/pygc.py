"""The serve process's garbage collector: settled once startup is done, and its pauses counted.

A collection stops the event loop, and every request in flight waits for it.
With CPython's defaults a young collection runs every 700 net allocations of
container objects (several times per second under load), and a full one
scans every object alive -- everything imported and built at startup too --
for tens of milliseconds: on a gateway answering 5,000 requests/s on 64
connections those full collections were most of the p99
(``bench/produce.py``'s ``concurrent_p99_ms``; docs/api.md, "Produce
performance").

:func:`settle` (``edgegw serve`` calls it once the gateway is ready, or, when
mirrors catch up at start, once their first pulls are over: its collections
would stop the loop in the middle of the catch-up's fetches) runs one
full collection, then ``gc.freeze()``: what is alive then (modules, the
configuration, the journal's recovered state) lives as long as the process,
and later collections no longer scan it (a frozen object is still freed
by reference counting when its last reference goes; only a reference cycle
among frozen objects would stay until exit). It raises the young generation's
threshold to :data:`GEN0_THRESHOLD`, so young collections are rarer and the
full ones, which follow the young, rarer still. Garbage cycles are still
collected, a little later.

One more collection runs *after* the freeze, with nothing left to scan. It
is what lets full collections happen at all: CPython runs one only once
the objects promoted to the old generation since the last full collection
exceed a quarter of what that collection left alive, and the collection
before the freeze left everything startup built (~96,000 objects, then
frozen). So the old generation grew by a quarter of startup's heap of
promoted garbage -- reference cycles of finished requests, bucket calls
and thread hand-offs that outlived two young collections -- before the
first full collection, ~14 minutes into a soak, the gateways' heap
growing ~30-40 MB/h until then. Counted from the empty old generation the
freeze leaves, a full collection follows every tenth middle one, and
scans only what is not frozen. :func:`statistics` (``edgegw status`` under
``python_gc``, the ``edgegw_gc_*`` metrics)
counts the collections and their pauses per generation from then on.
"""

from __future__ import annotations

import gc
import time
from typing import Any, Final

__all__ = ["GEN0_THRESHOLD", "count_pauses", "raise_young_threshold", "settle", "statistics"]

#: Net allocations of container objects between young collections (CPython: 700).
GEN0_THRESHOLD: Final = 20_000


class _Pauses:
    """Collections and their pause seconds, per generation (a ``gc.callbacks`` hook)."""

    def __init__(self) -> None:
        #: in ``gc.callbacks`` (after :func:`settle` or :func:`count_pauses`)
        self.installed = False
        #: :func:`settle` ran
        self.settled = False
        self.started = 0.0
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.max_seconds = [0.0, 0.0, 0.0]

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        took = time.perf_counter() - self.started
        gen = min(int(info.get("generation", 0)), 2)
        self.collections[gen] += 1
        self.seconds[gen] += took
        self.max_seconds[gen] = max(self.max_seconds[gen], took)


_PAUSES: Final = _Pauses()


def settle(gen0_threshold: int = GEN0_THRESHOLD) -> None:
    """Collect, freeze what is alive, raise the young threshold, and count pauses from now on.

    Once per process (a second call only collects and freezes what startup
    added since). The thresholds of the older generations stay CPython's.
    """
    gc.collect()
    gc.freeze()
    gc.collect()  # nothing to scan: the baseline of later full collections (above) is 0
    raise_young_threshold(gen0_threshold)
    _PAUSES.settled = True
    count_pauses()


def count_pauses() -> None:
    """Count the collections and their pauses from now on (:func:`statistics`); once per process."""
    if not _PAUSES.installed:
        _PAUSES.installed = True
        gc.callbacks.append(_PAUSES)


def raise_young_threshold(gen0_threshold: int = GEN0_THRESHOLD) -> None:
    """The young threshold of :func:`settle` alone: no collection, nothing frozen.

    For a process that puts :func:`settle` off (``edgegw serve`` while its
    mirrors catch up at start): young collections, and the full ones they
    lead to, are as rare meanwhile as after it.
    """
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)


def statistics() -> dict[str, Any]:
    """What ``edgegw status`` shows under ``python_gc`` (``settled`` false: CPython's defaults)."""
    p = _PAUSES
    doc: dict[str, Any] = {
        "settled": p.settled,
        "frozen_objects": gc.get_freeze_count(),
        "thresholds": list(gc.get_threshold()),
    }
    if p.installed:
        doc["collections"] = list(p.collections)
        doc["pause_seconds"] = [round(s, 6) for s in p.seconds]
        doc["max_pause_ms"] = [round(s * 1e3, 3) for s in p.max_seconds]
    return doc
