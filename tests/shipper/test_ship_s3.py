"""The shipper on the real S3 path: boto3 over HTTP to moto's server, through a TCP fault proxy.

Every test verifies the whole log afterwards, read straight from moto (not
through the proxy): contiguous seqs, non-decreasing epochs, LSN ranges that
follow each other, and every record of every partition once, in order.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from edge_gateway.bucket import (
    Bucket,
    BucketUnavailable,
    FaultyBucket,
    NotFound,
    PreconditionFailed,
    S3Bucket,
    S3Config,
)
from edge_gateway.bucket_log import find_head
from edge_gateway.errors import Fenced
from edge_gateway.format import logobject
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.logobject import LogObjectHeader
from edge_gateway.format.manifest import Manifest, log_key
from edge_gateway.journal import Journal, JournalConfig, open_journal
from edge_gateway.shipper import Shipper, ShipperConfig
from edge_gateway.testing import ProxyMode, TcpProxy
from edge_gateway.testing.moto import ACCESS_KEY, REGION, SECRET_KEY

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

MIB = 1024 * 1024
MULTIPART_CHILD = Path(__file__).parent / "multipart_child.py"
OBJECT_BYTES = 64 * 1024  # small objects, so a backlog makes many of them
CFG = ShipperConfig(
    flush_interval_ms=50,
    max_object_bytes=OBJECT_BYTES,
    # Backlog objects stay small too, so a backlog still makes several.
    backlog_object_bytes=2 * OBJECT_BYTES,
    manifest_every=5,
    retry_base_s=0.05,
    retry_cap_s=0.5,
)
JCFG = JournalConfig(segment_bytes=1 * MIB, max_bytes=256 * MIB, retention_ms=0)
TOPIC = "t"
REGION_NAME = "north"


def s3_config(endpoint: str, bucket: str, **overrides: object) -> S3Config:
    """Short timeouts: a blackholed request fails in 2 x (1 + 1 + 1) s + backoff."""
    values: dict[str, object] = {
        "bucket": bucket,
        "endpoint_url": endpoint,
        "region": REGION,
        "path_style": True,
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "connect_timeout": 1.0,
        "read_timeout": 1.0,
        "max_attempts": 2,
        "max_concurrency": 8,
        "multipart_threshold": 5 * MIB,
        "part_size": 5 * MIB,
    }
    values.update(overrides)
    return S3Config.from_mapping(values)


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[TcpProxy]:
    port = int(moto_endpoint.rsplit(":", 1)[1])
    with TcpProxy("127.0.0.1", port) as p:
        yield p


@pytest.fixture
async def s3(proxy: TcpProxy, s3_bucket_name: str) -> AsyncIterator[S3Bucket]:
    """The bucket as the gateway sees it: through the fault proxy."""
    bucket = await S3Bucket.open(s3_config(proxy.url, s3_bucket_name))
    try:
        yield bucket
    finally:
        await bucket.aclose()


@pytest.fixture
async def direct(moto_endpoint: str, s3_bucket_name: str) -> AsyncIterator[S3Bucket]:
    """The same bucket straight from moto, for checking what landed."""
    bucket = await S3Bucket.open(s3_config(moto_endpoint, s3_bucket_name, read_timeout=10.0))
    try:
        yield bucket
    finally:
        await bucket.aclose()


# ----------------------------------------------------------------- data


def value(p: int, o: int, size: int = 200) -> bytes:
    """The record at offset ``o`` of partition ``p``: telemetry-ish, checkable."""
    head = f'{{"p":{p},"o":{o},"v":"'.encode()
    return head + b"x" * max(0, size - len(head) - 2) + b'"}'


async def produce(j: Journal, partitions: int, rounds: int, per_batch: int = 10) -> None:
    """``rounds`` batches of ``per_batch`` records to each partition (about 2 KiB each)."""
    for _ in range(rounds):
        for p in range(partitions):
            first = j.next_offset(TOPIC, p)
            batch = encode_batch([value(p, first + i) for i in range(per_batch)], timestamps=first)
            await j.append(TOPIC, p, batch)


@dataclass
class Log:
    headers: list[LogObjectHeader]
    sizes: list[int]
    records: dict[int, list[tuple[int, bytes]]]


async def read_log(bucket: Bucket, *, single_writer: bool = True) -> Log:
    """Every entry of the region's log, checked for order, gaps and duplicates."""
    head = await find_head(bucket, "", REGION_NAME)
    log = Log([], [], {})
    prev: LogObjectHeader | None = None
    for seq in range(1, head + 1):
        key = log_key("", REGION_NAME, seq)
        data = (await bucket.get(key)).data
        h = logobject.decode_header(
            data[: logobject.header_length_hint(data[:12], where=key)], where=key
        )
        assert h.seq == seq
        assert h.total_length == len(data)
        if prev is not None:
            assert h.epoch >= prev.epoch, "epochs went down"
            if single_writer:
                assert h.first_lsn == prev.last_lsn + 1, f"LSN gap or overlap at seq {seq}"
        for b in h.blocks:
            raw = logobject.decode_block(b, data[b.offset : b.offset + b.stored_length], where=key)
            for batch in logobject.iter_block_batches(b, raw, where=key):
                assert b.topic == TOPIC
                log.records.setdefault(b.partition, []).extend(
                    (r.offset, r.value) for r in batch.records()
                )
        log.headers.append(h)
        log.sizes.append(len(data))
        prev = h
    return log


