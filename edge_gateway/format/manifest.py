"""Manifest encoding, versions 1, 2 and 3 (sans-IO), and the bucket keys of a region's log.

Every ``manifest_interval`` the writer creates
``regions/<region>/manifest/<last_seq:020d>.json``: a summary of the log
entries ``first_seq..last_seq`` (each entry's LSN range and block index, copied
from its header) plus every partition's next offset, so new or lagging
readers, the pipeline and GC plan from manifests instead of GETting every
header. The specification is in ``docs/log-object.md`` ("Manifest"); the
document, compact JSON with sorted keys::

    {"format": "edgegw-manifest", "version": 1, "region": str, "epoch": int,
     "first_seq": int, "last_seq": int, "low_watermark": int, "created_ms": int,
     "entries": [{"seq": int, "epoch": int, "first_lsn": int, "last_lsn": int,
                  "fence": bool, "header_length": int, "size": int,
                  "blocks": [[topic, partition, first_offset, last_offset,
                              record_count, min_ts, max_ts, offset,
                              stored_length, raw_length, codec, crc], ...]}, ...],
     "next_offsets": [[topic, partition, next_offset], ...]}

Version 2 is written only when an entry is a version 2 log object (a gateway
with several journal lanes): such an entry has one more key, ``"lanes":
[[lane, first_lsn, last_lsn], ...]`` -- its log object's lane table -- and
entries without it are version 1 log objects. A manifest with no such entry
is written as version 1, byte for byte as before. Version 3 is written only
when an entry is a version 3 log object (it carries a gap marker): such an
entry also has ``"gaps": [[lane, topic, partition, first_offset, last_offset,
records, bytes], ...]``, and a partition's offsets may jump over a gap.

Version 3 is written only when an entry is an encrypted log object: such an
entry has the key ``"key_id"`` (its header's key id); a version 3 manifest
may hold lane tables too, and one with no key id in any entry is refused.

Version 4 is written only when an entry is a log object with the NULLS flag
(it holds null values): such an entry has ``"nulls": true``, and may have
every key of versions 2 and 3. A reader from before refuses it ("unsupported
manifest version 4"), as it refuses the log object ("unknown flags 0x04").

:meth:`Manifest.decode` applies every rule of the log object format to each
entry (through :func:`~edge_gateway.format.logobject.validate_header`), and
across entries: seqs contiguous from ``first_seq``, journal LSNs growing,
each partition's offsets gap-free but for declared gaps, ``next_offsets`` matching the last block
of every partition shipped. It raises only
:class:`~edge_gateway.errors.CorruptData`, with a one-line message.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

from edge_gateway.errors import CorruptData, InvalidInput, InvalidName
from edge_gateway.format.logobject import (
    FLAG_ENCRYPTED,
    FLAG_FENCE,
    FLAG_NULLS,
    MAX_HEADER_BYTES,
    MAX_LANE,
    BlockIndex,
    GapRange,
    LaneRange,
    LogObjectHeader,
    lanes_version,
    valid_key_id,
    validate_header,
)
from edge_gateway.names import validate_region, validate_topic

FORMAT: Final = "edgegw-manifest"
VERSION: Final = 1
#: The version whose entries may carry a lane table (``"lanes"``).
VERSION_LANES: Final = 2
#: The version whose entries may also name the key of an encrypted log object
#: (``"key_id"``) and carry the log object's gap table (``"gaps"``).
VERSION_KEYS: Final = 3
VERSION_GAPS: Final = VERSION_KEYS
#: The version whose entries may also be log objects with null values (``"nulls"``).
VERSION_NULLS: Final = 4
_VERSIONS: Final = (VERSION, VERSION_LANES, VERSION_KEYS, VERSION_NULLS)
#: Most entries one manifest may cover.
MAX_ENTRIES: Final = 100_000
#: Largest manifest document a reader accepts.
MAX_DOCUMENT_BYTES: Final = 64 * 1024 * 1024
LOG_SUFFIX: Final = ".egw"
MANIFEST_SUFFIX: Final = ".json"

_U32_MAX: Final = 2**32 - 1
_U64_MAX: Final = 2**64 - 1
_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1

_TOP_KEYS: Final = frozenset(
    {
        "format",
        "version",
        "region",
        "epoch",
        "first_seq",
        "last_seq",
        "low_watermark",
        "created_ms",
        "entries",
        "next_offsets",
    }
)
_ENTRY_KEYS: Final = frozenset(
    {"seq", "epoch", "first_lsn", "last_lsn", "fence", "header_length", "size", "blocks"}
)
_LANE_ENTRY_KEYS: Final = _ENTRY_KEYS | {"lanes"}
# Name and (lo, hi) of each field of a block row after the topic, in order:
# the fields of BlockIndex, with the ranges of the log object's index entry.
_BLOCK_FIELDS: Final = (
    ("partition", 0, _U32_MAX),
    ("first_offset", _I64_MIN, _I64_MAX),
    ("last_offset", _I64_MIN, _I64_MAX),
    ("record_count", 0, _U32_MAX),
    ("min_ts", _I64_MIN, _I64_MAX),
    ("max_ts", _I64_MIN, _I64_MAX),
    ("offset", 0, _U64_MAX),
    ("stored_length", 0, _U32_MAX),
    ("raw_length", 0, _U32_MAX),
    ("codec", 0, 0xFF),
    ("crc", 0, _U32_MAX),
)
#: Fields of a block row: the topic, then ``_BLOCK_FIELDS``.
_BLOCK_ROW: Final = 1 + len(_BLOCK_FIELDS)
#: Range of a next offset: the offset after a block's last (an i64), so up to 2**63.
_NEXT_OFFSET_MAX: Final = _I64_MAX + 1


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One log entry as a manifest records it: its header minus region and time."""

    seq: int
    epoch: int
    first_lsn: int
    last_lsn: int
    fence: bool
    header_length: int
    #: Size of the whole log object in bytes (the end of its last block).
    size: int
    blocks: tuple[BlockIndex, ...] = ()
    #: The log object's lane table (version 2); ``first_lsn``/``last_lsn`` are lane 0's.
    lanes: tuple[LaneRange, ...] = ()
    #: The id of the key an encrypted log object is sealed with (None: not encrypted).
    key_id: str | None = None
    #: The log object's gap table (version 3): offsets the source dropped unshipped.
    gaps: tuple[GapRange, ...] = ()
    #: The log object has the NULLS flag (version 4): a batch holds null values.
    nulls: bool = False

    @classmethod
    def from_header(cls, header: LogObjectHeader, size: int) -> ManifestEntry:
        """The entry for a log object with ``header`` that is ``size`` bytes long."""
        if size != header.total_length:
            raise InvalidInput(
                f"log entry {header.seq}: size {size}, its header describes {header.total_length}"
            )
        return cls(
            header.seq,
            header.epoch,
            header.first_lsn,
            header.last_lsn,
            header.is_fence,
            header.header_length,
            size,
            header.blocks,
            header.lanes,
            header.key_id,
            header.gaps,
            header.has_nulls,
        )

    def to_block_index(self) -> tuple[BlockIndex, ...]:
        """The entry's block index, as in its log object's header."""
        return self.blocks

    @property
    def total_length(self) -> int:
        """Same as :attr:`size`; lets :func:`~.logobject.plan_ranges` take an entry."""
        return self.size

    def to_header(self, region: str, created_ms: int = 0) -> LogObjectHeader:
        """The log object header this entry summarises (``created_ms`` is not recorded)."""
        return LogObjectHeader(
            lanes_version(self.lanes, self.gaps),
            (FLAG_FENCE if self.fence else 0)
            | (FLAG_ENCRYPTED if self.key_id is not None else 0)
            | (FLAG_NULLS if self.nulls else 0),
            self.header_length,
            self.epoch,
            self.seq,
            self.first_lsn,
            self.last_lsn,
            created_ms,
            region,
            self.blocks,
            self.lanes,
            self.key_id,
            self.gaps,
        )

    def _to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "seq": self.seq,
            "epoch": self.epoch,
            "first_lsn": self.first_lsn,
            "last_lsn": self.last_lsn,
            "fence": self.fence,
            "header_length": self.header_length,
            "size": self.size,
            "blocks": [
                [
                    b.topic,
                    b.partition,
                    b.first_offset,
                    b.last_offset,
                    b.record_count,
                    b.min_ts,
                    b.max_ts,
                    b.offset,
                    b.stored_length,
                    b.raw_length,
                    b.codec,
                    b.crc,
                ]
                for b in self.blocks
            ],
        }
        if self.lanes:
            doc["lanes"] = [[r.lane, r.first_lsn, r.last_lsn] for r in self.lanes]
        if self.key_id is not None:
            doc["key_id"] = self.key_id
        if self.gaps:
            doc["gaps"] = [
                [g.lane, g.topic, g.partition, g.first_offset, g.last_offset, g.records, g.bytes]
                for g in self.gaps
            ]
        if self.nulls:
            doc["nulls"] = True
        return doc


