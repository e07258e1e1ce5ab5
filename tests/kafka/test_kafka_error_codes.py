"""Gateway errors answered with Kafka error codes (docs/kafka.md, "Errors"): a subclass gets
its own code, not its base's."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from edge_gateway.errors import (
    ConfigError,
    CorruptData,
    DiskFull,
    InvalidInput,
    InvalidName,
    JournalFull,
    OutOfOrderSequence,
    ProducerFenced,
    Unavailable,
    UnknownProducer,
    UnknownTopic,
    WrongRegion,
)
from edge_gateway.kafka._registry import error_for


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (UnknownProducer("forgotten"), ErrorCode.unknown_producer_id),
        (OutOfOrderSequence("gap"), ErrorCode.out_of_order_sequence_number),
        (ProducerFenced("bumped"), ErrorCode.invalid_producer_epoch),
        (UnknownTopic("t"), ErrorCode.unknown_topic_or_partition),
        (WrongRegion("a mirror", "eu"), ErrorCode.topic_authorization_failed),
        (InvalidName("bad/name"), ErrorCode.invalid_topic_exception),
        (CorruptData("bad crc", where="records"), ErrorCode.corrupt_message),
        (DiskFull("ENOSPC"), ErrorCode.kafka_storage_error),
        (JournalFull("budget"), ErrorCode.not_enough_replicas),
        (Unavailable("stopping"), ErrorCode.not_enough_replicas),
        (ConfigError("bad"), ErrorCode.invalid_request),
        (InvalidInput("bad"), ErrorCode.invalid_request),
        (RuntimeError("a bug"), ErrorCode.unknown_server_error),
    ],
)
def test_error_for(exc: Exception, code: ErrorCode) -> None:
    assert error_for(exc) is code
