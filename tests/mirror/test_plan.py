"""The tailer's sans-IO rules (``edge_gateway.mirror._plan``): epochs, fences, offsets, gaps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest
from _mirror_support import make_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_gateway.errors import CorruptData, InvalidInput
from edge_gateway.format import logobject
from edge_gateway.format.batch import RecordBatch, decode_batch
from edge_gateway.format.logobject import BlockIndex, LogObjectBuilder, encode_fence
from edge_gateway.journal import SourceCoords
from edge_gateway.mirror import Action, EntryInfo, GapKind, MirrorAppend, SourceState
from edge_gateway.mirror._plan import PollSchedule

SRC = "north"


def info_of(data: bytes, key: str = "k") -> EntryInfo:
    return EntryInfo.from_header(key, logobject.decode_header(data, where=key))


def entry(
    seq: int, epoch: int, parts: Mapping[tuple[str, int], list[tuple[int, int]]], region: str = SRC
) -> tuple[EntryInfo, dict[BlockIndex, list[RecordBatch]]]:
    """An entry with, per partition, batches given as (first offset, count)."""
    b = LogObjectBuilder()
    for (t, p), batches in sorted(parts.items()):
        for first, n in batches:
            b.add_batch(t, p, make_batch(t, p, first, n))
    data = b.build(region, epoch, seq, seq, seq, 0)
    info = info_of(data)
    decoded = {
        bi: [
            decode_batch(x.raw)
            for x in logobject.iter_block_batches(
                bi, logobject.decode_block(bi, data[bi.offset : bi.end], where="k")
            )
        ]
        for bi in info.blocks
    }
    return info, decoded


def fence(seq: int, epoch: int) -> EntryInfo:
    return info_of(encode_fence(SRC, epoch, seq, seq, 0))


class Local:
    """A stand-in for the journal's next offsets."""

    def __init__(self) -> None:
        self.next: dict[tuple[str, int], int] = {}

    def __call__(self, topic: str, partition: int) -> int:
        return self.next.get((topic, partition), 0)

    def apply(self, state: SourceState, info: EntryInfo, batches: dict) -> int:  # type: ignore[type-arg]
        plan = state.plan(info, self)
        appends, _dropped = state.assemble(plan, batches)
        for a in appends:
            assert a.base_offset == self(a.topic, a.partition) or a.allow_gap
            self.next[(a.topic, a.partition)] = a.base_offset + a.count
        state.applied(plan)
        return len(appends)


def fresh(topics: set[str] | None = None) -> SourceState:
    s = SourceState(SRC, lambda t: topics is None or t in topics)
    s.start_at(1)
    return s


def test_entries_apply_in_order_and_only_subscribed_topics() -> None:
    s, local = fresh({"t"}), Local()
    local.apply(s, fence(1, 1), {})
    info, batches = entry(2, 1, {("t", 0): [(0, 3), (3, 2)], ("u", 0): [(0, 4)]})
    assert local.apply(s, info, batches) == 2
    assert local.next == {("north.t", 0): 5}
    assert s.next_seq == 3
    with pytest.raises(CorruptData, match="claims seq 2, expected 3"):
        s.plan(info, local)


def test_fence_and_unsubscribed_entries_record_progress_only() -> None:
    s, local = fresh({"t"}), Local()
    assert s.plan(fence(1, 1), local).action is Action.PROGRESS
    s.applied(s.plan(fence(1, 1), local))
    info, _ = entry(2, 1, {("u", 0): [(0, 4)]})
    plan = s.plan(info, local)
    assert plan.action is Action.PROGRESS
    assert s.coords(plan, end_of_object=True) == SourceCoords(SRC, 2, 1, True)


def test_lower_epoch_is_skipped_and_does_not_lower_the_accepted_epoch() -> None:
    s, local = fresh(), Local()
    local.apply(s, fence(1, 2), {})
    info, batches = entry(2, 1, {("t", 0): [(0, 3)]})
    plan = s.plan(info, local)
    assert plan.action is Action.STALE
    assert s.coords(plan, end_of_object=True).epoch == 2
    s.applied(plan)
    assert s.accepted_epoch == 2
    assert s.next_seq == 3
    info, batches = entry(3, 2, {("t", 0): [(0, 3)]})
    assert local.apply(s, info, batches) == 1


