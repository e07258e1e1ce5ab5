"""Kafka clients (confluent-kafka, kafka-python, aiokafka) against a real ``edgegw serve``.

Each test starts gateway processes with ``[kafka] listen`` on a free port and
drives them with unmodified clients: records with keys, null values, headers
and timestamps go in over Kafka and come out over Kafka and over the HTTP
API at the same offsets; mirrors read at another region; hostile frames get
a closed connection while the gateway goes on.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import ssl as ssl_module
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from _kafka_support import KafkaGateway, kafka_gateway
from _serve import wait_until

TOPICS = """
[[topics]]
name = "events"
home = "north"
partitions = 3
subscribers = ["*"]
"""

TS0 = 1_700_000_000_000


def _records(
    n: int = 12,
) -> list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]:
    """(partition, key, value, headers): keys and nulls mixed; timestamp is TS0 + index."""
    out = []
    for i in range(n):
        key = None if i % 4 == 0 else f"k{i}".encode()
        value = None if i % 4 == 3 else f"value {i}".encode() * (1 + i % 3)
        headers = [("trace", f"t{i}".encode()), ("empty", b""), ("none", None)] if i % 3 else []
        out.append((i % 3, key, value, headers))
    return out


def _expected(records: list[Any]) -> dict[tuple[int, int], tuple[Any, ...]]:
    """(partition, offset) -> (key, value, headers, timestamp), offsets in produce order."""
    next_offset = {0: 0, 1: 0, 2: 0}
    out = {}
    for i, (p, key, value, headers) in enumerate(records):
        out[(p, next_offset[p])] = (key, value, [tuple(h) for h in headers], TS0 + i)
        next_offset[p] += 1
    return out


def _consume_confluent(gw: KafkaGateway, topic: str, n: int, **extra: Any) -> dict[Any, Any]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": gw.bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 200,
            **extra,
        }
    )
    got: dict[Any, Any] = {}
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(3)])
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got[(m.partition(), m.offset())] = (
                m.key(),
                m.value(),
                [tuple(h) for h in (m.headers() or [])],
                m.timestamp()[1],
            )
    finally:
        c.close()
    return got


def _produce_confluent(gw: KafkaGateway, topic: str, records: list[Any], **extra: Any) -> list[Any]:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": gw.bootstrap, "linger.ms": 5, **extra})
    reports: list[Any] = []
    for i, (part, key, value, headers) in enumerate(records):
        p.produce(
            topic,
            key=key,
            value=value,
            headers=headers,
            partition=part,
            timestamp=TS0 + i,
            on_delivery=lambda err, msg: reports.append((err, msg.partition(), msg.offset())),
        )
    assert p.flush(30) == 0
    return reports


def _http_records(gw: KafkaGateway, topic: str) -> dict[tuple[int, int], tuple[Any, ...]]:
    """What the HTTP API's JSON serves for the same partitions: (key, value, headers,
    timestamp), a null value as ``"value": null, "value_b64": null``, a null header
    value as null."""

    def raw(r: dict[str, Any], field: str) -> bytes | None:
        if r[field] is not None:
            return str(r[field]).encode()
        if r[f"{field}_b64"] is not None:
            return base64.b64decode(r[f"{field}_b64"])
        return None

    out = {}
    with gw.http() as c:
        for p in range(3):
            doc = c.get(f"/v1/topics/{topic}/partitions/{p}/records", params={"offset": 0}).json()
            for r in doc["records"]:
                assert "headers_b64" not in r
                headers = [(k, None if v is None else v.encode()) for k, v in r["headers"].items()]
                out[(p, r["offset"])] = (raw(r, "key"), raw(r, "value"), headers, r["timestamp"])
    return out


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_round_trip(tmp_path: Path, compression: str) -> None:
    records = _records()
    with kafka_gateway(tmp_path, topics=TOPICS) as gw:
        reports = _produce_confluent(gw, "events", records, **{"compression.type": compression})
        assert [err for err, _, _ in reports] == [None] * len(records)
        expected = _expected(records)
        assert {(p, o) for _, p, o in reports} == set(expected)
        assert _consume_confluent(gw, "events", len(records)) == expected
        # The HTTP API serves the same records at the same offsets, nulls as nulls.
        assert _http_records(gw, "events") == expected
        status = gw.get("/v1/status")["kafka"]
        assert status["requests"]["produce"] >= 1
        assert status["requests"]["fetch"] >= 1
        assert status["protocol_errors"] == 0


def test_kafka_python_round_trip_and_offsets(tmp_path: Path) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    # kafka-python refuses null header values on send.
    records = [(p, k, v, [(n, hv or b"") for n, hv in h]) for p, k, v, h in _records()]
    with kafka_gateway(tmp_path, topics=TOPICS) as gw:
        producer = KafkaProducer(
            bootstrap_servers=gw.bootstrap,
            compression_type="gzip",
            linger_ms=5,
        )
        try:
            futures = [
                producer.send(
                    "events", key=k, value=v, headers=h, partition=p, timestamp_ms=TS0 + i
                )
                for i, (p, k, v, h) in enumerate(records)
            ]
            producer.flush(30)
            metas = [f.get(timeout=30) for f in futures]
        finally:
            producer.close(timeout=10)
        expected = _expected(records)
        assert {(m.partition, m.offset) for m in metas} == set(expected)
        consumer = KafkaConsumer(bootstrap_servers=gw.bootstrap, consumer_timeout_ms=3000)
        try:
            tps = [TopicPartition("events", p) for p in range(3)]
            consumer.assign(tps)
            assert consumer.beginning_offsets(tps) == dict.fromkeys(tps, 0)
            assert consumer.end_offsets(tps) == dict.fromkeys(tps, 4)
            # ListOffsets by timestamp: the first record at or after TS0 + 6 in each partition.
            found = consumer.offsets_for_times(dict.fromkeys(tps, TS0 + 6))
            assert {tp.partition: (o.offset, o.timestamp) for tp, o in found.items()} == {
                0: (2, TS0 + 6),
                1: (2, TS0 + 7),
                2: (2, TS0 + 8),
            }
            assert consumer.offsets_for_times({tps[0]: TS0 + 10_000})[tps[0]] is None
            consumer.seek_to_beginning()
            got = {}
            for m in consumer:
                got[(m.partition, m.offset)] = (
                    m.key,
                    m.value,
                    [tuple(h) for h in m.headers],
                    m.timestamp,
                )
                if len(got) == len(records):
                    break
        finally:
            consumer.close()
        assert got == expected


def test_aiokafka_round_trip(tmp_path: Path) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    records = _records()

    async def run(bootstrap: str) -> dict[Any, Any]:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, compression_type="gzip", linger_ms=5
        )
        await producer.start()
        try:
            for i, (p, k, v, h) in enumerate(records):
                await producer.send_and_wait(
                    "events", key=k, value=v, headers=h, partition=p, timestamp_ms=TS0 + i
                )
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
        await consumer.start()
        got: dict[Any, Any] = {}
        try:
            consumer.assign([TopicPartition("events", p) for p in range(3)])
            async with asyncio.timeout(30):
                while len(got) < len(records):
                    batch = await consumer.getmany(timeout_ms=500)
                    for msgs in batch.values():
                        for m in msgs:
                            got[(m.partition, m.offset)] = (
                                m.key,
                                m.value,
                                [tuple(h) for h in m.headers],
                                m.timestamp,
                            )
        finally:
            await consumer.stop()
        return got

    with kafka_gateway(tmp_path, topics=TOPICS) as gw:
        assert asyncio.run(run(gw.bootstrap)) == _expected(records)


def test_acks(tmp_path: Path) -> None:
    """acks=0: no answer, journaled; acks=all with kafka.acks_all = "shipped": in the bucket."""
    with kafka_gateway(tmp_path, topics=TOPICS, extra='acks_all = "shipped"') as gw:
        records = [(0, b"k", b"fire and forget", [])] * 5
        _produce_confluent(gw, "events", records, acks=0)
        with gw.http() as c:
            deadline = time.monotonic() + 30
            while c.get("/v1/topics/events").json()["partitions"][0]["next_offset"] < 5:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        reports = _produce_confluent(gw, "events", [(1, None, b"durable", [])] * 3, acks="all")
        assert [(err, p) for err, p, _ in reports] == [(None, 1)] * 3
        last = max(o for _, _, o in reports)
        doc = gw.get("/v1/topics/events")
        # Acknowledged only once committed to the bucket.
        assert doc["partitions"][1]["shipped_offset"] >= last + 1


def test_mirror_topic_reads_with_the_source_offsets(tmp_path: Path) -> None:
    mirror = "[mirror]\npoll_interval_ms = 50\nmax_poll_interval_ms = 200"
    records = _records()
    with (
        kafka_gateway(tmp_path, "north", topics=TOPICS) as north,
        kafka_gateway(tmp_path, "south", topics=TOPICS, extra_toml=mirror) as south,
    ):
        _produce_confluent(north, "events", records)
        expected = _expected(records)
        assert _consume_confluent(south, "north.events", len(records)) == expected
        # Keys, nulls, headers and timestamps through the bucket: the mirror's HTTP
        # API serves them as the source's does.
        assert _http_records(south, "north.events") == expected
        # Produce to the mirror: refused, with a final error naming why.
        from confluent_kafka import KafkaError

        reports = _produce_confluent(south, "north.events", [(0, None, b"no", [])])
        ((err, _, _),) = reports
        assert err is not None
        assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert south.get("/v1/status")["kafka"]["errors"] == {"topic_authorization_failed": 1}


def _raw(gw: KafkaGateway) -> socket.socket:
    host, _, port = gw.bootstrap.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(1 << 16) == b""
    except ConnectionResetError:
        return True


def test_hostile_frames_close_the_connection_and_the_gateway_lives(tmp_path: Path) -> None:
    from kafka import KafkaAdminClient

    api_versions_v99 = bytes.fromhex("0012006300000005") + b"\xff\xff"
    with kafka_gateway(tmp_path, topics=TOPICS) as gw:
        hostile = [
            (2**31 - 1).to_bytes(4, "big"),  # huge length: refused before reading it
            (-7).to_bytes(4, "big", signed=True),
            (8).to_bytes(4, "big") + bytes.fromhex("2710000000000001"),  # unknown API key 10000
            (10).to_bytes(4, "big") + bytes.fromhex("0003007f0000000200ff"),  # Metadata v127
            (12).to_bytes(4, "big")
            + bytes.fromhex("0003000c00000002000178" + "00"),  # truncated body
            # Metadata v12 claiming ~2**34 topics (kio alone would abort the process)
            bytes.fromhex("0000001a0003000c00000002000178" + "00a597bfd5737c0a98020000000002"),
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS client on the plain port
        ]
        for frame in hostile:
            with _raw(gw) as s:
                s.sendall(frame)
                assert _closed(s), frame
        with _raw(gw) as s:  # half a frame, then the client goes away
            s.sendall((100).to_bytes(4, "big") + b"\0" * 10)
        with _raw(gw) as s:  # ApiVersions at a version not served: answered (KIP-511)
            s.sendall(len(api_versions_v99).to_bytes(4, "big") + api_versions_v99)
            head = s.recv(10)
            assert head[4:8] == (5).to_bytes(4, "big")  # correlation id
            assert head[8:10] == (35).to_bytes(2, "big")  # UNSUPPORTED_VERSION
        admin = KafkaAdminClient(bootstrap_servers=gw.bootstrap, request_timeout_ms=10_000)
        try:
            assert admin.list_topics() == ["events"]
        finally:
            admin.close()
        status = gw.get("/v1/status")["kafka"]
        assert status["protocol_errors"] >= len(hostile)
        assert gw.alive
        metrics = gw.get("/metrics")
        assert "edgegw_kafka_protocol_errors_total" in metrics


def test_topics_are_created_where_auto_create_allows(tmp_path: Path) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    with kafka_gateway(tmp_path, topics=TOPICS) as gw:
        admin = KafkaAdminClient(bootstrap_servers=gw.bootstrap, request_timeout_ms=10_000)
        try:
            admin.create_topics([NewTopic("made", num_partitions=-1, replication_factor=-1)])
            with pytest.raises(TopicAlreadyExistsError):
                admin.create_topics([NewTopic("events", 3, 1)])
            assert sorted(admin.list_topics()) == ["events", "made"]
            (cfg,) = admin.describe_configs(
                [
                    __import__("kafka.admin", fromlist=["ConfigResource"]).ConfigResource(
                        "TOPIC", "made"
                    )
                ]
            )
            assert cfg is not None
        finally:
            admin.close()
        # Producing to a topic that does not exist yet creates it (auto_create = true).
        reports = _produce_confluent(gw, "fresh", [(0, None, b"x", [])])
        assert [err for err, _, _ in reports] == [None]
        assert gw.get("/v1/topics/fresh")["partitions"][0]["next_offset"] == 1


def test_tls_on_the_api_terms(tmp_path: Path) -> None:
    """With api.tls_* set, the Kafka listener speaks TLS with the same certificate."""
    from edge_gateway.testing.tls import make_tls_files

    files = make_tls_files(tmp_path / "tls", names=("127.0.0.1",))
    tls = f'tls_cert = "{files.cert}"\ntls_key = "{files.key}"'
    records = _records()
    with kafka_gateway(tmp_path, topics=TOPICS, extra_toml=tls) as gw:
        ssl = {"security.protocol": "SSL", "ssl.ca.location": str(files.ca)}
        reports = _produce_confluent(gw, "events", records, **ssl)
        assert [err for err, _, _ in reports] == [None] * len(records)
        assert _consume_confluent(gw, "events", len(records), **ssl) == _expected(records)
        ctx = ssl_module.create_default_context(cafile=str(files.ca))
        # librdkafka may close a connection it no longer needs (the group coordinator's,
        # since FindCoordinator is served) before its handshake ends: count from here.
        with httpx.Client(base_url=gw.url, verify=ctx, timeout=30) as c:
            before = c.get("/v1/status").json()["kafka"]["tls_handshake_failures"]
        # A plaintext client on the TLS listener gets nowhere; the gateway counts it.
        with _raw(gw) as s:
            port = s.getsockname()[1]
            s.sendall(bytes.fromhex("00000015000300010000000100017800000001000000"))
            assert _closed(s)
        with httpx.Client(base_url=gw.url, verify=ctx, timeout=30) as c:
            status = c.get("/v1/status").json()["kafka"]
        assert status["tls"] is True
        assert status["tls_handshake_failures"] >= before + 1
        assert f"kafka: 127.0.0.1:{port}: TLS handshake failed" in gw.log.read_text()


def test_a_waiting_fetch_returns_what_is_produced_meanwhile(tmp_path: Path) -> None:
    """A consumer at the end of a partition long-polls (fetch.wait.max.ms) and gets new records."""
    import threading

    from confluent_kafka import Consumer, TopicPartition

    with kafka_gateway(tmp_path, topics=TOPICS) as gw:
        consumer = Consumer(
            {
                "bootstrap.servers": gw.bootstrap,
                "group.id": "g",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10_000,
            }
        )
        got: list[Any] = []
        done = threading.Event()

        def poll() -> None:
            deadline = time.monotonic() + 30
            while not got and time.monotonic() < deadline:
                m = consumer.poll(0.2)
                if m is not None and m.error() is None:
                    got.append((m.partition(), m.offset(), m.value()))
            done.set()

        try:
            consumer.assign([TopicPartition("events", 1, 0)])
            thread = threading.Thread(target=poll)
            thread.start()
            wait_until(
                lambda: gw.get("/v1/status")["kafka"]["requests"].get("fetch", 0),
                30,
                "the consumer's first Fetch",
            )
            _produce_confluent(gw, "events", [(1, b"k", b"late", [])])
            assert done.wait(40)
            thread.join(timeout=10)
        finally:
            consumer.close()
        assert got == [(1, 0, b"late")]


def test_nulls_stored_with_the_legacy_marker_still_fetch_as_nulls(tmp_path: Path) -> None:
    """Gateways from before nulls in the batch format stored a Kafka null as an empty
    value plus the reserved header edgegw.kafka.null: such records (in journals,
    buckets and mirrors) still come back over Kafka as nulls."""
    from edge_gateway.format.batch import encode_batch
    from edge_gateway.kafka._records import NULL_HEADER

    legacy = encode_batch(
        [b"", b"v"],
        keys=[b"k0", None],
        timestamps=[TS0, TS0 + 1],
        headers=[[(NULL_HEADER, b"value")], [("a", b""), ("b", b"x"), (NULL_HEADER, b"h0")]],
    )
    with kafka_gateway(tmp_path, topics=TOPICS) as gw, gw.http() as c:
        r = c.post(
            "/v1/topics/events/partitions/0/batches",
            content=legacy,
            headers={"content-type": "application/vnd.edgegw.batch"},
        )
        assert r.status_code == 200, r.text
        got = _consume_confluent(gw, "events", 2)
        assert got == {
            (0, 0): (b"k0", None, [], TS0),
            (0, 1): (None, b"v", [("a", None), ("b", b"x")], TS0 + 1),
        }
        # A Kafka record may not use the reserved name itself.
        reports = _produce_confluent(gw, "events", [(0, None, b"x", [(NULL_HEADER, b"value")])])
        assert reports[0][0] is not None


def test_snappy_without_cramjam_is_unsupported_compression_type(tmp_path: Path) -> None:
    """Without the kafka extra's cramjam, snappy is refused as before (no record stored)."""
    from confluent_kafka import KafkaError

    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "cramjam.py").write_text('raise ImportError("cramjam hidden by the test")\n')
    pythonpath = os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")])
    with kafka_gateway(tmp_path, topics=TOPICS, env={"PYTHONPATH": pythonpath}) as gw:
        reports = _produce_confluent(
            gw, "events", [(0, None, b"x" * 100, [])], **{"compression.type": "snappy"}
        )
        ((err, _, _),) = reports
        assert err is not None
        assert err.code() == KafkaError.UNSUPPORTED_COMPRESSION_TYPE
        assert gw.get("/v1/topics/events")["partitions"][0]["next_offset"] == 0
        assert gw.get("/v1/status")["kafka"]["errors"] == {"unsupported_compression_type": 1}


