"""Verify a region's log in the bucket, and compare it with the journal (issue 45, item 5).

Replication can look healthy while the replica is not: Litestream's users
found a replica that failed its integrity check long after it was written
(litestream#582). ``edgegw bucket verify`` reads the region's log back, a
bounded number of bytes per second, and checks every object as a mirror
would before applying it, then compares its records with the ranges the
local journal still holds. Read-only on both sides: no lock is taken and
nothing is written, so it runs beside the serving gateway.

What is checked (docs/operations.md, "Verifying the replica"):

* **The log.** Every seq from the GC boundary (or ``from_seq``) to the head
  listed at the start is present (a hole is *missing*); each object's header
  decodes, names its seq and region, and its size is what the header
  describes; every block's length and CRC-32C, its decryption tag when the
  object is sealed (with the keyring; without the key only the CRCs are
  checked, and a note says so), its zstd frame, and its batches against the
  index (offsets, counts, timestamps, batch CRCs). Across objects: an epoch
  that goes down is a zombie writer's entry (*stale*: readers skip it, a note),
  an epoch that goes up starts with a fence, a lane's LSNs never overlap
  within an epoch (they may jump: LSNs holding only checkpoints ship no
  object), and each partition's offsets continue from one object to the next
  but for the gaps a gap marker declares.
* **The manifests.** Each manifest decodes (its own rules), and every entry
  it records is the header of the object at that seq; its next offsets are
  those the objects reached.
* **The journal.** For every object whose LSNs the journal still holds, the
  records are the journal's: per partition, the same batches byte for byte --
  offsets, timestamps, keys, values, headers, nulls. A difference names the
  object, the partition, the offsets and the first field that differs. And
  no data entry of the journal lies in LSNs between two objects (shipped by
  none). The journal is read with :class:`~edge_gateway.journal.HeldLane`:
  no lock, the active segment up to its last whole entry.

The result is a :class:`ReplicaReport`; nothing here prints. Bucket errors
(:class:`~edge_gateway.bucket.BucketUnavailable`, ``Denied``) propagate: the
command says the bucket is unreachable and exits 2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import trio

from edge_gateway._crc import crc32c
from edge_gateway.bucket import Bucket, NotFound
from edge_gateway.bucket_log import read_gc_boundary
from edge_gateway.errors import CorruptData, InvalidInput, MissingKey
from edge_gateway.format import logobject
from edge_gateway.format.batch import decode_batch, read_header
from edge_gateway.format.crypt import Keyring
from edge_gateway.format.logobject import BlockIndex, LogObjectHeader
from edge_gateway.format.manifest import (
    Manifest,
    ManifestEntry,
    log_key,
    log_prefix,
    manifest_prefix,
    parse_log_key,
    parse_manifest_key,
)
from edge_gateway.journal import HeldLane, HeldRange, Lane, lane_by_id, lanes_on_disk

__all__ = [
    "DEFAULT_RATE",
    "Finding",
    "ReplicaReport",
    "describe_difference",
    "verify_replica",
]

#: Bytes per second read from the bucket unless told otherwise (0: no bound).
DEFAULT_RATE: Final = 16 * 1024 * 1024
#: Keys per LIST page while listing the log.
_LIST_PAGE: Final = 1000

#: ``damaged``: an object or manifest fails a check; ``missing``: a seq of the
#: log has no object; ``mismatch``: the bucket's records are not the journal's;
#: ``journal``: a journal segment could not be read to compare; ``note``: seen,
#: not damage (a stale entry, a sealed object without its key, ...).
Kind = Literal["damaged", "missing", "mismatch", "journal", "note"]
#: What makes the verdict fail.
_BAD_KINDS: Final = frozenset({"damaged", "missing", "mismatch", "journal"})

Key = tuple[str, int]
Batches = list[tuple[int, bytes]]


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing found wrong (or worth a note), with where it is."""

    kind: Kind
    #: the object's, manifest's or segment's key or path
    key: str
    what: str
    seq: int | None = None
    topic: str | None = None
    partition: int | None = None
    first_offset: int | None = None
    last_offset: int | None = None

    @property
    def bad(self) -> bool:
        return self.kind in _BAD_KINDS

    def line(self) -> str:
        """One line for the text report."""
        where = self.key
        if self.topic is not None:
            where += f" {self.topic}/{self.partition}"
            if self.first_offset is not None:
                where += f" offsets {self.first_offset}..{self.last_offset}"
        return f"{where}: {self.what}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "key": self.key,
            "seq": self.seq,
            "topic": self.topic,
            "partition": self.partition,
            "first_offset": self.first_offset,
            "last_offset": self.last_offset,
            "what": self.what,
        }