def assert_complete(log: Log, j: Journal, partitions: int) -> None:
    """Every record the journal holds is in the log exactly once, in order."""
    for p in range(partitions):
        got = log.records.get(p, [])
        n = j.next_offset(TOPIC, p)
        assert [o for o, _ in got] == list(range(n)), f"partition {p}: gap or duplicate"
        assert all(v == value(p, o) for o, v in got), f"partition {p}: wrong content"


async def wait_until(predicate: Callable[[], bool], limit_s: float = 60.0) -> None:
    """Poll ``predicate`` (statistics have no event to wait on); fail after ``limit_s``."""
    with trio.fail_after(limit_s):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.02)


# ---------------------------------------------------------------- (a) steady


async def test_steady_shipping_to_s3(
    s3: S3Bucket, direct: S3Bucket, s3_admin: S3Client, s3_bucket_name: str, tmp_path: Path
) -> None:
    async with open_journal(tmp_path / "j", JCFG) as j:
        s = Shipper(j, s3, REGION_NAME, config=CFG)
        async with trio.open_nursery() as nursery:
            await nursery.start(s.run)
            for _ in range(20):
                await produce(j, 4, 1)
                await trio.sleep(0.03)
            with trio.fail_after(30):
                await s.wait_shipped(j.next_lsn - 1)
            nursery.cancel_scope.cancel()
        log = await read_log(direct)
        assert_complete(log, j, 4)
        stats = s.statistics()
        assert stats.objects == len(log.headers) - 1  # all but the fence
        assert stats.retries == 0
        assert log.headers[0].is_fence
        # Manifests cover the log and carry each partition's next offset.
        listed = s3_admin.list_objects_v2(
            Bucket=s3_bucket_name, Prefix=f"regions/{REGION_NAME}/manifest/"
        )
        keys = [o["Key"] for o in listed.get("Contents", [])]
        assert keys
        manifests = [Manifest.decode((await direct.get(k)).data, where=k) for k in keys]
        covered = [e.seq for m in manifests for e in m.entries]
        last = manifests[-1]
        assert covered == list(range(1, last.last_seq + 1))
        expected_next: dict[tuple[str, int], int] = {}
        for h in log.headers[: last.last_seq]:
            for b in h.blocks:
                expected_next[(b.topic, b.partition)] = b.last_offset + 1
        assert dict(last.next_offsets) == expected_next


# ---------------------------------------------------------------- (b) outages