def test_mutual_tls_requires_a_client_certificate(tmp_path: Path) -> None:
    """With api.tls_client_ca, a Kafka client must present a certificate that CA signed."""
    from edge_gateway.testing.tls import make_tls_files

    files = make_tls_files(tmp_path / "tls", names=("127.0.0.1",))
    assert files.client_cert is not None
    assert files.client_key is not None
    tls = f'tls_cert = "{files.cert}"\ntls_key = "{files.key}"\ntls_client_ca = "{files.ca}"'
    with kafka_gateway(tmp_path, topics=TOPICS, extra_toml=tls) as gw:
        ssl = {"security.protocol": "SSL", "ssl.ca.location": str(files.ca)}
        mutual = {
            **ssl,
            "ssl.certificate.location": str(files.client_cert),
            "ssl.key.location": str(files.client_key),
        }
        reports = _produce_confluent(gw, "events", [(0, None, b"signed", [])], **mutual)
        assert [err for err, _, _ in reports] == [None]
        anonymous = _produce_confluent(
            gw, "events", [(0, None, b"anonymous", [])], **ssl, **{"message.timeout.ms": 3000}
        )
        ((err, _, _),) = anonymous
        assert err is not None
        ctx = ssl_module.create_default_context(cafile=str(files.ca))
        ctx.load_cert_chain(str(files.client_cert), str(files.client_key))
        with httpx.Client(base_url=gw.url, verify=ctx, timeout=30) as c:
            assert c.get("/v1/topics/events").json()["partitions"][0]["next_offset"] == 1
            assert c.get("/v1/status").json()["kafka"]["tls_handshake_failures"] >= 1


