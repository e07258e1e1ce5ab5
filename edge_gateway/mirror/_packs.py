"""A catch-up's packs: each GET once, its entries' bytes handed out by seq.

A pack (``format/pack.py``) copies a source's small log entries into one
object, so a tailer far behind fetches a hundred entries with one GET instead
of a hundred. The tailer plans entries from manifests in seq order; for each
planned entry it asks :meth:`PackReader.body`. The first entry of a pack
fetches the pack (and starts fetching the next few, so their round trips
overlap applying this one: on a 60 ms link, one pack at a time would cost a
round trip per ~40 entries); the others wait for it. A pack that is gone, refused,
too large or corrupt is only a miss: the entry is fetched from its own
object, as without packs. Nothing here is trusted either: the tailer checks
every body against the entry's manifest (size, block CRCs) and fetches the
entry's own object when a body disagrees.

Memory: a pack's bytes are dropped once the tailer applied its last entry
(:meth:`PackReader.applied`); packs are fetched ahead only while the packs
held stay within ``ahead_bytes`` (and at most ``AHEAD`` of them).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import trio

from edge_gateway._trio import wait_set
from edge_gateway.bucket import Bucket, BucketError
from edge_gateway.errors import CorruptData, EdgeGatewayError
from edge_gateway.format.pack import Pack, decode_pack, pack_list_start, pack_prefix, parse_pack_key

log = logging.getLogger(__name__)

#: Packs fetched ahead of the one being applied, at most.
AHEAD = 4


@dataclass(slots=True, eq=False)
class ListedPack:
    """A pack as listed: its key, its range (from the key) and its size."""

    key: str
    first_seq: int
    last_seq: int
    size: int
    #: Set once the fetch ended (``index`` is None if it failed).
    loaded: trio.Event = field(default_factory=trio.Event)
    started: bool = False
    data: bytes = b""
    index: Pack | None = None


async def list_packs(
    bucket: Bucket, prefix: str, source: str, first_seq: int, max_bytes: int | None = None
) -> list[ListedPack]:
    """The source's packs that hold seqs from ``first_seq`` on, by last seq (one LIST).

    Packs listed larger than ``max_bytes`` are left out.
    """
    out = []
    for info in await bucket.list(
        pack_prefix(prefix, source), start_after=pack_list_start(prefix, source, first_seq)
    ):
        try:
            region, first, last = parse_pack_key(info.key, prefix)
        except CorruptData:
            continue  # a stray object in the folder
        if region == source and (max_bytes is None or info.size <= max_bytes):
            out.append(ListedPack(info.key, first, last, info.size))
    return out


@dataclass(slots=True)
class PackStats:
    """What a tailer's catch-ups did with packs (kept across catch-ups)."""

    reads: int = 0
    #: Entries taken from packs (a body that disagreed is not counted).
    entries: int = 0
    #: Packs not used, and bodies that disagreed with their manifest entry.
    fallbacks: int = 0
    bytes_fetched: int = 0


class PackReader:
    """The packs of one catch-up, walked in seq order."""

    def __init__(
        self,
        bucket: Bucket,
        source: str,
        packs: Sequence[ListedPack],
        ahead_bytes: int,
        stats: PackStats,
    ) -> None:
        self.bucket = bucket
        self.source = source
        self.ahead_bytes = ahead_bytes
        #: Listed bytes of the packs started and not let go of yet.
        self._held = 0
        self._packs = list(packs)
        self._position = {id(p): i for i, p in enumerate(self._packs)}
        #: Index of the first pack whose last seq is not behind the entries asked for.
        self._at = 0
        #: Index of the first pack whose bytes may still be needed.
        self._kept = 0
        self.stats = stats

    def covering(self, seq: int) -> ListedPack | None:
        """The pack whose range holds ``seq`` (asked in ascending seq order), if any."""
        while self._at < len(self._packs) and self._packs[self._at].last_seq < seq:
            self._at += 1
        for p in self._packs[self._at :]:
            if p.first_seq > seq:
                break
            return p
        return None

    async def body(self, pack: ListedPack, seq: int, nursery: trio.Nursery) -> bytes | None:
        """The bytes of entry ``seq`` from ``pack``, or None: GET the entry's own object."""
        if not pack.started:
            self._start(pack)
            self._prefetch_next(pack, nursery)
            await self._load(pack)
        else:
            self._prefetch_next(pack, nursery)
        await wait_set(pack.loaded)
        return self._entry_bytes(pack, seq)

    def body_now(self, pack: ListedPack, seq: int, nursery: trio.Nursery) -> bytes | None:
        """The bytes of entry ``seq`` if ``pack`` holds them already (None: use :meth:`body`)."""
        if not pack.loaded.is_set():
            return None
        self._prefetch_next(pack, nursery)
        return self._entry_bytes(pack, seq)

    def _entry_bytes(self, pack: ListedPack, seq: int) -> bytes | None:
        if pack.index is None:
            return None
        e = pack.index.find(seq)
        if e is None:
            return None  # not packed (a fence, a large entry): its own GET
        self.stats.entries += 1
        return pack.data[e.offset : e.offset + e.length]

    def rejected(self, pack: ListedPack, seq: int, why: str) -> None:
        """A body disagreed with its entry: count it and say so (the entry is GET alone)."""
        self.stats.entries -= 1
        self.stats.fallbacks += 1
        log.warning(
            "mirror %s: entry %d in pack %s disagrees with its manifest (%s); "
            "fetching the entry itself",
            self.source,
            seq,
            pack.key,
            why,
        )

    def applied(self, seq: int) -> None:
        """Entries up to ``seq`` are applied: let go of the packs that end there."""
        while self._kept < len(self._packs) and self._packs[self._kept].last_seq <= seq:
            p = self._packs[self._kept]
            p.data = b""
            if p.started:
                self._held -= p.size
            self._kept += 1

    def _prefetch_next(self, pack: ListedPack, nursery: trio.Nursery) -> None:
        i = self._position[id(pack)]
        for nxt in self._packs[i + 1 : i + 1 + AHEAD]:
            if nxt.started:
                continue
            if nxt.first_seq <= pack.last_seq or self._held + nxt.size > self.ahead_bytes:
                return  # an overlapping pack is fetched only if needed; memory is bounded
            self._start(nxt)
            nursery.start_soon(self._load, nxt)

    def _start(self, pack: ListedPack) -> None:
        pack.started = True
        self._held += pack.size

    async def _load(self, pack: ListedPack) -> None:
        try:
            res = await self.bucket.get(pack.key)
            self.stats.reads += 1
            self.stats.bytes_fetched += len(res.data)
            index = decode_pack(res.data, where=pack.key)
            if index.region != self.source or not (
                pack.first_seq == index.first_seq and pack.last_seq == index.last_seq
            ):
                raise CorruptData(
                    f"pack of {index.region} {index.first_seq}..{index.last_seq} under the key "
                    f"of {self.source} {pack.first_seq}..{pack.last_seq}",
                    where=pack.key,
                )
            pack.data, pack.index = res.data, index
        except (BucketError, EdgeGatewayError) as exc:
            # A miss, never an error of the mirror: its entries are GET alone.
            self.stats.fallbacks += 1
            log.warning("mirror %s: pack %s not used (%s)", self.source, pack.key, exc)
        finally:
            pack.loaded.set()
