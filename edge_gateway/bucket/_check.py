"""What ``edgegw bucket check`` proves about a store, before a rollout.

edgegw needs little from a store, but needs it exactly (``docs/bucket.md``):
a create that fails when the key exists, also under races; a compare-and-
swap on the ETag; ranged reads; a 404 that means absent; LIST by prefix;
deletes; reads that see the last write. :func:`check_store` runs each of
these against a real bucket, in a scratch prefix (``_edgegw-check/<uuid>/``)
that it deletes afterwards, and measures the latency of small conditional
PUTs and GETs and the throughput of larger objects. It returns a
:class:`StoreReport`; ``ok`` is true when every *required* check passed.

Checks never raise for what the store answers: a store that ignores a
condition, or refuses a request's form (another 4xx), is a failed check with
a sentence saying what it did. Outages and refusals
(:class:`BucketUnavailable`, :class:`AccessDenied`) propagate: a store that
cannot be reached has not been checked.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import trio

from edge_gateway.bucket._base import Bucket
from edge_gateway.bucket._errors import InvalidRequest, NotFound, PreconditionFailed
from edge_gateway.errors import EdgeGatewayError

#: Scratch keys live under this (plus a fresh uuid per run).
SCRATCH: Final = "_edgegw-check"
#: Result of a check that passed, failed, or passed with edgegw working around the store.
PASS: Final = "pass"  # noqa: S105 - a verdict, not a password
FAIL: Final = "fail"
WORKAROUND: Final = "workaround"
#: Informational rows (figures) have no verdict.
INFO: Final = "info"

_CLEANUP_TIMEOUT: Final = 30.0


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One row of the report."""

    name: str
    result: str
    detail: str
    required: bool = True

    @property
    def failed(self) -> bool:
        return self.required and self.result == FAIL


@dataclass(frozen=True, slots=True)
class StoreReport:
    """Everything :func:`check_store` found."""

    store: str
    checks: tuple[CheckResult, ...]
    #: Figures: ``put_p50_ms``, ``put_p99_ms``, ``get_p50_ms``, ``get_p99_ms``,
    #: ``write_mb_s``, ``read_mb_s``, ``samples``, ``throughput_bytes``.
    figures: dict[str, float] = field(default_factory=dict)
    #: Keys of the scratch prefix that could not be deleted (normally none).
    leftovers: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether edgegw can run on this store: every required check passed."""
        return not any(c.failed for c in self.checks)

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.failed)

    def to_json(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "ok": self.ok,
            "checks": [asdict(c) for c in self.checks],
            "figures": dict(self.figures),
            "leftovers": list(self.leftovers),
        }


class _Failed(Exception):
    """A check found the store wanting (the message says how)."""


class _Workaround(Exception):
    """The store lacks the behaviour, and edgegw works around it (the message says how)."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise _Failed(message)


async def check_store(
    bucket: Bucket,
    prefix: str = "",
    *,
    racers: int = 50,
    samples: int = 20,
    throughput_bytes: int = 16 * 1024 * 1024,
    object_bytes: int = 4 * 1024 * 1024,
) -> StoreReport:
    """Run the contract edgegw relies on against ``bucket`` under ``prefix``; clean up.

    ``racers`` concurrent creators (and swappers) of one key; ``samples``
    small conditional PUTs and GETs for the latency figures;
    ``throughput_bytes`` written and read back in objects of
    ``object_bytes``, four at a time, for the throughput figures.
    """
    root = f"{prefix.rstrip('/')}/" if prefix.strip("/") else ""
    scratch = f"{root}{SCRATCH}/{uuid.uuid4().hex}/"
    checks: list[CheckResult] = []
    figures: dict[str, float] = {}

    async def run(name: str, body: Callable[[], Awaitable[str]], *, required: bool = True) -> None:
        try:
            detail = await body()
        except _Failed as exc:
            checks.append(CheckResult(name, FAIL, str(exc), required))
        except InvalidRequest as exc:
            # A 4xx other than 412/404: the store refused the request's form
            # (a conditional header it does not implement, say).
            checks.append(CheckResult(name, FAIL, f"the store refused the request: {exc}"))
        except _Workaround as exc:
            checks.append(CheckResult(name, WORKAROUND, str(exc), required))
        else:
            checks.append(CheckResult(name, PASS, detail, required))

    def k(name: str) -> str:
        return scratch + name

    try:
        await run("conditional create: new key", lambda: _create_new(bucket, k("create/new")))
        await run(
            "conditional create: existing key",
            lambda: _create_existing(bucket, k("create/existing")),
        )
        await run(
            f"conditional create: {racers} racers",
            lambda: _create_race(bucket, k("create/race"), racers),
        )
        await run("conditional overwrite (If-Match)", lambda: _overwrite(bucket, k("cas/")))
        await run(
            f"conditional overwrite: {min(racers, 10)} racers",
            lambda: _overwrite_race(bucket, k("cas/race"), min(racers, 10)),
        )
        await run(
            "conditional multipart complete",
            lambda: _multipart(bucket),
        )
        await run("ranged GET", lambda: _ranged(bucket, k("ranged")))
        await run("GET/HEAD of a missing key", lambda: _missing(bucket, k("missing")))
        await run("LIST by prefix", lambda: _list(bucket, k("list/")))
        await run("delete", lambda: _delete(bucket, k("delete")))
        await run("read-after-write", lambda: _read_after_write(bucket, k("raw")))
        figures.update(await _latency(bucket, k("latency/"), samples))
        checks.append(
            CheckResult(
                "small conditional PUT latency",
                INFO,
                f"p50 {figures['put_p50_ms']:.1f} ms, p99 {figures['put_p99_ms']:.1f} ms "
                f"({samples} PUTs of 1 KiB)",
                required=False,
            )
        )
        checks.append(
            CheckResult(
                "small GET latency",
                INFO,
                f"p50 {figures['get_p50_ms']:.1f} ms, p99 {figures['get_p99_ms']:.1f} ms "
                f"({samples} GETs of 1 KiB)",
                required=False,
            )
        )
        if throughput_bytes > 0:
            figures.update(
                await _throughput(bucket, k("throughput/"), throughput_bytes, object_bytes)
            )
            checks.append(
                CheckResult(
                    "throughput",
                    INFO,
                    f"write {figures['write_mb_s']:.1f} MB/s, read {figures['read_mb_s']:.1f} "
                    f"MB/s ({throughput_bytes // (1024 * 1024)} MiB in objects of "
                    f"{object_bytes // (1024 * 1024)} MiB, 4 at a time)",
                    required=False,
                )
            )
    finally:
        with trio.move_on_after(_CLEANUP_TIMEOUT, shield=True):
            leftovers = await _clean(bucket, scratch)
    return StoreReport(bucket.describe(), tuple(checks), figures, leftovers)


