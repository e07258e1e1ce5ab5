"""The local HTTP API against a real gateway: round trips, long polls, groups, shutdown."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import pytest
import trio
from _api_support import make_config, running, url_of

from edge_gateway.api.wire import BATCH_MEDIA_TYPE, HIGH_WATERMARK_HEADER, NEXT_OFFSET_HEADER
from edge_gateway.client import AsyncClient, Client, OffsetOutOfRange
from edge_gateway.errors import ReadOnlyTopic, UnknownTopic
from edge_gateway.format.batch import FLAG_NULLS, encode_batch, iter_batches
from edge_gateway.gateway import ProduceRecord


async def test_json_round_trip(tmp_path: Path) -> None:
    async with running(make_config(tmp_path)) as gw:
        assert (gw.config.data_dir / "api.addr").read_text().strip() == url_of(gw)[7:]
        async with httpx.AsyncClient(base_url=url_of(gw)) as http:
            body = {
                "records": [
                    {"value": "héllo", "key": "k1", "headers": {"h": "v"}, "timestamp": 1234},
                    {"value": {"temp": 21.5, "ok": True}, "key": "k1"},
                    {"value_b64": base64.b64encode(b"\xff\x00raw").decode(), "partition": 2},
                    {"value": [1, 2], "key_b64": base64.b64encode(b"\xfe").decode()},
                    {"value": "binhdr", "headers_b64": {"b": base64.b64encode(b"\xff").decode()}},
                ]
            }
            r = await http.post("/v1/topics/t/records", json=body)
            assert r.status_code == 200, r.text
            doc = r.json()
            assert doc["topic"] == "t"
            assert doc["shipped"] is False
            offsets = doc["offsets"]
            assert len(offsets) == 5
            assert offsets[0]["partition"] == offsets[1]["partition"]  # same key
            assert offsets[2]["partition"] == 2
            got = {}
            for p in range(3):
                r = await http.get(f"/v1/topics/t/partitions/{p}/records", params={"offset": 0})
                assert r.status_code == 200, r.text
                page = r.json()
                assert page["high_watermark"] == page["next_offset"] == len(page["records"])
                for rec in page["records"]:
                    got[(p, rec["offset"])] = rec
            first = got[(offsets[0]["partition"], offsets[0]["offset"])]
            assert first["value"] == "héllo"
            assert first["value_b64"] is None
            assert first["key"] == "k1"
            assert first["headers"] == {"h": "v"}
            assert first["timestamp"] == 1234
            second = got[(offsets[1]["partition"], offsets[1]["offset"])]
            assert second["value"] == '{"temp":21.5,"ok":true}'  # compact JSON bytes
            third = got[(2, offsets[2]["offset"])]
            assert third["value"] is None
            assert base64.b64decode(third["value_b64"]) == b"\xff\x00raw"
            fourth = got[(offsets[3]["partition"], offsets[3]["offset"])]
            assert fourth["key"] is None
            assert base64.b64decode(fourth["key_b64"]) == b"\xfe"
            assert fourth["value"] == "[1,2]"
            fifth = got[(offsets[4]["partition"], offsets[4]["offset"])]
            assert fifth["headers"] == {}
            assert base64.b64decode(fifth["headers_b64"]["b"]) == b"\xff"

            # what the API wrote is what the in-process API reads
            res = await gw.fetch("t", 2, offsets[2]["offset"])
            assert res.records[0].value == b"\xff\x00raw"

            # topics, one topic, status, health
            r = await http.get("/v1/topics")
            names = [t["name"] for t in r.json()["topics"]]
            assert names == ["south.s", "t"]
            r = await http.get("/v1/topics/t")
            assert sum(p["next_offset"] for p in r.json()["partitions"]) == 5
            r = await http.get("/v1/status")
            assert r.json()["region"] == "north"
            assert r.json()["accepting"] is True
            r = await http.get("/healthz")
            assert r.status_code == 200


async def test_binary_round_trip_and_fetch_formats(tmp_path: Path) -> None:
    async with (
        running(make_config(tmp_path)) as gw,
        httpx.AsyncClient(base_url=url_of(gw)) as http,
        AsyncClient(url_of(gw)) as client,
    ):
        values = [f"value-{i}".encode() for i in range(50)]
        keys: list[bytes | None] = [None if i % 3 else b"\x00k%d" % i for i in range(50)]
        headers = [(("trace", b"\x01\x02"),) if i % 5 == 0 else () for i in range(50)]
        batch = encode_batch(values, keys=keys, timestamps=list(range(50)), headers=headers)
        r = await http.post(
            "/v1/topics/t/partitions/1/batches",
            content=batch,
            headers={"content-type": BATCH_MEDIA_TYPE},
        )
        assert r.status_code == 200, r.text
        assert [o["offset"] for o in r.json()["offsets"]] == list(range(50))
        assert {o["partition"] for o in r.json()["offsets"]} == {1}
        # a second batch through the client, which encodes the values itself
        res = await client.produce_batch("t", 1, [b"x", "y"], keys=[b"kx", None])
        assert res.offsets == [50, 51]

        # binary fetch: the journal's batches, as they are
        r = await http.get(
            "/v1/topics/t/partitions/1/records",
            params={"offset": 10},
            headers={"accept": BATCH_MEDIA_TYPE},
        )
        assert r.status_code == 200
        assert r.headers["content-type"] == BATCH_MEDIA_TYPE
        assert r.headers[NEXT_OFFSET_HEADER] == "52"
        assert r.headers[HIGH_WATERMARK_HEADER] == "52"
        recs = [rec for b in iter_batches(r.content) for rec in b.records(10)]
        assert [rec.value for rec in recs] == [*values[10:], b"x", b"y"]
        assert [rec.key for rec in recs[:5]] == keys[10:15]
        assert recs[0].headers == (("trace", b"\x01\x02"),)

        # the client decodes both formats to the same records
        for binary in (False, True):
            page = await client.fetch("t", 1, 10, binary=binary)
            assert [rec.value for rec in page.records] == [*values[10:], b"x", b"y"]
            assert [rec.key for rec in page.records][:5] == keys[10:15]
            assert page.records[0].headers == (("trace", b"\x01\x02"),)
            assert page.records[0].timestamp == 10
            assert page.next_offset == 52
        page = await client.fetch("t", 1, 0, max_records=7)
        assert [rec.offset for rec in page.records] == list(range(7))
        assert page.next_offset == 7

        # client produce with keys, headers and record objects
        res = await client.produce(
            "t",
            [b"\xffbin", "text", ProduceRecord(b"obj", partition=0)],
            key="same",
            headers=[("a", "b")],
        )
        assert res.partitions[0] == res.partitions[1]
        assert res.partitions[2] == 0
        page = await client.fetch("t", res.partitions[0], res.offsets[0])
        assert page.records[0].value == b"\xffbin"
        assert page.records[0].key == b"same"
        assert page.records[0].headers == (("a", b"b"),)


async def test_null_values_round_trip(tmp_path: Path) -> None:
    """A null value (a Kafka tombstone) and a null header value are data: JSON
    produce takes them as null, JSON consume shows null (not "" nor the text
    "null"), the binary route carries the batch's NULLS flag as it is, and both
    clients give None back."""
    async with (
        running(make_config(tmp_path)) as gw,
        httpx.AsyncClient(base_url=url_of(gw)) as http,
        AsyncClient(url_of(gw)) as client,
    ):
        body = {
            "records": [
                {"value": None, "key": "k", "headers": {"h": None, "g": "x"}, "partition": 0},
                {"value": "", "partition": 0},
                {"value": "null", "partition": 0},
                {"value_b64": None, "headers_b64": {"b": None}, "partition": 0},
            ]
        }
        r = await http.post("/v1/topics/t/records", json=body)
        assert r.status_code == 200, r.text
        r = await http.get("/v1/topics/t/partitions/0/records", params={"offset": 0})
        recs = r.json()["records"]
        assert [(x["value"], x["value_b64"]) for x in recs] == [
            (None, None),
            ("", None),
            ("null", None),
            (None, None),
        ]
        assert recs[0]["headers"] == {"h": None, "g": "x"}
        assert recs[3]["headers"] == {"b": None}
        assert "headers_b64" not in recs[3]
        expected = [
            (b"k", None, (("h", None), ("g", b"x"))),
            (None, b"", ()),
            (None, b"null", ()),
            (None, None, (("b", None),)),
        ]
        # the binary route: the journal's batch as stored, with its NULLS flag
        r = await http.get(
            "/v1/topics/t/partitions/0/records",
            params={"offset": 0},
            headers={"accept": BATCH_MEDIA_TYPE},
        )
        (batch,) = iter_batches(r.content)
        assert batch.header.flags & FLAG_NULLS
        assert [(x.key, x.value, x.headers) for x in batch.records()] == expected
        for binary in (False, True):
            page = await client.fetch("t", 0, 0, binary=binary)
            assert [(x.key, x.value, x.headers) for x in page.records] == expected
        sync = Client(url_of(gw))
        try:
            page = await trio.to_thread.run_sync(sync.fetch, "t", 0, 0)
            assert [(x.key, x.value, x.headers) for x in page.records] == expected
            # a fetched record produced again keeps its nulls (the client's JSON)
            res = await trio.to_thread.run_sync(sync.produce, "t", page.records[0])
        finally:
            sync.close()
        again = await client.fetch("t", res.partitions[0], res.offsets[0])
        assert again.records[0].value is None
        assert again.records[0].headers == (("h", None), ("g", b"x"))
        # a header value that is neither a string nor null is still refused
        r = await http.post("/v1/topics/t/records", json={"records": [{"headers": {"h": 1}}]})
        assert r.status_code == 400


async def test_long_poll_wakes_on_append(tmp_path: Path) -> None:
    async with running(make_config(tmp_path)) as gw, AsyncClient(url_of(gw)) as client:
        hwm = (await client.fetch("t", 0, 0)).high_watermark

        async def produce_later() -> None:
            await trio.sleep(0.2)
            await client.produce("t", ["late"], partition=0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce_later)
            started = trio.current_time()
            page = await client.fetch("t", 0, hwm, wait_ms=30_000)
            elapsed = trio.current_time() - started
        assert [r.value for r in page.records] == [b"late"]
        assert elapsed < 20  # woken by the append, not by the 30 s timeout
        # a long poll that nothing wakes returns empty after wait_ms
        page = await client.fetch("t", 1, 0, wait_ms=50)
        assert page.records == []
        assert page.next_offset == 0


async def test_shutdown_ends_long_polls(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    async with running(cfg) as gw:
        url = url_of(gw)
        results: list[httpx.Response] = []

        async def poll() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                results.append(
                    await http.get(
                        "/v1/topics/t/partitions/0/records", params={"offset": 0, "wait_ms": 60_000}
                    )
                )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll)
            await trio.sleep(0.3)
            started = trio.current_time()
            gw.request_shutdown()
        assert trio.current_time() - started < 30
        assert results[0].status_code == 200
        assert results[0].json()["records"] == []
    assert not (cfg.data_dir / "api.addr").exists()


async def test_group_offsets_survive_restart(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    async with running(cfg) as gw, AsyncClient.from_data_dir(cfg.data_dir) as client:
        await client.produce("t", ["a", "b", "c"], partition=1)
        n = await client.commit_offsets("dash", [("t", 1, 3, "checkpoint-1"), ("south.s", 0, 0)])
        assert n == 2
        assert await client.commit_offsets("other", {("t", 0): 0}) == 1
    async with running(cfg) as gw, AsyncClient(url_of(gw)) as client:
        rows = await client.fetch_offsets("dash")
        assert [(r.topic, r.partition, r.offset, r.metadata) for r in rows] == [
            ("south.s", 0, 0, ""),
            ("t", 1, 3, "checkpoint-1"),
        ]
        rows = await client.fetch_offsets("dash", topic="t")
        assert [(r.topic, r.offset) for r in rows] == [("t", 3)]
        assert rows[0].committed_ms > 0
        assert await client.fetch_offsets("nobody") == []
        with pytest.raises(UnknownTopic):
            await client.fetch_offsets("dash", topic="nope")


async def test_ack_shipped(tmp_path: Path) -> None:
    async with running(make_config(tmp_path)) as gw, AsyncClient(url_of(gw)) as client:
        res = await client.produce("t", ["geo"], ack="shipped")
        assert res.shipped
        info = await client.topic("t")
        p = res.partitions[0]
        assert info["partitions"][p]["shipped_offset"] >= res.offsets[0] + 1


async def test_client_errors_are_edgegw_errors(tmp_path: Path) -> None:
    async with running(make_config(tmp_path, journal={"retention_ms": 0})) as gw:
        async with AsyncClient(url_of(gw)) as client:
            with pytest.raises(UnknownTopic) as info:
                await client.produce("nope", ["x"])
            assert "404 unknown_topic" in info.value.__notes__[0]
            with pytest.raises(ReadOnlyTopic):
                await client.produce("south.s", ["x"])
        url = url_of(gw)
    # the gateway is gone: connection refused -> Unavailable
    from edge_gateway.errors import Unavailable

    async with AsyncClient(url, timeout=5) as client:
        with pytest.raises(Unavailable):
            await client.status()
        assert not await client.healthy()
    with pytest.raises(Unavailable, match=r"api\.addr"):
        AsyncClient.from_data_dir(tmp_path / "data")


def test_offset_out_of_range_is_typed() -> None:
    """The client maps offset_out_of_range with its earliest offset (no server needed)."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            400,
            json={
                "error": {
                    "code": "offset_out_of_range",
                    "message": "t/0: offset 3 is no longer in the journal (earliest available 9)",
                    "earliest_offset": 9,
                }
            },
        )

    from edge_gateway.client import Client

    with (
        Client("http://gw", transport=httpx.MockTransport(handler)) as client,
        pytest.raises(OffsetOutOfRange) as info,
    ):
        client.fetch("t", 0, 3)
    assert info.value.earliest == 9