@dataclass(frozen=True, slots=True)
class Manifest:
    """A summary of the log entries ``first_seq..last_seq`` of one region."""

    region: str
    #: Epoch of the writer that wrote the manifest (no entry has a higher one).
    epoch: int
    first_seq: int
    last_seq: int
    #: Oldest log seq still in the bucket when the manifest was written.
    low_watermark: int
    created_ms: int
    #: One per seq, ``first_seq`` to ``last_seq`` in order.
    entries: tuple[ManifestEntry, ...]
    #: (topic, partition) -> next offset after ``last_seq``, for every
    #: partition the log has ever shipped.
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    @classmethod
    def covering(
        cls,
        *,
        region: str,
        epoch: int,
        entries: Sequence[ManifestEntry],
        low_watermark: int,
        created_ms: int,
        previous_offsets: Mapping[tuple[str, int], int] | None = None,
    ) -> Manifest:
        """A manifest of ``entries``, its next offsets carried on from the
        previous manifest's ``previous_offsets`` and advanced by the entries' blocks.

        ``entries`` are the log entries after the previous manifest, in seq
        order; a partition that ``previous_offsets`` knows must continue at its
        next offset (:class:`InvalidInput` otherwise: a gap or an overlap
        between two manifests). Partitions the entries do not touch keep their
        previous next offset. The other rules are checked by :meth:`encode`.
        """
        if not entries:
            raise InvalidInput("a manifest covers at least one log entry")
        offsets = dict(previous_offsets or {})
        for entry in entries:
            for g in entry.gaps:
                key = (g.topic, g.partition)
                if key in offsets and offsets[key] != g.first_offset:
                    raise InvalidInput(
                        f"log entry {entry.seq}: gap of {g.topic}/{g.partition} starts at "
                        f"offset {g.first_offset}, but the partition continues at {offsets[key]}"
                    )
                offsets[key] = g.last_offset + 1
            for b in entry.blocks:
                key = (b.topic, b.partition)
                if key in offsets and offsets[key] != b.first_offset:
                    raise InvalidInput(
                        f"log entry {entry.seq}: {b.topic}/{b.partition} starts at offset "
                        f"{b.first_offset}, but the partition continues at {offsets[key]}"
                    )
                offsets[key] = b.last_offset + 1
        return cls(
            region,
            epoch,
            entries[0].seq,
            entries[-1].seq,
            low_watermark,
            created_ms,
            tuple(entries),
            offsets,
        )

    def encode(self) -> bytes:
        """Compact, deterministic JSON (sorted keys); :class:`InvalidInput` if invalid."""
        try:
            doc = self._to_doc()
            _parse(doc, "manifest")
        except CorruptData as exc:
            raise InvalidInput(f"invalid manifest: {exc.reason}") from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise InvalidInput(f"invalid manifest: {exc}") from None
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("ascii")

    @classmethod
    def decode(
        cls,
        data: bytes | bytearray | memoryview,
        *,
        where: str,
        region: str | None = None,
        last_seq: int | None = None,
    ) -> Manifest:
        """Decode and validate a manifest document; raises only :class:`CorruptData`.

        ``region`` and ``last_seq``, when given (a reader takes them from the
        key with :func:`parse_manifest_key`), must match the document's: a
        manifest copied under another region's or seq's key is refused.
        """
        size = memoryview(data).nbytes
        if size > MAX_DOCUMENT_BYTES:
            raise CorruptData(
                f"manifest of {size} bytes exceeds the limit of {MAX_DOCUMENT_BYTES}",
                where=where,
            )
        try:
            text = bytes(data).decode("utf-8")
            doc = json.loads(
                text,
                object_pairs_hook=_no_duplicates,
                parse_float=_no_float,
                parse_constant=_no_constant,
            )
        except (ValueError, RecursionError) as exc:
            # ValueError covers JSONDecodeError, UnicodeDecodeError and ints
            # beyond Python's digit limit; RecursionError deep nesting.
            raise CorruptData(
                f"manifest is not valid JSON: {_clip(str(exc))}", where=where
            ) from None
        manifest = _parse(doc, where)
        if region is not None and manifest.region != region:
            raise CorruptData(
                f"manifest of region {manifest.region!r} under region {region!r}'s key",
                where=where,
            )
        if last_seq is not None and manifest.last_seq != last_seq:
            raise CorruptData(
                f"manifest ends at seq {manifest.last_seq}, its key says {last_seq}", where=where
            )
        return manifest

    def _to_doc(self) -> dict[str, Any]:
        lanes = any(e.lanes for e in self.entries)
        v3 = any(e.key_id is not None or e.gaps for e in self.entries)
        v4 = any(e.nulls for e in self.entries)
        return {
            "format": FORMAT,
            "version": (
                VERSION_NULLS if v4 else VERSION_KEYS if v3 else VERSION_LANES if lanes else VERSION
            ),
            "region": self.region,
            "epoch": self.epoch,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "low_watermark": self.low_watermark,
            "created_ms": self.created_ms,
            "entries": [e._to_doc() for e in self.entries],
            "next_offsets": [[t, p, o] for (t, p), o in sorted(self.next_offsets.items())],
        }


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        raise ValueError("duplicate key in an object")
    return doc


