"""Planning a read of regions' logs: which log-object slices hold which records (no Spark).

The driver plans from each region's manifests plus the headers of the few
entries after the newest one (``docs/log-object.md``, "Manifest"): it never
LISTs the log nor GETs every header. A plan is bounded by an inclusive seq
range per region, so a read of the same plan returns the same rows, however
far the log has grown since — what makes the job's commits exactly once.

Readers' epoch rule (``docs/protocol.md``, "Readers"): an entry whose epoch
is below one already accepted is skipped (a zombie writer's). Fence entries
carry no data.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from edge_gateway.bucket import NotFound, SyncBucket
from edge_gateway.errors import CorruptData, InvalidInput, MissingKey
from edge_gateway.format import logobject
from edge_gateway.format.crypt import Keyring
from edge_gateway.format.logobject import BlockIndex, GapRange, SealRef
from edge_gateway.format.manifest import (
    Manifest,
    gc_boundary_key,
    log_key,
    manifest_prefix,
    parse_manifest_key,
)
from edge_gateway.names import validate_region
from edge_gateway.protocol.log_decisions import HeadSearch


@dataclass(frozen=True, slots=True)
class ObjectSlice:
    """The wanted blocks of one log object (a partition of a Spark read holds several)."""

    region: str
    seq: int
    key: str
    #: size of the whole object
    size: int
    blocks: tuple[BlockIndex, ...]
    #: An encrypted object: what its blocks are bound to (None: plaintext).
    seal: SealRef | None = None

    @property
    def total_length(self) -> int:
        """The object's size (lets :func:`logobject.plan_ranges` take a slice)."""
        return self.size

    @property
    def stored_bytes(self) -> int:
        return sum(b.stored_length for b in self.blocks)

    @property
    def raw_bytes(self) -> int:
        return sum(b.raw_length for b in self.blocks)

    @property
    def records(self) -> int:
        return sum(b.record_count for b in self.blocks)


@dataclass(frozen=True, slots=True)
class PlannedGap:
    """Offsets ``first_offset..last_offset`` of a topic partition that the source
    dropped before shipping them (a gap marker in log entry ``seq``; docs/protocol.md,
    "Gap markers"). They are in no object: the tables have a hole there."""

    region: str
    seq: int
    topic: str
    partition: int
    first_offset: int
    last_offset: int
    records: int

    def describe(self) -> str:
        return (
            f"{self.region}:{self.topic}/{self.partition} offsets "
            f"{self.first_offset}..{self.last_offset} ({self.records} records) were dropped "
            f"at the source before they were shipped (on_full = drop-oldest; entry {self.seq})"
        )


@dataclass(frozen=True, slots=True)
class RegionPlan:
    """What to read of one region: entries ``first_seq..last_seq`` (empty if first > last)."""

    region: str
    first_seq: int
    last_seq: int
    slices: tuple[ObjectSlice, ...]
    #: entries skipped by the epoch rule
    skipped_seqs: tuple[int, ...] = ()
    #: gap markers of the wanted topics in the planned entries
    gaps: tuple[PlannedGap, ...] = ()

    @property
    def records(self) -> int:
        return sum(s.records for s in self.slices)

    @property
    def stored_bytes(self) -> int:
        return sum(s.stored_bytes for s in self.slices)

    def topics(self) -> set[str]:
        return {b.topic for s in self.slices for b in s.blocks}


@dataclass(frozen=True, slots=True)
class _Entry:
    seq: int
    epoch: int
    size: int
    blocks: tuple[BlockIndex, ...]
    seal: SealRef | None = None
    gaps: tuple[GapRange, ...] = ()