@pytest.mark.parametrize("fault", [ProxyMode.REFUSE, ProxyMode.RESET, ProxyMode.BLACKHOLE])
async def test_outage_then_backlog_ships_in_order_as_full_objects(
    fault: ProxyMode, proxy: TcpProxy, s3: S3Bucket, direct: S3Bucket, tmp_path: Path
) -> None:
    async with open_journal(tmp_path / "j", JCFG) as j:
        s = Shipper(j, s3, REGION_NAME, config=CFG)
        async with trio.open_nursery() as nursery:
            await nursery.start(s.run)
            await produce(j, 4, 5)
            with trio.fail_after(30):
                await s.wait_shipped(j.next_lsn - 1)
            await trio.sleep(0.1)  # let a due manifest go out first

            proxy.set_mode(fault)
            outage_lsn = j.next_lsn
            retries = s.statistics().retries
            await produce(j, 4, 1)
            # The failure surfaces (for a blackhole: after the client's timeouts).
            await wait_until(lambda: s.statistics().retries > retries)
            assert s.statistics().last_error is not None
            await produce(j, 4, 60)  # the journal keeps accepting: ~480 KiB of backlog
            restore_lsn = j.next_lsn
            assert restore_lsn - outage_lsn == 4 * 61
            assert s.shipped_lsn < outage_lsn

            proxy.set_mode(ProxyMode.PASS)
            with trio.fail_after(60):
                await s.wait_shipped(restore_lsn - 1)
            assert s.statistics().last_error is None
            nursery.cancel_scope.cancel()

        log = await read_log(direct)
        assert_complete(log, j, 4)
        after = [h for h in log.headers if h.blocks and h.last_lsn >= outage_lsn]
        # The first is the object that was being retried (the one round); the
        # backlog behind it went out as full-size objects, the last one partial.
        backlog_bytes = sum(b.raw_length for h in after[1:] for b in h.blocks)
        assert len(after) - 1 <= backlog_bytes // int(OBJECT_BYTES * 0.9) + 1
        for h in after[1:-1]:
            assert sum(b.raw_length for b in h.blocks) >= OBJECT_BYTES * 0.9


async def test_lost_responses_resolve_as_committed(
    proxy: TcpProxy, s3: S3Bucket, direct: S3Bucket, tmp_path: Path
) -> None:
    """A one-way partition: the PUT lands, the answer never comes back."""
    async with open_journal(tmp_path / "j", JCFG) as j:
        s = Shipper(j, s3, REGION_NAME, config=CFG)
        await s.claim()
        await produce(j, 2, 3)
        proxy.set_mode(ProxyMode.DROP_RESPONSES)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(s.ship_pending)
            # The entry is in the bucket, but the shipper could not know.
            key = log_key("", REGION_NAME, 2)
            await wait_until(lambda: s.statistics().retries > 0)
            assert (await direct.head(key)).size > 0
            assert s.shipped_lsn == 0
            proxy.set_mode(ProxyMode.PASS)
        assert s.shipped_lsn == j.next_lsn - 1
        assert_complete(await read_log(direct), j, 2)


async def test_entry_unreadable_after_412_is_retried_not_fatal(
    s3: S3Bucket, direct: S3Bucket, tmp_path: Path
) -> None:
    """A lost response, then the read-back of the 412 fails too: retry, do not crash."""
    faulty = FaultyBucket(s3, close_inner=False)
    async with open_journal(tmp_path / "j", JCFG) as j:
        s = Shipper(j, faulty, REGION_NAME, config=CFG)
        await s.claim()
        await produce(j, 2, 3)
        faulty.fail_next(1, after_commit=True, operations=["put"])
        faulty.operations = ["get"]
        faulty.outage = True
        async with trio.open_nursery() as nursery:
            nursery.start_soon(s.ship_pending)
            await wait_until(lambda: s.statistics().retries >= 3)
            faulty.outage = False
        assert s.shipped_lsn == j.next_lsn - 1
        assert s.statistics().objects == 1
        assert_complete(await read_log(direct), j, 2)