def _no_float(text: str) -> NoReturn:
    raise ValueError(f"non-integer number {text[:32]!r}")


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not allowed")


# --------------------------------------------------------------------------
# validation


_JSON_TYPES: Final = {
    dict: "object",
    list: "array",
    str: "string",
    int: "integer",
    bool: "boolean",
    type(None): "null",
}


def _fail(message: str, where: str) -> NoReturn:
    raise CorruptData(message, where=where)


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _show(value: object) -> str:
    """A short description of a JSON value for an error message.

    Never ``repr`` of a container: a hostile document could make it huge, or
    nest it deep enough for ``repr`` to overflow the stack.
    """
    if isinstance(value, str | int | bool) or value is None:
        text = repr(value) if type(value) is not int else str(value)
        return _clip(text, 40)
    return f"an {_JSON_TYPES.get(type(value), type(value).__name__)}"


def _type(value: object) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _int(value: object, lo: int, hi: int, what: str, where: str) -> int:
    # type() rather than isinstance(): JSON true/false are bools, and bool is an int.
    if type(value) is not int:
        _fail(f"{what} must be an integer, got {_type(value)}", where)
    if not lo <= value <= hi:
        _fail(f"{what} {_show(value)} out of range {lo}..{hi}", where)
    return value


def _list(value: object, what: str, where: str) -> list[Any]:
    if type(value) is not list:
        _fail(f"{what} must be an array, got {_type(value)}", where)
    return value