@dataclass(slots=True)
class ReplicaReport:
    """Everything :func:`verify_replica` checked, and what it found."""

    region: str
    bucket: str
    #: the journal compared with (None: the log alone)
    journal: Path | None
    gc_boundary: int = 0
    first_seq: int = 0
    #: the log's head when the listing was taken (0: an empty log)
    head: int = 0
    objects: int = 0
    bytes: int = 0
    blocks: int = 0
    records: int = 0
    manifests: int = 0
    #: objects whose records were compared with the journal, whole or in part
    compared: int = 0
    compared_records: int = 0
    #: objects compared of which the journal holds only some LSNs (the rest deleted)
    partly_held: int = 0
    #: objects with data whose LSNs the journal no longer holds
    not_held: int = 0
    stale: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.bad]

    @property
    def ok(self) -> bool:
        return not self.problems

    def count(self, kind: Kind) -> int:
        return sum(f.kind == kind for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {
            "region": self.region,
            "bucket": self.bucket,
            "journal": None if self.journal is None else str(self.journal),
            "ok": self.ok,
            "gc_boundary": self.gc_boundary,
            "first_seq": self.first_seq,
            "head": self.head,
            "findings": [f.to_json() for f in self.findings],
            "summary": {
                "objects": self.objects,
                "bytes": self.bytes,
                "blocks": self.blocks,
                "records": self.records,
                "manifests": self.manifests,
                "compared": self.compared,
                "compared_records": self.compared_records,
                "partly_held": self.partly_held,
                "not_held": self.not_held,
                "stale": self.stale,
                "damaged": self.count("damaged"),
                "missing": self.count("missing"),
                "mismatch": self.count("mismatch"),
                "journal": self.count("journal"),
                "notes": self.count("note"),
            },
        }


#: ``progress(done_bytes, total_bytes, key)``, called after each object.
Progress = Callable[[int, int, str], None]


# --------------------------------------------------------------------------
# pure comparisons


def _show(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bytes):
        text = repr(value[:24])
        return f"{text}... ({len(value)} bytes)" if len(value) > 24 else text
    return str(value)


_FIELDS: Final = ("offset", "timestamp", "key", "value", "headers")


def describe_difference(bucket_batch: bytes, journal_batch: bytes) -> str:
    """The first difference between two record batches, in words (the first field that
    differs at the first offset that differs)."""
    try:
        ours = decode_batch(bucket_batch).records()
        theirs = decode_batch(journal_batch).records()
    except CorruptData as exc:
        return f"the batches differ ({exc.reason})"
    for a, b in zip(ours, theirs, strict=False):
        for name in _FIELDS:
            x, y = getattr(a, name), getattr(b, name)
            if x != y:
                return (
                    f"at offset {b.offset}: {name} {'differ' if name == 'headers' else 'differs'} "
                    f"(bucket {_show(x)}, journal {_show(y)})"
                )
    if len(ours) != len(theirs):
        return f"{len(ours)} records in the bucket's batch, {len(theirs)} in the journal's"
    return "the batches' bytes differ, their records do not (flags or CRC)"


def compare_partition(
    obj: Batches, journal: Batches, *, whole: bool
) -> tuple[str, int, int] | None:
    """The first difference between a partition's batches in an object and in the journal.

    ``whole``: the journal holds every LSN of the object (the lists must be
    equal); else only its later part (the journal's batches must be the
    object's from the journal's first offset on). None when they agree;
    else ``(what, first offset, last offset)`` of the differing range.
    """
    if not whole and journal:
        start = journal[0][0]
        obj = [b for b in obj if b[0] >= start]
    for (ob, od), (jb, jd) in zip(obj, journal, strict=False):
        if ob != jb:
            return (
                f"a batch at offset {ob} in the bucket where the journal's starts at {jb}",
                min(ob, jb),
                max(ob, jb),
            )
        if od != jd:
            last = ob + read_header(jd).count - 1
            return describe_difference(od, jd), ob, last
    if len(obj) > len(journal):
        first = obj[len(journal)][0]
        return (
            "records in the bucket that the journal does not hold in these LSNs",
            first,
            _last_offset(obj),
        )
    if len(journal) > len(obj):
        first = journal[len(obj)][0]
        return (
            "records in the journal that the bucket's object does not hold",
            first,
            _last_offset(journal),
        )
    return None


def _last_offset(batches: Batches) -> int:
    base, data = batches[-1]
    return base + read_header(data).count - 1


# --------------------------------------------------------------------------
# the walk


class _Pacer:
    """Holds reads to ``rate`` bytes per second on average (0: no bound)."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.start = trio.current_time()
        self.done = 0

    async def took(self, n: int) -> None:
        self.done += n
        if self.rate > 0:
            await trio.sleep_until(self.start + self.done / self.rate)


@dataclass(slots=True)
class _Decoded:
    header: LogObjectHeader
    size: int
    #: per partition, its batches in offset order: ``(base offset, batch bytes)``
    batches: dict[Key, Batches]
    #: whether the blocks were opened and decoded (False: sealed, no key)
    contents: bool
    #: a block failed its checks (reported)
    damaged: bool = False


class _Verifier:
    def __init__(
        self,
        bucket: Bucket,
        prefix: str,
        report: ReplicaReport,
        *,
        journal: Path | None,
        keyring: Keyring | None,
        rate: int,
        progress: Progress | None,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.region = report.region
        self.report = report
        self.keyring = keyring
        self.pacer = _Pacer(rate)
        self.progress = progress
        self.journal = journal
        #: the journal's lanes by id (listed once the log is: see :meth:`run`)
        self.lanes: dict[int, HeldLane] = {}
        # across objects
        self.max_epoch = 0
        self.last_lsn: dict[int, tuple[int, int]] = {}  # lane id -> (epoch, last LSN)
        self.taken_to: dict[int, int] = {}  # lane id -> the last LSN taken from the journal
        self.next_offsets: dict[Key, int] = {}
        #: whether next_offsets hold every partition shipped since seq 1
        self.offsets_complete = True
        self.headers: dict[int, ManifestEntry] = {}
        self.manifests: list[tuple[int, str]] = []

    def find(self, kind: Kind, key: str, what: str, **where: Any) -> None:
        self.report.findings.append(Finding(kind, key, what, **where))

    # ---------------------------------------------------------------- listing

    async def list_log(self) -> dict[int, int]:
        """seq -> size of every object in the log folder (stray keys are noted)."""
        folder = log_prefix(self.prefix, self.region)
        sizes: dict[int, int] = {}
        after: str | None = None
        while True:
            page = await self.bucket.list(folder, start_after=after, limit=_LIST_PAGE)
            for info in page:
                try:
                    region, seq = parse_log_key(info.key, self.prefix)
                except CorruptData:
                    self.find("note", info.key, "not a log object's key (ignored)")
                    continue
                if region == self.region:
                    sizes[seq] = info.size
            if len(page) < _LIST_PAGE:
                return sizes
            after = page[-1].key

    async def list_manifests(self, start: int) -> None:
        folder = manifest_prefix(self.prefix, self.region)
        for info in await self.bucket.list(folder):
            try:
                _, last_seq = parse_manifest_key(info.key, self.prefix)
            except CorruptData:
                self.find("note", info.key, "not a manifest's key (ignored)")
                continue
            if last_seq >= start:
                self.manifests.append((last_seq, info.key))
        self.manifests.sort()

    # ---------------------------------------------------------------- objects

    async def run(self, from_seq: int) -> None:
        report = self.report
        try:
            report.gc_boundary = await read_gc_boundary(self.bucket, self.prefix, self.region)
        except CorruptData as exc:
            self.find("damaged", exc.where or "gc-boundary", exc.reason)
        sizes = await self.list_log()
        if self.journal is not None:
            # After the log's listing: every LSN an object listed ships was durable in
            # the journal before, so a segment listed now holds it or was deleted since
            # (retention). Listed before, a segment rolled in between would be missed.
            for lane in lanes_on_disk(self.journal):
                self.lanes[lane.id] = HeldLane(self.journal, lane)
        report.head = max(sizes, default=0)
        start = max(from_seq, report.gc_boundary + 1, 1)
        report.first_seq = start
        self.offsets_complete = start == 1
        await self.list_manifests(start)
        total = sum(size for seq, size in sizes.items() if seq >= start)
        for seq in range(start, report.head + 1):
            key = log_key(self.prefix, self.region, seq)
            if seq not in sizes:
                self.find("missing", key, "no object at this seq of the log", seq=seq)
                self.lost()
                continue
            await self.object(seq, key)
            if self.progress is not None:
                self.progress(min(self.pacer.done, total), total, key)
            await self.manifests_through(seq)
        await self.manifests_through(None)
        for held in self.lanes.values():
            for problem in held.problems:
                self.find("journal", str(held.directory), problem)

    async def object(self, seq: int, key: str) -> None:
        try:
            res = await self.bucket.get(key)
        except NotFound:
            # Deleted since the listing: the log's GC, or a hole now.
            try:
                boundary = await read_gc_boundary(self.bucket, self.prefix, self.region)
            except CorruptData:
                boundary = 0  # reported already, when the walk began
            if seq > boundary:
                self.find("missing", key, "deleted while verifying", seq=seq)
            else:
                self.find("note", key, "collected by the log's GC while verifying", seq=seq)
            self.lost()
            return
        self.report.objects += 1
        self.report.bytes += len(res.data)
        await self.pacer.took(len(res.data))
        try:
            decoded = self.decode(seq, key, res.data)
        except CorruptData as exc:
            self.find("damaged", key, exc.reason, seq=seq)
            self.lost()
            return
        if self.manifests:  # kept for the manifests still to check (they cover it)
            self.headers[seq] = ManifestEntry.from_header(decoded.header, decoded.size)
        if not self.continuity(key, decoded.header):
            return
        if self.lanes:
            # Taken even when not compared: the walk over the journal moves past it.
            held = self.held(decoded.header)
            if decoded.contents and not decoded.damaged:
                self.compare(key, decoded, held)

    def lost(self) -> None:
        """An object could not be read: what it held is unknown, so the checks across
        objects start again after it (its finding explains the jump they would see)."""
        self.offsets_complete = False
        self.next_offsets.clear()
        self.last_lsn.clear()
        self.taken_to.clear()

    def decode(self, seq: int, key: str, data: bytes) -> _Decoded:
        """Every check of one object's bytes. A bad header raises :class:`CorruptData`;
        each damaged block is reported (naming its partition and offsets) and makes
        :attr:`_Decoded.damaged` true."""
        header = logobject.decode_header(
            data[: logobject.header_length_hint(data[:12], where=key)],
            where=key,
            object_size=len(data),
        )
        if header.seq != seq or header.region != self.region:
            raise CorruptData(f"the object says it is seq {header.seq} of region {header.region!r}")
        opener = None
        decoded = _Decoded(header, len(data), {}, contents=True)
        if header.key_id is not None:
            try:
                opener = (self.keyring or Keyring()).header_opener(header, where=key)
            except MissingKey:
                decoded.contents = False
                self.find(
                    "note",
                    key,
                    f"sealed with key {header.key_id!r}, which was not given: block CRCs "
                    "checked, contents not (give --config with the region's [encryption])",
                    seq=seq,
                )
        view = memoryview(data)
        for b in header.blocks:
            self.report.blocks += 1
            self.report.records += b.record_count
            stored = view[b.offset : b.end]
            try:
                if not decoded.contents:
                    _check_crc(b, stored)
                    continue
                raw = logobject.decode_block(b, stored, where=key, opener=opener)
                out = decoded.batches.setdefault((b.topic, b.partition), [])
                pos = 0
                for batch in logobject.iter_block_batches(b, raw, where=key):
                    n = batch.header.length
                    out.append((batch.header.base_offset, raw[pos : pos + n]))
                    pos += n
            except CorruptData as exc:
                decoded.damaged = True
                self.find(
                    "damaged",
                    key,
                    exc.reason,
                    seq=seq,
                    topic=b.topic,
                    partition=b.partition,
                    first_offset=b.first_offset,
                    last_offset=b.last_offset,
                )
        return decoded

    def continuity(self, key: str, h: LogObjectHeader) -> bool:
        """The checks across objects (epochs, LSNs, offsets); False: a stale entry."""
        if h.epoch < self.max_epoch:
            self.report.stale += 1
            self.find(
                "note",
                key,
                f"stale: epoch {h.epoch} after epoch {self.max_epoch} (a fenced writer's "
                "late entry; readers skip it)",
                seq=h.seq,
            )
            return False
        if h.epoch > self.max_epoch and self.max_epoch and not h.is_fence:
            self.find(
                "damaged",
                key,
                f"epoch {h.epoch} begins without a fence (the entry before is epoch "
                f"{self.max_epoch})",
                seq=h.seq,
            )
        self.max_epoch = max(self.max_epoch, h.epoch)
        for lane, first, last in _lane_ranges(h):
            # LSNs may jump forward between objects: a range holding only checkpoints
            # ships no object. (Whether the journal holds data there is checked with it.)
            before = self.last_lsn.get(lane)
            if before is not None and before[0] == h.epoch and first <= before[1]:
                self.find(
                    "damaged",
                    key,
                    f"lane {_lane_name(lane)}: LSNs {first}..{last} overlap the entry "
                    f"before, which ends at LSN {before[1]} (same epoch {h.epoch})",
                    seq=h.seq,
                )
            self.last_lsn[lane] = (h.epoch, max(last, before[1] if before else 0))
        for g in h.gaps:
            k = (g.topic, g.partition)
            self.next_offsets[k] = max(self.next_offsets.get(k, 0), g.last_offset + 1)
        for b in h.blocks:
            k = (b.topic, b.partition)
            expected = self.next_offsets.get(k)
            if expected is None and self.offsets_complete:
                expected = 0
            if expected is not None and b.first_offset != expected:
                self.find(
                    "damaged",
                    key,
                    f"offsets {expected}..{b.first_offset - 1} are in no object and no gap "
                    "marker declares them"
                    if b.first_offset > expected
                    else f"the block starts at offset {b.first_offset}, but the objects "
                    f"before reached offset {expected}",
                    seq=h.seq,
                    topic=b.topic,
                    partition=b.partition,
                    first_offset=b.first_offset,
                    last_offset=b.last_offset,
                )
            self.next_offsets[k] = b.last_offset + 1
        return True

    # ---------------------------------------------------------------- the journal

    def held(self, h: LogObjectHeader) -> list[tuple[int, int, int, HeldRange]]:
        """What the journal holds of each lane's LSNs in the object: (lane, first, last, held)."""
        held: list[tuple[int, int, int, HeldRange]] = []
        for lane_id, first, last in _lane_ranges(h):
            lane = self.lanes.get(lane_id)
            before = self.taken_to.get(lane_id)
            if first > last:
                continue
            if lane is not None and before is not None and first > before + 1:
                self.unshipped(lane, before + 1, first - 1, h.seq)
            self.taken_to[lane_id] = max(last, before or 0)
            got = lane.take(first, last) if lane is not None else HeldRange(None)
            held.append((lane_id, first, last, got))
        return held

    def unshipped(self, lane: HeldLane, first: int, last: int, seq: int) -> None:
        """The journal's data entries in LSNs that no object ships (between two objects)."""
        by_partition: dict[Key, list[int]] = {}
        for e in lane.take(first, last).data:
            by_partition.setdefault((e.topic, e.partition), []).extend(
                (e.base_offset, e.next_offset - 1)
            )
        for (topic, partition), offsets in sorted(by_partition.items()):
            self.find(
                "mismatch",
                log_key(self.prefix, self.region, seq),
                f"records of the journal's lane {lane.lane} in LSNs {first}..{last}, which "
                "no object of the log ships (they fall between this object and the one before)",
                seq=seq,
                topic=topic,
                partition=partition,
                first_offset=min(offsets),
                last_offset=max(offsets),
            )

    def compare(self, key: str, d: _Decoded, held: list[tuple[int, int, int, HeldRange]]) -> None:
        """Compare the object's records with the journal's entries of its LSNs."""
        h = d.header
        if not d.batches:
            return
        held_any = [x for x in held if x[3].held_from is not None]
        if not held_any:
            self.report.not_held += 1
            return
        whole_lanes: set[int] = set()
        journal: dict[Key, Batches] = {}
        lane_of: dict[Key, int] = {}
        for lane_id, first, last, got in held_any:
            if got.holes:
                self.find(
                    "journal",
                    key,
                    f"the journal of lane {_lane_name(lane_id)} misses LSNs between "
                    f"{got.held_from} and {got.held_to}: not compared "
                    "(edgegw journal verify names the damage)",
                    seq=h.seq,
                )
                return
            if got.held_to is not None and got.held_to < last:
                self.find(
                    "mismatch",
                    key,
                    f"the object ships LSNs {first}..{last} of lane {_lane_name(lane_id)}; "
                    f"the journal holds them only up to LSN {got.held_to}",
                    seq=h.seq,
                )
                return
            if got.held_from == first:
                whole_lanes.add(lane_id)
            for e in got.data:
                k = (e.topic, e.partition)
                journal.setdefault(k, []).append((e.base_offset, bytes(e.payload)))
                lane_of[k] = lane_id
        every_lane_whole = len(whole_lanes) == len(held)
        self.report.compared += 1
        self.report.partly_held += not every_lane_whole
        for k in sorted(d.batches.keys() | journal.keys()):
            obj = d.batches.get(k, [])
            jour = journal.get(k)
            if jour is None:
                if not every_lane_whole:
                    continue  # its lane's entries of these LSNs are gone from the journal
                jour = []
            whole = lane_of.get(k) in whole_lanes if k in lane_of else every_lane_whole
            diff = compare_partition(obj, jour, whole=whole)
            if diff is None:
                self.report.compared_records += sum(read_header(b).count for _, b in jour)
                continue
            what, first_off, last_off = diff
            self.find(
                "mismatch",
                key,
                what,
                seq=h.seq,
                topic=k[0],
                partition=k[1],
                first_offset=first_off,
                last_offset=last_off,
            )

    # ---------------------------------------------------------------- manifests

    async def manifests_through(self, seq: int | None) -> None:
        """Check the manifests that end at or before ``seq`` (None: all that are left)."""
        while self.manifests and (seq is None or self.manifests[0][0] <= seq):
            last_seq, key = self.manifests.pop(0)
            await self.manifest(key, last_seq)
            # A manifest covers the entries since the one before: the next needs none of these.
            for s in [s for s in self.headers if s <= last_seq]:
                del self.headers[s]

    async def manifest(self, key: str, last_seq: int) -> None:
        try:
            res = await self.bucket.get(key)
        except NotFound:
            return  # collected by the log's GC meanwhile
        await self.pacer.took(len(res.data))
        self.report.bytes += len(res.data)
        self.report.manifests += 1
        try:
            m = Manifest.decode(res.data, where=key, region=self.region, last_seq=last_seq)
        except CorruptData as exc:
            self.find("damaged", key, exc.reason)
            return
        self.check_manifest(key, m)

    def check_manifest(self, key: str, m: Manifest) -> None:
        for entry in m.entries:
            got = self.headers.get(entry.seq)
            if got is None:
                continue  # before the first seq verified, or an object already reported
            if got != entry:
                self.find(
                    "damaged",
                    key,
                    f"its entry for seq {entry.seq} is not that object's header "
                    f"({_entry_difference(entry, got)})",
                    seq=entry.seq,
                )
        if not self.offsets_complete or m.last_seq not in self.headers:
            return
        for k, nxt in sorted(m.next_offsets.items()):
            ours = self.next_offsets.get(k)
            if ours is not None and ours != nxt:
                self.find(
                    "damaged",
                    key,
                    f"next offset {nxt}, the objects up to seq {m.last_seq} reach {ours}",
                    seq=m.last_seq,
                    topic=k[0],
                    partition=k[1],
                )


def _lane_ranges(h: LogObjectHeader) -> list[tuple[int, int, int]]:
    """Each lane's LSN range in an object: ``(lane id, first, last)``."""
    return [
        (logobject.LANE_MAIN, h.first_lsn, h.last_lsn),
        *((r.lane, r.first_lsn, r.last_lsn) for r in h.lanes),
    ]


def _check_crc(b: BlockIndex, stored: memoryview) -> None:
    """The checks of a sealed block without its key: length and CRC-32C."""
    if len(stored) != b.stored_length:
        raise CorruptData(f"{len(stored)} bytes, the index says {b.stored_length}")
    actual = crc32c(stored)
    if actual != b.crc:
        raise CorruptData(f"CRC mismatch (stored {b.crc:08x}, computed {actual:08x})")


def _entry_difference(entry: ManifestEntry, got: ManifestEntry) -> str:
    for name in (f.name for f in dataclasses.fields(ManifestEntry)):
        a, b = getattr(entry, name), getattr(got, name)
        if a != b:
            if name == "blocks":
                return _blocks_difference(a, b)
            return f"{name} {_show(a)} in the manifest, {_show(b)} in the object"
    return "they differ"  # pragma: no cover - equal fields make equal entries


def _blocks_difference(ours: tuple[BlockIndex, ...], theirs: tuple[BlockIndex, ...]) -> str:
    if len(ours) != len(theirs):
        return f"{len(ours)} blocks in the manifest, {len(theirs)} in the object"
    for i, (x, y) in enumerate(zip(ours, theirs, strict=True)):
        for f in dataclasses.fields(BlockIndex):
            a, b = getattr(x, f.name), getattr(y, f.name)
            if a != b:
                return (
                    f"block {i} ({y.topic}/{y.partition}): {f.name} {_show(a)} in the manifest, "
                    f"{_show(b)} in the object"
                )
    return "their blocks differ"  # pragma: no cover - equal fields make equal blocks


def _lane_name(lane_id: int) -> str:
    lane: Lane | None = lane_by_id(lane_id)
    return str(lane) if lane is not None else str(lane_id)


async def verify_replica(
    bucket: Bucket,
    prefix: str,
    region: str,
    *,
    journal: Path | None = None,
    keyring: Keyring | None = None,
    from_seq: int = 1,
    rate: int = DEFAULT_RATE,
    progress: Progress | None = None,
) -> ReplicaReport:
    """Verify region ``region``'s log in ``bucket`` (under ``prefix``); read-only.

    ``journal``: the normal lane's journal directory to compare with (every
    lane beside it is read too); None checks the log alone. ``keyring``
    opens sealed objects. ``rate``: bytes per second read from the bucket
    at most, on average (0: no bound). Bucket errors propagate.
    """
    if from_seq < 1:
        raise InvalidInput(f"from_seq must be at least 1, got {from_seq}")
    if rate < 0:
        raise InvalidInput(f"rate must be >= 0 bytes per second, got {rate}")
    report = ReplicaReport(region, bucket.describe(), journal)
    await _Verifier(
        bucket, prefix, report, journal=journal, keyring=keyring, rate=rate, progress=progress
    ).run(from_seq)
    return report
