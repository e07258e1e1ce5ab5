"""The Kafka wire protocol around kio's message types: frames, headers, versions (sans-IO).

Every request and response body is one of kio's dataclasses, generated from
Kafka's own message schemas; nothing here encodes a message field by hand.
What this module adds is the part kio leaves to the caller:

* **Framing** (:class:`FrameReader`): a request is a 4-byte big-endian size
  and that many bytes. A size above the limit (or negative) is refused before
  any of the frame is buffered, so memory per connection is bounded by the
  limit -- except a Produce (its 8-byte header says so, and a size up to
  1 GiB): it is read through without keeping its records
  (:class:`OversizedProduce`), so that it
  can be answered ``MESSAGE_TOO_LARGE`` per partition, as a Kafka broker
  answers a batch over ``message.max.bytes``, instead of a closed connection
  that a client reports as a network or TLS problem.
* **Headers**: the request header is v1 for a non-flexible request version
  and v2 for a flexible one (tagged fields); the response header v0/v1 alike,
  except that ApiVersions always answers with header v0 (a client that does
  not know the broker's versions yet must be able to read it).
* **Building responses across versions** (:func:`build`): each version of a
  message is its own dataclass with its own fields. Handlers describe a
  response once as plain values (nested dicts and lists); :func:`build` keeps
  the fields the requested version has and converts nested values to that
  version's nested classes.

Errors: :class:`ProtocolError` for anything a peer sent that cannot be
answered (the connection is closed: Kafka brokers do the same for a frame
they cannot parse); :class:`UnsupportedVersion` for a known API at a version
outside the supported range (ApiVersions answers it with error 35, others
close).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import types
import typing
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from kio._kio_native import (
    get_reader,
    read_compact_array_length,
    read_int8,
    read_int16,
    read_legacy_array_length,
    read_unsigned_varint,
)
from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map
from kio.serial import entity_reader, entity_writer
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.serial.errors import SerialError

__all__ = [
    "API_VERSIONS_KEY",
    "FrameReader",
    "OversizedProduce",
    "ProtocolError",
    "RequestFrame",
    "UnsupportedVersion",
    "build",
    "decode_request",
    "encode_response",
    "peek_header",
    "request_class",
    "response_class",
]

API_VERSIONS_KEY: Final = 18
PRODUCE_KEY: Final = 0
#: Produce versions whose layout :func:`_produce_outline` reads (v13 names
#: topics by id).
_OUTLINE_VERSIONS: Final = (3, 12)
#: Oversized frames up to this size (the largest ``kafka.max_request_bytes``
#: allowed) may be read through; a larger size is nonsense, refused at once.
_MAX_READ_THROUGH: Final = 1 << 30
#: Partitions an oversized Produce may name (its outline is kept in memory).
_OUTLINE_MAX_PARTITIONS: Final = 100_000

#: Bytes of the size prefix of every frame.
SIZE_BYTES: Final = 4


class ProtocolError(Exception):
    """The peer sent something that is not a request this broker can answer."""


class UnsupportedVersion(ProtocolError):
    """A known API at a version this broker does not serve."""

    def __init__(self, message: str, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(message)
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


@dataclass(frozen=True, slots=True)
class OversizedProduce:
    """A Produce request over the frame limit, read through without its records:
    what it takes to answer it ``MESSAGE_TOO_LARGE`` for each of its partitions."""

    api_version: int
    correlation_id: int
    client_id: str | None
    acks: int
    #: (topic, partition indexes) in request order
    topics: tuple[tuple[str, tuple[int, ...]], ...]
    #: the frame's size and the limit it broke
    size: int
    limit: int


#: What an outline reader asks for: (bytes, keep them?); kept bytes are sent back.
_Want = tuple[int, bool]
_Outline = Generator[_Want, bytes, Any]


def _int(n: int) -> _Outline:
    data = yield n, True
    return int.from_bytes(data, "big", signed=True)


def _uvarint() -> _Outline:
    value = 0
    for shift in range(0, 35, 7):
        (b,) = yield 1, True
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value
    raise ProtocolError("a varint longer than 5 bytes")


def _length(flexible: bool, width: int) -> _Outline:
    """A string's, bytes' or array's length (-1: null), compact when ``flexible``."""
    if flexible:
        return (yield from _uvarint()) - 1
    return (yield from _int(width))


