"""Scenario files: every shipped one parses; a bad key or value is refused naming it."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from edgegw_cli._scenario_spec import LinkSpec, ScenarioError, parse_scenario
from edgegw_cli.scenario import LagSampler, count_problems, held_since, split_old_writer

from edge_gateway.testing.tcpproxy import LinkShape

ROOT = Path(__file__).parents[2]

BASE = """
bucket = "s3"
duration_s = 10
[[regions]]
name = "ship"
[regions.link]
up_mbit = 1
down_mbit = 2
latency_ms = 300
jitter_ms = 20
resets_per_min = 6
slow_start_s = 2
[[regions]]
name = "shore"
[[topics]]
name = "engine"
home = "ship"
[[workload]]
region = "ship"
topic = "engine"
rate = 100
"""


def doc(extra: str = "", base: str = BASE) -> dict[str, Any]:
    return tomllib.loads(base + extra)


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_scenario_parses(path: Path) -> None:
    sc = parse_scenario(tomllib.loads(path.read_text()), path.stem)
    assert sc.regions
    quick = sc.quick()
    assert quick.duration_s <= sc.duration_s
    assert all(f.at_s <= quick.duration_s for f in quick.faults)


def test_a_link_table_becomes_the_proxy_shape() -> None:
    sc = parse_scenario(doc(), "x")
    assert sc.link("ship").shape(5) == LinkShape(
        up_bytes_per_s=125_000,
        down_bytes_per_s=250_000,
        latency_s=0.3,
        jitter_s=0.02,
        reset_rate=0.1,
        slow_start_s=2,
        seed=5,
    )
    assert sc.link("shore") == LinkSpec()
    assert sc.link("shore").shape(1).is_off
    assert "RTT 600 ms" in sc.link("ship").describe()


def test_link_faults_with_their_parameters() -> None:
    sc = parse_scenario(
        doc(
            '[[faults]]\nat_s = 4\naction = "cap"\nregion = "*"\nfor_s = 2\nup_mbit = 0.1\n'
            '[[faults]]\nat_s = 1\naction = "drop_responses"\nregion = "ship"\nfor_s = 1\n'
        ),
        "x",
    )
    assert [(f.action, f.region, f.params) for f in sc.faults] == [
        ("drop_responses", "ship", ()),
        ("cap", "*", (("up_mbit", 0.1),)),
    ]
    quick = sc.quick()
    assert (quick.faults[1].at_s, quick.faults[1].for_s) == (2, 1)


def test_metadata_faults_need_the_metadata_server() -> None:
    fault = '[[faults]]\nat_s = 2\naction = "metadata_blackhole"\nregion = "*"\nfor_s = 3\n'
    with_metadata = "metadata = true\n" + BASE
    sc = parse_scenario(doc(fault, with_metadata), "x")
    assert sc.metadata
    (f,) = sc.faults
    assert (f.action, f.region, f.for_s, f.is_metadata, f.is_link) == (
        "metadata_blackhole",
        "*",
        3,
        True,
        False,
    )
    with pytest.raises(ScenarioError, match="metadata_blackhole needs metadata = true"):
        parse_scenario(doc(fault), "x")
    with pytest.raises(ScenarioError, match=r"scenario\.metadata: expected true or false"):
        parse_scenario(doc(base='metadata = "yes"\n' + BASE), "x")
    with pytest.raises(ScenarioError, match="needs for_s"):
        parse_scenario(
            doc('[[faults]]\nat_s = 1\naction = "metadata_down"\nregion = "ship"\n', with_metadata),
            "x",
        )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("speed = 3\n", "unknown key speed"),
        ('[[faults]]\nat_s = 1\naction = "explode"\nregion = "ship"\n', "explode"),
        ('[[faults]]\nat_s = 1\naction = "link_down"\nregion = "ship"\n', "needs for_s"),
        ('[[faults]]\nat_s = 1\naction = "slow"\nregion = "ship"\nfor_s = 1\n', "slow needs"),
        (
            '[[faults]]\nat_s = 1\naction = "lossy"\nregion = "ship"\nfor_s = 1\nup_mbit = 1\n',
            "unknown key up_mbit",
        ),
        ('[[faults]]\nat_s = 1\naction = "kill"\nregion = "*"\n', "region: expected one of"),
        ('[[faults]]\nat_s = 1\naction = "kill"\nregion = "ship"\nfor_s = 2\n', "only pause"),
        ('[[faults]]\nat_s = 11\naction = "kill"\nregion = "ship"\n', "after the end"),
        (
            '[[faults]]\nat_s = 1\naction = "slow"\nregion = "shore"\nfor_s = 1\njitter_ms = 5\n',
            "jitter_ms must not exceed",
        ),
        ('[[faults]]\nat_s = -1\naction = "kill"\nregion = "ship"\n', "at_s: expected a number"),
    ],
)
def test_bad_faults_are_refused(extra: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(doc(extra), "x")


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('bucket = "s3"', 'bucket = "gcs"', 'expected "local" or "s3"'),
        ('bucket = "s3"', "", "links need bucket"),
        ("up_mbit = 1\n", "up_mbit = -1\n", r"regions\[0\].link.up_mbit: expected a number >= 0"),
        ("up_mbit = 1\n", 'up_mbit = "fast"\n', "up_mbit: expected a number"),
        ("up_mbit = 1\n", "upmbit = 1\n", "unknown key upmbit"),
        ("jitter_ms = 20", "jitter_ms = 400", "jitter_ms must not exceed"),
        ('home = "ship"', 'home = "moon"', "'moon' is not a region"),
        ("rate = 100", "rate = 0", "rate: expected a number > 0"),
        ('region = "ship"\ntopic', 'region = "shore"\ntopic', "must run in its home region"),
        ('name = "shore"', 'name = "ship"', "'ship' is taken"),
        ("duration_s = 10", "duration_s = true", "duration_s: expected a number"),
    ],
)
def test_bad_values_are_refused(old: str, new: str, message: str) -> None:
    assert old in BASE
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(doc(base=BASE.replace(old, new, 1)), "x")


def test_link_faults_need_the_s3_bucket() -> None:
    base = BASE.replace('bucket = "s3"', "").replace("[regions.link]", "[regions.nolink]")
    with pytest.raises(ScenarioError, match="unknown key nolink"):
        parse_scenario(doc(base=base), "x")
    base = (
        BASE.replace('bucket = "s3"', "").split("[regions.link]")[0]
        + BASE.split("slow_start_s = 2\n")[1]
    )
    parse_scenario(doc(base=base), "x")
    with pytest.raises(ScenarioError, match='link fault blackhole needs bucket = "s3"'):
        parse_scenario(
            doc('[[faults]]\nat_s = 1\naction = "blackhole"\nregion = "ship"\nfor_s = 1\n', base),
            "x",
        )


def _v(n: int) -> str:
    return f'{{"n": {n}, "v": 0.5}}'


def test_counting_lost_duplicated_reordered() -> None:
    acked = {(0, 0): _v(0), (0, 1): _v(1), (1, 0): _v(2), (1, 1): _v(3)}
    clean = [{0: _v(0), 1: _v(1)}, {0: _v(2), 1: _v(3)}]
    assert count_problems(clean, acked, set()) == {"lost": 0, "duplicated": 0, "reordered": 0}
    # An acknowledged record missing, or another value at its offset: lost.
    assert count_problems([{0: _v(0)}, {0: _v(2), 1: _v(3)}], acked, set())["lost"] == 1
    assert count_problems([{0: _v(0), 1: _v(9)}, clean[1]], acked, set())["lost"] == 1
    assert count_problems(clean[:1], acked, set())["lost"] == 2
    # A record stored twice (in the same or another partition): a duplicate,
    # unless the producer itself sent it twice after a lost answer.
    twice = [{0: _v(0), 1: _v(1), 2: _v(1)}, {0: _v(2), 1: _v(3), 2: _v(0)}]
    assert count_problems(twice, acked, set()) == {"lost": 0, "duplicated": 2, "reordered": 0}
    assert count_problems(twice, acked, {0, 1})["duplicated"] == 0
    # Out of order within a partition.
    swapped = [{0: _v(1), 1: _v(0)}, clean[1]]
    assert count_problems(swapped, {}, set()) == {"lost": 0, "duplicated": 0, "reordered": 1}
    # Values without a sequence number (another writer's) are ignored.
    assert count_problems([{0: "x", 1: b"\x00"}], {}, set()) == {
        "lost": 0,
        "duplicated": 0,
        "reordered": 0,
    }


def test_replication_lag_is_how_long_ago_the_home_held_what_the_mirror_holds() -> None:
    history = [(10.0, [0, 0]), (11.0, [5, 3]), (12.0, [9, 3]), (13.0, [9, 3])]
    assert held_since(history, [9, 3]) == 13.0  # holds all: no lag now
    assert held_since(history, [9, 2]) == 10.0  # partition 1 behind since 11.0
    assert held_since(history, [6, 3]) == 11.0
    assert held_since(history, [0, 0]) == 10.0
    assert held_since([(10.0, [4])], [1]) == 10.0  # behind the oldest: counted from it


class _Marks:
    """What LagSampler reads: the topics, the mirror pairs and each site's high watermarks."""

    def __init__(self) -> None:
        self.sc = SimpleNamespace(topics=[SimpleNamespace(name="t", home="h")])
        self.hwms: dict[tuple[str, str], list[int]] = {}

    def pairs(self) -> list[tuple[str, str, str]]:
        return [("t", "h", "r")]

    def hwm(self, region: str, topic: str) -> list[int] | None:
        return self.hwms.get((region, topic))


