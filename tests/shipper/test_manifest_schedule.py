"""ManifestSchedule: when the manifest of the pending entries is due (sans-IO)."""

from __future__ import annotations

from edge_gateway.protocol.log_decisions import ManifestSchedule


def test_nothing_pending_is_never_due() -> None:
    s = ManifestSchedule(interval_ms=300, max_entries=10)
    assert s.due_in_ms(10_000) is None
    assert not s.due(10_000)


def test_due_by_time_or_by_count() -> None:
    s = ManifestSchedule(interval_ms=300, max_entries=10, last_written_ms=1000)
    s.committed(2)
    assert s.due_in_ms(1100) == 200
    assert not s.due(1100)
    assert s.due_in_ms(1300) == 0
    assert s.due(1300)
    assert s.due_in_ms(5000) == 0  # overdue is due now, never negative
    s.written(last_seq=2, now_ms=1300)
    assert s.due_in_ms(1301) is None
    s.committed(10)
    assert s.due_in_ms(1301) == 0  # enough entries: due at once
    assert s.due(1301)
