"""The idempotent producers' table (sans-IO): duplicates, gaps, fencing, expiry, snapshots."""

from __future__ import annotations

import json

import pytest

from edge_gateway.errors import (
    CorruptData,
    Fenced,
    InvalidInput,
    OutOfOrderSequence,
    ProducerFenced,
    UnknownProducer,
)
from edge_gateway.idempotence import (
    REMEMBERED_BATCHES,
    SEQUENCE_MODULUS,
    ProducerSeq,
    ProducerTable,
)

T, P = "t", 0


def write(table: ProducerTable, seq: ProducerSeq, count: int, offset: int, *, now: int = 0) -> bool:
    """Check and record an append as the gateway does; True when it was a duplicate."""
    dup = table.check(T, P, seq, count, now)
    if dup is not None:
        assert dup.count == count
        return True
    table.record(T, P, seq, count, offset, lsn=offset + 100, now=now)
    return False


def test_new_ids_are_never_reused() -> None:
    table = ProducerTable()
    ids = [table.new_producer(0)[0] for _ in range(3)]
    assert ids == [1, 2, 3]
    assert table.new_producer(0) == (4, 0)


def test_duplicate_answers_the_original_batch() -> None:
    table = ProducerTable()
    pid, epoch = table.new_producer(0)
    assert not write(table, ProducerSeq(pid, epoch, 0), 3, 10)
    assert not write(table, ProducerSeq(pid, epoch, 3), 2, 13)
    dup = table.check(T, P, ProducerSeq(pid, epoch, 0), 3, 0)
    assert dup is not None
    assert (dup.base_offset, dup.count, dup.lsn) == (10, 3, 110)
    assert table.statistics().duplicates == 1
    # the same sequence with another count is not a duplicate: refused
    with pytest.raises(OutOfOrderSequence, match="written with 2 records"):
        table.check(T, P, ProducerSeq(pid, epoch, 3), 1, 0)
    # another partition has its own sequence
    assert table.check(T, 1, ProducerSeq(pid, epoch, 0), 1, 0) is None


def test_gap_and_too_old_are_refused() -> None:
    table = ProducerTable()
    pid, epoch = table.new_producer(0)
    with pytest.raises(OutOfOrderSequence, match="must be 0") as info:
        table.check(T, P, ProducerSeq(pid, epoch, 1), 1, 0)
    assert info.value.expected == 0
    offset = 0
    for i in range(REMEMBERED_BATCHES + 2):
        assert not write(table, ProducerSeq(pid, epoch, i), 1, offset)
        offset += 1
    with pytest.raises(OutOfOrderSequence, match="a gap") as info:
        table.check(T, P, ProducerSeq(pid, epoch, offset + 1), 1, 0)
    assert info.value.expected == offset
    # the oldest batches are no longer remembered: refused, never written again
    with pytest.raises(OutOfOrderSequence, match="older than the batches remembered"):
        table.check(T, P, ProducerSeq(pid, epoch, 0), 1, 0)
    # the last REMEMBERED_BATCHES are
    assert table.check(T, P, ProducerSeq(pid, epoch, offset - REMEMBERED_BATCHES), 1, 0)


def test_sequence_wraps_like_kafkas() -> None:
    table = ProducerTable()
    pid, epoch = 1, 0
    # force the last sequence near the end of the space, as a long-lived producer gets there
    table.restore(
        {
            "v": 1,
            "next_id": 2,
            "producers": [[pid, epoch, 0, [[T, P, [[epoch, SEQUENCE_MODULUS - 2, 2, 5, 9]]]]]],
        }
    )
    assert table.check(T, P, ProducerSeq(pid, epoch, 0), 1, 0) is None
    with pytest.raises(OutOfOrderSequence):
        table.check(T, P, ProducerSeq(pid, epoch, 1), 1, 0)


def test_epoch_bump_fences_the_older_instance() -> None:
    table = ProducerTable()
    pid, epoch = table.new_producer(0)
    assert not write(table, ProducerSeq(pid, epoch, 0), 2, 0)
    assert table.bump(pid, epoch, 0) == (pid, 1)
    with pytest.raises(ProducerFenced, match="fenced by epoch 1"):
        table.check(T, P, ProducerSeq(pid, 0, 2), 1, 0)
    assert issubclass(ProducerFenced, Fenced)
    with pytest.raises(ProducerFenced):
        table.bump(pid, 0, 0)
    with pytest.raises(ProducerFenced, match="newer"):
        table.check(T, P, ProducerSeq(pid, 5, 0), 1, 0)
    # the new epoch starts its sequences at 0 on every partition
    with pytest.raises(OutOfOrderSequence, match="must be 0"):
        table.check(T, P, ProducerSeq(pid, 1, 2), 1, 0)
    assert not write(table, ProducerSeq(pid, 1, 0), 1, 2)
    # an unconditional bump (epoch None)
    assert table.bump(pid, None, 0) == (pid, 2)


