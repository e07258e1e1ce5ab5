"""``edgegw journal verify`` on a data directory written by a real ``edgegw serve``:
clean (also while that gateway keeps producing), then with damage made on disk --
a flipped byte, a zeroed page, a segment cut short or missing its middle, a
damaged or forged index file, a missing segment -- and the golden compressed
segment. Exit codes 0 (clean), 1 (damage), 2 (usage); ``--json``; the command
lines of docs/operations.md, run as written.

The checks themselves are unit-tested in tests/journal/test_verify.py.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _cli_support import invoke, run_edgegw
from _serve import Fleet, Producer, TopicSpec, wait_until

from edge_gateway._crc import crc32c
from edge_gateway.journal._verify import check_segment

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "format" / "data"
TOPICS = [
    TopicSpec("t", "north", partitions=3),
    TopicSpec("alarms", "north", partitions=1, priority="critical"),
]
SEGMENTS = 5


@dataclass(frozen=True)
class Site:
    config: Path
    data_dir: Path
    #: ``--json`` reports taken while the gateway was producing
    while_running: list[dict[str, Any]]
    #: records acknowledged before and after those runs (the gateway kept producing)
    acked: tuple[int, int]


def _segments(journal: Path) -> list[Path]:
    return sorted(journal.glob("*.wal"))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    root = tmp_path_factory.mktemp("verify")
    fleet = Fleet(
        root,
        ["north"],
        TOPICS,
        # entry logs and their index files (compressed segments verify too:
        # tests/journal/test_compressed.py)
        sections={
            "journal": {"segment_bytes": 65536, "max_bytes": 4 * 1024 * 1024, "at_rest": "off"}
        },
    )
    gw = fleet["north"]
    gw.start()
    try:
        producers = [
            Producer(gw.url, "t", 3, pause=0, max_batch=20),
            Producer(gw.url, "alarms", 1, seed=2, pause=0.01, max_batch=5),
        ]
        for p in producers:
            p.start()
        wait_until(
            lambda: len(_segments(gw.data_dir / "journal")) >= SEGMENTS, 120, "sealed segments"
        )
        before = sum(p.n for p in producers)
        reports = []
        for _ in range(3):
            res = run_edgegw("journal", "verify", "--config", gw.config, "--json")
            assert res.returncode == 0, res.stdout + res.stderr
            reports.append(json.loads(res.stdout))
        after = sum(p.n for p in producers)
        for p in producers:
            p.stop()
            assert p.error is None, p.error
    finally:
        assert gw.stop() == 0, gw.tail()
    return Site(gw.config, gw.data_dir, reports, (before, after))


@pytest.fixture
def copy(site: Site, tmp_path: Path) -> Path:
    """A copy of the stopped gateway's data directory, to damage."""
    dst = tmp_path / "data"
    shutil.copytree(site.data_dir, dst, ignore=shutil.ignore_patterns("edgegw.lock", "bucket"))
    return dst


def _verify(data: Path) -> tuple[int, dict[str, Any], str]:
    res = invoke("journal", "verify", "--data-dir", data, "--json")
    text = invoke("journal", "verify", "--data-dir", data)
    assert text.exit_code == res.exit_code, text.stdout + text.stderr
    return res.exit_code, json.loads(res.stdout), text.stdout


def _entry_at(segment: bytes, byte: int) -> int:
    """The start of the entry that holds ``byte`` of a (clean) segment."""
    facts = check_segment(segment, base_lsn=struct.unpack_from("<Q", segment, 8)[0])
    return max(p for p in facts.positions if p <= byte)


def _damaged(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc["files"] if f["status"] == "damaged"]


def test_a_running_gateway_verifies_clean_while_it_produces(site: Site) -> None:
    before, after = site.acked
    assert after > before, "the gateway was not producing while verify ran"
    for doc in site.while_running:
        assert doc["ok"] is True
        assert doc["lanes"] == ["critical", "normal"]
        roles = [f["role"] for f in doc["files"]]
        assert roles.count("active") == 2
        # (the newest sealed segment's index may be written just after the listing)
        assert roles.count("index") >= SEGMENTS - 2
        assert all(f["status"] in ("ok", "skipped") for f in doc["files"])
    # The journal grew under the runs, and each saw it as it was.
    entries = [doc["summary"]["entries"] for doc in site.while_running]
    assert entries == sorted(entries)
    assert entries[0] < entries[-1]


