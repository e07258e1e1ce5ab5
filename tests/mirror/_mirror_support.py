"""Helpers for the mirroring tests: source data, hand-made logs, record comparison."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import trio

from edge_gateway.bucket import Bucket, LocalBucket, S3Bucket, S3Config
from edge_gateway.bucket_log import encode_gc_boundary, find_head
from edge_gateway.format import logobject
from edge_gateway.format.batch import Record, decode_batch, encode_batch
from edge_gateway.format.logobject import LogObjectBuilder, encode_fence
from edge_gateway.format.manifest import (
    Manifest,
    ManifestEntry,
    gc_boundary_key,
    log_key,
    manifest_key,
)
from edge_gateway.journal import Journal, JournalConfig
from edge_gateway.mirror import TailerConfig
from edge_gateway.names import mirror_topic

Key = tuple[str, int]

#: Small segments, no retention: what the mirror tests' journals use.
JCFG = JournalConfig(segment_bytes=256 * 1024, max_bytes=256 * 1024 * 1024, retention_ms=0)
#: A tailer that polls, retries and writes its cursor every few tens of ms.
QUICK = TailerConfig(
    poll_interval_s=0.01,
    max_poll_interval_s=0.05,
    retry_base_s=0.01,
    retry_cap_s=0.05,
    quarantine_retry_base_s=0.02,
    quarantine_retry_cap_s=0.1,
    gap_check_interval_s=0.05,
    cursor_interval_s=0.05,
    catch_up_threshold=8,
)


def record_value(topic: str, partition: int, offset: int) -> bytes:
    rnd = random.Random(f"{topic}/{partition}/{offset}")
    return f"{topic}:{partition}:{offset}:".encode() + rnd.randbytes(rnd.randrange(0, 120))


def make_batch(topic: str, partition: int, first: int, count: int) -> bytes:
    """A batch with keys (some null), headers (some empty) and distinct timestamps."""
    offsets = range(first, first + count)
    return encode_batch(
        [record_value(topic, partition, o) for o in offsets],
        keys=[None if o % 3 == 0 else f"k{o}".encode() for o in offsets],
        timestamps=[1_700_000_000_000 + o * 7 + partition for o in offsets],
        headers=[() if o % 2 else (("h", f"{o}".encode()), ("src", b"x")) for o in offsets],
        base_offset=first,
    )


def produce(journal: Journal, topic: str, partitions: int, batches: int, size: int = 5) -> None:
    """Append ``batches`` batches of ``size`` records to each partition of ``topic``."""
    for _ in range(batches):
        for p in range(partitions):
            first = journal.next_offset(topic, p)
            journal.append_nowait(topic, p, make_batch(topic, p, first, size))


def records_of_batches(payloads: Iterable[bytes], start: int = 0) -> list[Record]:
    out: list[Record] = []
    for payload in payloads:
        out.extend(decode_batch(payload).records(start))
    return [r for r in out if r.offset >= start]


def journal_records(journal: Journal, topic: str, partition: int) -> list[Record]:
    """Every record of a partition in the journal, in offset order."""
    out: list[Record] = []
    offset = journal.first_offset(topic, partition)
    while True:
        entries = journal.read(topic, partition, offset)
        if not entries:
            return out
        for e in entries:
            for r in decode_batch(e.payload).records():
                if r.offset >= offset:
                    out.append(r)
        offset = out[-1].offset + 1 if out else offset


def mirror_of(journal: Journal, source: str, keys: Iterable[Key]) -> dict[Key, list[Record]]:
    """The mirror's records of the source partitions ``keys`` (by source topic)."""
    return {(t, p): journal_records(journal, mirror_topic(source, t), p) for t, p in sorted(keys)}


async def log_records(
    bucket: Bucket, region: str, *, prefix: str = "", from_seq: int = 1
) -> dict[Key, list[Record]]:
    """Every record in a region's log by partition, in log order (epochs must not go down)."""
    head = await find_head(bucket, prefix, region, from_seq - 1)
    out: dict[Key, list[Record]] = {}
    for seq in range(from_seq, head + 1):
        key = log_key(prefix, region, seq)
        data = (await bucket.get(key)).data
        header = logobject.decode_header(
            data[: logobject.header_length_hint(data[:12], where=key)], where=key
        )
        for b in header.blocks:
            raw = logobject.decode_block(b, data[b.offset : b.offset + b.stored_length], where=key)
            for batch in logobject.iter_block_batches(b, raw, where=key):
                out.setdefault((b.topic, b.partition), []).extend(batch.records())
    return out