def _string(flexible: bool) -> _Outline:
    n = yield from _length(flexible, 2)
    if n <= 0:
        return None if n < 0 else ""
    if n > 0x7FFF:  # Kafka's strings have an int16 length, compact ones too
        raise ProtocolError(f"a string of {n} bytes")
    data = yield n, True
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ProtocolError("a string that is not UTF-8") from None


def _skip(n: int) -> _Outline:
    if n > 0:
        yield n, False


def _tagged_fields() -> _Outline:
    for _ in range((yield from _uvarint())):
        yield from _uvarint()  # tag
        yield from _skip((yield from _uvarint()))


def _produce_outline(version: int) -> _Outline:
    """Read a Produce request (after its fixed 8 header bytes) for its topics and
    partitions, skipping the records: returns ``(client_id, acks, topics)``."""
    flexible = version >= 9
    client_id = yield from _string(False)  # the header's client id is never compact
    if flexible:
        yield from _tagged_fields()
    yield from _string(flexible)  # transactional_id
    acks = yield from _int(2)
    yield from _int(4)  # timeout_ms
    topics = []
    count = 0
    for _ in range(max(0, (yield from _length(flexible, 4)))):
        name = yield from _string(flexible)
        partitions = []
        for _ in range(max(0, (yield from _length(flexible, 4)))):
            count += 1
            if count > _OUTLINE_MAX_PARTITIONS:
                raise ProtocolError(f"a produce request of over {count - 1} partitions")
            partitions.append((yield from _int(4)))
            yield from _skip((yield from _length(flexible, 4)))  # the records
            if flexible:
                yield from _tagged_fields()
        if flexible:
            yield from _tagged_fields()
        topics.append((name or "", tuple(partitions)))
    if flexible:
        yield from _tagged_fields()
    return client_id, acks, tuple(topics)


class _OutlineReader:
    """Drive :func:`_produce_outline` over the rest of a ``size``-byte frame fed in
    pieces: kept bytes are buffered only as far as a field asks, records are skipped."""

    def __init__(self, outline: _Outline, size: int) -> None:
        self._outline = outline
        self._left = size  # bytes of the frame not consumed yet
        self._kept = bytearray()
        self._have = 0
        self.result: Any = None
        self._want: _Want | None = None
        self._advance(None)

    def _advance(self, data: bytes | None) -> None:
        try:
            want = self._outline.send(data) if data is not None else next(self._outline)
        except StopIteration as stop:
            self.result, self._want = stop.value, None
            return
        if want[0] > self._left:
            raise ProtocolError(f"a field of {want[0]} bytes in the {self._left} left of the frame")
        self._want = want

    @property
    def done(self) -> bool:
        return self._left == 0

    def feed(self, data: bytes | bytearray) -> int:
        """Consume what of ``data`` belongs to the frame; returns the bytes used."""
        with memoryview(data) as whole:
            view = whole[: self._left]
            try:
                pos = 0
                while pos < len(view):
                    if self._want is None:
                        # Read: whatever else the frame holds is skipped.
                        self._left -= len(view) - pos
                        pos = len(view)
                        break
                    n, keep = self._want
                    take = min(n - self._have, len(view) - pos)
                    if keep:
                        self._kept += view[pos : pos + take]
                    self._have += take
                    pos += take
                    self._left -= take
                    if self._have == n:
                        kept, self._kept, self._have = bytes(self._kept), bytearray(), 0
                        self._advance(kept)
                return pos
            finally:
                view.release()

    def outcome(self) -> Any:
        if self._want is not None:
            raise ProtocolError("the produce request ends inside a field")
        return self.result


