"""A range reported lost, repaired later: it no longer counts as lost (issue 45 leftovers).

It happens today: with the bucket out of reach at a start, damage in the
last segment is quarantined (``lost.log``, ``repairable: true``) and the
site serves the rest; once the link heals and the segment is sealed, the
live repair rebuilds the range (``repaired.log``). With real processes, on
moto's S3 server behind a TCP proxy:

* before the repair the loss counts: ``/v1/status``'s ``lost`` block, the
  gauge ``edgegw_journal_lost_unrepaired_entries``, ``edgegw status`` in red;
* after it, ``lost.log`` is unchanged byte for byte (append-only, sealed),
  the loss carries ``repaired_later`` (the repair that superseded it), the
  still-lost counts and the gauge fall to 0 while the ``_total`` counters
  keep the history, and ``edgegw status`` says "repaired later";
* a restart reads both logs and says the same.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx
from _serve import Gateway, wait_until
from test_journal_damage import _damage, _fill, _last_segment, _produce, _served, _value
from test_journal_repair import _s3_site, _ship_all_and_stop

sys.path.insert(0, str(Path(__file__).parents[1] / "cli"))
from _cli_support import run_edgegw


def _lost(g: Gateway) -> dict[str, object]:
    [lane] = [x for x in g.status()["lanes"]["lanes"] if x["lane"] == "normal"]
    return dict(lane["lost"])


def _metric(g: Gateway, name: str) -> float:
    text = httpx.get(f"{g.url}/metrics", timeout=10).text
    m = re.search(rf'^{name}{{lane="normal"}} (\S+)$', text, re.MULTILINE)
    assert m, f"no {name} in the metrics"
    return float(m.group(1))


def _status_line(g: Gateway) -> str:
    out = run_edgegw("status", "--config", g.config)
    assert out.returncode == 0, out.stderr
    return " ".join(out.stdout.split())  # the table wraps long cells


def test_a_loss_repaired_later_no_longer_counts_as_lost(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    fleet = _s3_site(tmp_path, moto_endpoint, s3_bucket_name)
    g = fleet["north"]
    try:
        fleet.start()
        acked = _fill(g, "before")
        _ship_all_and_stop(g)
        damaged = _last_segment(g)
        _damage(damaged, "flip")
        fleet.proxies["north"].set_mode("blackhole")
        g.start()
        lost = _lost(g)
        [loss] = lost["losses"]  # type: ignore[misc]
        n = loss["lsn_last"] - loss["lsn_first"] + 1
        assert loss["repairable"] is True
        assert loss["repaired_later"] is None
        assert (lost["lsns"], lost["repaired_later_lsns"]) == (n, 0)
        assert _metric(g, "edgegw_journal_lost_unrepaired_entries") == n
        assert _metric(g, "edgegw_journal_lost_entries_total") == n
        assert "DAMAGE:" in _status_line(g)
        lost_log = (g.data_dir / "journal/lost.log").read_bytes()

        fleet.proxies["north"].set_mode("pass")
        i = 0
        while _last_segment(g) == damaged:  # produce until the damaged segment is sealed
            acked |= _produce(g.url, [_value("after", 10 * i + k) for k in range(10)])
            i += 1
        wait_until(lambda: _lost(g)["lsns"] == 0, 120, "the repair of the quarantined range")
        assert _served(g.url) == acked

        def superseded() -> None:
            lost = _lost(g)
            [loss] = lost["losses"]  # type: ignore[misc]
            later = loss["repaired_later"]
            assert later is not None
            assert [(r["lsn_first"], r["lsn_last"]) for r in later["repairs"]] == [
                (loss["lsn_first"], loss["lsn_last"])
            ]
            assert (lost["lsns"], lost["records"]) == (0, 0)
            assert lost["repaired_later_lsns"] == n
            assert _metric(g, "edgegw_journal_lost_unrepaired_entries") == 0
            assert _metric(g, "edgegw_journal_lost_entries_total") == n  # the history stays
            line = _status_line(g)
            assert "DAMAGE:" not in line, line
            assert "repaired later from the bucket" in line, line
            assert (g.data_dir / "journal/lost.log").read_bytes() == lost_log  # append-only

        superseded()
        assert g.stop() == 0
        g.start()
        superseded()
        assert _served(g.url) == acked
    finally:
        fleet.close()