def test_data_entry_raising_the_epoch_without_fence_is_impossible() -> None:
    s, local = fresh(), Local()
    local.apply(s, fence(1, 1), {})
    info, _ = entry(2, 3, {("t", 0): [(0, 3)]})
    with pytest.raises(CorruptData, match="impossible epoch"):
        s.plan(info, local)
    # a fence may raise it
    local.apply(s, fence(2, 3), {})
    assert s.accepted_epoch == 3


def test_epoch_zero_wrong_region_wrong_seq_are_refused() -> None:
    s, local = fresh(), Local()
    with pytest.raises(CorruptData, match="epoch 0"):
        s.plan(info_of(encode_fence(SRC, 0, 1, 0, 0)), local)
    info, _ = entry(1, 1, {("t", 0): [(0, 1)]}, region="south")
    with pytest.raises(CorruptData, match="region 'south'"):
        s.plan(info, local)
    assert s.next_seq == 1  # unchanged by a refusal


def test_a_reader_starting_mid_log_accepts_any_epoch_and_partition_starts() -> None:
    s = SourceState(SRC, lambda t: True)
    gap = s.start_at(10)
    assert gap is not None
    assert gap.kind is GapKind.START
    assert (gap.first_seq, gap.last_seq) == (1, 9)
    local = Local()
    info, batches = entry(10, 5, {("t", 0): [(40, 3)]})
    plan = s.plan(info, local)
    assert [g.kind for g in plan.gaps] == [GapKind.START]
    assert plan.gaps[0].first_offset == 0
    assert plan.gaps[0].end_offset == 40
    assert local.apply(s, info, batches) == 1
    assert local.next[("north.t", 0)] == 43


def test_offsets_backwards_or_overlapping_are_refused() -> None:
    s, local = fresh(), Local()
    local.apply(s, fence(1, 1), {})
    local.next[("north.t", 0)] = 10
    back, _ = entry(2, 1, {("t", 0): [(0, 5)]})
    with pytest.raises(CorruptData, match="go backwards"):
        s.plan(back, local)
    over, _ = entry(2, 1, {("t", 0): [(8, 5)]})
    with pytest.raises(CorruptData, match="overlap"):
        s.plan(over, local)


def test_forward_jump_on_a_partition_with_data_is_a_partition_gap() -> None:
    s, local = fresh(), Local()
    local.apply(s, fence(1, 1), {})
    local.next[("north.t", 0)] = 10
    info, batches = entry(2, 1, {("t", 0): [(15, 5)]})
    plan = s.plan(info, local)
    assert [(g.kind, g.first_offset, g.end_offset) for g in plan.partition_gaps] == [
        (GapKind.PARTITION, 10, 15)
    ]
    appends, _ = s.assemble(plan, batches)
    assert [a.allow_gap for a in appends] == [True]


def test_resume_inside_an_entry_drops_applied_batches() -> None:
    s = SourceState(SRC, lambda t: True, SourceCoords(SRC, 2, 1, end_of_object=False))
    assert s.next_seq == 2
    assert s.resume_inside
    local = Local()
    # the crash happened after t/0 (both batches) and the first batch of t/1
    local.next = {("north.t", 0): 5, ("north.t", 1): 3}
    info, batches = entry(2, 1, {("t", 0): [(0, 3), (3, 2)], ("t", 1): [(0, 3), (3, 4)]})
    plan = s.plan(info, local)
    assert plan.resumed
    assert [b.index.partition for b in plan.blocks] == [1]  # t/0 needs nothing
    appends, dropped = s.assemble(plan, batches)
    assert dropped == 1
    assert [(a.partition, a.base_offset, a.count) for a in appends] == [(1, 3, 4)]


