"""The Kafka listener's front door, sans-IO: framing, headers, version checks, hostile lengths."""

from __future__ import annotations

import datetime
import importlib
import io
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.serial import entity_writer
from kio.static.primitive import Records, i16, i32, i32Timedelta, i64Timedelta

import edge_gateway.kafka  # noqa: F401 - registers the handlers
from edge_gateway.kafka._protocol import (
    FrameReader,
    OversizedProduce,
    ProtocolError,
    UnsupportedVersion,
    decode_request,
    request_class,
)
from edge_gateway.kafka._registry import supported_versions


def _frame(api_key: int, version: int, request: Any, correlation_id: int = 7) -> bytes:
    cls = type(request)
    header_cls = cls.__header_schema__
    buf = io.BytesIO()
    entity_writer(header_cls)(
        buf,
        header_cls(
            request_api_key=i16(api_key),
            request_api_version=i16(version),
            correlation_id=i32(correlation_id),
            client_id="test",
        ),
    )
    entity_writer(cls)(buf, request)
    return buf.getvalue()


def _api_versions(version: int = 3) -> bytes:
    cls = request_class(18, version)
    assert cls is not None
    fields = {"client_software_name": "t", "client_software_version": "1"} if version >= 3 else {}
    return _frame(18, version, cls(**fields))


def test_frames_whole_and_byte_by_byte() -> None:
    frames = [_api_versions(3), _api_versions(0)]
    stream = b"".join(len(f).to_bytes(4, "big") + f for f in frames)
    whole = FrameReader(1 << 20)
    whole.feed(stream)
    assert [whole.next_frame(), whole.next_frame(), whole.next_frame()] == [*frames, None]
    one = FrameReader(1 << 20)
    got = []
    for b in stream:
        one.feed(bytes([b]))
        if (f := one.next_frame()) is not None:
            got.append(f)
    assert got == frames
    assert one.buffered == 0


@pytest.mark.parametrize("size", [1 << 20 + 1, 2**31 - 1, -1])
def test_a_frame_over_the_limit_is_refused_before_its_body(size: int) -> None:
    reader = FrameReader(1 << 20)
    # Under 1 GiB, the header says whether it is a Produce (read through, below).
    reader.feed(size.to_bytes(4, "big", signed=True) + _api_versions()[:8])
    with pytest.raises(ProtocolError, match="refused"):
        reader.next_frame()
    if size > 1 << 30 or size < 0:  # nonsense: refused without waiting for a header
        reader = FrameReader(1 << 20)
        reader.feed(size.to_bytes(4, "big", signed=True))
        with pytest.raises(ProtocolError, match="refused"):
            reader.next_frame()


def _produce(version: int, topics: dict[str, dict[int, bytes]], acks: int = -1) -> bytes:
    """A Produce request frame (with its size) of ``topics`` -> partition -> records bytes."""
    cls = request_class(0, version)
    assert cls is not None
    nested = importlib.import_module(cls.__module__)  # TopicProduceData, PartitionProduceData
    request = cls(
        transactional_id=None,
        acks=i16(acks),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        topic_data=tuple(
            nested.TopicProduceData(
                name=name,
                partition_data=tuple(
                    nested.PartitionProduceData(index=i32(p), records=Records(data))
                    for p, data in parts.items()
                ),
            )
            for name, parts in topics.items()
        ),
    )
    frame = _frame(0, version, request, correlation_id=41)
    return len(frame).to_bytes(4, "big") + frame


@pytest.mark.parametrize("version", [3, 8, 9, 12])
def test_a_produce_over_the_limit_is_read_through_for_its_partitions(version: int) -> None:
    # Issue 41, item 8: closing the connection made librdkafka report "verify
    # that security.protocol is correctly configured"; a broker answers a batch
    # over message.max.bytes with MESSAGE_TOO_LARGE. The records are skipped,
    # not kept; the next request on the connection is read as usual.
    big = _produce(version, {"a": {0: b"x" * 5000, 2: b"y" * 3000}, "b": {1: b"z" * 100}})
    after = _api_versions(3)
    stream = big + len(after).to_bytes(4, "big") + after
    want = OversizedProduce(
        api_version=version,
        correlation_id=41,
        client_id="test",
        acks=-1,
        topics=(("a", (0, 2)), ("b", (1,))),
        size=len(big) - 4,
        limit=4096,
    )
    whole = FrameReader(4096)
    whole.feed(stream)
    assert [whole.next_frame(), whole.next_frame(), whole.next_frame()] == [want, after, None]
    one = FrameReader(4096)
    got: list[Any] = []
    for b in stream:
        one.feed(bytes([b]))
        if (f := one.next_frame()) is not None:
            got.append(f)
        if not got:  # the oversized frame: never more than its size and header held
            assert one.buffered <= 4 + 8
    assert got == [want, after]


