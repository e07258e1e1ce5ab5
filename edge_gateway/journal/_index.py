"""Index files (``<segment>.idx``) of sealed journal segments, read from disk through a cache.

When a segment is sealed its read index is written next to it; from then on
the journal keeps only a summary of the segment in memory and reads entry
positions and partition entries from this file, a page at a time, through a
bounded LRU cache (:class:`IndexCache`, ``journal.index_cache_bytes``), as
Kafka reads its ``.index`` files. Only the active segment's index is in RAM.

Version 2 (little-endian; the arrays are fixed-size records, so entry ``i``
of an array is at a computed byte and a lookup is a binary search over
cached pages)::

    magic "EGWI" | u8 version=2 | 3 bytes zero
    u64 base_lsn | u64 n_entries | u64 segment_size | i64 last_append_time
    u32 n_partitions | u32 directory_length
    directory, per partition:
        u16 topic_len | u32 partition | u64 k | u64 at | i64 first_offset | topic
    zero padding to a multiple of 8
    positions      n_entries x i64     byte position of entry base_lsn + i
    per partition, at byte ``at``:  lsns k x i64 | base_offsets k x i64
    u32 crc32c of everything before it

Version 1 (the previous format, read and converted to version 2 at open)::

    magic "EGWI" | u8 version=1 | 3 bytes zero
    u64 base_lsn | u64 n_entries | u64 segment_size | i64 last_append_time
    positions         n_entries x i64
    u32 n_partitions
    per partition:    u16 topic_len | topic | u32 partition | u32 k
                      lsns k x i64 | base_offsets k x i64
    u32 crc32c of everything before it

An index file that is missing, short, or fails its CRC or size check is
ignored and rebuilt by scanning its segment. The whole file's CRC is checked
when the journal opens (read in 1 MiB pieces, nothing kept).
"""

from __future__ import annotations

import itertools
import os
import struct
import sys
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

from edge_gateway._crc import crc32c
from edge_gateway.errors import CorruptData, Unavailable
from edge_gateway.journal import _fs
from edge_gateway.journal._config import INDEX_CACHE_MIN_BYTES

_MAGIC: Final = b"EGWI"
VERSION: Final = 2
_HEAD_V1 = struct.Struct("<4sB3xQQQq")
_HEAD = struct.Struct("<4sB3xQQQqII")
_DIR = struct.Struct("<HIQQq")
_PART_V1 = struct.Struct("<HII")
_BIG = sys.byteorder == "big"
#: the unit the cache reads and keeps: 512 array elements
PAGE: Final = 4096
_PAGE_SHIFT: Final = 12
#: what a cached page costs in RAM beyond its bytes (the array object, the LRU's entry)
PAGE_OVERHEAD: Final = 320
_CHUNK: Final = 1 << 20
_READ_FDS: Final = 16
assert INDEX_CACHE_MIN_BYTES == 8 * (PAGE + PAGE_OVERHEAD)


def _arr_bytes(a: array[int]) -> bytes:
    if _BIG:  # pragma: no cover
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def _arr_from(data: bytes | memoryview) -> array[int]:
    a = array("q")
    a.frombytes(data)
    if _BIG:  # pragma: no cover
        a.byteswap()
    return a


class IntSequence(Protocol):
    """What readers need of positions, LSNs and offsets: an array, or a view of an index file."""

    def __len__(self) -> int: ...
    def __getitem__(self, i: int, /) -> int: ...


@dataclass(frozen=True, slots=True)
class PartitionRun:
    """One partition's entries in a sealed segment, as the index file's directory has them."""

    topic: str
    partition: int
    #: number of data entries
    count: int
    #: byte of the file where its LSNs start (its base offsets follow)
    at: int
    first_offset: int