def slice_opener(s: ObjectSlice, keyring: Keyring | None) -> logobject.BlockOpener | None:
    """The opener of an encrypted slice's blocks (None: plaintext; :class:`MissingKey`)."""
    if s.seal is None:
        return None
    ring = keyring if keyring is not None else Keyring()
    return ring.opener(
        s.region,
        s.seal.key_id,
        s.seal.epoch,
        s.seq,
        s.seal.first_lsn,
        s.seal.last_lsn,
        s.seal.n_blocks,
        where=s.key,
    )


def check_keys(plans: Iterable[RegionPlan], keyring: Keyring | None) -> None:
    """Raise :class:`MissingKey` for the first encrypted slice ``keyring`` cannot open."""
    for plan in plans:
        for s in plan.slices:
            if s.seal is not None and (
                keyring is None or s.seal.key_id not in keyring.key_ids(s.region)
            ):
                raise MissingKey(s.region, s.seal.key_id, where=s.key)


def read_gc_boundary(bucket: SyncBucket, region: str, prefix: str = "") -> int:
    """The highest seq ever deleted from the region's log (0 if none)."""
    key = gc_boundary_key(prefix, region)
    try:
        data = bucket.get(key).data
    except NotFound:
        return 0
    try:
        value = json.loads(data)["highest_deleted_seq"]
        if not isinstance(value, int) or value < 0:
            raise ValueError(value)
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptData(f"malformed GC boundary: {exc}", where=key) from None
    return value


def read_log_header(bucket: SyncBucket, key: str) -> tuple[logobject.LogObjectHeader, int]:
    """The header of a log object and the object's size (one ranged GET, rarely two)."""
    first = bucket.get(key, start=0, end=logobject.FIRST_GET_BYTES)
    data = first.data
    need = logobject.header_length_hint(data[: logobject.PREFIX_BYTES], where=key)
    if need > len(data):
        data += bucket.get(key, start=len(data), end=need).data
    return logobject.decode_header(data[:need], where=key, object_size=first.size), first.size


def find_head(bucket: SyncBucket, region: str, known: int = 0, prefix: str = "") -> int:
    """The highest seq of the region's log (0 if empty), galloping HEADs above ``known``."""
    search = HeadSearch(known)
    while (probe := search.next_probe()) is not None:
        search.record(probe, bucket.exists(log_key(prefix, region, probe)))
    return search.head


def _manifests(bucket: SyncBucket, region: str, prefix: str) -> list[tuple[int, str]]:
    out = []
    for obj in bucket.list(manifest_prefix(prefix, region)):
        key = obj.key
        try:
            _, last_seq = parse_manifest_key(key, prefix)
        except CorruptData:
            continue  # a stray file in the folder
        out.append((last_seq, key))
    return sorted(out)


