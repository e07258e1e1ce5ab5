"""``free_port``: below the ephemeral range, in the pytest-xdist worker's own slice."""

from __future__ import annotations

import contextlib
import itertools
import socket

import pytest

from edge_gateway.testing import ports


@pytest.fixture
def no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)


@pytest.mark.usefixtures("no_worker")
def test_outside_xdist_the_whole_range_below_the_ephemeral_ports() -> None:
    assert ports.port_range() == ports.PORT_RANGE
    low, high = ports.PORT_RANGE
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    assert high <= ephemeral_low
    assert low <= ports.free_port() < high


def test_each_worker_has_a_slice_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    slices = []
    for index in range(3):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
        slices.append(ports.port_range())
        low, high = slices[-1]
        assert low <= ports.free_port() < high
    low, high = ports.PORT_RANGE
    assert slices[0][0] == low
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(slices))
    assert slices[-1][1] <= high


@pytest.mark.parametrize(
    ("worker", "count"), [("", ""), ("gw5", "2"), ("master", "2"), ("gw1", "x")]
)
def test_an_odd_environment_falls_back_to_the_whole_range(
    monkeypatch: pytest.MonkeyPatch, worker: str, count: str
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", count)
    assert ports.port_range() == ports.PORT_RANGE


@pytest.mark.usefixtures("no_worker")
def test_consecutive_ports_differ_and_a_bound_one_is_skipped() -> None:
    first = ports.free_port()
    with socket.socket() as taken:
        # Hold the port that would come next (unless something else holds
        # it already): free_port must step over it.
        with contextlib.suppress(OSError):
            taken.bind(("127.0.0.1", first + 1))
        second = ports.free_port()
    assert second not in (first, first + 1)
