"""The client's I/O-free core: what a failed request means, decided once for both shells.

``Client`` and ``AsyncClient`` send and sleep; ``_Retry`` (a plain request:
the producer id, a topic lookup) and ``_PartitionSend`` (one partition's
idempotent produce) decide whether to send again, wait, renew the producer
id or give up. Fed errors here directly, with no gateway.
"""

from __future__ import annotations

import time

import pytest

from edge_gateway.api.wire import PRODUCER_ID_HEADER, PRODUCER_SEQUENCE_HEADER
from edge_gateway.client import (
    _Call,
    _Idempotence,
    _PartitionSend,
    _Plan,
    _Reply,
    _Retry,
    _Then,
)
from edge_gateway.errors import (
    Denied,
    EdgeGatewayError,
    InvalidInput,
    OutOfOrderSequence,
    ProducerFenced,
    Unavailable,
    UnknownProducer,
)

_DENIED = Denied("token revoked", code="revoked", action="issue a new token")


def _reply(status: int, body: bytes = b"{}") -> _Reply:
    return _Reply(status, {}, body, "POST", "http://gw/v1/producers")


def _idem(producer_id: int = 7, epoch: int = 0) -> _Idempotence:
    idem = _Idempotence()
    idem.initialized(_reply(200, b'{"producer_id": %d, "epoch": %d}' % (producer_id, epoch)))
    return idem


def _send(idem: _Idempotence, *, deadline_s: float = 60.0, count: int = 3) -> _PartitionSend:
    plan = _Plan(1, [0, 1, 2][:count], _Call("POST", "/v1/topics/t/partitions/1/records"))
    return _PartitionSend(idem, "t", plan, count, time.monotonic() + deadline_s)


def _seq(call: _Call) -> str:
    assert call.headers is not None
    return call.headers[PRODUCER_SEQUENCE_HEADER]


def test_sign_takes_the_partitions_next_sequences() -> None:
    idem = _idem()
    assert _seq(_send(idem).sign()) == "0"
    assert _seq(_send(idem).sign()) == "3"
    assert idem.next_seq == {("t", 1): 6}


def test_a_refusal_on_the_first_try_gives_the_sequences_back() -> None:
    """A 4xx before any retry: surely not written, so the next produce reuses the sequence."""
    idem = _idem()
    send = _send(idem)
    send.sign()
    assert send.failed(InvalidInput("bad record")) is _Then.GIVE_UP
    assert idem.next_seq == {("t", 1): 0}
    assert not idem.uncertain


def test_a_refusal_after_a_retry_leaves_the_sequences_uncertain() -> None:
    """The first try may have been written: the next produce must bump the epoch."""
    idem = _idem()
    send = _send(idem)
    send.sign()
    delay = send.failed(Unavailable("connection cut"))
    assert isinstance(delay, float)
    assert 0.0 <= delay < 0.05  # the first ceiling
    assert send.failed(_DENIED) is _Then.GIVE_UP
    assert idem.uncertain
    assert idem.next_seq == {("t", 1): 3}
    assert idem.init_call() is not None  # the bump


@pytest.mark.parametrize("exc", [OutOfOrderSequence("gap"), ProducerFenced("newer epoch")])
def test_a_sequence_or_epoch_conflict_gives_up_uncertain(exc: EdgeGatewayError) -> None:
    idem = _idem()
    send = _send(idem)
    send.sign()
    assert send.failed(exc) is _Then.GIVE_UP
    assert idem.uncertain


def test_an_unknown_producer_gets_one_new_id() -> None:
    idem = _idem()
    send = _send(idem)
    send.sign()
    assert send.failed(UnknownProducer("forgotten")) is _Then.NEW_PRODUCER_ID
    idem.forget()
    idem.initialized(_reply(200, b'{"producer_id": 8, "epoch": 0}'))
    call = send.sign()
    assert call.headers is not None
    assert call.headers[PRODUCER_ID_HEADER] == "8"
    assert _seq(call) == "0"
    assert send.failed(UnknownProducer("forgotten again")) is _Then.GIVE_UP


def test_unavailable_waits_growing_delays_until_the_deadline() -> None:
    idem = _idem()
    send = _send(idem, deadline_s=60.0)
    send.sign()
    ceilings = []
    for _ in range(6):
        delay = send.failed(Unavailable("503"))
        assert isinstance(delay, float)
        ceilings.append(delay)
    assert all(0.0 <= d < 1.0 for d in ceilings)  # the cap
    assert not idem.uncertain
    late = _send(idem, deadline_s=-1.0)
    late.sign()
    assert late.failed(Unavailable("503")) is _Then.GIVE_UP
    assert idem.uncertain


def test_retry_waits_out_503_and_cut_connections_until_the_deadline() -> None:
    retry = _Retry(time.monotonic() + 60.0)
    assert not retry.answered(_reply(503))
    assert retry.answered(_reply(200))
    assert retry.answered(_reply(400))
    assert retry.may_retry(Unavailable("connection refused"))
    assert not retry.may_retry(_DENIED)
    assert 0.0 <= retry.next_delay() < 0.05
    late = _Retry(time.monotonic() - 1.0)
    assert late.answered(_reply(503))
    assert not late.may_retry(Unavailable("connection refused"))