def _object(value: object, keys: frozenset[str], what: str, where: str) -> dict[str, Any]:
    if type(value) is not dict:
        _fail(f"{what} must be an object, got {_type(value)}", where)
    if value.keys() != keys:
        missing = sorted(keys - value.keys())
        extra = [_show(k) for k in sorted(value.keys() - keys)[:5]]
        _fail(f"{what}: missing keys {missing}, unknown keys [{', '.join(extra)}]", where)
    return value


def _name(value: object, check: Any, what: str, where: str) -> str:
    try:
        return str(check(value))
    except InvalidName as exc:
        _fail(f"{what}: {exc}", where)


def _block(row: object, what: str, where: str) -> BlockIndex:
    fields = _list(row, what, where)
    if len(fields) != _BLOCK_ROW:
        _fail(f"{what} has {len(fields)} fields, expected {_BLOCK_ROW}", where)
    topic = _name(fields[0], validate_topic, f"{what} topic", where)
    values = [
        _int(v, lo, hi, f"{what} {name}", where)
        for v, (name, lo, hi) in zip(fields[1:], _BLOCK_FIELDS, strict=True)
    ]
    return BlockIndex(topic, *values)


def _blocks(rows: list[Any], what: str, where: str) -> tuple[BlockIndex, ...]:
    """An entry's block rows, shaped into block indexes; their fields are checked later.

    Every entry goes through ``validate_header``, which checks each block's
    topic and the type and range of every field, as :func:`_block` does field
    by field (and :func:`_parse` runs :func:`_block` on the rows to name the
    bad one when it refuses). Checking them here too took a third of a
    manifest's decode, which a catch-up does for every entry of the backlog.
    A row of the wrong shape, or whose topic is not a string (which the
    header's check could not even look up), gets :func:`_block`'s message
    at once.
    """
    if all(type(r) is list and len(r) == _BLOCK_ROW and type(r[0]) is str for r in rows):
        return tuple(BlockIndex(*r) for r in rows)
    return tuple(_block(r, f"{what}.blocks[{j}]", where) for j, r in enumerate(rows))