@dataclass(slots=True)
class SegmentIndex:
    """The read index of one segment, whole (written at a seal, or read from a v1 file)."""

    base_lsn: int
    size: int
    last_append_time: int
    positions: array[int] = field(default_factory=lambda: array("q"))
    #: (topic, partition) -> (lsns, base offsets) of its data entries in this segment
    partitions: dict[tuple[str, int], tuple[array[int], array[int]]] = field(default_factory=dict)

    def encode(self) -> tuple[bytes, list[PartitionRun]]:
        """The version 2 file, and its directory."""
        entries = []
        for (topic, partition), (lsns, offsets) in self.partitions.items():
            if len(lsns) != len(offsets):
                raise ValueError("lsns and offsets differ in length")
            if lsns:
                entries.append((topic.encode(), partition, lsns, offsets))
        dir_len = sum(_DIR.size + len(raw) for raw, *_ in entries)
        at = _HEAD.size + dir_len
        at += -at % 8
        at += 8 * len(self.positions)
        directory: list[bytes] = []
        runs: list[PartitionRun] = []
        arrays: list[bytes] = []
        for raw, partition, lsns, offsets in entries:
            directory += (_DIR.pack(len(raw), partition, len(lsns), at, offsets[0]), raw)
            runs.append(PartitionRun(raw.decode(), partition, len(lsns), at, offsets[0]))
            arrays += (_arr_bytes(lsns), _arr_bytes(offsets))
            at += 16 * len(lsns)
        head = _HEAD.pack(
            _MAGIC,
            VERSION,
            self.base_lsn,
            len(self.positions),
            self.size,
            self.last_append_time,
            len(entries),
            dir_len,
        )
        pad = -(_HEAD.size + dir_len) % 8
        body = b"".join([head, *directory, bytes(pad), _arr_bytes(self.positions), *arrays])
        return body + struct.pack("<I", crc32c(body)), runs

    @classmethod
    def decode_v1(cls, data: bytes, *, where: str) -> SegmentIndex:
        """Read a whole version 1 file (the format before v2); CorruptData if it is not one."""
        if len(data) < _HEAD_V1.size + 8:
            raise CorruptData("index file truncated", where=where)
        (stored,) = struct.unpack_from("<I", data, len(data) - 4)
        body = memoryview(data)[:-4]
        if crc32c(body) != stored:
            raise CorruptData("index file CRC mismatch", where=where)
        magic, version, base_lsn, n, size, last_time = _HEAD_V1.unpack_from(body)
        if magic != _MAGIC or version != 1:
            raise CorruptData("not an index file of version 1", where=where)
        try:
            cur = _HEAD_V1.size
            positions = _arr_from(body[cur : cur + 8 * n])
            cur += 8 * n
            (nparts,) = struct.unpack_from("<I", body, cur)
            cur += 4
            parts: dict[tuple[str, int], tuple[array[int], array[int]]] = {}
            for _ in range(nparts):
                tlen, partition, k = _PART_V1.unpack_from(body, cur)
                cur += _PART_V1.size
                topic = bytes(body[cur : cur + tlen]).decode()
                cur += tlen
                lsns = _arr_from(body[cur : cur + 8 * k])
                cur += 8 * k
                offsets = _arr_from(body[cur : cur + 8 * k])
                cur += 8 * k
                parts[(topic, partition)] = (lsns, offsets)
        except (struct.error, ValueError, UnicodeDecodeError) as exc:
            raise CorruptData(f"malformed index file: {exc}", where=where) from None
        if cur != len(body) or len(positions) != n:
            raise CorruptData("index file length mismatch", where=where)
        return cls(base_lsn, size, last_time, positions, parts)


def file_version(path: Path) -> int:
    """The version byte of an index file (0 if it has none); OSError if unreadable."""
    with path.open("rb") as f:
        head = f.read(5)
    return head[4] if len(head) == 5 and head[:4] == _MAGIC else 0


_keys = itertools.count(1)