async def test_after_an_outage_another_answered_request_ends_the_backoff(
    proxy: TcpProxy, s3: S3Bucket, tmp_path: Path
) -> None:
    """The shipper's backoff grew long while the link was down; a mirror's GET that
    is answered once it is back wakes the shipper (it would wait out an hour here)."""
    hour = dataclasses.replace(CFG, retry_base_s=3600.0, retry_cap_s=3600.0)
    async with open_journal(tmp_path / "j", JCFG) as j:
        s = Shipper(j, s3, REGION_NAME, config=hour)
        s._rand = random.Random(0)  # the first delay: 0.84 h
        async with trio.open_nursery() as nursery:
            await nursery.start(s.run)
            await produce(j, 2, 1)
            with trio.fail_after(30):
                await s.wait_shipped(j.next_lsn - 1)
            proxy.set_mode(ProxyMode.REFUSE)
            retries = s.statistics().retries
            await produce(j, 2, 1)
            await wait_until(lambda: s.statistics().retries > retries)
            proxy.set_mode(ProxyMode.PASS)
            # What a mirror's next poll does: a request the store answers.
            await s3.head(log_key("", REGION_NAME, 1))
            with trio.fail_after(30):
                await s.wait_shipped(j.next_lsn - 1)
            assert s.statistics().last_error is None
            nursery.cancel_scope.cancel()


async def test_outage_during_the_gc_check_after_a_commit_is_waited_out(
    s3: S3Bucket, direct: S3Bucket, tmp_path: Path
) -> None:
    """After a stall the shipper re-reads the GC boundary; that read may fail too."""
    faulty = FaultyBucket(s3, close_inner=False)
    cfg = ShipperConfig(
        flush_interval_ms=50, gc_check_after_ms=0, retry_base_s=0.05, retry_cap_s=0.5
    )
    async with open_journal(tmp_path / "j", JCFG) as j:
        s = Shipper(j, faulty, REGION_NAME, config=cfg)
        await s.claim()
        await produce(j, 2, 3)
        faulty.operations = ["get"]  # the create goes through, the check does not
        faulty.outage = True
        async with trio.open_nursery() as nursery:
            nursery.start_soon(s.ship_pending)
            await wait_until(lambda: s.statistics().retries >= 2)
            assert s.shipped_lsn == 0  # committed, but not acknowledged before the check
            faulty.outage = False
        assert s.shipped_lsn == j.next_lsn - 1
        await produce(j, 2, 1)
        await s.ship_pending()
        assert_complete(await read_log(direct), j, 2)


async def test_blackholed_store_surfaces_as_unavailable(proxy: TcpProxy, s3: S3Bucket) -> None:
    proxy.set_mode(ProxyMode.BLACKHOLE)
    bound = s3.config.max_request_seconds
    assert bound <= 10
    # A hang guard well above the bound, not a timing assertion.
    with trio.fail_after(bound * 3), pytest.raises(BucketUnavailable, match="timeout"):
        await s3.put("k", b"x", if_none_match=True)


def test_default_timeouts_bound_a_silent_store() -> None:
    config = S3Config(bucket="edgegw")
    # 3 attempts x (5 s connect + 1 s 100-continue + 10 s read) + 1 + 2 s backoff.
    assert config.max_request_seconds == 51
    assert S3Config(bucket="edgegw", max_attempts=1, read_timeout=2).max_request_seconds == 8


# --------------------------------------------------------------- (c) multipart


async def append_random(
    j: Journal, partitions: int, batches: int, rng: random.Random
) -> dict[int, list[bytes]]:
    """About 1 MiB of incompressible records per batch; returns the values by partition."""
    out: dict[int, list[bytes]] = {}
    for _ in range(batches):
        for p in range(partitions):
            values = [rng.randbytes(64 * 1024) for _ in range(16)]
            await j.append(TOPIC, p, encode_batch(values, timestamps=j.next_offset(TOPIC, p)))
            out.setdefault(p, []).extend(values)
    return out


