"""A wrapper that injects faults into any bucket, for tests and scenarios.

Faults are plain attributes, changed at any time by the test::

    bucket = FaultyBucket(inner, seed=7)
    bucket.outage = True                 # every selected call: BucketUnavailable
    bucket.latency = 0.2                 # seconds added before each selected call
    bucket.error_rate = 0.1              # random BucketUnavailable before the call
    bucket.lost_response_rate = 0.1      # the call happens, then BucketUnavailable
    bucket.operations = {"put"}          # which operations the above apply to
    bucket.honor_conditions = False      # a store that ignores If-None-Match/If-Match
    bucket.refuse_if_match = True        # a store that answers 412 to every If-Match
    bucket.fail_next(2, after_commit=True, operations={"put"})  # deterministic

Random faults draw from ``random.Random(seed)``, so a run is reproducible
given the same sequence of calls. Injected errors say "injected" in their
message and are counted in :attr:`FaultyBucket.injected`.
"""

from __future__ import annotations

import builtins
import random
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

import trio

from edge_gateway.bucket._base import OPERATIONS, Bucket, GetResult, ObjectInfo
from edge_gateway.bucket._delegating import DelegatingBucket
from edge_gateway.bucket._errors import BucketUnavailable, InvalidRequest, PreconditionFailed

_T = TypeVar("_T")


def _operations(names: Iterable[str] | None) -> frozenset[str] | None:
    if names is None:
        return None
    selected = frozenset(names)
    unknown = selected - OPERATIONS
    if unknown:
        raise InvalidRequest(f"unknown operations {sorted(unknown)}; known: {sorted(OPERATIONS)}")
    return selected


class FaultyBucket(DelegatingBucket):
    """A :class:`Bucket` that forwards to ``inner`` and injects faults on the way.

    With no fault set it is transparent (the contract suite runs through it).
    ``aclose()`` closes ``inner`` too unless ``close_inner=False``.
    """

    def __init__(self, inner: Bucket, *, seed: int = 0, close_inner: bool = True) -> None:
        super().__init__(inner, close_inner=close_inner)
        #: While true, every selected call fails with BucketUnavailable without reaching inner.
        self.outage = False
        #: Seconds of extra delay before each selected call.
        self.latency = 0.0
        #: Probability that a selected call fails before reaching inner.
        self.error_rate = 0.0
        #: Probability that a selected call reaches inner and succeeds, but the
        #: caller gets BucketUnavailable: the "lost response" of a committed write.
        self.lost_response_rate = 0.0
        #: When false, puts drop if_none_match/if_match, like a store that
        #: ignores conditional headers (the probe must refuse it).
        self.honor_conditions = True
        #: When true, every put with if_match fails with PreconditionFailed
        #: without reaching inner, like a store that refuses compare-and-swap
        #: (or wants the ETag in a form the caller does not send).
        self.refuse_if_match = False
        #: Number of faults injected so far.
        self.injected = 0
        self._selected: frozenset[str] | None = None
        # Reproducible faults, not security: a seeded PRNG is the point.
        self._random = random.Random(seed)
        self._scripted = 0
        self._scripted_after_commit = False
        self._scripted_operations: frozenset[str] | None = None

    @property
    def operations(self) -> frozenset[str] | None:
        """Operations that outage, latency and the rates apply to (``None``: all)."""
        return self._selected

    @operations.setter
    def operations(self, names: Iterable[str] | None) -> None:
        self._selected = _operations(names)

    def fail_next(
        self, count: int = 1, *, after_commit: bool = False, operations: Iterable[str] | None = None
    ) -> None:
        """Make the next ``count`` calls of ``operations`` (default: any) fail.

        With ``after_commit=True`` the call reaches the inner bucket first (a
        put lands) and the caller still gets :class:`BucketUnavailable`.
        Replaces any earlier ``fail_next`` that has not run out.
        """
        self._scripted = count
        self._scripted_after_commit = after_commit
        self._scripted_operations = _operations(operations)

    @property
    def name(self) -> str:
        """``faulty+<inner name>``."""
        return f"faulty+{self.inner.name}"

    def describe(self) -> str:
        """The inner bucket's description, marked as wrapped."""
        return f"{self.inner.describe()} (fault-injecting wrapper)"

    # -- hooks --------------------------------------------------------------

    async def _put(
        self, key: str, data: bytes, *, if_none_match: bool, if_match: str | None
    ) -> ObjectInfo:
        if not self.honor_conditions:
            if_none_match, if_match = False, None
        if if_match is not None and self.refuse_if_match:
            self.injected += 1
            raise PreconditionFailed(
                f"put of key {key!r} on {self.describe()}: injected refusal of If-Match", key=key
            )
        return await self._around(
            "put",
            key,
            lambda: self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match),
        )

    async def _get(self, key: str, start: int, end: int | None) -> GetResult:
        return await self._around("get", key, lambda: self.inner.get(key, start=start, end=end))

    async def _head(self, key: str) -> ObjectInfo:
        return await self._around("head", key, lambda: self.inner.head(key))

    async def _list(
        self, prefix: str, *, start_after: str | None, limit: int | None
    ) -> builtins.list[ObjectInfo]:
        return await self._around(
            "list", None, lambda: self.inner.list(prefix, start_after=start_after, limit=limit)
        )

    async def _delete(self, key: str) -> None:
        await self._around("delete", key, lambda: self.inner.delete(key))

    # -- injection ------------------------------------------------------------------

    async def _around(
        self, operation: str, key: str | None, call: Callable[[], Awaitable[_T]]
    ) -> _T:
        selected = self._selected is None or operation in self._selected
        if selected and self.latency > 0:
            await trio.sleep(self.latency)
        if selected and self.outage:
            raise self._fault(operation, key, "outage")
        # Taken only now, so calls refused by an outage do not use it up.
        scripted = self._take_scripted(operation)
        if scripted == "before":
            raise self._fault(operation, key, "scripted failure")
        if selected and self.error_rate > 0 and self._random.random() < self.error_rate:
            raise self._fault(operation, key, "random failure")
        result = await call()
        if scripted == "after":
            raise self._fault(operation, key, "lost response after commit")
        if (
            selected
            and self.lost_response_rate > 0
            and self._random.random() < self.lost_response_rate
        ):
            raise self._fault(operation, key, "random lost response after commit")
        return result

    def _take_scripted(self, operation: str) -> str | None:
        if self._scripted <= 0:
            return None
        if self._scripted_operations is not None and operation not in self._scripted_operations:
            return None
        self._scripted -= 1
        return "after" if self._scripted_after_commit else "before"

    def _fault(self, operation: str, key: str | None, kind: str) -> BucketUnavailable:
        self.injected += 1
        what = f"{operation} of key {key!r}" if key is not None else operation
        return BucketUnavailable(f"{what} on {self.describe()}: injected {kind}", key=key)