def test_a_restored_mirror_replaying_history_lags_from_what_the_region_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    marks = _Marks()
    sampler = LagSampler(marks)  # type: ignore[arg-type]
    clock = iter([100.0, 101.0, 102.0, 103.0, 104.0])
    monkeypatch.setattr("edgegw_cli.scenario.time.monotonic", lambda: next(clock))

    def at(home: int, mirror: int) -> None:
        marks.hwms = {("h", "t"): [home], ("r", "h.t"): [mirror]}
        sampler.sample()

    at(10, 10)  # t=100: caught up
    at(20, 20)  # t=101: caught up
    at(30, 5)  # t=102: a restored gateway replays from the start: held 20 at t=101
    at(40, 25)  # t=103: past what the region held; the home held 25 no later than t=101
    at(50, 50)  # t=104: caught up
    figures = sampler.figures()["r:h.t"]
    assert sorted(sampler.samples["r:h.t"]) == [0.0, 0.0, 0.0, 1.0, 2.0]
    assert figures["max_s"] == 2.0
    # The replay's own lag: 5 is older than the oldest round (t=100, counted from it).
    assert figures["replay_max_s"] == 2.0


def test_region_budget_and_clock_skew() -> None:
    base = BASE.replace(
        'name = "shore"\n', 'name = "shore"\njournal_max_mb = 6\nclock_skew_h = -7.5\n'
    )
    sc = parse_scenario(doc(base=base), "x")
    assert sc.journal_max_mb == (("shore", 6.0),)
    assert sc.clock_skew_h == (("shore", -7.5),)
    for bad, message in [
        ("journal_max_mb = 2\n", "journal_max_mb: at least 4"),
        ("journal_max_mb = -1\n", "journal_max_mb: expected a number > 0"),
        ('clock_skew_h = "3h"\n', "clock_skew_h: expected hours"),
        ("clock_skew_h = true\n", "clock_skew_h: expected hours"),
    ]:
        with pytest.raises(ScenarioError, match=message):
            parse_scenario(
                doc(base=BASE.replace('name = "shore"\n', f'name = "shore"\n{bad}')), "x"
            )