async def read_values(bucket: Bucket, seq: int) -> dict[int, list[bytes]]:
    key = log_key("", REGION_NAME, seq)
    data = (await bucket.get(key)).data
    h = logobject.decode_header(
        data[: logobject.header_length_hint(data[:12], where=key)], where=key
    )
    out: dict[int, list[bytes]] = {}
    for b in h.blocks:
        raw = logobject.decode_block(b, data[b.offset : b.end], where=key)
        for batch in logobject.iter_block_batches(b, raw, where=key):
            out.setdefault(b.partition, []).extend(r.value for r in batch.records())
    return out


async def test_multipart_entries_commit_once_and_fence_a_second_writer(
    s3: S3Bucket, direct: S3Bucket, s3_admin: S3Client, s3_bucket_name: str, tmp_path: Path
) -> None:
    cfg = ShipperConfig(
        flush_interval_ms=50, max_object_bytes=16 * MIB, retry_base_s=0.05, retry_cap_s=0.5
    )
    rng = random.Random(5)
    faulty = FaultyBucket(s3, close_inner=False)
    async with (
        open_journal(tmp_path / "a", JCFG) as ja,
        open_journal(tmp_path / "b", JCFG) as jb,
    ):
        a = Shipper(ja, faulty, REGION_NAME, config=cfg)
        await a.claim()
        sent = await append_random(ja, 2, 6, rng)  # 12 MiB, incompressible
        # The first complete lands but its answer is lost: the retry's
        # CompleteMultipartUpload gets 412 and reads the entry back as ours.
        faulty.fail_next(1, after_commit=True, operations=["put"])
        assert await a.ship_pending() == 1
        assert a.statistics().retries == 1
        key = log_key("", REGION_NAME, 2)
        head = s3_admin.head_object(Bucket=s3_bucket_name, Key=key)
        assert head["ETag"].strip('"').endswith("-3"), "not a 3-part multipart upload"
        assert head["ContentLength"] > 12 * MIB
        got = await read_values(direct, 2)
        assert got == sent
        # A second writer's multipart create of the same seq is refused (412)
        # and its upload aborted; the entry is unchanged. (Sequentially: moto
        # 5.2.5 checks If-None-Match on CompleteMultipartUpload before
        # assembling the parts, so two *concurrent* completes both succeed
        # there; AWS refuses one. Log entries stay below the multipart
        # threshold with the default sizes, and fences are single PUTs.)
        with pytest.raises(PreconditionFailed):
            await s3.put(key, os.urandom(11 * MIB), if_none_match=True)
        assert (await read_values(direct, 2)) == got

        # A new gateway claims the region; the old one's next (multipart)
        # create hits the fence's seq, gets 412 and stops with Fenced.
        b = Shipper(jb, s3, REGION_NAME, config=cfg)
        await b.claim()
        await append_random(ja, 2, 6, rng)
        with pytest.raises(Fenced):
            await a.ship_pending()
        assert s3_admin.list_multipart_uploads(Bucket=s3_bucket_name).get("Uploads", []) == []
        # B's journal restarted after A's last LSN (its checkpoint takes one).
        log = await read_log(direct, single_writer=False)
        assert [h.epoch for h in log.headers] == [1, 1, 2]


