"""kill -9 of a real gateway at each step of a sealed segment's compressed rewrite (issue 42, 5).

``edgegw serve`` with small segments takes a producer's records; its
rewriter (``journal.at_rest = "compressed"``, the default) rewrites each
sealed segment. A fail point armed with ``kill`` (``EDGEGW_FAILPOINTS``)
kills the process with SIGKILL at exactly one step of the first rewrite:
the ``.z-tmp`` written and fsynced; verified, not renamed; renamed and
swapped in memory, the directory not fsynced; fsynced, the ``.idx`` not
unlinked. The test checks the half-done state on disk is the one that step
leaves, restarts the gateway, and checks that the next open is clean (no
``.z-tmp``, no index beside a compressed segment once the rewriter caught
up), that every acknowledged record is there as it was produced, and that
the rewriter went on.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import pytest
from _serve import Gateway, Producer, TopicSpec, read_partition, wait_until

sys.path.insert(0, str(Path(__file__).parents[1] / "cli"))
from _cli_support import run_edgegw

TOPIC = TopicSpec("t", "north", partitions=2)

#: step -> what the directory holds after a kill there: a .z-tmp, and whether the
#: first sealed segment is compressed already
STEPS = {
    "rewriter.written": (True, False),
    "rewriter.verified": (True, False),
    "rewriter.renamed": (False, True),
    "rewriter.synced": (False, True),
}


def _rewrite_children(journal: Path) -> list[int]:
    """Rewrite child processes (``_rewrite_child``) working on a file of ``journal``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"_rewrite_child" not in (proc / "cmdline").read_bytes():
                continue
            if (
                str(journal) in (proc / "maps").read_text()
                and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            ):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _metric(text: str, name: str) -> float:
    [line] = [ln for ln in text.splitlines() if ln.startswith(f"{name} ")]
    return float(line.split()[1])


def _gateway(tmp_path: Path) -> Gateway:
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    return Gateway(
        "north",
        tmp_path,
        {"type": "local", "path": str(bucket)},
        [TOPIC],
        {"journal": {"segment_bytes": "64KiB", "at_rest": "compressed"}},
    )


@pytest.mark.parametrize("step", list(STEPS))
def test_kill_9_at_each_step_of_a_rewrite_loses_nothing(tmp_path: Path, step: str) -> None:
    g = _gateway(tmp_path)
    journal = g.data_dir / "journal"
    g.env = {"EDGEGW_FAILPOINTS": f"{step}=kill"}
    g.start()
    producer = Producer(g.url, TOPIC.name, TOPIC.partitions, pause=0.0, max_batch=40)
    producer.start()
    try:
        deadline = time.monotonic() + 120
        while g.running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not g.running, f"the gateway never reached {step}:\n{g.tail()}"
        assert g.proc is not None
        assert g.proc.returncode == -9, g.tail()
    finally:
        producer.stop()  # its last request failed with the gateway: that one was not acked
    assert producer.acked, "nothing was acknowledged before the kill"
    # the rewrite's child (steps 1-3) sees its parent gone and exits
    wait_until(lambda: not _rewrite_children(journal), timeout=30, what="the child to exit")
    tmp_left, swapped = STEPS[step]
    first = sorted(journal.glob("*.wal"))[0]
    assert bool(list(journal.glob("*.z-tmp"))) == tmp_left
    assert (first.read_bytes()[:4] == b"EGWC") == swapped
    if swapped:
        assert first.with_suffix(".idx").exists()  # the index goes last

    g.env = {}
    g.start()
    try:
        wait_until(
            lambda: (
                (a := g.status()["journal"]["at_rest"])["pending_segments"] == 0
                and a["compressed_segments"] >= 1
            ),
            timeout=120,
            what="the rewriter to catch up",
        )
        at_rest = g.status()["journal"]["at_rest"]
        assert at_rest["running"]
        assert at_rest["rewrite_failures"] == 0
        assert at_rest["compressed_bytes"] < at_rest["compressed_wal_bytes"]
        assert not list(journal.glob("*.z-tmp"))
        assert not list(journal.glob("*.idx"))  # every sealed segment is compressed
        for p in range(TOPIC.partitions):
            stored = {r.offset: r for r in read_partition(g.url, TOPIC.name, p)}
            for (pp, offset), rec in producer.acked.items():
                if pp == p:
                    assert stored.get(offset) == rec, f"{TOPIC.name}/{p}@{offset} lost or changed"
        # the status row and the metrics say the same
        text = run_edgegw("status", "--config", g.config)
        assert text.returncode == 0, text.stdout + text.stderr
        out = " ".join(text.stdout.split())
        assert f"{at_rest['compressed_segments']} segments compressed" in out
        assert "rewriter running, 0 segments waiting" in out
        scrape = httpx.get(f"{g.url}/metrics", timeout=30).text
        assert (
            _metric(scrape, "edgegw_journal_compressed_segments") == at_rest["compressed_segments"]
        )
        assert _metric(scrape, "edgegw_journal_rewrite_pending_segments") == 0
        assert (
            _metric(scrape, "edgegw_journal_rewritten_segments_total")
            == at_rest["rewritten_segments"]
        )
        assert _metric(scrape, "edgegw_journal_compressed_bytes") == at_rest["compressed_bytes"]
        assert g.stop() == 0
    finally:
        g.kill()