def test_split_brain_is_a_process_fault() -> None:
    sc = parse_scenario(doc('[[faults]]\nat_s = 2\naction = "split_brain"\nregion = "ship"\n'), "x")
    assert [(f.action, f.region, f.is_link, f.is_metadata) for f in sc.faults] == [
        ("split_brain", "ship", False, False)
    ]
    with pytest.raises(ScenarioError, match="only pause"):
        parse_scenario(
            doc('[[faults]]\nat_s = 2\naction = "split_brain"\nregion = "ship"\nfor_s = 1\n'), "x"
        )


def test_what_a_fenced_writer_acknowledged_is_split_by_the_log() -> None:
    old = {(0, 0): "a", (0, 1): "b", (0, 2): "c", (1, 0): "d"}
    # The log (as a mirror holds it) has the first two of partition 0; the
    # survivor reused offset 2 for its own record; partition 1 never shipped.
    in_log: list[dict[int, object]] = [{0: "a", 1: "b", 2: "survivor's"}, {}]
    kept, fenced, lost = split_old_writer(old, in_log, {(0, 2): "c", (1, 0): "d"})
    assert kept == {(0, 0): "a", (0, 1): "b"}
    assert fenced == {(0, 2): "c", (1, 0): "d"}
    assert lost == 0
    # A record in neither the log nor the fenced journal is lost.
    _, _, lost = split_old_writer(old, in_log, {(0, 2): "c"})
    assert lost == 1
