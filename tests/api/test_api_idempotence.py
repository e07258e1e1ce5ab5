"""Idempotent produce over HTTP: producer ids, sequences, duplicates, the 409 codes, the clients.

Raw HTTP first (what any client sends), then the Python clients, which use it
by default: a retried produce answers with the original offsets.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio
from _api_support import gateway_thread, make_config, running, url_of

from edge_gateway._crc import crc32c
from edge_gateway.api._codec import producer_param
from edge_gateway.api.wire import (
    BATCH_MEDIA_TYPE,
    PRODUCER_EPOCH_HEADER,
    PRODUCER_ID_HEADER,
    PRODUCER_SEQUENCE_HEADER,
)
from edge_gateway.client import AsyncClient, Client
from edge_gateway.errors import InvalidInput, OutOfOrderSequence, ProducerFenced
from edge_gateway.format.batch import encode_batch
from edge_gateway.idempotence import ProducerSeq


def producer(pid: int, epoch: int, seq: int) -> dict[str, str]:
    return {
        PRODUCER_ID_HEADER: str(pid),
        PRODUCER_EPOCH_HEADER: str(epoch),
        PRODUCER_SEQUENCE_HEADER: str(seq),
    }


async def test_http_idempotent_produce(tmp_path: Path) -> None:
    async with running(make_config(tmp_path)) as gw, httpx.AsyncClient(base_url=url_of(gw)) as http:
        r = await http.post("/v1/producers")
        assert r.status_code == 200, r.text
        pid, epoch = r.json()["producer_id"], r.json()["epoch"]
        assert epoch == 0
        body = {"records": [{"value": "a", "partition": 1}, {"value": "b", "partition": 1}]}
        r = await http.post("/v1/topics/t/records", json=body, headers=producer(pid, epoch, 0))
        assert r.status_code == 200, r.text
        first = r.json()
        assert "duplicate" not in first
        r = await http.post("/v1/topics/t/records", json=body, headers=producer(pid, epoch, 0))
        assert r.json() == {**first, "duplicate": True}
        # ack=shipped answers a duplicate too, once shipped
        r = await http.post(
            "/v1/topics/t/records?ack=shipped", json=body, headers=producer(pid, epoch, 0)
        )
        assert r.json()["duplicate"] is True
        assert r.json()["shipped"] is True
        # the binary route: the sequence continues on partition 1
        batch = encode_batch([b"c"], timestamps=1)
        hdrs = {"content-type": BATCH_MEDIA_TYPE, **producer(pid, epoch, 2)}
        url = "/v1/topics/t/partitions/1/batches"
        r = await http.post(url, content=batch, headers=hdrs)
        assert r.json()["offsets"] == [{"partition": 1, "offset": 2}]
        r = await http.post(url, content=batch, headers=hdrs)
        assert r.json()["duplicate"] is True
        r = await http.get("/v1/topics/t/partitions/1/records", params={"offset": 0})
        assert [x["value"] for x in r.json()["records"]] == ["a", "b", "c"]

        # errors: a gap, an unknown id, a fenced epoch, missing or bad headers
        r = await http.post(url, content=batch, headers={**hdrs, **producer(pid, epoch, 9)})
        assert r.status_code == 409
        assert r.json()["error"]["code"] == "out_of_order_sequence"
        assert r.json()["error"]["expected_sequence"] == 3
        r = await http.post(url, content=batch, headers={**hdrs, **producer(pid + 99, 0, 0)})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "unknown_producer")
        r = await http.post("/v1/producers", json={"producer_id": pid, "epoch": epoch})
        assert r.json() == {"producer_id": pid, "epoch": epoch + 1}
        r = await http.post(url, content=batch, headers={**hdrs, **producer(pid, epoch, 3)})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "producer_fenced")
        r = await http.post("/v1/producers", json={"producer_id": pid, "epoch": epoch})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "producer_fenced")
        r = await http.post("/v1/producers", json={"producer_id": pid + 99})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "unknown_producer")
        r = await http.post(
            "/v1/topics/t/records", json=body, headers={PRODUCER_ID_HEADER: str(pid)}
        )
        assert r.status_code == 400
        assert "EdgeGW-Producer-Epoch" in r.json()["error"]["message"]
        r = await http.post("/v1/topics/t/records", json=body, headers=producer(pid, epoch + 1, -1))
        assert r.status_code == 400
        # the gateway does not choose partitions for an idempotent request
        r = await http.post(
            "/v1/topics/t/records",
            json={"records": [{"value": "x"}]},
            headers=producer(pid, epoch + 1, 0),
        )
        assert r.status_code == 400
        assert "one partition" in r.json()["error"]["message"]
        r = await http.post("/v1/producers", json={"epoch": 1})
        assert r.status_code == 400
        status = (await http.get("/v1/status")).json()
        assert status["producers"]["remembered"] == 1
        assert status["producers"]["duplicates"] == 3
        metrics = (await http.get("/metrics")).text
        assert "edgegw_producers_remembered 1.0" in metrics
        assert "edgegw_produce_duplicates_total 3.0" in metrics


async def test_async_client_numbers_partitions_and_answers_duplicates(tmp_path: Path) -> None:
    async with running(make_config(tmp_path)) as gw, AsyncClient(url_of(gw)) as client:
        keys = [f"k{i}" for i in range(12)]
        res = await client.produce("t", [{"value": k, "key": k} for k in keys])
        # placed as the gateway places keyed records
        assert res.partitions == [int(crc32c(k.encode())) % 3 for k in keys]
        assert not res.duplicate
        pid, epoch = await client.init_producer()
        # sequences per partition: the next produce to each continues
        idem = client._idem
        assert sum(idem.next_seq.values()) == len(keys)
        # a plain record (no key): one partition per call
        res = await client.produce("t", ["u1", "u2"])
        assert len(set(res.partitions)) == 1
        # a repeat of the same sequence (as a retry after a lost answer sends it)
        p = res.partitions[0]
        idem.next_seq[("t", p)] -= 2
        again = await client.produce("t", ["u1", "u2"], partition=p)
        assert again.duplicate
        assert again.offsets == res.offsets
        # a gap is refused; the next produce bumps the epoch and starts over
        before = idem.next_seq[("t", p)]
        idem.next_seq[("t", p)] += 5
        with pytest.raises(OutOfOrderSequence) as info:
            await client.produce("t", ["gap"], partition=p)
        assert info.value.expected == before
        res = await client.produce("t", ["after"], partition=p)
        assert await client.init_producer() == (pid, epoch + 1)
        assert not res.duplicate
        b = await client.produce_batch("t", 0, [b"x", b"y"])
        assert b.offsets[1] == b.offsets[0] + 1
        # another instance of the producer fences this one
        other = AsyncClient(url_of(gw))
        other._idem.producer_id, other._idem.epoch = pid, epoch + 1
        other._idem.uncertain = True
        assert await other.init_producer() == (pid, epoch + 2)
        with pytest.raises(ProducerFenced):
            await client.produce("t", ["zombie"], partition=0)
        await other.aclose()


def test_sync_client_plain_and_idempotent(tmp_path: Path) -> None:
    with gateway_thread(make_config(tmp_path, auto_create=True, default_partitions=2)) as g:
        with Client(g.url) as client:
            # a topic that does not exist yet: the first call writes partition 0
            res = client.produce("fresh", ["a", "b"], key="k")
            assert res.partitions == [0, 0]
            res = client.produce("fresh", ["c"], key="k")
            assert res.partitions == [int(crc32c(b"k")) % 2]
            with pytest.raises(InvalidInput):
                client.produce("t", ["x"], partition=7)
        with Client(g.url, idempotent=False) as plain:
            res = plain.produce("t", ["y"])
            assert not res.duplicate
            assert plain._idem.producer_id is None


async def test_concurrent_tasks_of_one_async_client_never_share_a_sequence(
    tmp_path: Path,
) -> None:
    """Tasks producing to the same partitions at once: each record written once, none lost."""
    async with running(make_config(tmp_path)) as gw, AsyncClient(url_of(gw)) as client:
        results: list[tuple[str, int, int]] = []

        async def task(n: int) -> None:
            for i in range(20):
                values = [f"{n}-{i}-{k}" for k in range(3)]
                res = await client.produce("t", values, partition=i % 2)
                assert not res.duplicate
                results.extend(zip(values, res.partitions, res.offsets, strict=True))

        async with trio.open_nursery() as nursery:
            for n in range(8):
                nursery.start_soon(task, n)
        assert len(results) == 8 * 20 * 3
        stored = {}
        for p in (0, 1):
            page = await client.fetch("t", p, 0, max_records=10_000)
            stored.update({r.value.decode(): (p, r.offset) for r in page.records})
        assert len(stored) == len(results)
        assert {v: (p, o) for v, p, o in results} == stored


def test_producer_headers_are_parsed_strictly() -> None:
    """Only ASCII digits in range (a header's bytes are latin-1: b"\\xb2" is "²", a digit to
    str.isdigit that int() refuses)."""
    assert producer_param({}) is None
    ok = {k.lower(): v for k, v in producer(7, 1, 3).items()}  # as the server has them
    assert producer_param(ok) == ProducerSeq(7, 1, 3)
    ok[PRODUCER_SEQUENCE_HEADER.lower()] = " 4 "
    assert producer_param(ok) == ProducerSeq(7, 1, 4)
    for bad in ("²", "+1", "-1", "", "1" * 20, "1_000", str(2**31), "٣"):
        headers = {k.lower(): v for k, v in producer(7, 1, 3).items()}
        headers[PRODUCER_SEQUENCE_HEADER.lower()] = bad
        with pytest.raises(InvalidInput, match="is not a producer sequence"):
            producer_param(headers)
    with pytest.raises(InvalidInput, match="is not a producer epoch"):
        producer_param({k.lower(): v for k, v in producer(7, 2**15, 3).items()})
