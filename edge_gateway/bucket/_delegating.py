"""A bucket that forwards every call to another: the base of the wrappers.

The fault injector (:class:`~edge_gateway.bucket.FaultyBucket`), the link
meter (:class:`~edge_gateway.bucket.MeteredBucket`) and the mirrors' link
hold (:class:`~edge_gateway.bucket.HeldBucket`) each change one or two
calls; the rest pass through unchanged from here, so a call added to the
interface is forwarded by all of them at once.
"""

from __future__ import annotations

import builtins

from edge_gateway.bucket._base import Bucket, GetResult, ObjectInfo


class DelegatingBucket(Bucket):
    """Forwards to ``inner``; ``aclose()`` closes ``inner`` too when ``close_inner``."""

    def __init__(self, inner: Bucket, *, close_inner: bool = True) -> None:
        super().__init__()
        self.inner = inner
        self._close_inner = close_inner

    @property
    def name(self) -> str:
        return self.inner.name

    def describe(self) -> str:
        return self.inner.describe()

    async def check_exists(self) -> None:
        await self.inner.check_exists()

    async def wait_reachable(self) -> None:
        await self.inner.wait_reachable()

    async def _put(
        self, key: str, data: bytes, *, if_none_match: bool, if_match: str | None
    ) -> ObjectInfo:
        return await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    async def _get(self, key: str, start: int, end: int | None) -> GetResult:
        return await self.inner.get(key, start=start, end=end)

    async def _head(self, key: str) -> ObjectInfo:
        return await self.inner.head(key)

    async def _list(
        self, prefix: str, *, start_after: str | None, limit: int | None
    ) -> builtins.list[ObjectInfo]:
        return await self.inner.list(prefix, start_after=start_after, limit=limit)

    async def _delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def _abort_incomplete_uploads(self, prefix: str) -> int:
        return await self.inner.abort_incomplete_uploads(prefix)

    async def _aclose(self) -> None:
        if self._close_inner:
            await self.inner.aclose()