def _lanes(value: object, what: str, where: str) -> tuple[LaneRange, ...]:
    rows = _list(value, what, where)
    if not rows:
        _fail(f"{what} is empty (an entry without lanes has no such key)", where)
    lanes: list[LaneRange] = []
    for j, row in enumerate(rows):
        triple = _list(row, f"{what}[{j}]", where)
        if len(triple) != 3:
            _fail(f"{what}[{j}] has {len(triple)} fields, expected 3", where)
        lanes.append(
            LaneRange(
                _int(triple[0], 1, MAX_LANE, f"{what}[{j}] lane", where),
                _int(triple[1], 1, _U64_MAX, f"{what}[{j}] first_lsn", where),
                _int(triple[2], 0, _U64_MAX, f"{what}[{j}] last_lsn", where),
            )
        )
    return tuple(lanes)


def _gaps(value: object, what: str, where: str) -> tuple[GapRange, ...]:
    rows = _list(value, what, where)
    if not rows:
        _fail(f"{what} is empty (an entry without gaps has no such key)", where)
    gaps: list[GapRange] = []
    for j, row in enumerate(rows):
        f = _list(row, f"{what}[{j}]", where)
        if len(f) != 7:
            _fail(f"{what}[{j}] has {len(f)} fields, expected 7", where)
        gaps.append(
            GapRange(
                _int(f[0], 0, MAX_LANE, f"{what}[{j}] lane", where),
                _name(f[1], validate_topic, f"{what}[{j}] topic", where),
                _int(f[2], 0, _U32_MAX, f"{what}[{j}] partition", where),
                _int(f[3], 0, _I64_MAX, f"{what}[{j}] first_offset", where),
                _int(f[4], 0, _I64_MAX, f"{what}[{j}] last_offset", where),
                _int(f[5], 1, _U64_MAX, f"{what}[{j}] records", where),
                _int(f[6], 0, _U64_MAX, f"{what}[{j}] bytes", where),
            )
        )
    return tuple(gaps)