async def test_lost_answer_to_a_completion_resolves_as_committed(
    proxy: TcpProxy,
    s3: S3Bucket,
    direct: S3Bucket,
    s3_admin: S3Client,
    s3_bucket_name: str,
    tmp_path: Path,
) -> None:
    """The store completes the upload; the answer (and botocore's retry's) never arrives."""
    cfg = ShipperConfig(max_object_bytes=16 * MIB, retry_base_s=0.05, retry_cap_s=0.5)
    rng = random.Random(17)
    async with open_journal(tmp_path / "j", JCFG) as j:
        s = Shipper(j, s3, REGION_NAME, config=cfg)
        await s.claim()
        sent = await append_random(j, 2, 6, rng)
        client = s3._client
        complete = client.complete_multipart_upload
        lost: list[str] = []

        def answer_lost(**kwargs: Any) -> Any:
            if "/log/" not in kwargs["Key"] or lost:
                return complete(**kwargs)
            lost.append(kwargs["UploadId"])
            proxy.set_mode(ProxyMode.DROP_RESPONSES)  # parts are in: only this answer goes
            try:
                return complete(**kwargs)
            finally:
                proxy.set_mode(ProxyMode.PASS)

        client.complete_multipart_upload = answer_lost  # type: ignore[method-assign]
        assert await s.ship_pending() == 1
        assert lost
        # Unknown outcome, retried as a new upload whose completion got 412;
        # the entry read back was ours: committed once, the retry aborted.
        assert s.statistics().retries == 1
        assert s.shipped_lsn == j.next_lsn - 1
    assert s3_admin.list_multipart_uploads(Bucket=s3_bucket_name).get("Uploads", []) == []
    log = await read_log(direct)
    assert [(h.epoch, h.is_fence) for h in log.headers] == [(1, True), (1, False)]
    assert await read_values(direct, 2) == sent


async def test_killed_between_parts_and_completion_next_claim_aborts_the_upload(
    moto_endpoint: str,
    direct: S3Bucket,
    s3_admin: S3Client,
    s3_bucket_name: str,
    tmp_path: Path,
) -> None:
    rng = random.Random(11)
    async with open_journal(tmp_path / "j", JCFG) as j:
        sent = await append_random(j, 2, 6, rng)  # 12 MiB, incompressible: 3 parts
    # A real process, killed -9 after its parts are in, before the completion.
    with trio.fail_after(120):
        child = await trio.run_process(
            [sys.executable, str(MULTIPART_CHILD), tmp_path / "j", moto_endpoint, s3_bucket_name],
            capture_stderr=True,
            check=False,
        )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    uploads = s3_admin.list_multipart_uploads(Bucket=s3_bucket_name).get("Uploads", [])
    assert [u["Key"] for u in uploads] == [log_key("", REGION_NAME, 2)]
    parts = s3_admin.list_parts(
        Bucket=s3_bucket_name, Key=uploads[0]["Key"], UploadId=uploads[0]["UploadId"]
    )
    assert len(parts["Parts"]) == 3
    with pytest.raises(NotFound):
        await direct.head(log_key("", REGION_NAME, 2))

    cfg = ShipperConfig(max_object_bytes=16 * MIB, retry_base_s=0.05, retry_cap_s=0.5)
    async with open_journal(tmp_path / "j", JCFG) as j:
        s = Shipper(j, direct, REGION_NAME, config=cfg)
        await s.claim()
        assert s.statistics().uploads_aborted == 1
        assert s3_admin.list_multipart_uploads(Bucket=s3_bucket_name).get("Uploads", []) == []
        assert await s.ship_pending() == 1
        assert s.shipped_lsn == j.next_lsn - 1
    log = await read_log(direct)
    assert [(h.epoch, h.is_fence) for h in log.headers] == [(1, True), (2, True), (2, False)]
    assert await read_values(direct, 3) == sent


async def test_a_new_writer_claims_while_an_upload_completes_the_old_one_is_fenced(
    s3: S3Bucket, direct: S3Bucket, s3_admin: S3Client, s3_bucket_name: str, tmp_path: Path
) -> None:
    """B claims the region between A's parts and A's completion of the same seq."""
    cfg = ShipperConfig(max_object_bytes=16 * MIB, retry_base_s=0.05, retry_cap_s=0.5)
    rng = random.Random(13)
    async with (
        open_journal(tmp_path / "a", JCFG) as ja,
        open_journal(tmp_path / "b", JCFG) as jb,
    ):
        a = Shipper(ja, s3, REGION_NAME, config=cfg)
        b = Shipper(jb, direct, REGION_NAME, config=cfg)
        await a.claim()
        await append_random(ja, 2, 6, rng)
        client = s3._client
        complete = client.complete_multipart_upload
        claimed: list[int] = []

        def b_claims_first(**kwargs: Any) -> Any:
            # In A's worker thread, with A's parts in: B claims (its fence
            # takes A's seq, and it aborts A's unfinished upload), then A's
            # completion goes out.
            if "/log/" in kwargs["Key"] and not claimed:
                trio.from_thread.run(b.claim)
                claimed.append(b.statistics().uploads_aborted)
            return complete(**kwargs)

        client.complete_multipart_upload = b_claims_first  # type: ignore[method-assign]
        with pytest.raises(Fenced):
            await a.ship_pending()
        assert claimed == [1]
        assert a.shipped_lsn == 0
        assert s3_admin.list_multipart_uploads(Bucket=s3_bucket_name).get("Uploads", []) == []
        log = await read_log(direct, single_writer=False)
        assert [(h.epoch, h.is_fence) for h in log.headers] == [(1, True), (2, True)]


