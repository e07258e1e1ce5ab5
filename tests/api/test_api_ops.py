"""Operations through the API: a full journal (503 + Retry-After) and Prometheus metrics."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio
from _api_support import make_config, running, url_of
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from edge_gateway.bucket import Bucket, FaultyBucket, LocalBucket
from edge_gateway.client import AsyncClient
from edge_gateway.config import GatewayConfig
from edge_gateway.errors import JournalFull
from edge_gateway.gateway import Gateway
from edge_gateway.metrics import MirrorLag, metrics_for


class FaultyGateway(Gateway):
    """A gateway whose bucket can be taken away by the test."""

    def __init__(self, config: GatewayConfig) -> None:
        super().__init__(config)
        self.faulty: FaultyBucket | None = None
        # The gateway opens its bucket through its wiring (edge_gateway/wiring.py).
        self.wiring.open_bucket = self._open_faulty  # type: ignore[method-assign]

    async def _open_faulty(self, *, create: bool | None = None) -> Bucket:
        inner = await LocalBucket.open(
            self.config.bucket.local_path(self.config.data_dir), create=True
        )
        self.faulty = FaultyBucket(inner)
        return self.faulty


def samples(text: str) -> dict[str, list[Sample]]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(families: dict[str, list[Sample]], family: str, sample: str | None = None) -> float:
    name = sample or family
    return next(s.value for s in families[family] if s.name == name)


async def test_full_journal_is_503_with_retry_after(tmp_path: Path) -> None:
    cfg = make_config(
        tmp_path,
        # a budget of entry logs: repeated values compressed would never fill it
        # (the compressed budget: tests/journal/test_rewriter.py)
        journal={"segment_bytes": 64 * 1024, "max_bytes": 128 * 1024, "at_rest": "off"},
        shipper={"retry_base_s": 0.02, "retry_cap_s": 0.2},
    )
    async with running(cfg, FaultyGateway) as gw, httpx.AsyncClient(base_url=url_of(gw)) as http:
        assert isinstance(gw, FaultyGateway)
        assert gw.faulty is not None
        await gw.shipper.wait_claimed()
        gw.faulty.outage = True  # nothing ships, so nothing can be deleted
        value_1k = "v" * 1000
        acked = 0
        for _ in range(1000):
            r = await http.post(
                "/v1/topics/t/records", json={"records": [{"value": value_1k, "partition": 0}]}
            )
            if r.status_code != 200:
                break
            acked += 1
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "journal_full"
        assert "budget" in r.json()["error"]["message"]
        assert int(r.headers["retry-after"]) >= 1
        assert 50 < acked < 1000
        async with AsyncClient(url_of(gw), retry_s=0) as client:  # no retry of the 503
            with pytest.raises(JournalFull) as info:
                await client.produce("t", [value_1k])
        assert "Retry-After" in info.value.__notes__[0]
        # metrics and status tell the operator why
        m = samples((await http.get("/metrics")).text)
        assert (
            value(m, "edgegw_journal_full_rejections", "edgegw_journal_full_rejections_total") >= 2
        )
        assert value(m, "edgegw_shipper_pending_lsns") >= acked
        assert value(m, "edgegw_shipper_oldest_unshipped_age_seconds") > 0
        assert value(m, "edgegw_shipper_retries", "edgegw_shipper_retries_total") >= 1
        # reads keep working while full
        r = await http.get("/v1/topics/t/partitions/0/records", params={"offset": 0})
        assert len(r.json()["records"]) > 0

        # the bucket comes back: the backlog ships, space frees, produce works again
        gw.faulty.outage = False
        with trio.fail_after(60):
            while True:
                r = await http.post("/v1/topics/t/records", json={"records": [{"value": value_1k}]})
                if r.status_code == 200:
                    break
                assert r.json()["error"]["code"] == "journal_full"
                await trio.sleep(0.05)
        # nothing acknowledged was lost: shipped, and partition 0 kept its offsets
        info = (await http.get("/v1/topics/t")).json()["partitions"][0]
        assert info["next_offset"] >= acked
        assert info["shipped_offset"] >= acked
        # deleting shipped segments made the room; reading below them is offset_out_of_range
        assert info["first_offset"] > 0
        r = await http.get("/v1/topics/t/partitions/0/records", params={"offset": 0})
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "offset_out_of_range"
        assert r.json()["error"]["earliest_offset"] == info["first_offset"]


async def test_metrics(tmp_path: Path) -> None:
    north = make_config(tmp_path / "n")
    south = make_config(
        tmp_path / "s",
        region="south",
        topics=[{"name": "t", "home": "south", "partitions": 1}],
    )
    async with (
        running(north) as gw,
        running(south) as other,
        httpx.AsyncClient(base_url=url_of(gw)) as http,
    ):
        for _ in range(3):
            r = await http.post(
                "/v1/topics/t/records?ack=shipped", json={"records": [{"value": "x"}]}
            )
            assert r.status_code == 200
        await http.get("/v1/topics/nope")
        await http.get("/not/a/route")
        # by default the mirror lag comes from the gateway's tailers (north mirrors south.s)
        m = samples((await http.get("/metrics")).text)
        assert {s.labels["source"] for s in m["edgegw_mirror_entries_behind"]} == {"south"}
        assert [s.labels["source"] for s in m["edgegw_mirror_state"]] == ["south"]
        metrics_for(gw).set_mirror_lag_provider(
            lambda: [
                MirrorLag("south", 4, 4096, 2.5, 0, 1, 3.0, "catching-up"),
                MirrorLag("east", 0, 0, None, 1, 0, None, "quarantined"),
            ]
        )
        r = await http.get("/metrics")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain")
        m = samples(r.text)
        for family in (
            "edgegw_info",
            "edgegw_accepting",
            "edgegw_journal_bytes",
            "edgegw_journal_segments",
            "edgegw_journal_appends",
            "edgegw_journal_fsyncs",
            "edgegw_journal_fsync_seconds",
            "edgegw_journal_full_rejections",
            "edgegw_journal_index_bytes",
            "edgegw_journal_index_cache_hits",
            "edgegw_shipper_pending_lsns",
            "edgegw_shipper_oldest_unshipped_age_seconds",
            "edgegw_shipper_objects",
            "edgegw_shipper_bytes",
            "edgegw_shipper_wire_bytes",
            "edgegw_shipper_retries",
            "edgegw_shipper_upload_seconds",
            "edgegw_shipper_epoch",
            "edgegw_api_request_seconds",
            "edgegw_mirror_entries_behind",
            "edgegw_mirror_lag_seconds",
        ):
            assert family in m, family
        assert value(m, "edgegw_accepting") == 1
        assert value(m, "edgegw_journal_appends", "edgegw_journal_appends_total") >= 3
        assert value(m, "edgegw_shipper_objects", "edgegw_shipper_objects_total") >= 1
        assert value(m, "edgegw_shipper_epoch") >= 1
        assert value(m, "edgegw_journal_bytes") > 0
        assert value(m, "edgegw_journal_index_bytes") > 0
        info = next(s for s in m["edgegw_info"])
        assert info.labels["region"] == "north"  # this gateway's registry, not the other's
        counts = {
            (s.labels["route"], s.labels["method"], s.labels["code"]): s.value
            for s in m["edgegw_api_request_seconds"]
            if s.name == "edgegw_api_request_seconds_count"
        }
        assert counts[("/v1/topics/{topic}/records", "POST", "200")] == 3
        assert counts[("/v1/topics/{topic}", "GET", "404")] == 1
        assert counts[("unmatched", "GET", "404")] == 1
        lag = {s.labels["source"]: s.value for s in m["edgegw_mirror_entries_behind"]}
        assert lag == {"south": 4, "east": 0}
        seconds = {s.labels["source"]: s.value for s in m["edgegw_mirror_lag_seconds"]}
        assert seconds == {"south": 2.5}  # unknown lag is left out, not reported as 0
        states = {(s.labels["source"], s.labels["state"]) for s in m["edgegw_mirror_state"]}
        assert states == {("south", "catching-up"), ("east", "quarantined")}

        async with httpx.AsyncClient(base_url=url_of(other)) as http2:
            m2 = samples((await http2.get("/metrics")).text)
        assert next(iter(m2["edgegw_info"])).labels["region"] == "south"
        assert "edgegw_mirror_entries_behind" not in m2 or not m2["edgegw_mirror_entries_behind"]
        counts2 = [s for s in m2["edgegw_api_request_seconds"] if s.name.endswith("_count")]
        assert all(s.labels["route"] == "/metrics" for s in counts2)