def test_an_oversized_frame_that_is_not_a_readable_produce_is_refused() -> None:
    big = _produce(9, {"a": {0: b"x" * 5000}})
    for stream in (
        big[:4] + b"\x00\x03" + big[6:12],  # Metadata, not Produce
        big[:4] + b"\x00\x00\x00\x0d" + big[8:12],  # Produce v13 (topic ids)
    ):
        reader = FrameReader(4096)
        reader.feed(stream)
        with pytest.raises(ProtocolError, match="refused"):
            reader.next_frame()
    # A produce whose fields run past its frame: a protocol error, not a hang.
    reader = FrameReader(4096)
    lying = bytearray(big)
    lying[0:4] = (5000).to_bytes(4, "big")  # shorter than the records it announces
    reader.feed(bytes(lying))
    with pytest.raises(ProtocolError, match="left of the frame"):
        reader.next_frame()
    # Not before authentication: then it is refused like any oversized frame.
    reader = FrameReader(4096)
    reader.read_oversized_produce = False
    reader.feed(big)
    with pytest.raises(ProtocolError, match="refused"):
        reader.next_frame()


def test_unknown_api_key() -> None:
    frame = bytearray(_api_versions())
    frame[0:2] = (9999).to_bytes(2, "big")
    with pytest.raises(ProtocolError, match="not supported") as info:
        decode_request(bytes(frame), supported_versions())
    assert not isinstance(info.value, UnsupportedVersion)


def test_unsupported_version_carries_the_correlation_id() -> None:
    frame = bytearray(_api_versions())
    frame[2:4] = (99).to_bytes(2, "big")
    with pytest.raises(UnsupportedVersion) as info:
        decode_request(bytes(frame), supported_versions())
    assert (info.value.api_key, info.value.api_version, info.value.correlation_id) == (18, 99, 7)


def test_every_truncation_and_trailing_bytes_are_protocol_errors() -> None:
    frame = _api_versions()
    assert decode_request(frame, supported_versions()).correlation_id == 7
    for cut in range(len(frame)):
        with pytest.raises(ProtocolError):
            decode_request(frame[:cut], supported_versions())
    with pytest.raises(ProtocolError, match="after the request"):
        decode_request(frame + b"\0", supported_versions())


def test_a_hostile_array_length_never_reaches_kio() -> None:
    # Metadata v12 whose topics array claims ~2**34 entries: kio would try to
    # allocate them all and abort the process (found by fuzz/fuzz_kafka_batch.py).
    frame = bytes.fromhex("0003000c00000002000178" + "00" + "a597bfd5737c0a98020000000002")
    with pytest.raises(ProtocolError, match="array of"):
        decode_request(frame, supported_versions())


# kio registers strategies for its primitives, not for the opaque records blob.
st.register_type_strategy(Records, st.binary(max_size=64))

# kio's native reader turns an int64 of milliseconds into a timedelta through
# microseconds, so it refuses |ms| > 2**63 // 1000 (about 292,000 years) that its
# writer accepts; such a request is answered as malformed (next test). Its
# writer goes through a float of seconds, exact only to about 2**43 ms (278
# years), so the strategy stays within that: far beyond any retention a client
# means.
_KIO_MAX_MS = 2**63 // 1000
st.register_type_strategy(
    i64Timedelta,
    st.integers(-(2**43), 2**43).map(lambda ms: i64Timedelta(datetime.timedelta(milliseconds=ms))),
)


def test_a_retention_beyond_what_kio_reads_is_malformed_not_a_crash() -> None:
    cls = request_class(8, 2)
    assert cls is not None
    fields = {
        "group_id": "g",
        "generation_id_or_member_epoch": i32(-1),
        "member_id": "",
        "retention_time": datetime.timedelta(milliseconds=123),
        "topics": (),
    }
    frame = _frame(8, 2, cls(**fields))
    assert decode_request(frame, supported_versions()).api_key == 8
    # The same frame with the int64 one past the limit (it sits right before the
    # empty topics array, an int32 0 in this version).
    tail = (0).to_bytes(4, "big")
    assert frame.endswith((123).to_bytes(8, "big") + tail)
    at_limit = frame[:-12] + _KIO_MAX_MS.to_bytes(8, "big") + tail
    assert decode_request(at_limit, supported_versions()).api_key == 8
    beyond = frame[:-12] + (_KIO_MAX_MS + 1).to_bytes(8, "big") + tail
    with pytest.raises(ProtocolError, match="malformed request"):
        decode_request(beyond, supported_versions())


def _requests() -> st.SearchStrategy[tuple[int, int, Any]]:
    pairs = [
        (key, version)
        for key, (lo, hi) in sorted(supported_versions().items())
        for version in range(lo, hi + 1)
    ]

    def one(pair: tuple[int, int]) -> st.SearchStrategy[tuple[int, int, Any]]:
        cls = request_class(*pair)
        assert cls is not None
        return st.tuples(st.just(pair[0]), st.just(pair[1]), st.from_type(cls))

    return st.sampled_from(pairs).flatmap(one)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(_requests())
def test_every_served_request_decodes_as_kio_encodes_it(req: tuple[int, int, Any]) -> None:
    """The bounds walk (check_bounds) accepts everything kio writes, for every version served."""
    key, version, request = req
    decoded = decode_request(_frame(key, version, request), supported_versions())
    assert (decoded.api_key, decoded.api_version) == (key, version)
    assert decoded.request == request