def _parse(doc: object, where: str) -> Manifest:
    if type(doc) is not dict:
        _fail(f"manifest must be a JSON object, got {_type(doc)}", where)
    if doc.get("format") != FORMAT:
        _fail(f"not a manifest (format {_show(doc.get('format'))})", where)
    version = doc.get("version")
    if type(version) is not int or version not in _VERSIONS:
        known = ", ".join(map(str, _VERSIONS))
        _fail(f"unsupported manifest version {_show(version)} (this reader knows {known})", where)
    doc = _object(doc, _TOP_KEYS, "manifest", where)
    region = _name(doc["region"], validate_region, "region", where)
    epoch = _int(doc["epoch"], 0, _U64_MAX, "epoch", where)
    # Log seqs start at 1; the oldest entry still in the bucket is at most
    # the first one this manifest covers.
    first_seq = _int(doc["first_seq"], 1, _U64_MAX, "first_seq", where)
    last_seq = _int(doc["last_seq"], first_seq, _U64_MAX, "last_seq (>= first_seq)", where)
    low_watermark = _int(doc["low_watermark"], 1, first_seq, "low_watermark (<= first_seq)", where)
    created_ms = _int(doc["created_ms"], _I64_MIN, _I64_MAX, "created_ms", where)
    raw_entries = _list(doc["entries"], "entries", where)
    if len(raw_entries) > MAX_ENTRIES:
        _fail(f"{len(raw_entries)} entries exceed the limit of {MAX_ENTRIES}", where)
    if len(raw_entries) != last_seq - first_seq + 1:
        _fail(f"{len(raw_entries)} entries for seqs {first_seq}..{last_seq}", where)

    entries: list[ManifestEntry] = []
    # (topic, partition) -> offset after its last block in these entries
    shipped: dict[tuple[str, int], int] = {}
    # lane -> last_lsn of the previous entry that listed the lane (lane 0: every entry)
    prev_lsns: dict[int, int] = {0: 0}
    any_lanes = any_v3 = any_nulls = False
    for i, raw in enumerate(raw_entries):
        what = f"entries[{i}]"
        has_lanes = version >= VERSION_LANES and type(raw) is dict and "lanes" in raw
        has_key = version >= VERSION_KEYS and type(raw) is dict and "key_id" in raw
        has_gaps = version >= VERSION_GAPS and type(raw) is dict and "gaps" in raw
        has_nulls = version >= VERSION_NULLS and type(raw) is dict and "nulls" in raw
        allowed = _LANE_ENTRY_KEYS if has_lanes else _ENTRY_KEYS
        if has_key:
            allowed = allowed | {"key_id"}
        if has_gaps:
            allowed = allowed | {"gaps"}
        if has_nulls:
            allowed = allowed | {"nulls"}
        e = _object(raw, allowed, what, where)
        if has_nulls and e["nulls"] is not True:
            _fail(f"{what}.nulls must be true (or absent), got {_show(e['nulls'])}", where)
        key_id: str | None = None
        if has_key:
            key_id = e["key_id"]
            if not valid_key_id(key_id):
                _fail(f"{what}.key_id {_show(key_id)} is not a key id", where)
        seq = _int(e["seq"], 0, _U64_MAX, f"{what}.seq", where)
        if seq != first_seq + i:
            _fail(f"{what} has seq {seq}, expected {first_seq + i} (seqs are contiguous)", where)
        fence = e["fence"]
        if type(fence) is not bool:
            _fail(f"{what}.fence must be a boolean, got {_type(fence)}", where)
        entry_epoch = _int(e["epoch"], 0, epoch, f"{what}.epoch (<= the manifest's)", where)
        rows = _list(e["blocks"], f"{what}.blocks", where)
        blocks = _blocks(rows, what, where)
        entry = ManifestEntry(
            seq,
            entry_epoch,
            _int(e["first_lsn"], 0, _U64_MAX, f"{what}.first_lsn", where),
            _int(e["last_lsn"], 0, _U64_MAX, f"{what}.last_lsn", where),
            fence,
            _int(e["header_length"], 0, MAX_HEADER_BYTES, f"{what}.header_length", where),
            _int(e["size"], 0, _U64_MAX, f"{what}.size", where),
            blocks,
            _lanes(e["lanes"], f"{what}.lanes", where) if has_lanes else (),
            key_id,
            _gaps(e["gaps"], f"{what}.gaps", where) if has_gaps else (),
            has_nulls,
        )
        any_lanes = any_lanes or has_lanes
        any_v3 = any_v3 or has_key or has_gaps
        any_nulls = any_nulls or has_nulls
        header = entry.to_header(region)
        try:
            validate_header(header, where=where)
        except CorruptData as exc:
            # A bad field of a block row is named by its row (validate_header
            # checks the same types and ranges, but cannot say which row).
            for j, row in enumerate(rows):
                _block(row, f"{what}.blocks[{j}]", where)
            _fail(f"{what} (log entry {seq}): {exc.reason}", where)
        if entry.size != header.total_length:
            _fail(f"{what}.size {entry.size}, its blocks end at {header.total_length}", where)
        # Journal LSNs only grow along the log: an entry ships LSNs after the
        # previous entry's (an empty range first_lsn = last_lsn + 1 included).
        # The same holds in each lane (a lane appears once it is in use).
        for lane, first, last in (
            (0, entry.first_lsn, entry.last_lsn),
            *((r.lane, r.first_lsn, r.last_lsn) for r in entry.lanes),
        ):
            prev_lsn = prev_lsns.get(lane, 0)
            if first <= prev_lsn:
                in_lane = f" of lane {lane}" if lane else ""
                _fail(
                    f"{what} (log entry {seq}) starts at LSN {first}{in_lane}, "
                    f"but the previous entry shipped up to LSN {prev_lsn}",
                    where,
                )
            prev_lsns[lane] = last
        # Offsets of a partition are gap-free along the log, but for the gaps
        # the log declares (offsets a drop-oldest lane dropped): a gap starts
        # where the partition's shipped offsets end and moves them on.
        for g in entry.gaps:
            key = (g.topic, g.partition)
            if key in shipped and shipped[key] != g.first_offset:
                _fail(
                    f"{what} (log entry {seq}): gap of {g.topic}/{g.partition} starts at "
                    f"offset {g.first_offset}, but the previous entries end before {shipped[key]}",
                    where,
                )
            shipped[key] = g.last_offset + 1
        for b in blocks:
            key = (b.topic, b.partition)
            if key in shipped and shipped[key] != b.first_offset:
                _fail(
                    f"{what} (log entry {seq}): {b.topic}/{b.partition} starts at offset "
                    f"{b.first_offset}, but the previous entries end before {shipped[key]}",
                    where,
                )
            shipped[key] = b.last_offset + 1
        entries.append(entry)

    next_offsets: dict[tuple[str, int], int] = {}
    prev: tuple[str, int] | None = None
    for j, row in enumerate(_list(doc["next_offsets"], "next_offsets", where)):
        what = f"next_offsets[{j}]"
        triple = _list(row, what, where)
        if len(triple) != 3:
            _fail(f"{what} has {len(triple)} fields, expected 3", where)
        key = (
            _name(triple[0], validate_topic, f"{what} topic", where),
            _int(triple[1], 0, _U32_MAX, f"{what} partition", where),
        )
        if prev is not None and key <= prev:
            _fail(f"{what}: next_offsets are not sorted by (topic, partition)", where)
        prev = key
        next_offsets[key] = _int(triple[2], _I64_MIN, _NEXT_OFFSET_MAX, f"{what} offset", where)
    if version == VERSION_LANES and not any_lanes:
        _fail("a version 2 manifest with no lane table in any entry (write version 1)", where)
    if version == VERSION_NULLS and not any_nulls:
        _fail("a version 4 manifest with no entry of null values (write version 1, 2 or 3)", where)
    if version == VERSION_KEYS and not any_v3:
        _fail(
            "a version 3 manifest with neither a key id nor a gap table in any entry "
            "(write version 1 or 2)",
            where,
        )
    for key, offset in shipped.items():
        if next_offsets.get(key) != offset:
            _fail(
                f"next offset of {key[0]}/{key[1]} is {next_offsets.get(key)}, "
                f"but its last block in this manifest ends before {offset}",
                where,
            )
    return Manifest(
        region, epoch, first_seq, last_seq, low_watermark, created_ms, tuple(entries), next_offsets
    )