def test_whole_blocks_are_kept_as_blocks_a_block_resumed_inside_is_not() -> None:
    """An entry whose every planned block is new is appended as block entries (each with
    its local topic and gap flag); one resumed inside a block goes batch by batch."""
    s, local = fresh(), Local()
    info, _ = entry(1, 1, {("t", 0): [(0, 3), (3, 2)], ("t", 1): [(10, 3)]})
    plan = s.plan(info, local)
    assert plan.whole_blocks
    stored = {b: f"block {b.partition}".encode() for b in info.blocks}
    appends = plan.block_appends(stored)
    assert [(a.topic, a.index.partition, a.stored, a.allow_gap) for a in appends] == [
        ("north.t", 0, b"block 0", False),
        ("north.t", 1, b"block 1", True),  # t/1 starts at 10: a start gap, skipped over
    ]
    with pytest.raises(InvalidInput, match="no stored bytes"):
        plan.block_appends({})
    resumed = SourceState(SRC, lambda t: True, SourceCoords(SRC, 2, 1, end_of_object=False))
    local.next = {("north.t", 0): 3}  # a crash after the first batch of t/0's block
    info, _ = entry(2, 1, {("t", 0): [(0, 3), (3, 2)]})
    plan = resumed.plan(info, local)
    assert not plan.whole_blocks
    with pytest.raises(InvalidInput, match="resumes inside a block"):
        plan.block_appends(dict.fromkeys(info.blocks, b"x"))


def test_resume_point_inside_a_batch_is_refused() -> None:
    s = SourceState(SRC, lambda t: True, SourceCoords(SRC, 2, 1, end_of_object=False))
    local = Local()
    local.next = {("north.t", 0): 2}
    info, batches = entry(2, 1, {("t", 0): [(0, 3)]})
    plan = s.plan(info, local)
    with pytest.raises(CorruptData, match="straddles"):
        s.assemble(plan, batches)


def test_resumed_entry_must_keep_its_epoch() -> None:
    s = SourceState(SRC, lambda t: True, SourceCoords(SRC, 2, 1, end_of_object=False))
    info, _ = entry(2, 2, {("t", 0): [(0, 3)]})
    with pytest.raises(CorruptData, match="immutable"):
        s.plan(info, Local())


def test_progress_restores_position_and_epoch() -> None:
    s = SourceState(SRC, lambda t: True, SourceCoords(SRC, 7, 3, True))
    assert (s.next_seq, s.accepted_epoch, s.resume_inside, s.anchored) == (8, 3, False, True)
    assert s.position() == SourceCoords(SRC, 7, 3, True)
    with pytest.raises(InvalidInput):
        SourceState(SRC, lambda t: True, SourceCoords("south", 7, 3, True))


def test_log_gap_and_skip_forget_the_epoch() -> None:
    s = SourceState(SRC, lambda t: True, SourceCoords(SRC, 7, 3, True))
    gap = s.log_gap(20)
    assert (gap.kind, gap.first_seq, gap.last_seq) == (GapKind.LOG, 8, 19)
    coords = s.skip_to(20)
    assert coords == SourceCoords(SRC, 19, 0, True)
    assert s.next_seq == 20
    assert s.accepted_epoch == 0
    assert not s.anchored
    # after the gap, a data entry of a new epoch is fine (its fence was deleted)
    info, _batches = entry(20, 5, {("t", 0): [(0, 1)]})
    assert s.plan(info, Local()).action is Action.APPLY
    # and a restart from the recorded coordinates is not anchored either
    again = SourceState(SRC, lambda t: True, coords)
    assert again.next_seq == 20
    assert not again.anchored
    assert again.plan(info, Local()).action is Action.APPLY


def test_fresh_reader_gap_is_a_start() -> None:
    s = SourceState(SRC, lambda t: True)
    s.start_at(1)
    assert s.log_gap(5).kind is GapKind.START


