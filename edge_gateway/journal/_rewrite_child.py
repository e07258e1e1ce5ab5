"""The rewrite's child process: steps 1-3 of a segment's rewrite, out of the gateway's process.

``python -m edge_gateway.journal._rewrite_child``, started by the live
rewriter (``_rewriter.py``) once per segment. Python's encoding of a
segment holds the GIL for slices of milliseconds; on a thread of the
gateway a request that arrives during a slice waits for it (p99 2.6x in
``bench/produce.py --at-rest-only``). In a process of its own the gateway's
event loop never waits for it.

The protocol, one JSON object a line:

- stdin, from the parent: the request ``{"path", "level", "frame_raw_bytes",
  "chunk_raw_bytes", "duty"}``; then a line ``go`` after each step the child
  reports, so that the parent's fail points (``rewriter.written``,
  ``rewriter.verified``) run at exactly that step while the child waits;
- stdout, to the parent: ``{"step": "rewriter.written"}`` and ``{"step":
  "rewriter.verified"}`` (waiting for ``go`` after each), then the result:
  ``{"ok": true, "tmp", "wal_bytes", "size", "busy_s", "paced_s",
  "max_rss_bytes"}``, ``{"ok": true, "skip": true}`` (a version it does not
  compress), or ``{"ok": false, "kind": "os" | "corrupt", "errno", "error"}``.

The child runs at the lowest priority the system allows an unprivileged
process (``nice`` 19, then ``SCHED_IDLE`` on Linux) and paces itself with
:class:`~edge_gateway.journal._rewriter.Pacer` to the parent's duty (a
quarter of one core by default): the priority keeps it off a core the
gateway wants, the pacer bounds what it takes of an otherwise idle device.

SIGTERM and SIGINT are ignored (a shutdown signals the whole group; the
parent ends the child itself). The parent's death ends it: a thread reads
stdin, and at end of file (the parent is gone, or closed the pipe) the
process exits at once, wherever it is. A ``.z-tmp`` it leaves is deleted
by the journal's next open; it never renames anything (the rename is the
parent's, on its event loop).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import resource
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Final, TextIO

from edge_gateway.errors import CorruptData
from edge_gateway.journal._rewriter import Pacer, write_compressed

__all__ = ["GO", "main"]

#: What the parent writes to let the child go on after a step.
GO: Final = "go"
#: Exit status of a child whose parent went away (stdin at end of file).
ORPHANED: Final = 3


def _lower_priority() -> None:
    """nice 19, then SCHED_IDLE where the platform has it (both allowed unprivileged)."""
    with contextlib.suppress(OSError):
        os.nice(19)
    idle = getattr(os, "SCHED_IDLE", None)
    if idle is not None:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, idle, os.sched_param(0))


def _watch(stdin: TextIO, lines: queue.Queue[str]) -> None:
    """Hand the parent's lines over; exit the process when the parent is gone."""
    for line in stdin:
        lines.put(line.strip())
    os._exit(ORPHANED)


def _peak_rss() -> int:
    """This process's peak resident memory, bytes.

    ``VmHWM``: Linux's ``ru_maxrss`` survives ``fork`` and ``execve``, so a
    child would report its parent's peak (the gateway's) when that was higher.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _send(out: TextIO, msg: dict[str, Any]) -> None:
    out.write(json.dumps(msg) + "\n")
    out.flush()


def main() -> int:
    # SIGTERM and SIGINT go to a whole process group or cgroup at once (Ctrl-C,
    # systemd's stop): the parent decides when the child ends (it kills it when
    # cancelled; its death ends the child's stdin), so a rewrite is not counted
    # as failed at every shutdown.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _lower_priority()
    out = sys.stdout
    request = json.loads(sys.stdin.readline() or "null")
    if not isinstance(request, dict):
        return 2
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_watch, args=(sys.stdin, lines), daemon=True).start()

    def step(name: str) -> None:
        _send(out, {"step": name})
        if lines.get() != GO:
            raise SystemExit(2)

    pacer = Pacer(float(request["duty"]))
    try:
        prepared = write_compressed(
            Path(request["path"]),
            level=int(request["level"]),
            frame_raw_bytes=int(request["frame_raw_bytes"]),
            chunk_raw_bytes=int(request["chunk_raw_bytes"]),
            tick=pacer,
            step=step,
        )
    except OSError as exc:
        _send(out, {"ok": False, "kind": "os", "errno": exc.errno, "error": str(exc)})
        return 0
    except CorruptData as exc:
        _send(out, {"ok": False, "kind": "corrupt", "errno": None, "error": str(exc)})
        return 0
    if prepared is None:
        _send(out, {"ok": True, "skip": True})
        return 0
    rss = _peak_rss()
    _send(
        out,
        {
            "ok": True,
            "tmp": str(prepared.tmp),
            "wal_bytes": prepared.wal_bytes,
            "size": prepared.size,
            "busy_s": pacer.busy_s,
            "paced_s": pacer.slept_s,
            "max_rss_bytes": rss,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
