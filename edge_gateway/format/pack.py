"""Pack objects (sans-IO): many small log entries of one region in one object.

A log entry is one object, and a quiet site writes one small entry per flush
interval: a reader that was away (a ship back in range, a restored gateway, a
new region) pays one GET, one round trip, for every ~1 KB entry it missed.
So when the home region writes a manifest it may first write a *pack*: verbatim
copies of the manifest's small entries, back to back, in one object::

    regions/<region>/pack/<last_seq:020d>-<first_seq:020d>.pack

Keys sort by their last seq, so one LIST starting after
:func:`pack_list_start` finds every pack that still holds a seq a reader
needs. The byte layout (little-endian, CRC-32C; ``docs/log-object.md``,
"Packs")::

    offset size field
    0      4    magic          "EGPK"
    4      1    version        u8 = 1
    5      3    reserved       zero
    8      4    header_length  u32 bytes of the header, its CRC included
    12     2    region_len     u16, then the region (UTF-8)
           4    count          u32 >= 1, then count entries:
                  u64 seq | u32 length   (seqs strictly ascending)
           4    header_crc     CRC-32C of bytes [0, header_length - 4)
    bodies: from header_length, back to back in the entries' order; the
            object is exactly header_length + the sum of the lengths

A pack is an accelerator, never the log: the log objects stay where they are
(GC deletes a pack with the entries it copies), a pack may skip entries (a
fence, a large entry, one the writer no longer held after a restart), and a
reader checks every body against what it knows of that entry (the manifest's
size and block CRCs; the body's own header) before it uses it -- a body that
disagrees, or a pack that fails to decode, only sends the reader back to the
entry's own object. Readers from before packs never look under ``pack/``.

:func:`decode_pack` raises only :class:`~edge_gateway.errors.CorruptData`.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from edge_gateway._crc import crc32c
from edge_gateway.errors import CorruptData, InvalidInput, InvalidName
from edge_gateway.format.manifest import _prefix, _seq, region_prefix
from edge_gateway.names import validate_region

MAGIC: Final = b"EGPK"
VERSION: Final = 1
PACK_SUFFIX: Final = ".pack"
#: At most this many entries in one pack (a manifest holds ``manifest_every``).
MAX_ENTRIES: Final = 65_536
_U64_MAX: Final = (1 << 64) - 1
_U32_MAX: Final = (1 << 32) - 1

_FIXED = struct.Struct("<4sB3sIH")  # magic, version, reserved, header_length, region_len
_COUNT = struct.Struct("<I")
_ENTRY = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_KEY = re.compile(r"regions/([A-Za-z0-9_-]+)/pack/([0-9]{20})-([0-9]{20})\.pack")


@dataclass(frozen=True, slots=True)
class PackEntry:
    """One log entry inside a pack: its seq and where its bytes are."""

    seq: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class Pack:
    """A decoded pack header: the region and where each entry's bytes are."""

    region: str
    entries: tuple[PackEntry, ...]
    #: The whole object's length (header and bodies).
    size: int

    @property
    def first_seq(self) -> int:
        return self.entries[0].seq

    @property
    def last_seq(self) -> int:
        return self.entries[-1].seq

    def find(self, seq: int) -> PackEntry | None:
        """The entry of ``seq``, or ``None`` if this pack does not hold it."""
        lo, hi = 0, len(self.entries)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entries[mid].seq < seq:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(self.entries) and self.entries[lo].seq == seq:
            return self.entries[lo]
        return None


def encode_pack(region: str, entries: Sequence[tuple[int, bytes]]) -> bytes:
    """The pack of ``entries`` (``(seq, log object bytes)``, seqs strictly ascending)."""
    validate_region(region)
    if not 1 <= len(entries) <= MAX_ENTRIES:
        raise InvalidInput(f"a pack holds 1..{MAX_ENTRIES} entries, got {len(entries)}")
    name = region.encode()
    table = bytearray()
    previous = -1
    for seq, body in entries:
        if type(seq) is not int or not previous < seq <= _U64_MAX:
            raise InvalidInput(f"pack seqs must be strictly ascending u64s, got {seq!r}")
        if not 0 < len(body) <= _U32_MAX:
            raise InvalidInput(f"entry {seq}: a packed entry is 1..{_U32_MAX} bytes")
        table += _ENTRY.pack(seq, len(body))
        previous = seq
    header_length = _FIXED.size + len(name) + _COUNT.size + len(table) + _CRC.size
    head = b"".join(
        (
            _FIXED.pack(MAGIC, VERSION, b"\0\0\0", header_length, len(name)),
            name,
            _COUNT.pack(len(entries)),
            table,
        )
    )
    return b"".join((head, _CRC.pack(crc32c(head)), *(body for _, body in entries)))