# ------------------------------------------------------------ (d) two writers


async def test_two_shippers_for_one_region_the_older_is_fenced(
    s3: S3Bucket, direct: S3Bucket, tmp_path: Path
) -> None:
    fenced: list[Fenced] = []

    async def run_until_fenced(s: Shipper, task_status: trio.TaskStatus[None]) -> None:
        try:
            await s.run(task_status=task_status)
        except Fenced as exc:
            fenced.append(exc)

    async with (
        open_journal(tmp_path / "a", JCFG) as ja,
        open_journal(tmp_path / "b", JCFG) as jb,
    ):
        a = Shipper(ja, s3, REGION_NAME, config=CFG)
        b = Shipper(jb, s3, REGION_NAME, config=CFG)
        async with trio.open_nursery() as nursery:
            await nursery.start(run_until_fenced, a)
            await produce(ja, 3, 4)
            with trio.fail_after(30):
                await a.wait_shipped(ja.next_lsn - 1)
            shipped_by_a = {p: ja.next_offset(TOPIC, p) for p in range(3)}
            # B starts on an empty journal: it claims the next epoch and
            # continues every partition's offsets where the log ends.
            await nursery.start(run_until_fenced, b)
            assert b.statistics().epoch == a.statistics().epoch + 1
            assert {p: jb.next_offset(TOPIC, p) for p in range(3)} == shipped_by_a
            await produce(jb, 3, 2)
            await produce(ja, 3, 2)  # A's next create meets B's entries
            await wait_until(lambda: bool(fenced))
            with trio.fail_after(30):
                await b.wait_shipped(jb.next_lsn - 1)
            nursery.cancel_scope.cancel()
        assert len(fenced) == 1
        assert "replaced" in str(fenced[0])
        log = await read_log(direct, single_writer=False)
        # A's records up to the claim, then B's, with no offset used twice.
        assert_complete(log, jb, 3)
        epochs = [h.epoch for h in log.headers]
        assert epochs == sorted(epochs)
        assert set(epochs) == {1, 2}


async def test_fenced_in_a_pipelined_drain_drops_what_was_built_ahead(
    s3: S3Bucket, direct: S3Bucket, tmp_path: Path
) -> None:
    async with (
        open_journal(tmp_path / "a", JCFG) as ja,
        open_journal(tmp_path / "b", JCFG) as jb,
    ):
        a = Shipper(ja, s3, REGION_NAME, config=CFG)
        await a.claim()
        await produce(ja, 3, 2)
        assert await a.ship_pending() == 1
        await produce(ja, 3, 40)  # a backlog of several full objects
        b = Shipper(jb, s3, REGION_NAME, config=CFG)
        await b.claim()
        with pytest.raises(Fenced):
            await a.ship_pending()
        await produce(jb, 3, 1)
        await b.ship_pending()
        log = await read_log(direct, single_writer=False)
        # A's first entry, B's fence and entry: nothing of A's backlog landed.
        assert [(h.epoch, h.is_fence) for h in log.headers] == [
            (1, True),
            (1, False),
            (2, True),
            (2, False),
        ]
        assert_complete(log, jb, 3)