# --------------------------------------------------------------------------
# bucket keys

_LOG_KEY = re.compile(r"regions/([A-Za-z0-9_-]+)/log/([0-9]{20})\.egw")
_MANIFEST_KEY = re.compile(r"regions/([A-Za-z0-9_-]+)/manifest/([0-9]{20})\.json")


def _prefix(prefix: str) -> str:
    if not isinstance(prefix, str):
        raise InvalidInput(f"key prefix must be a string, got {type(prefix).__name__}")
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def _seq(seq: int) -> int:
    if type(seq) is not int or not 0 <= seq <= _U64_MAX:
        raise InvalidInput(f"seq must be an int in 0..{_U64_MAX}, got {seq!r}")
    return seq


@functools.lru_cache(maxsize=256)
def region_prefix(prefix: str, region: str) -> str:
    """``<prefix>/regions/<region>/``: what every key of the region starts with.

    ``prefix`` may be empty; a missing trailing ``/`` is added. ``region`` must
    be a valid region name (:class:`~edge_gateway.errors.InvalidName` otherwise).
    """
    return f"{_prefix(prefix)}regions/{validate_region(region)}/"


def log_prefix(prefix: str, region: str) -> str:
    """``<prefix>/regions/<region>/log/``: what every log key of the region starts with."""
    return f"{region_prefix(prefix, region)}log/"


