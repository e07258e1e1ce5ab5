"""Read other regions' log objects back, for the repair of this journal's mirror entries (issue 45).

A mirror topic's entries hold records of another region (the source), so a
damaged range of them is re-fetched from the source's log in the shared
bucket (``regions/<source>/log/<seq>``), not from this region's
(``journal/_mirror_repair.py`` finds the seqs from the intact entries around
the damage and rebuilds the entries). :class:`MirrorRepairSource` is the
gateway's repair source of the main lane (the lane the tailers append to):
:class:`~edge_gateway.bucket_repair.BucketRepairSource` for the region's own
entries, plus :meth:`MirrorRepairSource.mirrored` for the source regions'.

Like the tailer, each object's blocks are checked as shipped (length, CRC),
opened with the gateway's keyring when the object is sealed (the keys the
tailers use) and checked again opened (``atrest.check_stored_block``); they
are kept as stored, so that a mirror that keeps blocks gets them back byte
for byte. An object the source's GC collected is :class:`CorruptData`: the
range is quarantined and reported lost, and a live repair counts the attempt
(``journal/_live_repair.py``: at most five, never a loop).
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from edge_gateway.bucket import Bucket, NotFound
from edge_gateway.bucket_log import read_gc_boundary
from edge_gateway.bucket_repair import DEFAULT_TIMEOUT, BucketRepairSource
from edge_gateway.errors import CorruptData, Unavailable
from edge_gateway.failpoints import FailPointError, fail_point
from edge_gateway.format import atrest, logobject
from edge_gateway.format.crypt import Keyring
from edge_gateway.format.manifest import log_key
from edge_gateway.journal import MirroredObject

__all__ = ["MirrorRepairSource", "read_mirrored"]


class MirrorRepairSource(BucketRepairSource):
    """The main lane's repair source: this region's log objects (of the main lane), and
    the source regions' (the tailers append to the main lane)."""

    def __init__(
        self,
        bucket: Bucket,
        prefix: str,
        region: str,
        *,
        keyring: Keyring | None = None,
        keep_blocks: bool = True,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(bucket, prefix, region, keyring=keyring, timeout=timeout)
        #: the tailers keep fetched blocks as block entries (``mirror.keep_blocks``)
        self.keep_blocks = keep_blocks

    def mirrored(self, region: str, first_seq: int, last_seq: int) -> Sequence[MirroredObject]:
        """Blocking: :func:`read_mirrored` in the trio loop, bounded by :attr:`timeout`
        (the bucket out of reach once: every later call fails at once, as :meth:`shipped`)."""
        if self.down is not None:
            raise Unavailable(f"the bucket was out of reach ({self.down})")
        try:
            return trio.from_thread.run(self._mirrored, region, first_seq, last_seq)
        except Unavailable as exc:
            self.down = str(exc)
            raise

    async def _mirrored(self, region: str, first_seq: int, last_seq: int) -> list[MirroredObject]:
        try:
            fail_point("repair.fetch")
        except FailPointError as exc:
            raise Unavailable(f"the bucket is out of reach ({exc})") from None
        with trio.move_on_after(self.timeout):
            return await read_mirrored(
                self.bucket, self.prefix, region, first_seq, last_seq, keyring=self.keyring
            )
        raise Unavailable(f"the bucket did not answer within {self.timeout:g} s")


async def read_mirrored(
    bucket: Bucket,
    prefix: str,
    region: str,
    first_seq: int,
    last_seq: int,
    *,
    keyring: Keyring | None = None,
) -> list[MirroredObject]:
    """The objects ``first_seq..last_seq`` of ``region``'s log, their blocks checked and
    opened. :class:`CorruptData` when one does not decode or the source's GC collected
    it; bucket errors propagate."""
    if first_seq < 1 or last_seq < first_seq:
        raise CorruptData(f"no entries {first_seq}..{last_seq} in {region}'s log")
    collected = await read_gc_boundary(bucket, prefix, region)
    if first_seq <= collected:
        raise CorruptData(
            f"{region}'s log entries up to {collected} were collected by its GC "
            f"(entries {first_seq}..{last_seq} wanted)"
        )
    out = []
    for seq in range(first_seq, last_seq + 1):
        key = log_key(prefix, region, seq)
        try:
            data = (await bucket.get(key)).data
        except NotFound:
            raise CorruptData(
                f"not in the bucket (collected by {region}'s GC?)", where=key
            ) from None
        out.append(_decode(key, region, seq, data, keyring))
    return out


def _decode(
    key: str, region: str, seq: int, data: bytes, keyring: Keyring | None
) -> MirroredObject:
    need = logobject.header_length_hint(data[:12], where=key)
    h = logobject.decode_header(data[:need], where=key, object_size=len(data))
    if h.seq != seq or h.region != region:
        raise CorruptData(f"the object says it is seq {h.seq} of region {h.region!r}", where=key)
    opener = (keyring or Keyring()).header_opener(h, where=key)
    view = memoryview(data)
    blocks = []
    for b in h.blocks:
        opened = bytes(logobject.open_block(b, view[b.offset : b.end], where=key, opener=opener))
        atrest.check_stored_block(b, opened, where=key)
        blocks.append((b, opened))
    return MirroredObject(key, h.seq, h.epoch, h.is_fence, h.has_nulls, tuple(blocks))
