"""A paged listing collected into the interface's answer (the Azure and GCS backends).

Both SDKs list page by page in a worker thread; what is left is the same:
strip the bucket's prefix, skip keys up to ``start_after`` (Azure has no
start-after, and an emulator may ignore GCS's start offset), sort, and stop
at ``limit``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from edge_gateway.bucket._base import ObjectInfo


async def collect_listing(
    next_page: Callable[[], Awaitable[list[Any] | None]],
    strip: str,
    start_after: str | None,
    limit: int | None,
    info: Callable[[Any, str], ObjectInfo],
) -> list[ObjectInfo]:
    """The objects of a listing, by key, after ``start_after``, at most ``limit``.

    ``next_page`` returns the next page of listed items (each with a
    ``name``: the full key) or None at the end; one call per page, so a long
    listing neither holds a limiter slot throughout nor ignores cancellation
    between pages. ``info`` makes the :class:`ObjectInfo` of an item, given
    its key with ``strip`` removed. The result is sorted by key whatever
    order the service lists in, so the interface's promise never rests on a
    service detail.
    """
    out: list[ObjectInfo] = []
    while limit is None or len(out) < limit:
        page = await next_page()
        if page is None:
            break
        for item in page:
            name: str = item.name
            if not name.startswith(strip):
                continue
            key = name[len(strip) :]
            if start_after is not None and key <= start_after:
                continue
            out.append(info(item, key))
    out.sort(key=lambda i: i.key)
    return out if limit is None else out[:limit]