class FrameReader:
    """Split a byte stream into request frames (sans-IO: feed bytes, take frames).

    ``max_frame`` bounds one frame; a larger (or negative) size prefix raises
    :class:`ProtocolError` before the body is read -- unless its first 8 bytes
    are a Produce header (``produce_versions``, default the versions
    :func:`_produce_outline` reads): then the frame is read through, keeping
    only its topics and partitions, and :meth:`next_frame` returns an
    :class:`OversizedProduce` in its place. A size over 1 GiB (or negative) is
    refused at once, without waiting for a header.
    """

    def __init__(self, max_frame: int, produce_versions: tuple[int, int] | None = None) -> None:
        self.max_frame = max_frame
        lo, hi = produce_versions or _OUTLINE_VERSIONS
        self._produce_versions = (max(lo, _OUTLINE_VERSIONS[0]), min(hi, _OUTLINE_VERSIONS[1]))
        self._buf = bytearray()
        self._need: int | None = None
        self._oversized: tuple[_OutlineReader, int, int, int] | None = None
        #: Read an oversized Produce through (False: refuse it like any frame,
        #: e.g. before SASL authentication, when nothing may be answered).
        self.read_oversized_produce = True

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def next_frame(self) -> bytes | OversizedProduce | None:
        """The next whole frame (without its size), an :class:`OversizedProduce`
        read through, or None until more bytes arrive."""
        if self._oversized is not None:
            return self._read_oversized()
        if self._need is None:
            if len(self._buf) < SIZE_BYTES:
                return None
            size = int.from_bytes(self._buf[:SIZE_BYTES], "big", signed=True)
            if size > self.max_frame and 8 <= size <= _MAX_READ_THROUGH:
                if self.read_oversized_produce and len(self._buf) < SIZE_BYTES + 8:
                    return None  # its header tells whether it is a Produce
                if self._is_produce():
                    _, version, correlation_id = peek_header(self._buf[SIZE_BYTES : SIZE_BYTES + 8])
                    del self._buf[: SIZE_BYTES + 8]
                    outline = _OutlineReader(_produce_outline(version), size - 8)
                    self._oversized = (outline, version, correlation_id, size)
                    return self._read_oversized()
            if size < 0 or size > self.max_frame:
                raise ProtocolError(
                    f"frame of {size} bytes refused (limit kafka.max_request_bytes = "
                    f"{self.max_frame})"
                )
            del self._buf[:SIZE_BYTES]
            self._need = size
        if len(self._buf) < self._need:
            return None
        frame = bytes(self._buf[: self._need])
        del self._buf[: self._need]
        self._need = None
        return frame

    def _is_produce(self) -> bool:
        """Whether the oversized frame buffered is a Produce this reader reads through."""
        if not self.read_oversized_produce:
            return False
        api_key, api_version, _ = peek_header(self._buf[SIZE_BYTES : SIZE_BYTES + 8])
        lo, hi = self._produce_versions
        return api_key == PRODUCE_KEY and lo <= api_version <= hi

    def _read_oversized(self) -> OversizedProduce | None:
        assert self._oversized is not None
        outline, api_version, correlation_id, size = self._oversized
        del self._buf[: outline.feed(self._buf)]
        if not outline.done:
            return None
        self._oversized = None
        client_id, acks, topics = outline.outcome()
        return OversizedProduce(
            api_version, correlation_id, client_id, acks, topics, size, self.max_frame
        )


@dataclass(frozen=True, slots=True)
class RequestFrame:
    """A decoded request: its header fields and kio's request entity."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    request: Any


def peek_header(frame: bytes | bytearray) -> tuple[int, int, int]:
    """(api key, api version, correlation id): the fixed start of every request header."""
    if len(frame) < 8:
        raise ProtocolError(f"request of {len(frame)} bytes is shorter than a request header")
    return (
        int.from_bytes(frame[0:2], "big", signed=True),
        int.from_bytes(frame[2:4], "big", signed=True),
        int.from_bytes(frame[4:8], "big", signed=True),
    )


@functools.cache
def request_class(api_key: int, api_version: int) -> type[Any] | None:
    """kio's request class for a key and version; None when kio has no such version."""
    try:
        return load_request_schema(api_key, api_version)
    except Exception:  # noqa: BLE001 - kio's lookup errors: "no such version"
        return None


