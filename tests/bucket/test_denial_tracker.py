"""The refusal episode of a component: logged at ERROR when it starts, reminded, cleared.

Pure (a fake clock, pytest's log capture). Issue 26: a revoked key must be
said once at ERROR, then every few minutes while it lasts -- not as a
warning per retry, and not never.
"""

from __future__ import annotations

import logging

import pytest

from edge_gateway.bucket import AccessDenied, DenialTracker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _refusal(code: str = "InvalidAccessKeyId") -> AccessDenied:
    return AccessDenied(f"put of key 'k' on S3 bucket 'b': HTTP 403 {code}", key="k", code=code)


def test_an_episode_is_logged_once_reminded_and_cleared(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = logging.getLogger("test.denial")
    tracker = DenialTracker(
        log, "shipper of region a", remind_s=300, clock=clock, wall_ms=lambda: 7
    )
    caplog.set_level(logging.DEBUG, logger="test.denial")

    assert tracker.current is None
    tracker.refused(_refusal())
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "shipper of region a: the bucket refuses this gateway (InvalidAccessKeyId)" in (
        errors[0].getMessage()
    )
    assert "what to do: give the gateway valid credentials" in errors[0].getMessage()
    denial = tracker.current
    assert denial is not None
    assert (denial.code, denial.since_ms, denial.refusals) == ("InvalidAccessKeyId", 7, 1)
    assert denial.to_json()["action"] == _refusal().action

    for _ in range(10):  # retries within the reminder period: not at ERROR
        clock.now += 20
        tracker.refused(_refusal())
    assert sum(r.levelno == logging.ERROR for r in caplog.records) == 1
    assert tracker.current is not None
    assert tracker.current.refusals == 11

    clock.now += 100  # 300 s after the first: a reminder
    tracker.refused(_refusal())
    reminders = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR][1:]
    assert len(reminders) == 1
    assert "still refused by the bucket after 300 s and 12 attempts" in reminders[0]

    tracker.refused(_refusal("AccessDenied"))  # another reason: said at once
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 3
    assert "(AccessDenied)" in errors[-1]
    assert "edgegw iam policy" in errors[-1]
    assert tracker.current is not None
    assert tracker.current.since_ms == 7  # the same episode

    clock.now += 5
    tracker.cleared()
    assert tracker.current is None
    (back,) = [
        r.getMessage() for r in caplog.records if "accepts this gateway again" in r.getMessage()
    ]
    assert "after 305 s refused (AccessDenied, 13 attempts)" in back
    tracker.cleared()  # nothing to clear: silent
    assert sum("accepts" in r.getMessage() for r in caplog.records) == 1
