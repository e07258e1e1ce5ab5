"""Supervision of the gateway's long-lived tasks: one task's bug never stops the site.

The gateway runs many tasks in one trio nursery: the shipper, a tailer per
mirrored region, bucket GC, the metadata agent, the local API. Without
supervision an unexpected exception in any of them (a bug, a library raising
something nobody expected while a link stalls) cancels the nursery and ends
the process — intake, reads, shipping and every other mirror with it. Under
systemd that is a crash loop, and nothing the site produces is taken.

:class:`Supervisor` restarts a failed task instead, one-for-one as in
Erlang/OTP: the failure is logged once with its traceback, counted, and shown
as a *degraded* task (``edgegw status``, ``/healthz``, the
``edgegw_task_*`` metrics) while the task waits out an exponential backoff
(:data:`RESTART_BASE_S` doubling to :data:`RESTART_CAP_S`, full jitter, never
sooner than :data:`RESTART_BASE_S`: no tight crash loop) and runs again.
Everything else goes on.

Only deliberate ends stop the gateway — the :data:`FATAL` kinds: fenced by a
newer writer, invalid configuration, the data directory in use, a bucket
that lost this region's log. They propagate as before. A task that fails
*before* it reports ready is a start-up failure (the API's port is taken, the
journal cannot be opened) and propagates too: a gateway that cannot start
says so and exits, rather than running half built.

A task that keeps failing is restarted for as long as the gateway runs, at
most :data:`RESTART_CAP_S` apart: giving up would leave the site without that
function until a person restarts the process, which cannot do better than
the backoff does. It stays degraded (and alerting) until it has run
:data:`STABLE_S` without failing; then its backoff starts from the base again.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import trio

from edge_gateway.backoff import Backoff
from edge_gateway.errors import BucketLost, ConfigError, Fenced, InUse

__all__ = [
    "FATAL",
    "RESTART_BASE_S",
    "RESTART_CAP_S",
    "STABLE_S",
    "Supervisor",
    "TaskHealth",
]

log = logging.getLogger("edgegw.supervisor")

#: First restart delay after a failure; doubles per consecutive failure.
RESTART_BASE_S = 1.0
#: The longest wait between restarts of a task that keeps failing.
RESTART_CAP_S = 60.0
#: A task that runs this long without failing is healthy again (backoff resets).
STABLE_S = 60.0

#: Exceptions that end the gateway on purpose; never restarted.
FATAL: tuple[type[BaseException], ...] = (Fenced, ConfigError, InUse, BucketLost)

TaskState = Literal["running", "restarting", "stopped"]


@dataclass(frozen=True, slots=True)
class TaskHealth:
    """One supervised task as ``edgegw status`` shows it."""

    name: str
    state: TaskState
    #: True from a failure until the task has run :data:`STABLE_S` without failing.
    degraded: bool
    failures: int
    restarts: int
    last_error: str | None
    #: Wall-clock ms of the last failure (0: never failed).
    last_failure_ms: int
    #: Seconds until the next restart (while ``restarting``).
    restart_in_s: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "degraded": self.degraded,
            "failures": self.failures,
            "restarts": self.restarts,
            "last_error": self.last_error,
            "last_failure_ms": self.last_failure_ms,
            "restart_in_s": None if self.restart_in_s is None else round(self.restart_in_s, 1),
        }


class _Task:
    __slots__ = (
        "failures",
        "last_error",
        "last_failure_ms",
        "name",
        "restart_at",
        "restarts",
        "run_started",
        "state",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.state: TaskState = "running"
        self.failures = 0
        self.restarts = 0
        self.last_error: str | None = None
        self.last_failure_ms = 0
        self.restart_at: float | None = None
        self.run_started = trio.current_time()

    def degraded(self, now: float) -> bool:
        if self.failures == 0:
            return False
        return self.state != "running" or now - self.run_started < STABLE_S


class _Relay:
    """Passes a task's ``started()`` on to the supervisor's caller and remembers it."""

    def __init__(self, inner: trio.TaskStatus[Any]) -> None:
        self.inner = inner
        self.started_once = False

    def started(self, value: Any = None) -> None:
        self.started_once = True
        self.inner.started(value)


def _is_fatal(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_is_fatal(e) for e in exc.exceptions)
    return isinstance(exc, FATAL)


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


class Supervisor:
    """Runs tasks and restarts the ones that fail unexpectedly (see the module docstring)."""

    def __init__(
        self,
        *,
        base_s: float = RESTART_BASE_S,
        cap_s: float = RESTART_CAP_S,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        #: Called with the task's name at each unexpected failure (metrics).
        self.on_failure = on_failure
        self._tasks: dict[str, _Task] = {}
        self._rand = random.Random()

    async def supervise(
        self,
        name: str,
        fn: Callable[..., Awaitable[Any]],
        *,
        before_restart: Callable[[], Any] | None = None,
        task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run ``fn(task_status=...)`` for ever: use as ``await nursery.start(sup.supervise, ...)``.

        ``fn``'s first ``started()`` reaches the caller; a failure before it
        propagates (start-up failure). Returning normally ends supervision.
        ``before_restart`` runs before each restart (to rebuild what the
        failed run left behind, e.g. a fresh tailer).
        """
        task = self._tasks[name] = _Task(name)
        relay = _Relay(task_status)
        backoff = Backoff(self.base_s, self.cap_s, floor_s=self.base_s, rng=self._rand.random)
        try:
            while True:
                task.state = "running"
                task.run_started = trio.current_time()
                try:
                    if relay.started_once:
                        await fn(task_status=trio.TASK_STATUS_IGNORED)
                    else:
                        await fn(task_status=relay)
                    task.state = "stopped"
                    return
                except Exception as exc:
                    if _is_fatal(exc) or not relay.started_once:
                        raise
                    if trio.current_time() - task.run_started >= STABLE_S:
                        backoff.reset()
                    delay = backoff.next_delay()
                    task.failures += 1
                    task.last_error = _describe(exc)
                    task.last_failure_ms = time.time_ns() // 1_000_000
                    task.state = "restarting"
                    task.restart_at = trio.current_time() + delay
                    log.error(
                        "task %s failed (failure %d); restarting in %.1fs; the gateway goes on",
                        name,
                        task.failures,
                        delay,
                        exc_info=exc,
                    )
                    if self.on_failure is not None:
                        self.on_failure(name)
                await trio.sleep(delay)
                task.restart_at = None
                if before_restart is not None:
                    before_restart()
                task.restarts += 1
                log.info("task %s: restarting (restart %d)", name, task.restarts)
        finally:
            if task.state == "running":
                task.state = "stopped"

    def health(self) -> list[TaskHealth]:
        """Every supervised task's state, by name."""
        now = trio.current_time()
        return [
            TaskHealth(
                t.name,
                t.state,
                t.degraded(now),
                t.failures,
                t.restarts,
                t.last_error,
                t.last_failure_ms,
                None if t.restart_at is None else max(0.0, t.restart_at - now),
            )
            for t in sorted(self._tasks.values(), key=lambda t: t.name)
        ]

    def degraded(self) -> list[TaskHealth]:
        return [h for h in self.health() if h.degraded]

    def forget(self, name: str) -> None:
        """Drop a task that was stopped on purpose (a tailer no longer wanted)."""
        self._tasks.pop(name, None)