def test_the_stopped_gateways_data_dir_verifies_clean(site: Site) -> None:
    res = run_edgegw("journal", "verify", "--data-dir", site.data_dir)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert re.search(r"files, \d+ entries, .*: OK$", lines[-1])
    segments = _segments(site.data_dir / "journal")
    for seg in segments:
        [line] = [x for x in lines if x.startswith("normal ") and seg.name in x]
        assert re.search(r"journal v[12] +LSN \d+-\d+ +\d+ entries .* OK$", line), line
    idx = [x for x in lines if x.startswith("normal ") and ".idx" in x]
    assert len(idx) == len(segments) - 1  # the active segment's index is in memory
    assert all(re.search(r"index +index v2 +LSN \d+-\d+ .* OK$", x) for x in idx), idx
    assert any(x.startswith("critical ") for x in lines)


def test_json_shape(copy: Path) -> None:
    code, doc, _ = _verify(copy)
    assert code == 0
    assert set(doc) == {"journal", "ok", "lanes", "files", "summary"}
    assert doc["journal"] == str(copy / "journal")
    assert set(doc["summary"]) == {"files", "damaged", "skipped", "entries", "bytes"}
    for f in doc["files"]:
        assert set(f) == {
            "lane",
            "file",
            "role",
            "kind",
            "status",
            "first_lsn",
            "last_lsn",
            "entries",
            "bytes",
            "offset",
            "reason",
            "notes",
        }
        assert f["role"] in ("sealed", "active", "index")
        assert f["status"] == "ok"
        assert f["offset"] is None
        assert f["reason"] is None
        assert Path(f["file"]).stat().st_size == f["bytes"]
        assert f["last_lsn"] - f["first_lsn"] + 1 == f["entries"]
    assert doc["summary"]["damaged"] == 0


def _one_damaged(copy: Path, path: Path) -> tuple[dict[str, Any], str]:
    code, doc, text = _verify(copy)
    assert code == 1, text
    [bad] = _damaged(doc)
    assert bad["file"] == str(path)
    [line] = [x for x in text.splitlines() if "DAMAGED at" in x]
    assert line.startswith("normal ")
    assert path.name in line
    assert f"DAMAGED at byte {bad['offset']}: " in line
    assert text.splitlines()[-1].endswith("DAMAGED (1 files)")
    return bad, line


def test_a_flipped_byte_in_a_sealed_segment(copy: Path) -> None:
    seg = _segments(copy / "journal")[1]
    clean = seg.read_bytes()
    data = bytearray(clean)
    byte = len(data) // 2
    data[byte] ^= 0x40
    seg.write_bytes(data)
    bad, _ = _one_damaged(copy, seg)
    assert bad["offset"] == _entry_at(clean, byte)  # the entry that holds the byte
    assert "CRC mismatch" in bad["reason"]


