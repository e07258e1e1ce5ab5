"""Supervision: one task's unexpected exception never stops the gateway (issue 29, item 1).

Unit tests of :class:`~edge_gateway.supervisor.Supervisor` on trio's
autojump clock; an in-process gateway whose GC, mirror and shipper raise;
and a real `edgegw serve` process whose tasks raise through fail points:
it stays up, each task restarts, the metrics count it, nothing is lost.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from _serve import Fleet, TopicSpec, read_partition, wait_until

from edge_gateway import failpoints
from edge_gateway.config import parse_config
from edge_gateway.errors import ConfigError, Fenced
from edge_gateway.gateway import Gateway, ProduceRecord
from edge_gateway.supervisor import Supervisor

# ---------------------------------------------------------------- the supervisor


async def until(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` (the supervisor's state has no event to wait on)."""
    while not predicate():  # noqa: ASYNC110
        await trio.sleep(0.05)


class Flaky:
    """A task that fails ``fails`` times after reporting ready, then runs for ever."""

    def __init__(self, fails: int, exc: BaseException | None = None) -> None:
        self.fails = fails
        self.runs = 0
        self.exc = exc

    async def __call__(self, *, task_status: trio.TaskStatus[str]) -> None:
        self.runs += 1
        task_status.started("ready")
        await trio.sleep(1)
        if self.runs <= self.fails:
            raise self.exc or RuntimeError(f"boom {self.runs}")
        await trio.sleep_forever()


async def test_a_failed_task_restarts_with_backoff_and_is_degraded_until_stable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    failed: list[str] = []
    sup = Supervisor(base_s=1.0, cap_s=8.0, on_failure=failed.append)
    task = Flaky(fails=3)
    async with trio.open_nursery() as nursery:
        assert await nursery.start(sup.supervise, "t", task) == "ready"
        t0 = trio.current_time()
        await trio.sleep(1.5)  # the first run failed at t0+1
        (h,) = sup.health()
        assert (h.state, h.degraded, h.failures, h.restarts) == ("restarting", True, 1, 0)
        assert h.last_error == "RuntimeError: boom 1"
        await until(lambda: task.runs >= 4)
        # run, fail, wait 1, run, fail, wait 1-2, run, fail, wait 1-4: full jitter
        # under ceilings of 1, 2, 4 s, never sooner than the 1 s base
        elapsed = trio.current_time() - t0
        assert 3 * 1 + (1 + 1 + 1) <= elapsed <= 3 * 1 + (1 + 2 + 4) + 0.5
        (h,) = sup.health()
        assert (h.state, h.degraded, h.failures, h.restarts) == ("running", True, 3, 3)
        await trio.sleep(61)
        (h,) = sup.health()
        assert (h.state, h.degraded) == ("running", False)
        assert failed == ["t", "t", "t"]
        nursery.cancel_scope.cancel()


async def test_backoff_is_capped(autojump_clock: trio.testing.MockClock) -> None:
    sup = Supervisor(base_s=1.0, cap_s=4.0)
    task = Flaky(fails=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.supervise, "t", task)
        await until(lambda: task.runs >= 8)
        (h,) = sup.health()
        assert h.restart_in_s is None or h.restart_in_s <= 4
        t0 = trio.current_time()
        await until(lambda: task.runs >= 9)
        assert trio.current_time() - t0 <= 1 + 4 + 0.2
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("exc", [Fenced("newer epoch"), ConfigError("bad key")])
async def test_deliberate_ends_are_not_restarted(
    exc: BaseException, autojump_clock: trio.testing.MockClock
) -> None:
    sup = Supervisor()
    task = Flaky(fails=1, exc=exc)
    with pytest.RaisesGroup(type(exc)):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.supervise, "t", task)
    assert task.runs == 1


async def test_a_failure_before_ready_is_a_start_up_failure() -> None:
    sup = Supervisor()

    async def broken(*, task_status: trio.TaskStatus[None]) -> None:
        raise OSError(98, "Address already in use")

    async with trio.open_nursery() as nursery:
        with pytest.raises(OSError, match="Address already in use"):
            await nursery.start(sup.supervise, "api", broken)


async def test_before_restart_runs_before_each_restart(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rebuilt: list[int] = []
    task = Flaky(fails=2)
    sup = Supervisor(base_s=0.5)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda **kw: sup.supervise(
                "t", task, before_restart=lambda: rebuilt.append(task.runs), **kw
            )
        )
        await until(lambda: task.runs >= 3)
        assert rebuilt == [1, 2]
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------- in-process gateway