def manifest_prefix(prefix: str, region: str) -> str:
    """``<prefix>/regions/<region>/manifest/``."""
    return f"{region_prefix(prefix, region)}manifest/"


def quarantine_key(prefix: str, region: str, seq: int, now_ms: int) -> str:
    """``<prefix>/regions/<region>/quarantine/<seq:020d>-<ms>.json``: a set-aside object's note."""
    return f"{region_prefix(prefix, region)}quarantine/{seq:020d}-{now_ms}.json"


def gc_boundary_key(prefix: str, region: str) -> str:
    """``<prefix>/regions/<region>/gc-boundary.json``: the highest seq ever deleted."""
    return f"{region_prefix(prefix, region)}gc-boundary.json"


def log_key(prefix: str, region: str, seq: int) -> str:
    """``<prefix>/regions/<region>/log/<seq:020d>.egw`` (``prefix`` may be empty)."""
    return f"{log_prefix(prefix, region)}{_seq(seq):020d}{LOG_SUFFIX}"


def manifest_key(prefix: str, region: str, last_seq: int) -> str:
    """``<prefix>/regions/<region>/manifest/<last_seq:020d>.json``."""
    return f"{manifest_prefix(prefix, region)}{_seq(last_seq):020d}{MANIFEST_SUFFIX}"


def _parse_key(key: str, prefix: str, pattern: re.Pattern[str], kind: str) -> tuple[str, int]:
    p = _prefix(prefix)
    if not isinstance(key, str) or not key.startswith(p):
        raise CorruptData(f"not a {kind} key under {p!r}", where=str(key))
    m = pattern.fullmatch(key, len(p))
    if m is None:
        raise CorruptData(f"not a {kind} key", where=key)
    region, digits = m.group(1, 2)
    seq = int(digits)
    if seq > _U64_MAX:
        raise CorruptData(f"{kind} seq {seq} out of range", where=key)
    try:
        validate_region(region)
    except InvalidName as exc:
        raise CorruptData(str(exc), where=key) from None
    return region, seq


def parse_log_key(key: str, prefix: str = "") -> tuple[str, int]:
    """``(region, seq)`` of a log key; :class:`CorruptData` if ``key`` is not one."""
    return _parse_key(key, prefix, _LOG_KEY, "log")


def parse_manifest_key(key: str, prefix: str = "") -> tuple[str, int]:
    """``(region, last_seq)`` of a manifest key; :class:`CorruptData` if it is not one."""
    return _parse_key(key, prefix, _MANIFEST_KEY, "manifest")