def test_poll_schedule_backs_off_and_snaps_back() -> None:
    p = PollSchedule(0.1, 1.0)
    assert [p.idle() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    p.reset()
    assert p.idle() == 0.1


def test_poll_schedule_holds_the_base_interval_after_data() -> None:
    p = PollSchedule(0.1, 1.0, hold=3)
    assert [p.idle() for _ in range(6)] == [0.1, 0.1, 0.1, 0.1, 0.2, 0.4]
    p.reset()
    assert [p.idle() for _ in range(5)] == [0.1, 0.1, 0.1, 0.1, 0.2]


# --------------------------------------------------------------------------
# a model check: random logs, random crashes, the mirror equals the log


@dataclass
class FakeJournal:
    """What the tailer needs of a journal: next offsets, appends, the last coordinates."""

    batches: dict[tuple[str, int], list[tuple[int, int]]] = field(default_factory=dict)
    progress: SourceCoords | None = None
    budget: int = 10**9  # appends before the next 'crash'

    def next_offset(self, topic: str, partition: int) -> int:
        got = self.batches.get((topic, partition))
        return got[-1][0] + got[-1][1] if got else 0

    def append(self, topic: str, partition: int, a: object, coords: SourceCoords) -> None:
        self._spend()
        assert isinstance(a, MirrorAppend)
        assert a.base_offset == self.next_offset(topic, partition) or a.allow_gap
        self.batches.setdefault((topic, partition), []).append((a.base_offset, a.count))
        self.progress = coords

    def marker(self, coords: SourceCoords) -> None:
        self._spend()
        self.progress = coords

    def _spend(self) -> None:
        if self.budget == 0:
            raise Crashed
        self.budget -= 1


class Crashed(Exception):
    pass


def run_tailer(
    log: list[tuple[EntryInfo, dict[BlockIndex, list[RecordBatch]]]],
    j: FakeJournal,
    subscribed: set[str],
) -> None:
    """What Tailer._apply does, over the whole log, from the journal's progress."""
    s = SourceState(SRC, lambda t: t in subscribed, j.progress)
    if not s.started:
        s.start_at(1)
    for info, batches in log[s.next_seq - 1 :]:
        plan = s.plan(info, j.next_offset)
        if plan.action is not Action.APPLY:
            j.marker(s.coords(plan, end_of_object=True))
            s.applied(plan)
            continue
        appends, _ = s.assemble(plan, batches)
        s.entered(plan)
        for i, a in enumerate(appends):
            end = i == len(appends) - 1
            j.append(a.topic, a.partition, a, s.coords(plan, end_of_object=end))
        if not appends:
            j.marker(s.coords(plan, end_of_object=True))
        s.applied(plan)


STEP = st.one_of(
    st.just(("fence",)),
    st.just(("zombie",)),
    st.dictionaries(
        st.tuples(st.sampled_from(["t", "u"]), st.integers(0, 2)),
        st.lists(st.integers(1, 4), min_size=1, max_size=3),
        max_size=4,
    ),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(STEP, min_size=1, max_size=12),
    crashes=st.lists(st.integers(0, 12), max_size=6),
    subscribed=st.sampled_from([{"t"}, {"t", "u"}, {"u"}]),
)
def test_any_log_any_crashes_mirror_equals_log(
    steps: list[object], crashes: list[int], subscribed: set[str]
) -> None:
    # build a legitimate log: a fence first, zombies only of an older epoch
    log: list[tuple[EntryInfo, dict[BlockIndex, list[RecordBatch]]]] = []
    nexts: dict[tuple[str, int], int] = {}
    expected: dict[tuple[str, int], list[tuple[int, int]]] = {}
    epoch = 1
    log.append((fence(1, 1), {}))
    for step in steps:
        seq = len(log) + 1
        if step == ("fence",):
            epoch += 1
            log.append((fence(seq, epoch), {}))
            continue
        parts = {("t", 0): [1]} if step == ("zombie",) else step
        assert isinstance(parts, dict)
        layout: dict[tuple[str, int], list[tuple[int, int]]] = {}
        local = dict(nexts)
        for key, counts in sorted(parts.items()):
            for n in counts:
                first = local.get(key, 0)
                layout.setdefault(key, []).append((first, n))
                local[key] = first + n
        zombie = step == ("zombie",)
        if zombie and epoch == 1:
            continue  # no older epoch to be a zombie of
        log.append(entry(seq, epoch - 1 if zombie else epoch, layout))
        if not zombie:
            nexts = local
            for key, batches in layout.items():
                if key[0] in subscribed:
                    expected.setdefault(key, []).extend(batches)
    j = FakeJournal()
    for budget in crashes:
        j.budget = budget
        try:
            run_tailer(log, j, subscribed)
        except Crashed:
            continue  # restart from what the journal recorded
    j.budget = 10**9
    run_tailer(log, j, subscribed)
    mirrored = {(t.split(".", 1)[1], p): b for (t, p), b in j.batches.items()}
    assert mirrored == expected
    assert j.progress == SourceCoords(SRC, len(log), epoch, True)


# ---------------------------------------------------------------- gap markers (drop-oldest)


def gap_entry(
    seq: int,
    gaps: list[tuple[str, int, int, int]],
    parts: Mapping[tuple[str, int], list[tuple[int, int]]] | None = None,
) -> tuple[EntryInfo, dict[BlockIndex, list[RecordBatch]]]:
    """A version 3 entry of lane 5 with gap markers (topic, partition, first, last)."""
    b = LogObjectBuilder()
    for (t, p), batches in sorted((parts or {}).items()):
        for first, n in batches:
            b.add_batch(t, p, make_batch(t, p, first, n))
    table = tuple(logobject.GapRange(5, t, p, a, z, z - a + 1, 100) for t, p, a, z in sorted(gaps))
    data = b.build(SRC, 1, seq, 1, 0, 0, lanes=(logobject.LaneRange(5, seq, seq),), gaps=table)
    info = info_of(data)
    decoded = {
        bi: [
            decode_batch(x.raw)
            for x in logobject.iter_block_batches(
                bi, logobject.decode_block(bi, data[bi.offset : bi.end], where="k")
            )
        ]
        for bi in info.blocks
    }
    return info, decoded


def test_a_gap_marker_and_the_data_after_it_in_one_entry() -> None:
    s, local = fresh(), Local()
    local.apply(s, *entry(1, 1, {("t", 0): [(0, 10)]}))
    info, batches = gap_entry(2, [("t", 0, 10, 49)], {("t", 0): [(50, 5)]})
    plan = s.plan(info, local)
    assert [(g.kind, g.first_offset, g.end_offset) for g in plan.gaps] == [
        (GapKind.DROPPED, 10, 50)
    ]
    assert plan.partition_gaps == ()  # declared by the source: no gap policy applies
    appends, _ = s.assemble(plan, batches)
    assert appends[0].base_offset == 50
    assert appends[0].allow_gap
    assert "dropped by the source" in plan.gaps[0].describe()


def test_a_gap_marker_alone_then_the_data_in_a_later_entry() -> None:
    s, local = fresh(), Local()
    local.apply(s, *entry(1, 1, {("t", 0): [(0, 10)]}))
    info, batches = gap_entry(2, [("t", 0, 10, 49)])
    plan = s.plan(info, local)
    assert [g.kind for g in plan.gaps] == [GapKind.DROPPED]
    assert local.apply(s, info, batches) == 0
    # the next entry's block starts after the gap: no second gap, no policy
    info, batches = entry(3, 1, {("t", 0): [(50, 5)]})
    plan = s.plan(info, local)
    assert plan.gaps == ()
    appends, _ = s.assemble(plan, batches)
    assert appends[0].allow_gap
    assert local.apply(s, info, batches) == 1
    assert local.next[("north.t", 0)] == 55
    # and then normal contiguity rules again
    info, _ = entry(4, 1, {("t", 0): [(60, 1)]})
    assert s.plan(info, local).partition_gaps


def test_a_gap_marker_of_an_unsubscribed_topic_or_applied_before_is_ignored() -> None:
    s, local = fresh({"t"}), Local()
    local.apply(s, *entry(1, 1, {("t", 0): [(0, 60)]}))
    info, _ = gap_entry(2, [("t", 0, 10, 49), ("u", 0, 0, 9)])
    assert s.plan(info, local).gaps == ()