def decode_pack(data: bytes | memoryview, *, where: str = "") -> Pack:
    """Check a whole pack object's header and layout; :class:`CorruptData` if anything is off."""
    view = memoryview(data)
    if len(view) < _FIXED.size:
        raise CorruptData(f"a pack is at least {_FIXED.size} bytes, got {len(view)}", where=where)
    magic, version, reserved, header_length, region_len = _FIXED.unpack_from(view, 0)
    if magic != MAGIC:
        raise CorruptData(f"not a pack (magic {bytes(magic)!r})", where=where)
    if version != VERSION:
        raise CorruptData(f"unsupported pack version {version}", where=where)
    if reserved != b"\0\0\0":
        raise CorruptData("reserved pack header bytes are not zero", where=where)
    smallest = _FIXED.size + region_len + _COUNT.size + _ENTRY.size + _CRC.size
    if not smallest <= header_length <= len(view):
        raise CorruptData(
            f"pack header_length {header_length} is outside {smallest}..{len(view)}", where=where
        )
    (crc,) = _CRC.unpack_from(view, header_length - _CRC.size)
    if crc32c(view[: header_length - _CRC.size]) != crc:
        raise CorruptData("pack header CRC mismatch", where=where)
    pos = _FIXED.size
    try:
        region = validate_region(bytes(view[pos : pos + region_len]).decode())
    except (UnicodeDecodeError, InvalidName) as exc:
        raise CorruptData(f"bad region in pack: {exc}", where=where) from None
    pos += region_len
    (count,) = _COUNT.unpack_from(view, pos)
    pos += _COUNT.size
    if not 1 <= count <= MAX_ENTRIES or pos + count * _ENTRY.size + _CRC.size != header_length:
        raise CorruptData(
            f"pack entry count {count} does not fit header_length {header_length}", where=where
        )
    entries: list[PackEntry] = []
    offset = header_length
    previous = -1
    for seq, length in _ENTRY.iter_unpack(view[pos : pos + count * _ENTRY.size]):
        if seq <= previous:
            raise CorruptData(f"pack seqs not strictly ascending at {seq}", where=where)
        if length == 0:
            raise CorruptData(f"packed entry {seq} is empty", where=where)
        entries.append(PackEntry(seq, offset, length))
        offset += length
        previous = seq
    if offset != len(view):
        raise CorruptData(f"pack is {len(view)} bytes, its table describes {offset}", where=where)
    return Pack(region, tuple(entries), len(view))


# --------------------------------------------------------------------------
# bucket keys


def pack_prefix(prefix: str, region: str) -> str:
    """``<prefix>/regions/<region>/pack/``."""
    return f"{region_prefix(prefix, region)}pack/"


def pack_key(prefix: str, region: str, first_seq: int, last_seq: int) -> str:
    """``<prefix>/regions/<region>/pack/<last_seq:020d>-<first_seq:020d>.pack``."""
    if _seq(first_seq) > _seq(last_seq):
        raise InvalidInput(f"pack range {first_seq}..{last_seq} is empty")
    return f"{pack_prefix(prefix, region)}{last_seq:020d}-{first_seq:020d}{PACK_SUFFIX}"


def pack_list_start(prefix: str, region: str, seq: int) -> str:
    """A LIST ``start_after`` past which come exactly the packs whose last seq is >= ``seq``."""
    if _seq(seq) == 0:
        return pack_prefix(prefix, region)
    # "-" sorts below the digits and "~" above them: every key of last seq
    # seq - 1 sorts below this, every key of a higher last seq above.
    return f"{pack_prefix(prefix, region)}{seq - 1:020d}-~"


def parse_pack_key(key: str, prefix: str = "") -> tuple[str, int, int]:
    """``(region, first_seq, last_seq)`` of a pack key; :class:`CorruptData` if it is not one."""
    p = _prefix(prefix)
    if not isinstance(key, str) or not key.startswith(p):
        raise CorruptData(f"not a pack key under {p!r}", where=str(key))
    m = _KEY.fullmatch(key, len(p))
    if m is None:
        raise CorruptData("not a pack key", where=key)
    region, last, first = m.group(1), int(m.group(2)), int(m.group(3))
    if last > _U64_MAX or first > last:
        raise CorruptData(f"pack key range {first}..{last} is not a range", where=key)
    try:
        validate_region(region)
    except InvalidName as exc:
        raise CorruptData(str(exc), where=key) from None
    return region, first, last
