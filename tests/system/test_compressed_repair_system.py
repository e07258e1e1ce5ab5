"""A compressed segment's damaged entry table or directory, repaired while the gateway runs.

With real processes: ``edgegw serve`` with a local bucket, ``journal.at_rest
= "compressed"`` (the rewriter compresses each sealed segment in its child
process) and segments of 10 MiB, so that a compressed segment has two chunks
(8 MiB of entries each at most, docs/at-rest.md): the second chunk's entry
table is not the one holding the segment's checkpoint. Once three segments
are sealed, shipped and compressed, one byte of the second one is flipped
under the running gateway -- in its second chunk's entry table, or in a
topic's name in its directory (a field that still decodes: only the CRC
tells), or in its first chunk's entry table (the one holding the segment's
checkpoint, which no bucket has: derived from the neighbouring segments).
The scrub finds it; the gateway rebuilds the damaged part from the
region's log objects (the chunk's entries; with the directory damaged, every
entry after the checkpoint) and swaps the segment in. Every record reads
back exactly, nothing is reported lost, and the repair is named. The same
directory damage found by a start (the gateway stopped meanwhile) is rebuilt
by the open instead of stopping it.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from _serve import Gateway, TopicSpec, wait_until
from test_journal_damage import _served

from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry

TOPIC = "t"
VALUE_BYTES = 8192
_DIR_FIXED = 48  # the directory's fixed fields (docs/at-rest.md, "Directory")


def _gateway(tmp_path: Path) -> Gateway:
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    return Gateway(
        "north",
        tmp_path,
        {"type": "local", "path": str(bucket)},
        [TopicSpec(TOPIC, "north", partitions=1)],
        {"journal": {"segment_bytes": "10MiB", "at_rest": "compressed", "scrub_interval": "2s"}},
    )


def _produce(url: str, first: int, n: int) -> dict[int, str]:
    # values that compress a little (a counter in noise-free text), 64 per request
    values = [f"{i:08d}-".ljust(VALUE_BYTES, "abcdefgh"[i % 8]) for i in range(first, first + n)]
    r = httpx.post(
        f"{url}/v1/topics/{TOPIC}/records",
        json={"records": [{"value": v} for v in values]},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return {o["offset"]: v for v, o in zip(values, r.json()["offsets"], strict=True)}


def _sealed(g: Gateway) -> list[Path]:
    return sorted((g.data_dir / "journal").glob("*.wal"))[:-1]


def _shipped_through(g: Gateway) -> int:
    try:
        return int(json.loads((g.data_dir / "journal/shipper.json").read_text())["log_lsn"])
    except (OSError, ValueError, KeyError):
        return 0


def _directory(path: Path) -> atrest.SegmentDirectory | None:
    data = path.read_bytes()
    if data[: len(atrest.MAGIC)] != atrest.MAGIC:
        return None
    return atrest.CompressedSegment(data).directory


def _checkpoint(path: Path) -> bytes:
    """The segment's checkpoint's payload (compressed or an entry log)."""
    data = path.read_bytes()
    if data[: len(atrest.MAGIC)] == atrest.MAGIC:
        e = next(atrest.CompressedSegment(data).entries())
    else:
        e = atrest.decode_any_entry(data, 16)
    assert isinstance(e, fentry.Entry)
    return bytes(e.payload)


def _repairs(g: Gateway) -> list[dict[str, object]]:
    [lane] = [x for x in g.status()["lanes"]["lanes"] if x["lane"] == "normal"]
    block = lane.get("repaired")
    return list(block["repairs"]) if isinstance(block, dict) else []


def _ready(g: Gateway) -> tuple[dict[int, str], Path]:
    """Produce until three segments are sealed; wait until they are shipped and the
    second is compressed (with two chunks). The records, and the second segment."""
    acked: dict[int, str] = {}
    while len(_sealed(g)) < 3:
        acked |= _produce(g.url, len(acked), 64)

    def ready() -> bool:
        sealed = _sealed(g)
        d = _directory(sealed[1])
        return _shipped_through(g) >= int(sealed[2].stem) - 1 and d is not None

    wait_until(ready, 180, "three sealed segments, shipped, the second compressed")
    seg = _sealed(g)[1]
    d = _directory(seg)
    assert d is not None
    assert len(d.chunks) >= 2, "the segment should have two chunks"
    return acked, seg


def _flip(seg: Path, where: str) -> None:
    d = _directory(seg)
    assert d is not None
    last = d.chunks[-1]
    if where == "entry-table":
        at = last.meta_offset + last.meta_stored // 2
    elif where == "first-table":  # the table holding the segment's checkpoint
        first = d.chunks[0]
        at = first.meta_offset + first.meta_stored // 2
    else:  # the first character of the topic's name in the directory
        at = last.meta_offset + last.meta_stored + _DIR_FIXED + 2
    with seg.open("r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x01]))


@pytest.mark.parametrize("where", ["entry-table", "directory", "first-table"])
def test_a_damaged_entry_table_or_directory_is_repaired_while_running(
    tmp_path: Path, where: str
) -> None:
    g = _gateway(tmp_path)
    try:
        g.start()
        acked, seg = _ready(g)
        checkpoint = _checkpoint(seg)
        _flip(seg, where)
        wait_until(lambda: bool(_repairs(g)), 120, "the live repair")
        [one] = _repairs(g)
        assert one["segment"] == int(seg.stem)
        log = g.tail(400)
        assert "repaired from the bucket" in log
        if where == "directory":
            assert one["lsn_first"] == int(seg.stem) + 1  # all but the checkpoint
            assert "its directory is damaged" in log
        if where == "first-table":  # the checkpoint derived, the chunk's other entries rebuilt
            assert one["lsn_first"] == int(seg.stem) + 1
            assert "derived from the neighbouring segments" in log
            assert _checkpoint(seg) == checkpoint  # the derived one is the lost one
        copy = g.data_dir / "quarantine" / f"journal-{seg.stem}-compressed.damaged"
        assert copy.exists()
        [lane] = [x for x in g.status()["lanes"]["lanes"] if x["lane"] == "normal"]
        assert "lost" not in lane
        assert lane["live_repair"]["segments_repaired"] == 1
        acked |= _produce(g.url, len(acked), 64)  # produce goes on
        assert _served(g.url) == acked  # every record, exactly
        assert g.stop() == 0
        g.start()
        assert _served(g.url) == acked
        assert len(_repairs(g)) == 1
    finally:
        g.kill()


def test_a_damaged_directory_found_at_start_is_rebuilt(tmp_path: Path) -> None:
    """The open loads a sealed compressed segment from its directory alone; one whose
    CRC fails no longer stops the start: the segment is rebuilt from the bucket."""
    g = _gateway(tmp_path)
    try:
        g.start()
        acked, seg = _ready(g)
        assert g.stop() == 0
        _flip(seg, "directory")
        g.start()
        assert "rebuilt from the bucket" in g.tail(400)
        assert _served(g.url) == acked
        [one] = _repairs(g)
        assert (one["segment"], one["lsn_first"]) == (int(seg.stem), int(seg.stem) + 1)
        [lane] = [x for x in g.status()["lanes"]["lanes"] if x["lane"] == "normal"]
        assert "lost" not in lane
    finally:
        g.kill()