@dataclass
class HandLog:
    """Writes a region's log entry by entry, for tests that need exact control.

    Entries are built with the real builder; ``put`` lets a test store any
    bytes (a corrupt or hostile entry) at a seq.
    """

    bucket: Bucket
    region: str
    prefix: str = ""
    epoch: int = 0
    seq: int = 0
    lsn: int = 0
    next_offsets: dict[Key, int] = field(default_factory=dict)
    entries: list[ManifestEntry] = field(default_factory=list)
    manifest_from: int = 1

    async def fence(self, epoch: int | None = None) -> bytes:
        self.epoch = self.epoch + 1 if epoch is None else epoch
        self.seq += 1
        data = encode_fence(self.region, self.epoch, self.seq, self.lsn, _now())
        await self.put(self.seq, data)
        return data

    def build(
        self,
        batches: Mapping[Key, Iterable[int]],
        *,
        epoch: int | None = None,
        seq: int | None = None,
    ) -> bytes:
        """An entry holding, per partition, batches of the given record counts."""
        builder = LogObjectBuilder()
        for (topic, p), counts in sorted(batches.items()):
            for n in counts:
                first = self.next_offsets.get((topic, p), 0)
                builder.add_batch(topic, p, make_batch(topic, p, first, n))
                self.next_offsets[(topic, p)] = first + n
        first_lsn = self.lsn + 1
        self.lsn += max(1, builder.batch_count)
        return builder.build(
            self.region,
            self.epoch if epoch is None else epoch,
            self.seq + 1 if seq is None else seq,
            first_lsn,
            self.lsn,
            _now(),
        )

    async def entry(
        self, batches: Mapping[Key, Iterable[int]], *, epoch: int | None = None
    ) -> bytes:
        data = self.build(batches, epoch=epoch)
        self.seq += 1
        await self.put(self.seq, data)
        return data

    async def put(self, seq: int, data: bytes) -> None:
        await self.bucket.put(log_key(self.prefix, self.region, seq), data)
        try:
            h = logobject.decode_header(
                data[: logobject.header_length_hint(data[:12], where="x")], where="x"
            )
        except Exception:
            return  # a corrupt entry: not in manifests
        self.entries = [e for e in self.entries if e.seq != seq]
        self.entries.append(ManifestEntry.from_header(h, h.total_length))

    async def manifest(self) -> Manifest:
        """A manifest of the entries since the previous one."""
        entries = sorted(
            (e for e in self.entries if e.seq >= self.manifest_from), key=lambda e: e.seq
        )
        m = Manifest(
            region=self.region,
            epoch=max(e.epoch for e in entries),
            first_seq=entries[0].seq,
            last_seq=entries[-1].seq,
            low_watermark=1,
            created_ms=_now(),
            entries=tuple(entries),
            next_offsets=dict(self.next_offsets),
        )
        await self.bucket.put(manifest_key(self.prefix, self.region, m.last_seq), m.encode())
        self.manifest_from = m.last_seq + 1
        return m

    async def delete_through(self, seq: int) -> None:
        """What GC does: advance the boundary, delete the entries."""
        await self.bucket.put(gc_boundary_key(self.prefix, self.region), encode_gc_boundary(seq))
        for s in range(1, seq + 1):
            await self.bucket.delete(log_key(self.prefix, self.region, s))


async def eventually(predicate: Callable[[], bool]) -> None:
    """Wait until ``predicate()`` holds (polling a statistic); fails after 30 s.

    Generous: a loaded CI machine must not turn a slow pass into a failure.
    """
    with trio.fail_after(30):
        while not predicate():  # noqa: ASYNC110 - statistics have no event to wait on
            await trio.sleep(0.005)


def _now() -> int:
    return time.time_ns() // 1_000_000


async def open_bucket(kind: str, tmp: object, endpoint: str | None, name: str | None) -> Bucket:
    if kind in ("s3", "rgw"):
        assert endpoint is not None
        assert name is not None
        from _rgw import ACCESS_KEY as RGW_ACCESS_KEY
        from _rgw import SECRET_KEY as RGW_SECRET_KEY

        rgw = kind == "rgw"
        return await S3Bucket.open(
            S3Config(
                bucket=name,
                endpoint_url=endpoint,
                path_style=True,
                region="us-east-1",
                access_key=RGW_ACCESS_KEY if rgw else "testing",
                secret_key=RGW_SECRET_KEY if rgw else "testing",
            )
        )
    from pathlib import Path

    assert isinstance(tmp, Path)
    return await LocalBucket.open(tmp / "bucket", create=True)