def _config(tmp_path: Path) -> dict[str, Any]:
    return {
        "region": "north",
        "data_dir": str(tmp_path / "north"),
        "bucket": {"type": "local", "path": str(tmp_path / "bucket")},
        "shipper": {"flush_interval_ms": 20, "retry_base_s": 0.05},
        "mirror": {"poll_interval_ms": 50, "max_poll_interval_ms": 200},
        "gc": {"enabled": True, "interval_ms": 100},
        "shutdown_grace_s": 5.0,
        "topics": [
            {"name": "t", "home": "north", "partitions": 2},
            {"name": "s", "home": "south", "partitions": 1, "subscribers": ["north"]},
        ],
    }


async def test_tasks_that_raise_restart_while_intake_goes_on(tmp_path: Path) -> None:
    (tmp_path / "bucket").mkdir()  # an empty directory becomes a bucket; a missing one is refused
    gw = Gateway(parse_config(_config(tmp_path)))
    async with trio.open_nursery() as nursery:
        await nursery.start(gw.run)
        failpoints.arm("gc.run", 2)
        failpoints.arm("mirror.pull", 1)
        failpoints.arm("shipper.loop", 1)
        want = {"gc": 2, "mirror south": 1, "shipper": 1}
        with trio.fail_after(60):
            while any(h.failures < want.get(h.name, 0) for h in gw.task_health()):
                # intake never stops while they fail and restart
                await gw.produce("t", [ProduceRecord(b"x")])
                await trio.sleep(0.05)
        by_name = {h.name: h for h in gw.task_health()}
        assert by_name["gc"].failures == 2
        assert by_name["mirror south"].failures == 1
        assert by_name["shipper"].failures == 1
        assert "FailPointError" in (by_name["gc"].last_error or "")
        status = gw.status()
        assert set(status["errors"]) >= {"gc", "mirror south", "shipper"}
        # Everything produced is shipped by the restarted shipper.
        res = await gw.produce("t", [ProduceRecord(b"last")], ack="shipped")
        assert res.shipped
        with trio.fail_after(30):
            await until(lambda: bool(all(h.restarts == h.failures for h in gw.task_health())))
        gw.request_shutdown()


# ---------------------------------------------------------------- a real process


def _metric(text: str, name: str, task: str) -> float:
    m = re.search(rf'^{name}\{{task="{re.escape(task)}"\}} (\S+)$', text, re.MULTILINE)
    return float(m.group(1)) if m else -1.0


def test_serve_stays_up_when_its_tasks_raise(tmp_path: Path) -> None:
    topics = [TopicSpec("t-a", "a", partitions=2), TopicSpec("t-b", "b", partitions=2)]
    fleet = Fleet(
        tmp_path,
        ["a", "b"],
        topics,
        per_region={"a": {"gc": {"enabled": True, "interval_ms": 200}}},
    )
    fleet["a"].env = {failpoints.ENV: "gc.run=2,mirror.pull=2,shipper.loop=1"}
    try:
        fleet.start()
        a, b = fleet["a"], fleet["b"]
        sent: list[str] = []
        with (
            httpx.Client(base_url=a.url, timeout=30) as c,
            httpx.Client(base_url=b.url, timeout=30) as cb,
        ):

            def failures() -> dict[str, float]:
                text = c.get("/metrics").text
                return {
                    t: _metric(text, "edgegw_task_failures_total", t)
                    for t in ("gc", "mirror b", "shipper")
                }

            def produce_and_check() -> bool:
                v = f"v{len(sent)}"
                r = c.post("/v1/topics/t-a/records", json={"records": [{"value": v}]})
                assert r.status_code == 200, r.text  # intake never stops
                sent.append(v)
                r = cb.post("/v1/topics/t-b/records", json={"records": [{"value": v}]})
                assert r.status_code == 200, r.text
                return failures() == {"gc": 2.0, "mirror b": 2.0, "shipper": 1.0}

            wait_until(produce_and_check, 60, "every armed task to fail", interval=0.1)
            health = c.get("/healthz").json()
            assert health["status"] == "degraded"
            assert {d["name"] for d in health["degraded"]} == {"gc", "mirror b", "shipper"}
            assert a.running
        # The restarted shipper and tailer converge: b mirrors all of a, and a all of b.
        fleet.wait_converged(timeout=60)
        assert fleet.mismatches() == []
        got = sorted(r.value.decode() for p in range(2) for r in read_partition(a.url, "t-a", p))
        assert got == sorted(sent)
        log = a.log.read_text()
        assert "task gc failed (failure 1); restarting in" in log
        assert log.count("Traceback") >= 5  # each failure logged once, with its traceback
        assert a.stop() == 0  # it ends when told to (SIGTERM), not because a task failed
    finally:
        fleet.close()