class IndexFile:
    """A sealed segment's version 2 index file, read a page at a time through the cache.

    While the file could not be written yet (a full disk), its bytes are
    kept in ``data`` and read from there (see docs/journal.md, "Memory").
    """

    __slots__ = ("_positions_at", "cache", "data", "key", "n", "path", "size")

    def __init__(
        self,
        path: Path,
        cache: IndexCache,
        n: int,
        positions_at: int,
        size: int,
        data: bytes | None = None,
    ) -> None:
        self.path = path
        self.cache = cache
        self.n = n
        self._positions_at = positions_at
        #: bytes of the file
        self.size = size
        self.data = data
        #: identifies this file's pages in the cache
        self.key = next(_keys)

    @classmethod
    def from_bytes(cls, path: Path, cache: IndexCache, data: bytes) -> IndexFile:
        """The index ``data`` (just encoded, not yet written to ``path``) held in memory."""
        _, _, _, n, _, _, _, dir_len = _HEAD.unpack_from(data)
        at = _HEAD.size + dir_len
        return cls(path, cache, n, at + -at % 8, len(data), data)

    @classmethod
    def open(
        cls, path: Path, cache: IndexCache, *, base_lsn: int, segment_size: int
    ) -> tuple[IndexFile, int, list[PartitionRun]]:
        """Check a version 2 file whole (CRC, layout, its segment) and read its directory.

        Returns the file, the segment's last append time and the directory.
        Raises CorruptData (or OSError) for a file that cannot be used.
        """
        where = str(path)
        fd = _fs.ops.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size < _HEAD.size + 4:
                raise CorruptData("index file truncated", where=where)
            head = os.pread(fd, _HEAD.size, 0)
            magic, version, base, n, seg_size, last_time, nparts, dir_len = _HEAD.unpack(head)
            if magic != _MAGIC or version != VERSION:
                raise CorruptData(f"not an index file of version {VERSION}", where=where)
            if base != base_lsn or seg_size != segment_size:
                raise CorruptData("index does not match its segment", where=where)
            crc = 0
            pos = 0
            body = size - 4
            while pos < body:
                chunk = os.pread(fd, min(_CHUNK, body - pos), pos)
                if not chunk:
                    raise CorruptData("index file truncated", where=where)
                crc = crc32c(chunk, crc)
                pos += len(chunk)
            (stored,) = struct.unpack("<I", os.pread(fd, 4, body))
            if crc != stored:
                raise CorruptData("index file CRC mismatch", where=where)
            raw_dir = os.pread(fd, dir_len, _HEAD.size)
        finally:
            _fs.ops.close(fd)
        runs: list[PartitionRun] = []
        try:
            cur = 0
            for _ in range(nparts):
                tlen, partition, k, at, first = _DIR.unpack_from(raw_dir, cur)
                cur += _DIR.size
                topic = raw_dir[cur : cur + tlen].decode()
                cur += tlen
                runs.append(PartitionRun(topic, partition, k, at, first))
        except (struct.error, UnicodeDecodeError) as exc:
            raise CorruptData(f"malformed index directory: {exc}", where=where) from None
        at = _HEAD.size + dir_len
        positions_at = at + -at % 8
        end = positions_at + 8 * n + sum(16 * r.count for r in runs)
        if cur != dir_len or end != body or n < 1:
            raise CorruptData("index file length mismatch", where=where)
        return cls(path, cache, n, positions_at, size), last_time, runs

    def positions(self) -> DiskArray:
        return DiskArray(self, self._positions_at, self.n)

    def run(self, at: int, count: int) -> tuple[DiskArray, DiskArray]:
        """(LSNs, base offsets) of one partition's run (see :class:`PartitionRun`)."""
        return DiskArray(self, at, count), DiskArray(self, at + 8 * count, count)

    def read_array(self, at: int, n: int) -> array[int]:
        """``n`` i64 from byte ``at``, read at once (bypassing the page cache): for a
        one-off scan of a whole run, such as a drop-oldest lane describing a
        segment it drops."""
        if self.data is not None:
            return _arr_from(self.data[at : at + 8 * n])
        try:
            fd = _fs.ops.open(self.path, os.O_RDONLY)
            try:
                data = os.pread(fd, 8 * n, at)
            finally:
                _fs.ops.close(fd)
        except OSError as exc:
            raise Unavailable(f"journal: cannot read index file {self.path}: {exc}") from exc
        if len(data) != 8 * n:
            raise Unavailable(f"journal: index file {self.path} is shorter than when it was opened")
        return _arr_from(data)

    def read_page(self, page: int) -> bytes:
        if self.data is not None:
            return self.data[page << _PAGE_SHIFT : (page + 1) << _PAGE_SHIFT]
        return self.cache.pread(self, page)