@functools.cache
def response_class(api_key: int, api_version: int) -> type[Any]:
    return load_response_schema(api_key, api_version)


_READERS: dict[type[Any], Any] = {}
_WRITERS: dict[type[Any], Any] = {}


def _reader(cls: type[Any]) -> Any:
    r = _READERS.get(cls)
    if r is None:
        r = _READERS[cls] = entity_reader(cls)
    return r


def _writer(cls: type[Any]) -> Any:
    w = _WRITERS.get(cls)
    if w is None:
        w = _WRITERS[cls] = entity_writer(cls)
    return w


def api_name(api_key: int) -> str:
    """``produce``, ``fetch``, ... (``api_<key>`` for a key Kafka does not define)."""
    return api_key_map.get(api_key, f"api_{api_key}")


def decode_request(frame: bytes, supported: Mapping[int, tuple[int, int]]) -> RequestFrame:
    """Decode one request frame; ``supported`` maps API key -> (min, max) version served.

    Raises :class:`UnsupportedVersion` for a served API at another version and
    :class:`ProtocolError` for anything else not answerable (unknown key,
    truncated or malformed body, trailing bytes).
    """
    api_key, api_version, correlation_id = peek_header(frame)
    versions = supported.get(api_key)
    if versions is None:
        raise ProtocolError(f"API key {api_key} ({api_name(api_key)}) is not supported")
    cls = request_class(api_key, api_version)
    if cls is None or not versions[0] <= api_version <= versions[1]:
        raise UnsupportedVersion(
            f"{api_name(api_key)} v{api_version} is not supported (versions "
            f"{versions[0]}..{versions[1]})",
            api_key,
            api_version,
            correlation_id,
        )
    try:
        # kio's native decoder sizes an array by its length field before
        # reading it: a hostile length (2**31 entries) aborts the process on
        # the failed allocation. So every length is checked against the bytes
        # left first (check_bounds); only then does kio decode.
        check_bounds(cls, frame)
        header, used = _reader(cls.__header_schema__)(frame, 0)
        request, size = _reader(cls)(frame, used)
    except (SerialError, LookupError, ValueError, TypeError, OverflowError) as exc:
        # kio's native decoder raises SerialError for short or bad fields, but
        # also KeyError (an unknown tagged field), ValueError (a bad enum or
        # UUID) and UnicodeDecodeError: all mean "malformed", said once here.
        raise ProtocolError(
            f"{api_name(api_key)} v{api_version}: malformed request: {exc}"
        ) from None
    if used + size != len(frame):
        raise ProtocolError(
            f"{api_name(api_key)} v{api_version}: {len(frame) - used - size} bytes after the "
            "request"
        )
    return RequestFrame(api_key, api_version, correlation_id, header.client_id, request)


def _tagged_section(buf: bytes, pos: int) -> int:
    """Skip a flexible entity's tagged fields, each length checked; returns the position after."""
    count, used = read_unsigned_varint(buf, pos)
    pos += used
    if count > len(buf) - pos:
        raise ProtocolError(f"{count} tagged fields in {len(buf) - pos} bytes")
    for _ in range(count):
        _tag, used = read_unsigned_varint(buf, pos)
        pos += used
        size, used = read_unsigned_varint(buf, pos)
        pos += used
        if size > len(buf) - pos:
            raise ProtocolError(f"a tagged field of {size} bytes in {len(buf) - pos}")
        pos += size
    return pos