# --------------------------------------------------------------------------
# the checks (each returns a detail, raises _Failed or _Workaround)


async def _create_new(bucket: Bucket, key: str) -> str:
    info = await bucket.put(key, b"first", if_none_match=True)
    got = await bucket.get(key)
    _require(got.data == b"first", "the object read back is not the one created")
    return f"created, ETag {info.etag}"


async def _create_existing(bucket: Bucket, key: str) -> str:
    await bucket.put(key, b"first", if_none_match=True)
    try:
        await bucket.put(key, b"second", if_none_match=True)
    except PreconditionFailed:
        pass
    else:
        raise _Failed(
            "the store accepted a second create-only put of one key (it ignores "
            "If-None-Match: *): writers of one region cannot be fenced"
        )
    _require(
        (await bucket.get(key)).data == b"first",
        "the store answered 412 but replaced the object anyway",
    )
    return "412 PreconditionFailed; the first object kept"


async def _create_race(bucket: Bucket, key: str, racers: int) -> str:
    winners: list[int] = []
    losers: list[int] = []

    async def create(i: int) -> None:
        try:
            await bucket.put(key, f"racer {i}".encode(), if_none_match=True)
        except PreconditionFailed:
            losers.append(i)
        else:
            winners.append(i)

    async with trio.open_nursery() as nursery:
        for i in range(racers):
            nursery.start_soon(create, i)
    _require(len(winners) == 1, f"{len(winners)} of {racers} concurrent creators succeeded")
    data = (await bucket.get(key)).data
    _require(data == f"racer {winners[0]}".encode(), "the object is not the winner's")
    return f"exactly one winner, {len(losers)} got 412"


async def _overwrite(bucket: Bucket, base: str) -> str:
    key = base + "state"
    v1 = await bucket.put(key, b"v1")
    try:
        v2 = await bucket.put(key, b"v2", if_match=v1.etag)
    except PreconditionFailed as exc:
        raise _Failed(
            f"a compare-and-swap with the current ETag was refused ({exc}): bucket GC "
            "cannot advance its boundary here"
        ) from None
    try:
        await bucket.put(key, b"v3", if_match=v1.etag)
    except PreconditionFailed:
        pass
    else:
        raise _Failed("a compare-and-swap with a stale ETag succeeded (If-Match is ignored)")
    _require((await bucket.get(key)).data == b"v2", "a refused swap changed the object")
    try:
        await bucket.put(base + "absent", b"x", if_match=v2.etag)
    except (PreconditionFailed, NotFound) as exc:
        missing = "404" if isinstance(exc, NotFound) else "412"
    else:
        raise _Failed("a compare-and-swap on a missing key created it")
    form = getattr(bucket, "if_match_form", None)
    how = f"; the store wants the {form} ETag" if form == "bare" else ""
    return f"right ETag replaced, stale ETag 412, missing key {missing}{how}"


async def _overwrite_race(bucket: Bucket, key: str, racers: int) -> str:
    base = await bucket.put(key, b"base")
    won: list[int] = []

    async def swap(i: int) -> None:
        try:
            await bucket.put(key, f"racer {i}".encode(), if_match=base.etag)
        except PreconditionFailed:
            pass
        else:
            won.append(i)

    async with trio.open_nursery() as nursery:
        for i in range(racers):
            nursery.start_soon(swap, i)
    _require(len(won) == 1, f"{len(won)} of {racers} concurrent swaps succeeded")
    return "exactly one winner"


