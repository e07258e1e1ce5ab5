"""Mirror cursors: how far each reader has mirrored a source region's log.

A tailer publishes ``<prefix>regions/<source>/cursors/<reader>.json`` now and
then (plain PUT; one tailer per reader and source, so last writer wins)::

    {"format": "edgegw-cursor", "version": 1, "source": "north", "reader": "south",
     "through_seq": 1234, "epoch": 3, "updated_ms": 1764000000000}

``through_seq`` means every entry ``<= through_seq`` is applied *and durable*
in the reader's journal (the tailer fsyncs before publishing), so the source's
GC may delete those entries without ever causing a gap for this reader.
A cursor only moves forward.

The encoding is sans-IO; :func:`read_cursors` and :func:`publish_cursor` do
the bucket calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from edge_gateway.bucket import Bucket, NotFound
from edge_gateway.errors import CorruptData, InvalidInput, InvalidName
from edge_gateway.format.manifest import region_prefix
from edge_gateway.names import validate_region

FORMAT: Final = "edgegw-cursor"
VERSION: Final = 1
#: A cursor document is tiny; anything larger is not one.
MAX_CURSOR_BYTES: Final = 4096
_U64_MAX: Final = 2**64 - 1
_KEYS: Final = frozenset(
    {"format", "version", "source", "reader", "through_seq", "epoch", "updated_ms"}
)


@dataclass(frozen=True, slots=True)
class Cursor:
    """A reader's published position in a source region's log."""

    source: str
    reader: str
    #: Every entry up to this seq is applied and durable at the reader (0: none).
    through_seq: int
    #: Highest epoch the reader accepted.
    epoch: int
    updated_ms: int

    def encode(self) -> bytes:
        """Compact JSON; :class:`InvalidInput` if a field is out of range."""
        try:
            validate_region(self.source)
            validate_region(self.reader)
        except InvalidName as exc:
            raise InvalidInput(str(exc)) from None
        for name in ("through_seq", "epoch", "updated_ms"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value <= _U64_MAX:
                raise InvalidInput(f"cursor {name} must be an int in 0..2^64-1, got {value!r}")
        doc: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "source": self.source,
            "reader": self.reader,
            "through_seq": self.through_seq,
            "epoch": self.epoch,
            "updated_ms": self.updated_ms,
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("ascii")

    @classmethod
    def decode(cls, data: bytes, *, where: str) -> Cursor:
        """Parse and check a cursor document; raises only :class:`CorruptData`."""
        if len(data) > MAX_CURSOR_BYTES:
            raise CorruptData(f"cursor of {len(data)} bytes is too large", where=where)
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise CorruptData(f"cursor is not valid JSON: {exc}", where=where) from None
        if type(doc) is not dict or doc.get("format") != FORMAT:
            raise CorruptData("not a cursor document", where=where)
        if doc.get("version") != VERSION:
            raise CorruptData(f"unsupported cursor version {doc.get('version')!r}", where=where)
        if doc.keys() != _KEYS:
            raise CorruptData(f"cursor keys {sorted(doc)} are not {sorted(_KEYS)}", where=where)
        try:
            source = validate_region(doc["source"])
            reader = validate_region(doc["reader"])
        except InvalidName as exc:
            raise CorruptData(str(exc), where=where) from None
        values = []
        for name in ("through_seq", "epoch", "updated_ms"):
            value = doc[name]
            if type(value) is not int or not 0 <= value <= _U64_MAX:
                raise CorruptData(f"cursor {name} {value!r} out of range", where=where)
            values.append(value)
        return cls(source, reader, values[0], values[1], values[2])


def cursors_prefix(prefix: str, source: str) -> str:
    """``<prefix>regions/<source>/cursors/``."""
    return f"{region_prefix(prefix, source)}cursors/"


def cursor_key(prefix: str, source: str, reader: str) -> str:
    """``<prefix>regions/<source>/cursors/<reader>.json``."""
    return f"{cursors_prefix(prefix, source)}{validate_region(reader)}.json"


async def publish_cursor(bucket: Bucket, prefix: str, cursor: Cursor) -> None:
    """Write ``cursor`` (a plain PUT: one writer per reader and source)."""
    await bucket.put(cursor_key(prefix, cursor.source, cursor.reader), cursor.encode())


async def read_cursor(bucket: Bucket, prefix: str, source: str, reader: str) -> Cursor | None:
    """The cursor of ``reader`` on ``source``'s log, or ``None`` if it never published one.

    A cursor that names another source or reader than its key is refused
    (:class:`CorruptData`).
    """
    key = cursor_key(prefix, source, reader)
    try:
        res = await bucket.get(key)
    except NotFound:
        return None
    cursor = Cursor.decode(res.data, where=key)
    if (cursor.source, cursor.reader) != (source, reader):
        raise CorruptData(
            f"cursor of {cursor.reader!r} on {cursor.source!r} stored under this key", where=key
        )
    return cursor


async def read_cursors(
    bucket: Bucket, prefix: str, source: str, readers: Iterable[str] | None = None
) -> dict[str, Cursor | None]:
    """Cursors of ``readers`` on ``source`` (``None`` for a reader with none).

    ``readers=None`` reads every cursor present (one LIST of the cursors folder).
    """
    if readers is None:
        folder = cursors_prefix(prefix, source)
        names = []
        for info in await bucket.list(folder):
            name = info.key[len(folder) :]
            if name.endswith(".json") and "/" not in name:
                names.append(name[: -len(".json")])
        readers = names
    return {r: await read_cursor(bucket, prefix, source, r) for r in readers}