def _array_length(flexible: bool, buf: bytes, pos: int) -> tuple[int, int]:
    """(length, bytes read) of an array; -1 for a null array; checked against what is left."""
    if flexible:
        n, used = read_compact_array_length(buf, pos)
        n = -1 if n is None else n
    else:
        n, used = read_legacy_array_length(buf, pos)
    if n < -1 or n > len(buf) - pos - used:
        raise ProtocolError(f"array of {n} entries in {len(buf) - pos - used} bytes")
    return n, used


def _check_entity(cls: type[Any], buf: bytes, pos: int, depth: int) -> int:
    if depth > 8:
        raise ProtocolError("entities nested too deeply")
    flexible = bool(cls.__flexible__)
    for f in dataclasses.fields(cls):
        if get_field_tag(f) is not None:
            continue  # in the tagged section
        kind = classify_field(f)
        optional = is_optional(f)
        if isinstance(kind, EntityTupleField | PrimitiveTupleField):
            n, used = _array_length(flexible, buf, pos)
            pos += used
            if isinstance(kind, EntityTupleField):
                for _ in range(max(n, 0)):
                    pos = _check_entity(kind.type_, buf, pos, depth + 1)
            else:
                item = get_reader(get_schema_field_type(f), flexible, False)
                for _ in range(max(n, 0)):
                    pos += item(buf, pos)[1]
        elif isinstance(kind, EntityField):
            if optional:
                marker, used = read_int8(buf, pos)
                pos += used
                if marker < 0:
                    continue
            pos = _check_entity(kind.type_, buf, pos, depth + 1)
        else:
            pos += get_reader(get_schema_field_type(f), flexible, optional)(buf, pos)[1]
    return _tagged_section(buf, pos) if flexible else pos


def check_bounds(cls: type[Any], frame: bytes) -> None:
    """Walk a request frame by ``cls``'s schema, checking every length against the bytes left.

    Raises :class:`ProtocolError` (or a kio read error) before any length
    could make kio allocate more than the frame could hold.
    """
    pos = 8  # api key, version, correlation id
    n, used = read_int16(frame, pos)  # client_id: a nullable legacy string in every version
    pos += used + max(n, 0)
    if pos > len(frame):
        raise ProtocolError("client id runs past the frame")
    if cls.__header_schema__.__flexible__:
        pos = _tagged_section(frame, pos)
    _check_entity(cls, frame, pos, 0)


def encode_response(correlation_id: int, response: Any) -> bytes:
    """The whole response frame (size, header, body) for a kio response entity."""
    cls = type(response)
    header_cls = cls.__header_schema__
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    _writer(header_cls)(buf, header_cls(correlation_id=correlation_id))
    _writer(cls)(buf, response)
    out = buf.getbuffer()
    out[0:4] = (len(out) - 4).to_bytes(4, "big")
    return bytes(out)


# ------------------------------------------------------------------ build


_HINTS: dict[type[Any], tuple[frozenset[str], dict[str, Any]]] = {}


def _fields(cls: type[Any]) -> tuple[frozenset[str], dict[str, Any]]:
    """The field names and type hints of a kio dataclass (cached per class)."""
    got = _HINTS.get(cls)
    if got is None:
        names = frozenset(f.name for f in dataclasses.fields(cls))
        got = _HINTS[cls] = (names, typing.get_type_hints(cls))
    return got


def _convert(value: Any, hint: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(value, args[0]) if len(args) == 1 else value
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return tuple(_convert(v, item) for v in value)
    if isinstance(hint, type):
        if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
            return build(hint, value)
        if issubclass(hint, datetime.timedelta) and isinstance(value, int):
            return datetime.timedelta(milliseconds=value)
    return value


def build(cls: type[Any], values: Mapping[str, Any]) -> Any:
    """An instance of kio's ``cls`` from ``values``: the fields ``cls`` has, nested converted.

    Values for fields this version lacks are dropped (a response described
    once serves every version); nested entities may be given as mappings and
    sequences of mappings; ``timedelta`` fields take milliseconds.
    """
    names, hints = _fields(cls)
    return cls(**{k: _convert(v, hints[k]) for k, v in values.items() if k in names})
