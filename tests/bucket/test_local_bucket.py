"""LocalBucket specifics: on-disk layout, durability mechanics, several openers."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio

from edge_gateway.bucket import (
    AccessDenied,
    BucketGone,
    BucketUnavailable,
    InvalidRequest,
    LocalBucket,
    NoSuchBucket,
    NotFound,
    PreconditionFailed,
    verify_conditional_create,
)


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalBucket]:
    bucket = await LocalBucket.open(tmp_path / "b", create=True)
    try:
        yield bucket
    finally:
        await bucket.aclose()


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


async def test_layout_objects_are_plain_files(local: LocalBucket) -> None:
    await local.put("regions/r1/log/00000000000000000001.eglog", b"entry", if_none_match=True)
    await local.put("regions/r1/cursors/r2.json", b"{}")
    path = local.root / "objects" / "regions" / "r1" / "log" / "00000000000000000001.eglog"
    assert path.read_bytes() == b"entry"
    # Nothing left in tmp/, including after a refused create.
    with pytest.raises(PreconditionFailed):
        await local.put("regions/r1/log/00000000000000000001.eglog", b"x", if_none_match=True)
    assert _files(local.root / "tmp") == []
    assert local.name == local.root.as_uri()
    assert str(local.root) in local.describe()


async def test_etag_is_quoted_md5_like_s3_single_part(local: LocalBucket) -> None:
    info = await local.put("k", b"content")
    assert info.etag == f'"{hashlib.md5(b"content").hexdigest()}"'
    # S3 accepts If-Match with or without the quotes; so does the local bucket.
    await local.put("k", b"next", if_match=info.etag.strip('"'))
    with pytest.raises(PreconditionFailed):
        await local.put("k", b"again", if_match=info.etag.strip('"'))


async def test_etag_follows_files_changed_behind_its_back(local: LocalBucket) -> None:
    # Another tool replaces the file (a new inode): the etag must follow the content.
    info = await local.put("k", b"one")
    assert (await local.head("k")).etag == info.etag
    replacement = local.root / "replacement"
    replacement.write_bytes(b"two")
    os.replace(replacement, local.root / "objects" / "k")
    head = await local.head("k")
    assert head.etag == f'"{hashlib.md5(b"two").hexdigest()}"'
    with pytest.raises(PreconditionFailed):
        await local.put("k", b"three", if_match=info.etag)


async def test_object_and_directory_cannot_share_a_key(local: LocalBucket) -> None:
    await local.put("a/b", b"x")
    with pytest.raises(InvalidRequest, match="cannot hold both"):
        await local.put("a", b"y")
    with pytest.raises(InvalidRequest, match="cannot hold both"):
        await local.put("a", b"y", if_none_match=True)
    await local.put("c", b"x")
    with pytest.raises(InvalidRequest, match="cannot hold both"):
        await local.put("c/d", b"y")
    with pytest.raises(NotFound):
        await local.put("a", b"y", if_match='"abc"')


async def test_objects_survive_reopening(tmp_path: Path) -> None:
    async with await LocalBucket.open(tmp_path / "b", create=True) as first:
        info = await first.put("log/1", b"durable", if_none_match=True)
    async with await LocalBucket.open(tmp_path / "b", create=True) as second:
        got = await second.get("log/1")
        assert (got.data, got.etag) == (b"durable", info.etag)
        with pytest.raises(PreconditionFailed):
            await second.put("log/1", b"again", if_none_match=True)


async def test_open_removes_only_stale_temporary_files(tmp_path: Path) -> None:
    async with await LocalBucket.open(tmp_path / "b", create=True):
        pass
    tmp = tmp_path / "b" / "tmp"
    stale, fresh = tmp / "stale.tmp", tmp / "fresh.tmp"
    stale.write_bytes(b"crashed writer")
    fresh.write_bytes(b"another process writing now")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    async with await LocalBucket.open(tmp_path / "b", create=True):
        pass
    assert not stale.exists()
    assert fresh.exists()


def test_an_opener_whose_clock_is_ahead_leaves_a_fresh_temporary_file(tmp_path: Path) -> None:
    """The age of a temporary file is taken on the directory's clock, not the opener's."""
    from _faketime import shifted

    env = {**os.environ, **shifted("+2d")}
    opener = (
        "import sys, trio\n"
        "from edge_gateway.bucket import LocalBucket\n"
        "async def main():\n"
        "    async with await LocalBucket.open(sys.argv[1], create=True):\n"
        "        pass\n"
        "trio.run(main)\n"
    )
    bucket = tmp_path / "b"
    subprocess.run([sys.executable, "-c", opener, str(bucket)], env=env, check=True, timeout=60)
    fresh = bucket / "tmp" / "fresh.tmp"
    fresh.write_bytes(b"another machine writing now")
    subprocess.run([sys.executable, "-c", opener, str(bucket)], env=env, check=True, timeout=60)
    assert fresh.exists()


async def test_two_openers_of_one_directory_race_safely(tmp_path: Path) -> None:
    # Two bucket objects stand in for two processes sharing a directory:
    # create-only relies on link(2), CAS on flock(2), neither on in-process locks.
    async with (
        await LocalBucket.open(tmp_path / "b", create=True) as one,
        await LocalBucket.open(tmp_path / "b", create=True) as two,
    ):
        base = await one.put("state.json", b"0")
        won: list[str] = []

        async def create(bucket: LocalBucket, tag: str) -> None:
            try:
                await bucket.put("log/1", tag.encode(), if_none_match=True)
                won.append(tag)
            except PreconditionFailed:
                pass

        async def swap(bucket: LocalBucket, tag: str) -> None:
            try:
                await bucket.put("state.json", tag.encode(), if_match=base.etag)
                won.append("cas-" + tag)
            except PreconditionFailed:
                pass

        async with trio.open_nursery() as nursery:
            for index in range(4):
                nursery.start_soon(create, one, f"one-{index}")
                nursery.start_soon(create, two, f"two-{index}")
                nursery.start_soon(swap, one, f"one-{index}")
                nursery.start_soon(swap, two, f"two-{index}")
        creates = [tag for tag in won if not tag.startswith("cas-")]
        swaps = [tag for tag in won if tag.startswith("cas-")]
        assert len(creates) == 1
        assert len(swaps) == 1
        assert (await two.get("log/1")).data == creates[0].encode()
        assert (await one.get("state.json")).data == swaps[0].removeprefix("cas-").encode()


async def test_overlong_segment_is_invalid(local: LocalBucket) -> None:
    # Valid for S3 (under 1024 bytes) but longer than a file name may be.
    with pytest.raises(InvalidRequest, match="too long"):
        await local.put("x" * 300, b"v")


async def test_probe_on_local(local: LocalBucket) -> None:
    await verify_conditional_create(local, "regions/r1")
    assert await local.list() == []
    assert _files(local.root / "objects") == []


async def test_a_missing_bucket_directory_is_unavailable_not_empty(tmp_path: Path) -> None:
    # The bucket lives on a share that is not mounted now: the bare mount
    # point is left. Reads must not answer "no such object" or "empty" (a
    # tailer would read "nothing new", GC "deleted"), and nothing may be
    # written into the mount point.
    root = tmp_path / "share"
    bucket = await LocalBucket.open(root, create=True)
    try:
        await bucket.put("regions/r1/log/1", b"entry", if_none_match=True)
        shutil.rmtree(root)
        root.mkdir()
        calls = {
            "get": lambda: bucket.get("regions/r1/log/1"),
            "ranged get": lambda: bucket.get("regions/r1/log/2", start=0, end=10),
            "head": lambda: bucket.head("regions/r1/log/1"),
            "list": bucket.list,
            "list prefix": lambda: bucket.list("regions/r1/"),
            "delete": lambda: bucket.delete("regions/r1/log/1"),
            "create": lambda: bucket.put("regions/r1/log/2", b"x", if_none_match=True),
            "put": lambda: bucket.put("regions/r1/cursor", b"x"),
            "cas": lambda: bucket.put("regions/r1/cursor", b"x", if_match='"e"'),
        }
        for name, call in calls.items():
            with pytest.raises(BucketUnavailable, match=r"missing|lost its layout") as excinfo:
                await call()
            assert str(root) in str(excinfo.value), name
        assert list(root.iterdir()) == []
        assert bucket.statistics().unavailable == len(calls)
    finally:
        await bucket.aclose()


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (errno.ENOSPC, BucketUnavailable),
        (errno.EDQUOT, BucketUnavailable),
        (errno.EIO, BucketUnavailable),
        (errno.EROFS, BucketUnavailable),
        (errno.ENOENT, BucketUnavailable),
        (errno.ESTALE, BucketUnavailable),
        (errno.EACCES, AccessDenied),
        (errno.EPERM, AccessDenied),
        (errno.ENAMETOOLONG, InvalidRequest),
    ],
)
async def test_os_errors_map_to_one_kind_each(
    local: LocalBucket, code: int, expected: type[Exception]
) -> None:
    err = local._translate(OSError(code, os.strerror(code), "/x/tmp/1.tmp"), "k")
    assert type(err) is expected
    assert errno.errorcode[code] in str(err)
    assert "/x/tmp/1.tmp" in str(err)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (needs root; skipped elsewhere)."""
    path = tmp_path / "small"
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