async def _multipart(bucket: Bucket) -> str:
    probe: Callable[[], Awaitable[bool]] | None = getattr(
        bucket, "multipart_create_is_conditional", None
    )
    if probe is None:
        return "not applicable (this backend has no multipart uploads)"
    commit = getattr(bucket, "multipart_commit", "CompleteMultipartUpload")
    if await probe():
        return f"412 on {commit} onto an existing key"
    raise _Workaround(
        getattr(
            bucket,
            "multipart_workaround",
            "the store ignores If-None-Match on CompleteMultipartUpload; edgegw sends every "
            "create-only put as one PutObject on it (up to 5 GiB), so it stays create-only",
        )
    )


async def _ranged(bucket: Bucket, key: str) -> str:
    content = os.urandom(4096)
    info = await bucket.put(key, content)
    for start, end in ((0, 100), (1000, 3000), (4000, None), (4090, 5000)):
        got = await bucket.get(key, start=start, end=end)
        _require(
            got.data == content[start:end] and got.size == len(content) and got.etag == info.etag,
            f"bytes {start}..{end} came back wrong (size {got.size}, {len(got.data)} bytes)",
        )
    return "every range returned the right bytes, size and ETag"


async def _missing(bucket: Bucket, key: str) -> str:
    for what, call in (("GET", bucket.get), ("HEAD", bucket.head)):
        try:
            await call(key)
        except NotFound:
            continue
        raise _Failed(f"{what} of a missing key did not answer 404")
    return "404 for both"


async def _list(bucket: Bucket, base: str) -> str:
    keys = [f"{base}log/{i:020d}" for i in range(12)]
    async with trio.open_nursery() as nursery:
        for key in [*keys, f"{base}other"]:
            nursery.start_soon(bucket.put, key, b".")
    listed = [i.key for i in await bucket.list(f"{base}log/")]
    _require(listed == keys, f"LIST returned {len(listed)} keys, not the 12 written, in order")
    after = [i.key for i in await bucket.list(f"{base}log/", start_after=keys[4])]
    _require(after == keys[5:], "LIST with start-after did not start after the key")
    return "sorted, by prefix, with start-after"


async def _delete(bucket: Bucket, key: str) -> str:
    await bucket.put(key, b"x")
    await bucket.delete(key)
    try:
        await bucket.get(key)
    except NotFound:
        pass
    else:
        raise _Failed("a deleted object can still be read")
    await bucket.delete(key)  # deleting a missing key succeeds
    return "gone at once; deleting a missing key succeeds"


async def _read_after_write(bucket: Bucket, key: str) -> str:
    for i in range(5):
        data = f"version {i}".encode()
        await bucket.put(key, data)
        got = await bucket.get(key)
        _require(got.data == data, f"a read right after a write returned an older version ({i})")
    return "every read saw the write before it"


async def _latency(bucket: Bucket, base: str, samples: int) -> dict[str, float]:
    body = os.urandom(1024)
    puts: list[float] = []
    gets: list[float] = []
    for i in range(samples):
        start = time.perf_counter()
        await bucket.put(f"{base}{i}", body, if_none_match=True)
        puts.append((time.perf_counter() - start) * 1000)
    for i in range(samples):
        start = time.perf_counter()
        await bucket.get(f"{base}{i}")
        gets.append((time.perf_counter() - start) * 1000)
    return {
        "samples": samples,
        "put_p50_ms": _percentile(puts, 50),
        "put_p99_ms": _percentile(puts, 99),
        "get_p50_ms": _percentile(gets, 50),
        "get_p99_ms": _percentile(gets, 99),
    }


async def _throughput(bucket: Bucket, base: str, total: int, object_bytes: int) -> dict[str, float]:
    count = max(1, total // object_bytes)
    data = os.urandom(object_bytes)
    limiter = trio.CapacityLimiter(4)

    async def put(i: int) -> None:
        async with limiter:
            await bucket.put(f"{base}{i}", data, if_none_match=True)

    async def get(i: int) -> None:
        async with limiter:
            await bucket.get(f"{base}{i}")

    rates = {}
    for label, one in (("write_mb_s", put), ("read_mb_s", get)):
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(count):
                nursery.start_soon(one, i)
        rates[label] = count * object_bytes / (time.perf_counter() - start) / 1e6
    return {**rates, "throughput_bytes": count * object_bytes}


def _percentile(values: list[float], p: int) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, (len(ordered) * p) // 100)]


async def _clean(bucket: Bucket, scratch: str) -> tuple[str, ...]:
    """Delete everything under ``scratch``; returns what is left."""
    try:
        for info in await bucket.list(scratch):
            await bucket.delete(info.key)
        return tuple(i.key for i in await bucket.list(scratch))
    except EdgeGatewayError:
        return (f"{scratch} (could not list or delete)",)
