"""The soak's figures (``bench/soak.py``): the RSS slopes it reports, from synthetic samples."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def soak() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "soak.py"
    spec = importlib.util.spec_from_file_location("soak_bench", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def series(pid: int, start_mb: float, mb_per_hour: float, until_s: int) -> list[list[float]]:
    """(t, pid, VmRSS, RssAnon) every 5 s, the anonymous part 10 MB below the total."""
    out = []
    for t in range(0, until_s, 5):
        mb = start_mb + mb_per_hour * t / 3600
        out.append([float(t), float(pid), mb * 2**20, (mb - 10) * 2**20])
    return out


def test_slopes_are_per_region_after_warm_up_over_the_longest_lived_process(
    soak: ModuleType,
) -> None:
    # alpha grows 6 MB/h; beta was killed early (a short-lived pid growing
    # fast) and its restart stays flat; gamma shrinks after warm-up.
    warm_up = [[float(t), 1.0, 0.0, 0.0] for t in range(0, 900, 5)]  # dropped: first quarter
    samples = {
        "alpha": warm_up + series(1, 60, 6.0, 3600)[180:],
        "beta": series(2, 60, 500.0, 1000)[180:] + series(3, 60, 0.0, 3600)[200:],
        "gamma": series(4, 70, -3.0, 3600)[180:],
    }
    growth, window = soak.rss_growth_mb_per_hour(samples, 3600)
    assert growth == pytest.approx(6.0, abs=0.01)
    assert window == pytest.approx(2595, abs=1)  # the shortest: beta's restart, t = 1000 to 3595
    anon, _ = soak.rss_growth_mb_per_hour(samples, 3600, column=3)
    assert anon == pytest.approx(6.0, abs=0.01)
    by_region = soak.rss_growth_by_region(samples, 3600)
    assert by_region == pytest.approx({"alpha": 6.0, "beta": 0.0, "gamma": -3.0}, abs=0.01)


def test_a_region_without_enough_samples_reports_nothing_rather_than_a_guess(
    soak: ModuleType,
) -> None:
    samples = {"alpha": series(1, 60, 100.0, 3600)[:2], "beta": []}
    assert soak.rss_growth_mb_per_hour(samples, 60) == (0.0, 0.0)
    assert soak.rss_growth_by_region(samples, 60) == {"alpha": 0.0, "beta": 0.0}