def plan_region(
    bucket: SyncBucket,
    region: str,
    *,
    first_seq: int = 1,
    last_seq: int | None = None,
    wanted: Callable[[str], bool] = lambda _topic: True,
    prefix: str = "",
) -> RegionPlan:
    """Plan the read of entries ``first_seq..last_seq`` of ``region`` (to the head if None).

    Entries below the GC boundary are gone: a plan that needs them raises
    :class:`CorruptData`, except a fresh start (``first_seq == 1``), which
    starts at the oldest entry still in the bucket.
    """
    validate_region(region)
    if first_seq < 1 or (last_seq is not None and last_seq < 0):
        raise InvalidInput(f"bad seq range {first_seq}..{last_seq} for region {region}")
    boundary = read_gc_boundary(bucket, region, prefix)
    if first_seq <= boundary:
        if first_seq != 1:
            raise CorruptData(
                f"entries {first_seq}..{boundary} were deleted before the pipeline read them",
                where=gc_boundary_key(prefix, region),
            )
        first_seq = boundary + 1
    entries: dict[int, _Entry] = {}
    covered = boundary
    for m_last, key in _manifests(bucket, region, prefix):
        if m_last < first_seq:
            covered = max(covered, m_last)  # exists (or was collected): a lower bound of the head
            continue
        if last_seq is not None and covered >= last_seq:
            break
        data = bucket.get(key).data
        manifest = Manifest.decode(data, where=key, region=region, last_seq=m_last)
        for e in manifest.entries:
            entries[e.seq] = _Entry(
                e.seq, e.epoch, e.size, e.blocks, SealRef.of(e.key_id, e, len(e.blocks)), e.gaps
            )
        covered = max(covered, m_last)
    if last_seq is None:
        last_seq = find_head(bucket, region, covered, prefix)
    # the epoch accepted before first_seq: from the manifest entries we hold
    epoch = max((e.epoch for s, e in entries.items() if s < first_seq), default=0)
    slices: list[ObjectSlice] = []
    skipped: list[int] = []
    gaps: list[PlannedGap] = []
    for seq in range(first_seq, last_seq + 1):
        key = log_key(prefix, region, seq)
        entry = entries.get(seq)
        if entry is None:
            try:
                header, size = read_log_header(bucket, key)
            except NotFound:
                raise CorruptData(
                    f"log entry {seq} of {region} is missing (plan up to {last_seq})", where=key
                ) from None
            if header.seq != seq or header.region != region:
                raise CorruptData(
                    f"entry claims seq {header.seq} of region {header.region!r}", where=key
                )
            entry = _Entry(
                seq,
                header.epoch,
                size,
                header.blocks,
                SealRef.of(header.key_id, header, len(header.blocks)),
                header.gaps,
            )
        if entry.epoch < epoch:
            skipped.append(seq)
            continue
        epoch = entry.epoch
        gaps += (
            PlannedGap(region, seq, g.topic, g.partition, g.first_offset, g.last_offset, g.records)
            for g in entry.gaps
            if wanted(g.topic)
        )
        blocks = tuple(b for b in entry.blocks if wanted(b.topic))
        if blocks:
            slices.append(ObjectSlice(region, seq, key, entry.size, blocks, entry.seal))
    return RegionPlan(region, first_seq, last_seq, tuple(slices), tuple(skipped), tuple(gaps))


def list_regions(bucket: SyncBucket, prefix: str = "") -> list[str]:
    """Regions with a log or manifest in the bucket (one LIST of ``regions/``)."""
    base = f"{prefix.rstrip('/') + '/' if prefix else ''}regions/"
    out: set[str] = set()
    for obj in bucket.list(base):
        region = obj.key[len(base) :].split("/", 1)[0]
        try:
            out.add(validate_region(region))
        except InvalidInput:
            continue
    return sorted(out)


def split_slices(
    slices: list[ObjectSlice], *, target_raw_bytes: int, min_parts: int = 1, multiple_of: int = 1
) -> Iterator[list[ObjectSlice]]:
    """Group slices into read tasks of about ``target_raw_bytes`` of raw batches each.

    The number of tasks is at least ``min_parts`` (when there are that many
    blocks) and a multiple of ``multiple_of`` (the cluster's parallelism, so
    that the last wave of tasks keeps every core busy); tasks are cut where
    the running total of raw bytes crosses each multiple of total / tasks, so
    their sizes differ by at most one block. A slice may be split between
    tasks by block.
    """
    total = sum(s.raw_bytes for s in slices)
    if total == 0:
        if slices:
            yield list(slices)
        return
    parts = max(min_parts, -(-total // max(1, target_raw_bytes)), 1)
    step = max(1, multiple_of)
    parts = -(-parts // step) * step
    group: list[ObjectSlice] = []
    done = 0
    cut = 1
    for s in slices:
        pending: list[BlockIndex] = []
        for b in s.blocks:
            pending.append(b)
            done += b.raw_length
            if done * parts >= cut * total:
                group.append(dataclasses.replace(s, blocks=tuple(pending)))
                yield group
                group, pending = [], []
                while done * parts >= cut * total:
                    cut += 1
        if pending:
            group.append(dataclasses.replace(s, blocks=tuple(pending)))
    if group:
        yield group