async def test_full_disk_is_unavailable_and_leaves_nothing_half_written(small_fs: Path) -> None:
    bucket = await LocalBucket.open(small_fs / "b", create=True)
    try:
        await bucket.put("small", b"s" * 1000, if_none_match=True)
        for call in (
            lambda: bucket.put("big", os.urandom(2 * 1024 * 1024), if_none_match=True),
            lambda: bucket.put("small", os.urandom(2 * 1024 * 1024)),
        ):
            with pytest.raises(BucketUnavailable, match=r"No space left on device \(ENOSPC\)"):
                await call()
        # Nothing half-written: no object, no temporary file; the old one intact.
        with pytest.raises(NotFound):
            await bucket.head("big")
        assert _files(bucket.root / "tmp") == []
        assert (await bucket.get("small")).data == b"s" * 1000
        # Space is back (the big write was never there to free): writes work.
        await bucket.put("big", b"b" * 100_000, if_none_match=True)
        assert (await bucket.get("big")).size == 100_000
    finally:
        await bucket.aclose()


# -- opening: never a new bucket by accident ---------------------------------------------


async def test_open_refuses_a_missing_directory_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(NoSuchBucket, match="does not exist"):
        await LocalBucket.open(tmp_path / "typo")
    assert not (tmp_path / "typo").exists()


