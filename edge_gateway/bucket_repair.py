"""Read a lane's shipped entries back from the region's log, for the journal's repair (issue 45).

The journal rebuilds a damaged range it had shipped (``journal/_repair.py``)
from the log objects whose LSN range meets it; it imports no bucket, so the
gateway gives each lane's open a :class:`BucketRepairSource`. The journal
opens in a worker thread, so :meth:`BucketRepairSource.shipped` blocks: it
runs the async reads in the gateway's trio loop (``trio.from_thread.run``)
under a bound (:data:`DEFAULT_TIMEOUT`): a start never waits long for a
bucket out of reach (the range is quarantined then, ``repairable: true``).

Finding the objects: the log's head (galloping HEADs), then a binary search
over seqs on the lane's ``last_lsn`` (it never goes down along the log: a
fence carries the highest LSN shipped before it), then the headers forward
while they start at or before the range's end. Only the objects with data in
the range are read whole; their blocks are checked (CRCs, decryption with the
gateway's keyring, batches against the index) by the format's decoders.

Every lane is served. The main (normal) lane's LSNs are an object's fixed
``first_lsn``/``last_lsn``; another lane's are its row of the object's lane
table (log object version 2: a multi-lane writer puts every lane's row in
every object and fence, an empty one carrying the lane's watermark), so its
``last_lsn`` never goes down along the objects that have the row either. An
object without the row (a writer that had no such lane, a version 1 object)
holds none of the lane's LSNs: the search steps over it (:func:`lane_lsns`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import trio

from edge_gateway.bucket import Bucket, NotFound
from edge_gateway.bucket_log import find_head, read_gc_boundary, read_header
from edge_gateway.errors import CorruptData, Unavailable
from edge_gateway.failpoints import FailPointError, fail_point
from edge_gateway.format import logobject
from edge_gateway.format.crypt import Keyring
from edge_gateway.format.logobject import LogObjectHeader
from edge_gateway.format.manifest import log_key
from edge_gateway.journal import Lane, ShippedObject

__all__ = ["DEFAULT_TIMEOUT", "BucketRepairSource", "find_shipped", "lane_lsns"]

#: Seconds a repair at open waits for the bucket at most (then: quarantined).
DEFAULT_TIMEOUT: Final = 10.0


class BucketRepairSource:
    """The region's log objects of one lane (``lane``: its id in the lane tables, 0 the
    main lane), read for the journal's repair."""

    def __init__(
        self,
        bucket: Bucket,
        prefix: str,
        region: str,
        *,
        keyring: Keyring | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        lane: int = 0,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.region = region
        self.keyring = keyring
        self.timeout = timeout
        self.lane = lane
        #: why the bucket was out of reach at an earlier call (then every later
        #: call fails at once: an open with many damaged ranges waits once)
        self.down: str | None = None

    @classmethod
    def for_lane(
        cls, lane: Lane, bucket: Bucket, prefix: str, region: str, *, keyring: Keyring | None
    ) -> BucketRepairSource:
        """A source for ``lane`` (every lane is served: its LSNs are found in the lane tables)."""
        return cls(bucket, prefix, region, keyring=keyring, lane=lane.id)

    def shipped(self, first_lsn: int, last_lsn: int) -> Sequence[ShippedObject]:
        """Blocking: :func:`find_shipped` in the trio loop, bounded by :attr:`timeout`.

        Once the bucket was out of reach, every later call raises
        :class:`~edge_gateway.errors.Unavailable` at once (:attr:`down`).
        """
        if self.down is not None:
            raise Unavailable(f"the bucket was out of reach ({self.down})")
        try:
            return trio.from_thread.run(self._shipped, first_lsn, last_lsn)
        except Unavailable as exc:
            self.down = str(exc)
            raise

    async def _shipped(self, first_lsn: int, last_lsn: int) -> Sequence[ShippedObject]:
        try:
            fail_point("repair.fetch")
        except FailPointError as exc:
            raise Unavailable(f"the bucket is out of reach ({exc})") from None
        with trio.move_on_after(self.timeout):
            return await find_shipped(
                self.bucket,
                self.prefix,
                self.region,
                first_lsn,
                last_lsn,
                keyring=self.keyring,
                lane=self.lane,
            )
        raise Unavailable(f"the bucket did not answer within {self.timeout:g} s")


async def find_shipped(
    bucket: Bucket,
    prefix: str,
    region: str,
    first_lsn: int,
    last_lsn: int,
    *,
    keyring: Keyring | None = None,
    lane: int = 0,
) -> list[ShippedObject]:
    """The objects of ``region``'s log whose LSNs of ``lane`` (0: the main lane) meet
    ``first_lsn..last_lsn``, in seq order, with their batches. :class:`CorruptData` if
    one does not decode or one was collected by the log's GC; bucket errors propagate."""
    low = await read_gc_boundary(bucket, prefix, region) + 1
    head = await find_head(bucket, prefix, region, known=low - 1)  # the log reached the boundary

    async def header(seq: int) -> LogObjectHeader:
        key = log_key(prefix, region, seq)
        h = (await read_header(bucket, key)).header
        if h.seq != seq or h.region != region:
            raise CorruptData(
                f"the object says it is seq {h.seq} of region {h.region!r}", where=key
            )
        return h

    # The first seq whose last LSN of the lane reaches first_lsn (or a seq before it
    # from which only objects without the lane's row lead to it).
    lo, hi = max(low, 1), head + 1
    while lo < hi:
        mid = probe = (lo + hi) // 2
        lsns = lane_lsns(await header(mid), lane)
        while lsns is None and probe + 1 < hi:  # no row of the lane: the next object's
            probe += 1
            lsns = lane_lsns(await header(probe), lane)
        if lsns is None or lsns[1] >= first_lsn:
            hi = mid
        else:
            lo = probe + 1
    out: list[ShippedObject] = []
    seq, at_boundary = lo, lo == low > 1
    while seq <= head:
        h = await header(seq)
        seq += 1
        lsns = lane_lsns(h, lane)
        if lsns is None:
            continue  # none of the lane's LSNs in this object
        first, last = lsns
        if at_boundary and first > first_lsn:
            # The search stopped at the GC boundary: LSNs before this object may have
            # been in objects the GC collected.
            raise CorruptData(f"LSN {first_lsn} may be in an object the log's GC collected")
        at_boundary = False
        if first > last_lsn:
            break  # (an empty range too: its last_lsn says every LSN up to it shipped before)
        if h.blocks and first <= last and last >= first_lsn:
            key = log_key(prefix, region, seq - 1)
            out.append(await _read_object(bucket, key, h, keyring, lane))
    return out


def lane_lsns(h: LogObjectHeader, lane: int) -> tuple[int, int] | None:
    """``(first_lsn, last_lsn)`` of ``lane`` in the object ``h`` (an empty range is
    ``(w + 1, w)``: the lane had shipped through ``w``); None when the object has no row
    of that lane (it holds none of its LSNs). Lane 0 is the fixed fields."""
    if lane == 0:
        return h.first_lsn, h.last_lsn
    for r in h.lanes:
        if r.lane == lane:
            return r.first_lsn, r.last_lsn
    return None


async def _read_object(
    bucket: Bucket, key: str, h: LogObjectHeader, keyring: Keyring | None, lane: int
) -> ShippedObject:
    try:
        data = (await bucket.get(key)).data
    except NotFound:
        raise CorruptData("collected by the log's GC while being read", where=key) from None
    opener = (keyring or Keyring()).header_opener(h, where=key) if h.key_id is not None else None
    view = memoryview(data)
    batches: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    for b in h.blocks:
        raw = logobject.decode_block(b, view[b.offset : b.end], where=key, opener=opener)
        out = batches.setdefault((b.topic, b.partition), [])
        pos = 0
        for batch in logobject.iter_block_batches(b, raw, where=key):
            n = batch.header.length
            out.append((batch.header.base_offset, bytes(raw[pos : pos + n])))
            pos += n
    lsns = lane_lsns(h, lane)
    assert lsns is not None
    others = [(0, h.first_lsn, h.last_lsn)] if lane else []
    others += [(r.lane, r.first_lsn, r.last_lsn) for r in h.lanes if r.lane != lane]
    return ShippedObject(
        key,
        lsns[0],
        lsns[1],
        h.created_ms,
        batches,
        other_lanes=any(first <= last for _, first, last in others),
        lane=lane,
    )