class DiskArray:
    """A read-only array of i64 in an index file: ``len``, ``[i]`` and ``bisect`` work."""

    __slots__ = ("_at", "_file", "_n")

    def to_array(self) -> array[int]:
        """All of it in memory (one read)."""
        return self._file.read_array(self._at, self._n)

    def __init__(self, file: IndexFile, at: int, n: int) -> None:
        self._file = file
        self._at = at
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int, /) -> int:
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("index out of range")
        b = self._at + 8 * i
        return self._file.cache.page(self._file, b >> _PAGE_SHIFT)[(b & (PAGE - 1)) >> 3]


class IndexCache:
    """A bounded LRU of index file pages, shared by every sealed segment of a journal.

    ``capacity`` bytes of pages (each counted with its overhead); at least
    a few pages are kept, so a binary search and a sequential reader do
    not evict each other at every step. Files are read with ``pread``, not
    mapped: a mapped page that was read counts in the process's RSS until
    the kernel reclaims it, a cached page only while it is in this LRU.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, INDEX_CACHE_MIN_BYTES)
        self._pages: OrderedDict[tuple[int, int], array[int]] = OrderedDict()
        self._fds: OrderedDict[int, int] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def page(self, f: IndexFile, page: int) -> array[int]:
        key = (f.key, page)
        a = self._pages.get(key)
        if a is not None:
            self.hits += 1
            self._pages.move_to_end(key)
            return a
        self.misses += 1
        data = f.read_page(page)
        a = _arr_from(memoryview(data)[: len(data) & ~7])
        # A page may start inside an element only if arrays were not 8-aligned:
        # they are (see the layout), so element j of the page is at byte 8 * j.
        self._pages[key] = a
        self.bytes += PAGE + PAGE_OVERHEAD
        while self.bytes > self.capacity:
            self._pages.popitem(last=False)
            self.bytes -= PAGE + PAGE_OVERHEAD
        return a

    def pread(self, f: IndexFile, page: int) -> bytes:
        fd = self._fds.get(f.key)
        try:
            if fd is None:
                fd = self._fds[f.key] = _fs.ops.open(f.path, os.O_RDONLY)
                if len(self._fds) > _READ_FDS:
                    os.close(self._fds.popitem(last=False)[1])
            else:
                self._fds.move_to_end(f.key)
            data = os.pread(fd, PAGE, page << _PAGE_SHIFT)
        except OSError as exc:
            raise Unavailable(f"journal: cannot read index file {f.path}: {exc}") from exc
        if len(data) < min(PAGE, f.size - (page << _PAGE_SHIFT)):
            raise Unavailable(f"journal: index file {f.path} is shorter than when it was opened")
        return data

    def forget(self, f: IndexFile) -> None:
        """Drop a file's pages and descriptor (its segment is deleted, or its file replaced)."""
        for key in [k for k in self._pages if k[0] == f.key]:
            del self._pages[key]
            self.bytes -= PAGE + PAGE_OVERHEAD
        fd = self._fds.pop(f.key, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._pages.clear()
        self.bytes = 0