def test_a_zeroed_page_in_the_middle_of_a_segment(copy: Path) -> None:
    seg = _segments(copy / "journal")[2]
    clean = seg.read_bytes()
    page = (len(clean) // 2) & ~4095
    seg.write_bytes(clean[:page] + bytes(4096) + clean[page + 4096 :])
    bad, _ = _one_damaged(copy, seg)
    assert bad["offset"] == _entry_at(clean, page)


@pytest.mark.parametrize("how", ["cut short", "middle removed"])
def test_a_sealed_segment_truncated(copy: Path, how: str) -> None:
    seg = _segments(copy / "journal")[1]
    clean = seg.read_bytes()
    third = len(clean) // 3
    seg.write_bytes(clean[:third] if how == "cut short" else clean[:third] + clean[2 * third :])
    bad, _ = _one_damaged(copy, seg)
    assert bad["offset"] == _entry_at(clean, third)


def test_an_index_file_with_a_flipped_byte(copy: Path) -> None:
    idx = _segments(copy / "journal")[1].with_suffix(".idx")
    data = bytearray(idx.read_bytes())
    data[len(data) // 2] ^= 1
    idx.write_bytes(data)
    bad, _ = _one_damaged(copy, idx)
    assert bad["role"] == "index"
    assert bad["reason"] == "index file CRC mismatch"


def test_an_index_that_points_at_the_wrong_entry(copy: Path) -> None:
    # A forged index: its CRC matches, one position does not -- only a comparison
    # with the segment finds it.
    seg = _segments(copy / "journal")[1]
    idx = seg.with_suffix(".idx")
    data = bytearray(idx.read_bytes()[:-4])
    dir_len = struct.unpack_from("<I", data, 44)[0]
    at = 48 + dir_len + (-(48 + dir_len) % 8) + 8 * 5
    real = struct.unpack_from("<q", data, at)[0]
    struct.pack_into("<q", data, at, real + 7)
    idx.write_bytes(bytes(data) + struct.pack("<I", crc32c(bytes(data))))
    bad, _ = _one_damaged(copy, idx)
    base = int(seg.stem)
    assert bad["offset"] == at
    assert (
        f"LSN {base + 5} is at byte {real + 7} of the segment; it is at byte {real}"
        in (bad["reason"])
    )


def test_a_missing_middle_segment_is_an_lsn_gap(copy: Path) -> None:
    segs = _segments(copy / "journal")
    gone = segs[2]
    gone.unlink()
    gone.with_suffix(".idx").unlink()
    bad, line = _one_damaged(copy, segs[3])
    assert bad["offset"] == 8
    assert f"LSNs {int(gone.stem)}..{int(segs[3].stem) - 1} are missing" in bad["reason"]
    assert "LSN gap" in line


def _golden_dir(root: Path, flip: int | None = None) -> Path:
    journal = root / "data" / "journal"
    journal.mkdir(parents=True)
    data = bytearray((GOLDEN / "atrest_v1.egwc").read_bytes())
    if flip is not None:
        data[flip] ^= 0x01
    (journal / f"{41:020d}.wal").write_bytes(data)
    return root / "data"


def test_the_golden_compressed_segment_verifies(tmp_path: Path) -> None:
    code, doc, text = _verify(_golden_dir(tmp_path))
    assert code == 0, text
    [f] = doc["files"]
    assert (f["kind"], f["first_lsn"], f["last_lsn"], f["entries"], f["status"]) == (
        "compressed EGWC v1 (of journal v3)",
        41,
        51,
        11,
        "ok",
    )


@pytest.mark.parametrize(
    ("flip", "where"),
    [
        (2, "magic"),
        (6, "header"),
        (100, "frame"),
        (700, "entry table"),
        (1000, "directory"),
        (1620, "trailer"),
    ],
)
def test_the_golden_compressed_segment_with_a_flipped_byte(
    tmp_path: Path, flip: int, where: str
) -> None:
    code, doc, text = _verify(_golden_dir(tmp_path, flip))
    assert code == 1, text
    [bad] = _damaged(doc)
    assert bad["offset"] <= flip
    if where in ("directory", "trailer"):
        assert where in bad["reason"]
    if where in ("magic", "header"):
        assert bad["offset"] == 0


@pytest.mark.parametrize(
    "args",
    [
        ["--data-dir", "/nonexistent/edgegw-dat"],
        ["--config", "/nonexistent/edgegw.tmol"],
        [],
        ["--data-dir", ".", "--config", "x.toml"],
    ],
)
def test_usage_errors_exit_2_with_one_clear_line(args: list[str]) -> None:
    res = invoke("journal", "verify", *args)
    assert res.exit_code == 2, res.stdout + res.stderr
    assert res.stderr.startswith("error: ")
    assert len(res.stderr.strip().splitlines()) == 1
    assert res.stdout == ""


def test_a_data_dir_without_a_journal_exits_2(tmp_path: Path) -> None:
    res = run_edgegw("journal", "verify", "--data-dir", tmp_path)
    assert res.returncode == 2
    assert res.stderr == (
        f"error: no journal in {tmp_path} ({tmp_path / 'journal'} does not exist): "
        "is this a gateway's data directory?\n"
    )


def _documented() -> list[str]:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("\n## A damaged disk\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^(edgegw journal verify .*)$", section, re.MULTILINE)


def test_the_documented_commands_run(site: Site) -> None:
    lines = _documented()
    assert len(lines) >= 3
    for line in lines:
        line = line.replace("/etc/edgegw/edgegw.toml", str(site.config))
        args = line.replace("/var/lib/edgegw", str(site.data_dir)).split()[1:]
        res = run_edgegw(*args)
        assert res.returncode == 0, f"{line}: {res.stdout}{res.stderr}"
        if "--json" in args:
            assert json.loads(res.stdout)["ok"] is True
        else:
            assert res.stdout.splitlines()[-1].endswith(": OK")
