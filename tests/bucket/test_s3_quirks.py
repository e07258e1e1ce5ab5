"""S3Bucket on stores whose conditional writes differ from AWS's (issue 27).

Each store is moto's server behind the quirks of a real one
(tests/_quirky_s3.py), a real process over HTTP: Ceph RGW 16.2 compares
``If-Match`` with the bare ETag and ignores ``If-None-Match`` on
CompleteMultipartUpload; a store may refuse ``If-Match`` altogether.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import trio
from _bucket_support import MIB, make_s3_config
from _quirky_s3 import new_bucket_on

from edge_gateway.bucket import NotFound, PreconditionFailed, S3Bucket

Quirky = Callable[..., str]


async def _open(endpoint: str) -> S3Bucket:
    return await S3Bucket.open(make_s3_config(endpoint, new_bucket_on(endpoint), prefix="p/"))


async def test_cas_learns_the_bare_etag_form_of_rgw(quirky_s3: Quirky) -> None:
    async with await _open(quirky_s3("bare-if-match")) as bucket:
        assert bucket.if_match_form is None
        v1 = await bucket.put("gc-boundary.json", b'{"seq": 1}')
        assert v1.etag.startswith('"')  # handed out quoted, as S3 does
        v2 = await bucket.put("gc-boundary.json", b'{"seq": 2}', if_match=v1.etag)
        assert bucket.if_match_form == "bare"
        assert (await bucket.get("gc-boundary.json")).data == b'{"seq": 2}'
        # Learned: the next swap takes one request, a stale one is refused.
        puts = bucket.statistics().puts
        v3 = await bucket.put("gc-boundary.json", b'{"seq": 3}', if_match=v2.etag)
        with pytest.raises(PreconditionFailed):
            await bucket.put("gc-boundary.json", b'{"seq": 4}', if_match=v2.etag)
        assert bucket.statistics().puts == puts + 2
        assert (await bucket.get("gc-boundary.json")).etag == v3.etag


async def test_stale_and_missing_before_the_form_is_learned(quirky_s3: Quirky) -> None:
    async with await _open(quirky_s3("bare-if-match")) as bucket:
        v1 = await bucket.put("k", b"one")
        await bucket.put("k", b"two")
        with pytest.raises(PreconditionFailed):
            await bucket.put("k", b"three", if_match=v1.etag)
        assert bucket.if_match_form is None  # a real mismatch teaches nothing
        # RGW answers 412 for a missing key; the read-back tells it is gone.
        with pytest.raises(NotFound):
            await bucket.put("absent", b"x", if_match=v1.etag)
        assert (await bucket.get("k")).data == b"two"


async def test_racers_on_an_unlearned_store_exactly_one_wins(quirky_s3: Quirky) -> None:
    endpoint = quirky_s3("bare-if-match")
    name = new_bucket_on(endpoint)
    for round_ in range(3):
        # A fresh bucket object per round: every racer starts without the form.
        async with await S3Bucket.open(make_s3_config(endpoint, name)) as bucket:
            key = f"state-{round_}"
            base = await bucket.put(key, b"base")
            won: list[int] = []
            lost: list[int] = []

            async def swap(
                i: int, bucket: S3Bucket, key: str, etag: str, won: list[int], lost: list[int]
            ) -> None:
                try:
                    await bucket.put(key, f"racer {i}".encode(), if_match=etag)
                except PreconditionFailed:
                    lost.append(i)
                else:
                    won.append(i)

            async with trio.open_nursery() as nursery:
                for i in range(8):
                    nursery.start_soon(swap, i, bucket, key, base.etag, won, lost)
            assert len(won) == 1, won
            assert len(lost) == 7
            assert (await bucket.get(key)).data == f"racer {won[0]}".encode()


async def test_moto_keeps_the_quoted_form(s3_config: object) -> None:
    from edge_gateway.bucket import S3Config

    assert isinstance(s3_config, S3Config)
    async with await S3Bucket.open(s3_config) as bucket:
        v1 = await bucket.put("k", b"one")
        await bucket.put("k", b"two", if_match=v1.etag)
        assert bucket.if_match_form == "quoted"


async def test_a_store_refusing_if_match_is_named(quirky_s3: Quirky) -> None:
    async with await _open(quirky_s3("refuse-if-match")) as bucket:
        v1 = await bucket.put("k", b"one")
        with pytest.raises(PreconditionFailed, match="does not support compare-and-swap"):
            await bucket.put("k", b"two", if_match=v1.etag)
        assert (await bucket.get("k")).data == b"one"
        assert bucket.if_match_form is None


async def test_multipart_condition_ignored_then_single_puts(quirky_s3: Quirky) -> None:
    endpoint = quirky_s3("ignore-multipart-condition")
    async with await _open(endpoint) as bucket:
        assert not await bucket.multipart_create_is_conditional()
        data = os.urandom(6 * MIB)  # above the test threshold of 5 MiB
        info = await bucket.put("log/big", data, if_none_match=True)
        assert "-" not in info.etag  # one PUT, not a multipart upload
        with pytest.raises(PreconditionFailed):
            await bucket.put("log/big", data[::-1], if_none_match=True)
        assert (await bucket.get("log/big")).data == data
        # The probe object is gone; only the log object is left.
        assert [i.key for i in await bucket.list()] == ["log/big"]


async def test_multipart_condition_honoured_on_moto(quirky_s3: Quirky) -> None:
    async with await _open(quirky_s3()) as bucket:
        assert await bucket.multipart_create_is_conditional()
        info = await bucket.put("log/big", os.urandom(6 * MIB), if_none_match=True)
        assert info.etag.endswith('-2"')
        assert await bucket.list() == [await bucket.head("log/big")]
