"""The heads watch's wire format, sans-IO: NDJSON lines, each a ``GET /v1/heads`` answer.

``GET /v1/heads?watch=1&since=V&regions=a,b&wait_ms=W`` (docs/metadata-api.md,
"Head relay", protocol 2) answers ``200`` with ``Content-Type:
application/x-ndjson`` and a chunked body that does not end: one line at once
(the heads moved after ``V``, possibly none), then one line per change of the
watched heads — coalesced: the changes made while the previous line was being
written become one line — and a line with ``"heads": {}`` after ``W`` ms
without a change (the keep-alive that lets both sides notice a dead
connection). Every line is a document of the long poll's shape::

    {"version": 1732838400000123, "heads": {"north": 42}}\\n

so a client resumes a broken watch with ``since`` = the last line's version,
and an older server, which ignores ``watch=1``, answers the same request as
one long poll: a single JSON document, which :class:`WatchDecoder` reads as
one line (the client then asks again; no extra round trip to find out).

This module only encodes and decodes; the server's and the client's I/O shells
(``server.py``, ``client.py``) and ``bench/fleet.py`` use it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from edge_gateway.errors import CorruptData

__all__ = [
    "MAX_LINE_BYTES",
    "WATCH_MEDIA_TYPE",
    "WatchDecoder",
    "encode_heads",
    "parse_heads",
]

#: The watch's media type (newline-delimited JSON).
WATCH_MEDIA_TYPE: Final = "application/x-ndjson"
#: A line longer than this is refused (a watch of every region of a large
#: fleet is ~30 bytes per region: 1 MiB is ~30,000 regions moved at once).
MAX_LINE_BYTES: Final = 1 << 20


def encode_heads(version: int, heads: Mapping[str, int]) -> bytes:
    """One line: ``{"version": V, "heads": {...}}`` and a newline."""
    rendered = json.dumps(
        heads, ensure_ascii=False, allow_nan=False, separators=(",", ":")
    ).encode()
    return b'{"version":%d,"heads":%b}\n' % (version, rendered)


def parse_heads(doc: object, where: str) -> tuple[int, dict[str, int]]:
    """(version, heads) of a heads document; :class:`CorruptData` when malformed."""
    if not isinstance(doc, dict):
        raise CorruptData("heads answer is not a JSON object", where=where)
    version, heads = doc.get("version"), doc.get("heads")
    if isinstance(version, bool) or not isinstance(version, int) or not isinstance(heads, dict):
        raise CorruptData("malformed heads answer", where=where)
    for k, v in heads.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int):
            raise CorruptData("malformed heads answer", where=where)
    return version, heads


class WatchDecoder:
    """Bytes of a watch's body in (any split), (version, heads) per complete line out.

    A line past ``max_line`` bytes, or one that is not a heads document,
    raises :class:`CorruptData` and leaves the decoder unusable (the caller
    drops the connection). Blank lines are skipped.
    """

    __slots__ = ("_broken", "_buf", "max_line", "where")

    def __init__(self, where: str, *, max_line: int = MAX_LINE_BYTES) -> None:
        self.where = where
        self.max_line = max_line
        self._buf = bytearray()
        self._broken = False

    @property
    def pending(self) -> int:
        """Bytes of an incomplete line held."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[tuple[int, dict[str, int]]]:
        if self._broken:
            raise CorruptData("watch decoder used after an error", where=self.where)
        start = len(self._buf)
        self._buf += data
        out: list[tuple[int, dict[str, int]]] = []
        begin = 0
        search = start
        while (end := self._buf.find(b"\n", search)) >= 0:
            update = self._line(bytes(self._buf[begin:end]))
            if update is not None:
                out.append(update)
            begin = search = end + 1
        del self._buf[:begin]
        if len(self._buf) > self.max_line:
            self._broken = True
            raise CorruptData(f"watch line longer than {self.max_line} bytes", where=self.where)
        return out

    def end(self) -> tuple[int, dict[str, int]] | None:
        """The stream ended: its last line when it had no newline (an older
        server's single answer), else None."""
        rest, self._buf = bytes(self._buf), bytearray()
        return self._line(rest)

    def _line(self, line: bytes) -> tuple[int, dict[str, int]] | None:
        if len(line) > self.max_line:
            self._broken = True
            raise CorruptData(f"watch line longer than {self.max_line} bytes", where=self.where)
        if not line.strip():
            return None
        try:
            doc = json.loads(line)
        except ValueError:
            self._broken = True
            raise CorruptData("watch line is not JSON", where=self.where) from None
        try:
            return parse_heads(doc, self.where)
        except CorruptData:
            self._broken = True
            raise
