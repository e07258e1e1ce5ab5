"""Which losses a later repair superseded (``journal/_lost_repaired.py``; pure)."""

from __future__ import annotations

from edge_gateway.journal import Loss, LostRange, Repaired, later_repairs
from edge_gateway.journal._lost_repaired import still_lost


def _loss(first: int, last: int, time_ms: int = 100) -> Loss:
    rng = (LostRange("t", 0, 10 * first, 10 * last + 9, exact=True),)
    return Loss(1, first, last, 0, 10, time_ms, "flip", True, "quarantine/x", rng)


def _repair(first: int, last: int, time_ms: int = 200) -> Repaired:
    return Repaired(
        1, first, last, 0, 10, time_ms, "lost", "quarantine/y", last - first + 1, (), ()
    )


def test_a_repair_of_every_lsn_later_supersedes_the_loss() -> None:
    loss = _loss(5, 7)
    assert later_repairs(loss, []) == []
    assert later_repairs(loss, [_repair(5, 7)]) == [_repair(5, 7)]
    assert later_repairs(loss, [_repair(3, 9)]) == [_repair(3, 9)]  # a wider one
    # two repairs that meet cover it, in either order of record
    parts = [_repair(6, 7), _repair(5, 5)]
    assert later_repairs(loss, parts) == [_repair(5, 5), _repair(6, 7)]


def test_a_partial_or_earlier_repair_does_not() -> None:
    loss = _loss(5, 7)
    assert later_repairs(loss, [_repair(5, 6)]) == []  # LSN 7 is still lost
    assert later_repairs(loss, [_repair(5, 5), _repair(7, 7)]) == []  # a hole at 6
    assert later_repairs(loss, [_repair(8, 9)]) == []
    # repaired once, damaged again and quarantined after: still lost
    assert later_repairs(loss, [_repair(5, 7, time_ms=50)]) == []


def test_still_lost_keeps_the_order() -> None:
    a, b, c = _loss(1, 1), _loss(5, 7), _loss(9, 9)
    assert still_lost([a, b, c], [_repair(5, 7)]) == [a, c]
    assert still_lost([a, b, c], [_repair(1, 9)]) == []
