"""Fail points: named places that raise on demand, to test real processes.

Supervision (``edge_gateway.supervisor``) exists for exceptions nobody
expected, so no honest input makes a task raise one; a test of a real
``edgegw serve`` process needs a way to cause one anyway. As FreeBSD's
``fail(9)`` and TiKV's ``fail-rs`` do, the environment variable
``EDGEGW_FAILPOINTS`` names points and how often each raises::

    EDGEGW_FAILPOINTS="gc.run=2,mirror.pull=1" edgegw serve --config ...

makes the next two GC runs and the next mirror poll raise
:class:`FailPointError` (a ``RuntimeError``: unexpected by design). Unset,
a point costs one check of an empty dict. The points: ``shipper.loop``,
``mirror.pull``, ``gc.run``, ``mqtt.before_ack`` (an ingest batch is durable in
the journal, its PUBACKs not sent yet), ``kafka.produce_before_response`` (a
Kafka Produce is durable, its response not sent: the connection closes),
``journal.mirror_publish`` (a group of mirror entries is written by its worker
thread, not yet published: see ``Journal.append_mirror_batches``),
``statefile.quarantined`` (a damaged state file is copied to ``quarantine/``,
not yet rebuilt or removed: see ``edge_gateway.statefile``), and the
steps of the journal's rewrite of a sealed segment (``journal/_rewriter.py``):
``rewriter.written`` (the ``.z-tmp`` written and fsynced), ``rewriter.verified``
(before the rename), ``rewriter.renamed`` (renamed and swapped in memory, the
directory not fsynced), ``rewriter.synced`` (before the ``.idx`` is unlinked), and
the steps of quarantining damage at an open (``journal/_quarantine.py``, and
``journal/_compressed_quarantine.py`` for a compressed segment that does not open):
``quarantine.copied`` (the damaged segment copied aside, nothing recorded yet) and
``quarantine.recorded`` (``lost.log`` written, the segment not yet rewritten),
the steps of repairing it from the bucket instead (``journal/_repair.py``):
``repair.copied`` and ``repair.recorded`` (``repaired.log`` written, the segment
not yet rewritten), and ``repair.fetch`` (``edge_gateway/bucket_repair.py``,
``edge_gateway/mirror_repair.py``: the bucket's log, or a source region's,
answers a repair as if out of reach, so the damage is quarantined).

A point armed with ``kill`` instead of a count (``rewriter.renamed=kill``)
kills the process with SIGKILL when reached: a kill -9 at exactly that step.
"""

from __future__ import annotations

import os
import signal

__all__ = ["ENV", "KILL", "FailPointError", "arm", "fail_point", "parse"]

ENV = "EDGEGW_FAILPOINTS"
#: The count of a point armed with ``kill``: reaching it kills the process (SIGKILL).
KILL = -1


class FailPointError(RuntimeError):
    """Raised by an armed fail point."""


def parse(spec: str) -> dict[str, int]:
    """``"a=2,b"`` -> ``{"a": 2, "b": 1}``; raises ValueError on a malformed spec."""
    points: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, count = part.partition("=")
        if not name.strip():
            raise ValueError(f"{ENV}: empty fail point name in {spec!r}")
        if count.strip() == "kill":
            points[name.strip()] = KILL
            continue
        n = int(count) if count else 1
        if n < 0:
            raise ValueError(f"{ENV}: count of {name} must be >= 0")
        points[name.strip()] = n
    return points


_armed: dict[str, int] = parse(os.environ.get(ENV, ""))


def fail_point(name: str) -> None:
    """Raise :class:`FailPointError` if ``name`` is armed (and count one use down)."""
    if not _armed:
        return
    left = _armed.get(name, 0)
    if left == KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    if left > 0:
        _armed[name] = left - 1
        raise FailPointError(f"fail point {name} (from {ENV})")


def arm(name: str, times: int = 1) -> None:
    """Arm ``name`` in this process (tests of in-process gateways)."""
    _armed[name] = times
