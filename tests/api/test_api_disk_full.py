"""A full disk through the API: 503 disk_full with Retry-After, status and metrics, recovery.

The disk is made full with the journal's fault-injecting file operations
(``tests/_faults.py``): every write fails with ENOSPC and the filesystem
reports no free bytes, so the gateway meets a full disk without one. The
real-disk versions are tests/journal/test_disk_full.py (in-process) and
tests/system/test_disk_full_serve.py (`edgegw serve` on a small tmpfs).
"""

from __future__ import annotations

import errno
from pathlib import Path

import httpx
import pytest
import trio
from _api_support import make_config, running, url_of
from _faults import FaultyFs
from _tmpfs import fill, mounted_tmpfs
from prometheus_client.parser import text_string_to_metric_families

from edge_gateway.client import AsyncClient
from edge_gateway.errors import DiskFull
from edge_gateway.journal import _fs as fs_module


def metric(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return float(s.value)
    raise AssertionError(f"no sample {name}")


async def test_disk_full_is_503_disk_full_and_intake_resumes_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = FaultyFs()
    monkeypatch.setattr(fs_module, "ops", fs)
    # No preallocation: every entry is a pwritev, the call the fault hits.
    cfg = make_config(tmp_path, journal={"preallocate": False})
    async with running(cfg) as gw, httpx.AsyncClient(base_url=url_of(gw)) as http:
        r = await http.post("/v1/topics/t/records", json={"records": [{"value": "before"}]})
        assert r.status_code == 200, r.text
        status = (await http.get("/v1/status")).json()
        assert status["disk"]["state"] == "ok"
        assert status["disk"]["free_bytes"] > 0
        assert status["disk"]["size_bytes"] >= status["disk"]["free_bytes"]

        fs.fail("write", fs.calls["write"] + 1, errno=errno.ENOSPC)  # every write from now on
        for _ in range(3):
            r = await http.post(
                "/v1/topics/t/records", json={"records": [{"value": "x", "partition": 0}]}
            )
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "disk_full"
            assert "disk full writing" in r.json()["error"]["message"]
            assert int(r.headers["retry-after"]) >= 1
        # (retry_s=0: the client would otherwise retry a 503 for 30 s, idempotently)
        async with AsyncClient(url_of(gw), retry_s=0) as client:
            with pytest.raises(DiskFull) as info:
                await client.produce("t", ["y"])
        assert "Retry-After" in info.value.__notes__[0]
        status = (await http.get("/v1/status")).json()
        assert status["disk"]["state"] == "full"
        assert status["disk"]["full_rejections"] == 4
        assert status["disk"]["free_bytes"] == 0
        text = (await http.get("/metrics")).text
        assert metric(text, "edgegw_journal_disk_full") == 1
        assert metric(text, "edgegw_journal_disk_free_bytes") == 0
        assert metric(text, "edgegw_journal_disk_full_rejections_total") == 4
        assert metric(text, "edgegw_journal_full_rejections_total") == 0  # not the budget
        # Reads go on.
        r = await http.get("/v1/topics/t/partitions/0/records", params={"offset": 0})
        assert r.status_code == 200

        fs.heal()  # space returns: the very next produce goes through, no restart
        r = await http.post("/v1/topics/t/records", json={"records": [{"value": "after"}]})
        assert r.status_code == 200, r.text
        with trio.fail_after(10):
            while (await http.get("/v1/status")).json()["disk"]["state"] != "ok":  # noqa: ASYNC110
                await trio.sleep(0.05)
        assert gw.accepting


async def test_committing_offsets_on_a_full_disk_is_503_disk_full(tmp_path: Path) -> None:
    # The consumer-group offsets (SQLite) on a full disk: SQLITE_FULL is a
    # DiskFull like the journal's, not a 500 with a traceback.
    with mounted_tmpfs(tmp_path / "disk", "16m") as disk:
        cfg = make_config(disk)
        async with running(cfg) as gw, httpx.AsyncClient(base_url=url_of(gw)) as http:
            body = {"offsets": [{"topic": "t", "partition": 0, "offset": 0}]}
            r = await http.post("/v1/groups/g/offsets", json=body)
            assert r.status_code == 200, r.text
            fill(disk / "filler")
            for i in range(200):  # until SQLite needs a page it has not got
                rows = [
                    {"topic": "t", "partition": p, "offset": i, "metadata": f"{i}" * 4000}
                    for p in range(3)
                ]
                r = await http.post(f"/v1/groups/g{i}/offsets", json={"offsets": rows})
                if r.status_code != 200:
                    break
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "disk_full"
            (disk / "filler").unlink()
            r = await http.post("/v1/groups/g/offsets", json=body)
            assert r.status_code == 200, r.text