def test_unknown_producer() -> None:
    table = ProducerTable()
    with pytest.raises(UnknownProducer, match="get a new one"):
        table.check(T, P, ProducerSeq(7, 0, 0), 1, 0)
    with pytest.raises(UnknownProducer):
        table.bump(7, 0, 0)


def test_idle_producers_expire() -> None:
    table = ProducerTable(expiry_ms=1000)
    pid, epoch = table.new_producer(0)
    assert not write(table, ProducerSeq(pid, epoch, 0), 1, 0, now=500)
    # used at 500: still known at 1400
    assert table.check(T, P, ProducerSeq(pid, epoch, 1), 1, 1400) is None
    with pytest.raises(UnknownProducer):
        table.check(T, P, ProducerSeq(pid, epoch, 1), 1, 2401)
    assert table.statistics().expired == 1
    assert len(table) == 0


def test_the_oldest_idle_is_evicted_beyond_max_producers() -> None:
    table = ProducerTable(max_producers=2)
    a, _ = table.new_producer(0)
    b, _ = table.new_producer(1)
    assert not write(table, ProducerSeq(a, 0, 0), 1, 0, now=5)  # a is now the more recent
    c, _ = table.new_producer(6)
    assert a in table
    assert c in table
    assert b not in table
    assert table.statistics().evicted == 1
    with pytest.raises(UnknownProducer):
        table.check(T, P, ProducerSeq(b, 0, 0), 1, 7)


def test_bad_fields_are_invalid_input() -> None:
    table = ProducerTable()
    pid, _ = table.new_producer(0)
    for seq in (ProducerSeq(pid, -1, 0), ProducerSeq(pid, 0, -1), ProducerSeq(-1, 0, 0)):
        with pytest.raises(InvalidInput):
            table.check(T, P, seq, 1, 0)
    with pytest.raises(InvalidInput):
        table.check(T, P, ProducerSeq(pid, 0, 0), 0, 0)
    with pytest.raises(InvalidInput):
        ProducerTable(max_producers=0)


def test_snapshot_restore_and_replay() -> None:
    table = ProducerTable()
    pid, epoch = table.new_producer(0)
    other, _ = table.new_producer(0)
    for i in range(7):
        table.record(T, P, ProducerSeq(pid, epoch, i), 1, i, lsn=i + 1, lane=0, now=10)
    table.record(T, 1, ProducerSeq(pid, epoch, 0), 2, 0, lsn=50, lane=1, now=11)
    # one lane's snapshot holds only that lane's batches (JSON round trip, as in a checkpoint)
    lane0 = json.loads(json.dumps(table.snapshot(0)))
    lane1 = json.loads(json.dumps(table.snapshot(1)))
    again = ProducerTable()
    again.restore(lane1, lane=1)
    again.restore(lane0, lane=0)
    assert again.next_id == table.next_id
    assert other in again
    dup = again.check(T, P, ProducerSeq(pid, epoch, 6), 1, 12)
    assert dup is not None
    assert (dup.base_offset, dup.lsn, dup.lane) == (6, 7, 0)
    dup = again.check(T, 1, ProducerSeq(pid, epoch, 0), 2, 12)
    assert dup is not None
    assert dup.lane == 1
    assert again.check(T, P, ProducerSeq(pid, epoch, 7), 1, 12) is None
    # entries after the checkpoint replay on top of it
    again.replay(T, P, ProducerSeq(pid, epoch, 7), 3, 7, lsn=8, append_time=13)
    assert again.check(T, P, ProducerSeq(pid, epoch, 10), 1, 14) is None
    # a producer first seen in an entry comes back; its id is never issued again
    again.replay(T, P, ProducerSeq(900, 0, 0), 1, 20, lsn=9, append_time=13)
    assert 900 in again
    assert again.new_producer(15)[0] == 901
    with pytest.raises(CorruptData, match="snapshot version"):
        again.restore({"v": 9})
    with pytest.raises(CorruptData, match="malformed"):
        again.restore({"v": 1, "next_id": 1, "producers": [[1]]})
