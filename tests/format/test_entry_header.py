"""decode_entry_header: stepping over a journal entry without its body (sans-IO)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from edge_gateway.errors import CorruptData
from edge_gateway.format import entry as fentry
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.entry import SourceCoords


def mirror_entry() -> bytes:
    return fentry.encode_entry(
        lsn=42,
        kind=fentry.KIND_MIRROR,
        topic=b"north.t",
        partition=3,
        base_offset=7,
        count=2,
        append_time=1_764_000_000_000,
        payload=encode_batch([b"a", b"b"], timestamps=1, base_offset=7),
        source=SourceCoords("north", 9, 2, True),
    )


def test_header_fields_agree_with_the_full_decode() -> None:
    buf = b"\x00" * 5 + mirror_entry() + b"tail"
    full = fentry.decode_entry(buf, 5)
    head = fentry.decode_entry_header(buf, 5)
    assert (head.lsn, head.kind, head.partition, head.base_offset, head.count) == (
        full.lsn,
        full.kind,
        full.partition,
        full.base_offset,
        full.count,
    )
    assert (head.append_time, head.length) == (full.append_time, full.length)
    assert (head.topic, head.source, head.payload) == ("", None, b"")
    assert buf[5 + fentry.KIND_OFFSET] == fentry.KIND_MIRROR


@pytest.mark.parametrize("at", [fentry.KIND_OFFSET, 30, -1])
def test_a_corrupt_entry_is_not_stepped_over(at: int) -> None:
    # The kind byte, a header field and the last body byte: the CRC covers them all.
    bad = bytearray(mirror_entry())
    bad[at] ^= 0x01
    with pytest.raises(CorruptData, match="CRC mismatch"):
        fentry.decode_entry_header(bytes(bad))


@pytest.mark.parametrize("cut", [0, 10, fentry.ENTRY_HEADER_SIZE, -1])
def test_a_truncated_entry_is_refused(cut: int) -> None:
    with pytest.raises(CorruptData, match="truncated"):
        fentry.decode_entry_header(mirror_entry()[:cut])


def data_entry(flags: int) -> bytes:
    keys = [b"k", None] if flags else None
    return fentry.encode_entry(
        lsn=7,
        kind=fentry.KIND_DATA,
        topic=b"telemetry",
        partition=5,
        base_offset=100,
        count=2,
        append_time=1_764_000_000_000,
        payload=encode_batch([b"v1", b"v2"], timestamps=[3, 9], keys=keys, base_offset=100),
    )


def _outcome(fn: Callable[[bytes, int], fentry.Entry], buf: bytes) -> fentry.Entry | str:
    try:
        return fn(buf, 0)
    except CorruptData:
        return "corrupt"


@pytest.mark.parametrize("flags", [0, 1])
def test_the_fast_data_path_accepts_only_what_the_full_decode_accepts(flags: int) -> None:
    """decode_data_entry (the drain's fast path) against decode_entry, byte by byte.

    Every byte of the entry header, topic and batch header set to several
    values, with the entry's CRC made right again (so each structural check is
    what decides): whenever the fast path returns an entry, the full decode
    returns the same one; when it returns None, the full decode either
    refuses the bytes or they are not an ordinary DATA entry.
    """
    good = data_entry(flags)
    assert fentry.decode_data_entry(good) == fentry.decode_entry(good)
    # From a view: the same entry, its payload a copy (short) or a view (long).
    short = fentry.decode_data_entry(memoryview(good))
    assert short == fentry.decode_entry(good)
    assert short is not None
    assert type(short.payload) is bytes
    accepted = 0
    for at in range(fentry.ENTRY_HEADER_SIZE + len(b"telemetry") + 40):
        for v in {0, 1, 2, 3, 0x7F, 0xFF, good[at] ^ 1, good[at] ^ 0x80}:
            buf = bytearray(good)
            buf[at] = v
            length = int.from_bytes(buf[0:4], "little")
            if 8 <= length <= len(buf):
                buf[4:8] = fentry.crc32c(memoryview(buf)[8:length]).to_bytes(4, "little")
            raw = bytes(buf)
            fast = fentry.decode_data_entry(raw)
            full = _outcome(fentry.decode_entry, raw)
            if fast is not None:
                accepted += 1
                assert fast == full, (at, v)
            else:
                assert isinstance(full, str) or full.kind != fentry.KIND_DATA or not full.count, (
                    at,
                    v,
                )
    assert accepted > 0  # some changes keep the entry valid (the LSN, a partition number)


def test_a_long_data_entry_decoded_from_a_view_views_its_payload() -> None:
    """The shipper's reads: a long entry's payload is a view into the buffer read (no
    copy), equal to what decode_entry copies out; a corrupt one is still refused."""
    values = [b"reading %d" % i * 40 for i in range(40)]
    raw = fentry.encode_entry(
        lsn=9,
        kind=fentry.KIND_DATA,
        topic=b"telemetry",
        partition=1,
        base_offset=0,
        count=len(values),
        append_time=1,
        payload=encode_batch(values, timestamps=1),
    )
    assert len(raw) >= fentry.VIEW_MIN_BYTES
    buf = bytearray(b"\x00" * 3 + raw)
    view = memoryview(buf).toreadonly()
    e = fentry.decode_data_entry(view, 3)
    assert e is not None
    assert e == fentry.decode_entry(raw)
    assert type(e.payload) is memoryview
    assert e.payload.obj is buf
    buf2 = bytearray(buf)
    buf2[-1] ^= 1
    assert fentry.decode_data_entry(memoryview(buf2), 3) is None
