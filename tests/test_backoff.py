"""The one retry wait, :class:`edge_gateway.backoff.Backoff` (issue 43, step 4).

Deterministic: every test injects its random source (a seeded
:class:`random.Random`, or a fixed list of draws) or passes each draw.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable

import pytest

from edge_gateway.backoff import Backoff


def draws(values: Iterable[float]) -> Callable[[], float]:
    """A random source that returns ``values`` in turn."""
    it = iter(values)
    return lambda: next(it)


def test_each_delay_is_in_its_window_and_the_window_doubles_to_the_cap() -> None:
    rng = random.Random(43)
    b = Backoff(0.1, 5.0, rng=rng.random)
    ceilings = [0.1 * 2**n for n in range(6)] + [5.0] * 20  # 0.1 .. 3.2, then capped
    for n, ceiling in enumerate(ceilings):
        assert b.attempt == n
        assert b.ceiling_s == pytest.approx(ceiling)
        assert 0.0 <= b.next_delay() < ceiling


def test_full_jitter_spans_the_whole_window() -> None:
    assert Backoff(1.0, 8.0).next_delay(0.0) == 0.0
    top = Backoff(1.0, 8.0, attempt=3)
    assert top.next_delay(0.999999) == pytest.approx(8.0, rel=1e-5)
    # Spread over the window, not bunched: at the cap the mean is about cap/2.
    rng = random.Random(1)
    delays = [Backoff(1.0, 8.0, attempt=10, rng=rng.random).next_delay() for _ in range(4000)]
    assert min(delays) < 0.1
    assert max(delays) > 7.9
    assert sum(delays) / len(delays) == pytest.approx(4.0, rel=0.05)
    quarters = [sum(1 for d in delays if 2 * i <= d < 2 * (i + 1)) for i in range(4)]
    assert min(quarters) > 850  # about 1000 each


def test_the_cap_holds_after_any_number_of_failures() -> None:
    b = Backoff(0.5, 20.0, rng=lambda: 0.999999)
    assert max(b.next_delay() for _ in range(2000)) <= 20.0
    assert b.ceiling_s == 20.0
    # No overflow, whatever the attempt count or the multiplier.
    assert Backoff(1.0, 8.0, attempt=10**6).next_delay(0.5) == pytest.approx(4.0)
    assert Backoff(1.0, 8.0, attempt=5000, multiplier=1e6).next_delay(0.5) == pytest.approx(4.0)
    assert Backoff(0.0, 8.0, attempt=5000, multiplier=1e6).next_delay(0.5) == 0.0
    # A base above the cap starts at the cap.
    assert Backoff(10.0, 4.0).ceiling_s == 4.0


def test_the_multiplier_is_per_call_site() -> None:
    b = Backoff(1.0, 100.0, multiplier=3.0, rng=lambda: 0.5)
    assert [b.next_delay() for _ in range(5)] == pytest.approx([0.5, 1.5, 4.5, 13.5, 40.5])
    flat = Backoff(2.0, 100.0, multiplier=1.0, rng=lambda: 0.5)
    assert [flat.next_delay() for _ in range(3)] == pytest.approx([1.0, 1.0, 1.0])


def test_reset_after_a_success_starts_from_the_base_again() -> None:
    b = Backoff(0.1, 30.0, rng=lambda: 0.999999)
    for _ in range(8):
        b.next_delay()
    assert b.ceiling_s == pytest.approx(25.6)  # the 9th window: 0.1 s · 2^8
    b.reset()
    assert b.attempt == 0
    assert b.next_delay() == pytest.approx(0.1, rel=1e-5)
    assert b.next_delay() == pytest.approx(0.2, rel=1e-5)


def test_the_floor_is_the_shortest_wait() -> None:
    # The tailer's quarantine: base 1 s, cap 30 s, never sooner than 1 s.
    b = Backoff(1.0, 30.0, floor_s=1.0, rng=random.Random(2).random)
    assert b.next_delay() == 1.0  # the first window is [1, 1]: exactly the base
    for n in range(1, 40):
        ceiling = min(30.0, 2.0**n)
        assert b.ceiling_s == ceiling
        assert 1.0 <= b.next_delay() < ceiling
    # A draw of 0 is the floor, not zero; the draw spreads above it.
    assert Backoff(1.0, 30.0, attempt=4, floor_s=1.0).next_delay(0.0) == 1.0
    assert Backoff(1.0, 30.0, attempt=4, floor_s=1.0).next_delay(0.5) == pytest.approx(8.5)
    # A floor above the cap wins: "never sooner" is the harder promise.
    assert Backoff(0.1, 2.0, floor_s=5.0).next_delay(0.7) == 5.0


def test_retry_after_shifts_the_draw() -> None:
    rng = random.Random(5)
    delays = []
    for _ in range(2000):
        b = Backoff(0.5, 20.0, attempt=3, rng=rng.random)  # window up to 4 s
        d = b.delay_after(5.0)
        assert 5.0 <= d < 9.0  # never sooner than asked, spread after it
        delays.append(d)
    assert max(delays) - min(delays) > 3.5
    assert Backoff(0.5, 20.0).delay_after(None, 0.5) == pytest.approx(0.25)
    assert Backoff(0.5, 20.0).delay_after(-3.0, 0.0) == 0.0
    # With a floor: Retry-After, then the floor, then the jitter.
    assert Backoff(1.0, 30.0, floor_s=1.0).delay_after(5.0, 0.0) == 6.0
    b = Backoff(0.5, 20.0)  # each call is an attempt: the window grows
    assert [b.delay_after(1.0, 0.999999) for _ in range(3)] == pytest.approx(
        [1.5, 2.0, 3.0], rel=1e-3
    )


def test_the_random_source_is_injectable_and_a_passed_draw_wins() -> None:
    a = Backoff(0.1, 30.0, rng=random.Random(7).random)
    b = Backoff(0.1, 30.0, rng=random.Random(7).random)
    assert [a.next_delay() for _ in range(10)] == [b.next_delay() for _ in range(10)]
    taken = itertools.count()

    def counting() -> float:
        next(taken)
        return 0.25

    c = Backoff(1.0, 30.0, rng=counting)
    assert c.next_delay(0.5) == 0.5  # the passed draw; the source untouched
    assert next(taken) == 0
    assert c.next_delay() == 0.5  # 2 s window, the source's 0.25
    scripted = Backoff(1.0, 30.0, rng=draws([0.0, 0.5, 1.0]))
    assert [scripted.next_delay() for _ in range(3)] == [0.0, 1.0, 4.0]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_s": -0.1},
        {"cap_s": -1.0},
        {"floor_s": -1.0},
        {"multiplier": 0.5},
        {"attempt": -1},
    ],
)
def test_nonsense_parameters_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("draw", [-0.1, 1.5, float("nan")])
def test_a_draw_outside_0_1_raises_and_counts_nothing(draw: float) -> None:
    b = Backoff(0.1, 30.0, attempt=2)
    with pytest.raises(ValueError, match="draw"):
        b.next_delay(draw)
    assert b.attempt == 2
