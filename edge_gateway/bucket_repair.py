"""Read a lane's shipped entries back from the region's log, for the journal's repair (issue 45).

The journal rebuilds a damaged range it had shipped (``journal/_repair.py``)
from the log objects whose LSN range meets it; it imports no bucket, so the
gateway gives each lane's open a :class:`BucketRepairSource`. The journal
opens in a worker thread, so :meth:`BucketRepairSource.shipped` blocks: it
runs the async reads in the gateway's trio loop (``trio.from_thread.run``)
under a bound (:data:`DEFAULT_TIMEOUT`): a start never waits long for a
bucket out of reach (the range is quarantined then, ``repairable: true``).

Finding the objects: the log's head (galloping HEADs), then a binary search
over seqs on the main lane's ``last_lsn`` (it never goes down along the log:
a fence carries the highest LSN shipped before it), then the headers forward
while they start at or before the range's end. Only the objects with data in
the range are read whole; their blocks are checked (CRCs, decryption with the
gateway's keyring, batches against the index) by the format's decoders.

Only the main (normal) lane is served: the other lanes' ranges are in a lane
table that an object may lack, so no search order is known for them (their
damage is quarantined as before).
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

__all__ = ["DEFAULT_TIMEOUT", "BucketRepairSource", "find_shipped"]

#: Seconds a repair at open waits for the bucket at most (then: quarantined).
DEFAULT_TIMEOUT: Final = 10.0


class BucketRepairSource:
    """The region's log objects of the main lane, read for the journal's repair at open."""

    def __init__(
        self,
        bucket: Bucket,
        prefix: str,
        region: str,
        *,
        keyring: Keyring | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.region = region
        self.keyring = keyring
        self.timeout = timeout
        #: why the bucket was out of reach at an earlier call (then every later
        #: call fails at once: an open with many damaged ranges waits once)
        self.down: str | None = None

    @classmethod
    def for_lane(
        cls, lane: Lane, bucket: Bucket, prefix: str, region: str, *, keyring: Keyring | None
    ) -> BucketRepairSource | None:
        """A source for ``lane`` (None for a lane other than the main one: not served)."""
        return cls(bucket, prefix, region, keyring=keyring) if lane.is_main else None

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
                self.bucket, self.prefix, self.region, first_lsn, last_lsn, keyring=self.keyring
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
) -> list[ShippedObject]:
    """The objects of ``region``'s log whose main-lane LSNs meet ``first_lsn..last_lsn``,
    in seq order, with their batches. :class:`CorruptData` if one does not decode or
    one was collected by the log's GC; bucket errors propagate."""
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

    # The first seq whose last LSN reaches first_lsn.
    lo, hi = max(low, 1), head + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if (await header(mid)).last_lsn >= first_lsn:
            hi = mid
        else:
            lo = mid + 1
    out: list[ShippedObject] = []
    seq = lo
    while seq <= head:
        h = await header(seq)
        if seq == low > 1 and h.first_lsn > first_lsn:
            # The search stopped at the GC boundary: LSNs before this object may have
            # been in objects the GC collected.
            raise CorruptData(f"LSN {first_lsn} may be in an object the log's GC collected")
        if h.first_lsn > last_lsn:
            break  # (an empty range too: its last_lsn says every LSN up to it shipped before)
        if h.blocks and h.first_lsn <= h.last_lsn and h.last_lsn >= first_lsn:
            out.append(await _read_object(bucket, log_key(prefix, region, seq), h, keyring))
        seq += 1
    return out


async def _read_object(
    bucket: Bucket, key: str, h: LogObjectHeader, keyring: Keyring | None
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
    return ShippedObject(
        key,
        h.first_lsn,
        h.last_lsn,
        h.created_ms,
        batches,
        other_lanes=any(r.first_lsn <= r.last_lsn for r in h.lanes),
    )