def test_a_produce_over_the_frame_limit_gets_message_too_large(tmp_path: Path) -> None:
    # Issue 41, item 8: a request over kafka.max_request_bytes closed the
    # connection, and librdkafka said "verify that security.protocol is correctly
    # configured". A broker answers a batch over message.max.bytes with
    # MESSAGE_TOO_LARGE per partition and keeps the connection: so does the gateway.
    from confluent_kafka import KafkaError, Producer

    with kafka_gateway(tmp_path, topics=TOPICS, extra="max_request_bytes = 65536") as gw:
        logs: list[str] = []
        p = Producer(
            {
                "bootstrap.servers": gw.bootstrap,
                "message.max.bytes": 1_000_000,  # the client lets it go; the gateway must answer
                "linger.ms": 0,
                "retries": 0,
                "logger": _ListLogger(logs),
            }
        )
        reports: list[Any] = []

        def report(err: Any, msg: Any) -> None:
            reports.append((err, msg.partition(), msg.offset()))

        p.produce("events", value=os.urandom(200_000), partition=1, on_delivery=report)
        assert p.flush(30) == 0
        ((err, part, _),) = reports
        assert err is not None
        assert err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
        assert part == 1
        # The same connection goes on: a small record is taken.
        reports.clear()
        p.produce("events", value=b"small", partition=1, on_delivery=report)
        assert p.flush(30) == 0
        ((err, part, offset),) = reports
        assert err is None, err
        assert (part, offset) == (1, 0)
        assert not [line for line in logs if "security.protocol" in line], logs
        status = gw.get("/v1/status")["kafka"]
        assert status["errors"] == {"message_too_large": 1}
        assert status["protocol_errors"] == 0
    assert "answered MESSAGE_TOO_LARGE" in gw.log.read_text()


class _ListLogger:
    """A ``logging.Logger`` stand-in for librdkafka's ``logger``: keeps each line."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def log(self, level: int, fmt: str, *args: Any) -> None:
        self.lines.append(fmt % args if args else fmt)
