"""The background scrub in a real ``edgegw serve`` (``journal.scrub_interval``): a byte
flipped on disk in a sealed segment is found while the gateway keeps accepting
produce, and ``edgegw status`` (text and JSON), ``/metrics`` and the log say so.

The scrubber's pacing and passes are unit-tested in tests/journal/test_scrub.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from _cli_support import run_edgegw
from _serve import Fleet, Producer, TopicSpec, wait_until

from edge_gateway import failpoints


def _segments(journal: Path) -> list[Path]:
    return sorted(journal.glob("*.wal"))


def _metric(text: str, name: str) -> float:
    [line] = [ln for ln in text.splitlines() if ln.startswith(f"{name} ")]
    return float(line.split()[1])


def test_a_flipped_byte_in_a_sealed_segment_is_reported_while_produce_goes_on(
    tmp_path: Path,
) -> None:
    fleet = Fleet(
        tmp_path,
        ["north"],
        [TopicSpec("t", "north", partitions=2)],
        sections={
            "journal": {
                "segment_bytes": 65536,
                "max_bytes": 4 * 1024 * 1024,
                "scrub_interval": "300ms",
            }
        },
    )
    gw = fleet["north"]
    # The bucket's log cannot be read for a repair: the damage stays for the scrub to
    # report (its live repair from the bucket: tests/system/test_live_repair_system.py).
    gw.env = {failpoints.ENV: "repair.fetch=1000000"}
    gw.start()
    producer = Producer(gw.url, "t", 2, pause=0.005, max_batch=10)
    try:
        producer.start()
        journal = gw.data_dir / "journal"
        wait_until(lambda: len(_segments(journal)) >= 4, 120, "sealed segments")
        victim = _segments(journal)[1]
        after = int(_segments(journal)[2].stem)
        # Damage only what has shipped: nothing reads it again but the scrub.
        wait_until(lambda: gw.status()["shipper"]["shipped_lsn"] >= after, 60, "shipped")
        wait_until(lambda: gw.status()["journal"]["scrub"]["passes"] >= 1, 60, "a clean pass")
        assert gw.status()["journal"]["scrub"]["damaged"] == []
        data = bytearray(victim.read_bytes())
        at = len(data) // 2
        data[at] ^= 0x10
        with victim.open("r+b") as f:  # in place, as a bit rotting on the card
            f.seek(at)
            f.write(data[at : at + 1])

        def damaged() -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = gw.status()["journal"]["scrub"]["damaged"]
            return found

        [finding] = wait_until(damaged, 60, "the scrub to find the flipped byte")
        assert finding["file"] == str(victim)
        assert finding["lane"] == "normal"
        assert 0 < finding["offset"] <= at
        assert finding["reason"]

        acked = producer.n
        wait_until(lambda: producer.n > acked + 20, 60, "produce to go on")
        assert producer.error is None, producer.error

        scrape = httpx.get(f"{gw.url}/metrics", timeout=30).text
        assert _metric(scrape, "edgegw_journal_scrub_damaged_segments") == 1
        assert _metric(scrape, "edgegw_journal_scrub_passes_total") >= 1
        assert _metric(scrape, "edgegw_journal_scrub_bytes_total") > 0

        text = run_edgegw("status", "--config", gw.config)
        assert text.returncode == 0, text.stdout + text.stderr
        out = " ".join(text.stdout.split())
        assert "1 damaged" in out
        assert f"at byte {finding['offset']}" in out
        [task] = [t for t in gw.status()["tasks"] if t["name"] == "scrub"]
        assert not task["degraded"]
    finally:
        producer.stop()
        assert gw.stop() == 0, gw.tail()
    warnings = [ln for ln in gw.log.read_text().splitlines() if "journal scrub:" in ln]
    assert len(warnings) == 1, warnings  # one WARNING per damaged segment, not one per pass
    assert str(victim) in warnings[0]
    assert f"at byte {finding['offset']}" in warnings[0]
