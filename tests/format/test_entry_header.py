"""decode_entry_header: stepping over a journal entry without its body (sans-IO)."""

from __future__ import annotations

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