async def test_open_refuses_an_empty_directory_unless_create(tmp_path: Path) -> None:
    root = tmp_path / "mnt"
    root.mkdir()
    with pytest.raises(NoSuchBucket, match="is empty, not a bucket directory"):
        await LocalBucket.open(root)
    assert list(root.iterdir()) == []
    (root / "lost+found").mkdir()  # a freshly made filesystem counts as empty
    async with await LocalBucket.open(root, create=True) as made:
        await made.put("k", b"v")
    async with await LocalBucket.open(root) as reopened:
        assert (await reopened.get("k")).data == b"v"


async def test_open_refuses_a_directory_of_other_files_even_with_create(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(NoSuchBucket, match=r"not a bucket directory .*notes\.txt"):
        await LocalBucket.open(tmp_path, create=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


async def test_create_makes_missing_parents(tmp_path: Path) -> None:
    async with await LocalBucket.open(tmp_path / "a" / "b", create=True) as made:
        await made.put("k", b"v", if_none_match=True)
    assert (tmp_path / "a" / "b" / "objects" / "k").read_bytes() == b"v"


@pytest.mark.parametrize("recreate", [False, True])
async def test_writes_to_a_bucket_whose_directory_vanished_fail_and_recreate_nothing(
    tmp_path: Path, recreate: bool
) -> None:
    root = tmp_path / "b"
    async with await LocalBucket.open(root, create=True) as bucket:
        await bucket.put("regions/r/log/1", b"one", if_none_match=True)
        shutil.rmtree(root)
        if recreate:
            root.mkdir()  # wiped and made again, empty
        with pytest.raises(BucketGone, match="lost its layout"):
            await bucket.put("regions/r/log/2", b"two", if_none_match=True)
        with pytest.raises(BucketGone, match="lost its layout"):
            await bucket.put("regions/r/cursor", b"c")
        with pytest.raises(BucketGone):  # not an empty listing: the bucket is away
            await bucket.list()
    assert not (root / "objects").exists()


async def test_a_vanished_objects_directory_is_not_made_again(tmp_path: Path) -> None:
    root = tmp_path / "b"
    async with await LocalBucket.open(root, create=True) as bucket:
        shutil.rmtree(root / "objects")
        with pytest.raises(BucketGone):
            await bucket.put("regions/r/log/2", b"two", if_none_match=True)
    assert not (root / "objects").exists()


def test_a_layout_made_by_another_opener_meanwhile_is_not_foreign(tmp_path: Path) -> None:
    # Two gateways started at once on a new, empty bucket directory: one saw no
    # objects/ and looks at the directory just after the other made the layout.
    root = tmp_path / "b"
    root.mkdir()
    for name in ("objects", "tmp"):
        (root / name).mkdir()
    (root / "lock").touch()
    LocalBucket(root)._check_new_root(create=True)  # not "holds objects"
    (root / "data.csv").touch()
    with pytest.raises(NoSuchBucket, match=r"holds data\.csv"):
        LocalBucket(root)._check_new_root(create=True)


def test_many_processes_opening_a_new_bucket_at_once_all_succeed(tmp_path: Path) -> None:
    opener = (
        "import sys, trio\n"
        "from edge_gateway.bucket import LocalBucket\n"
        "async def main():\n"
        "    b = await LocalBucket.open(sys.argv[1], create=True)\n"
        "    await b.aclose()\n"
        "trio.run(main)\n"
    )
    for round_ in range(3):
        root = tmp_path / f"b{round_}"
        root.mkdir()
        procs = [
            subprocess.Popen([sys.executable, "-c", opener, str(root)], stderr=subprocess.PIPE)
            for _ in range(6)
        ]
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, err.decode()


async def test_an_existing_bucket_read_only_at_open_opens_and_writes_wait(small_fs: Path) -> None:
    """Issue 41.4: EROFS at open (the lock file) is an outage, not a failed open."""
    bucket = await LocalBucket.open(small_fs / "b", create=True)
    await bucket.put("kept", b"k", if_none_match=True)
    await bucket.aclose()
    stale = small_fs / "b" / "tmp" / "stale.tmp"
    stale.write_bytes(b"leftover")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    (small_fs / "b" / "lock").unlink()
    await trio.run_process(["mount", "-o", "remount,ro", str(small_fs)])
    try:
        ro = await LocalBucket.open(small_fs / "b")  # raised BucketUnavailable (EROFS: .../lock)
        assert (await ro.get("kept")).data == b"k"
        assert [i.key for i in await ro.list("")] == ["kept"]
        for call in (
            lambda: ro.put("new", b"n", if_none_match=True),
            lambda: ro.delete("kept"),
        ):
            with pytest.raises(BucketUnavailable, match=r"EROFS"):
                await call()
        assert stale.exists()
    finally:
        await trio.run_process(["mount", "-o", "remount,rw", str(small_fs)])
    # Writable again: the first write keeps house (lock file, stale tmp/ files), then lands.
    await ro.put("new", b"n", if_none_match=True)
    assert (small_fs / "b" / "lock").exists()
    assert not stale.exists()
    assert (await ro.get("new")).data == b"n"
    await ro.aclose()
