"""Kafka consumer groups and SASL/PLAIN on a real ``edgegw serve``, with real clients.

Every wait is bounded (a deadline, then a failure that says what was missing);
nothing asserts on timings.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from _kafka_support import KafkaGateway, kafka_gateway
from _serve import EDGEGW

from edge_gateway.testing.ports import free_port

TOPICS = """
[[topics]]
name = "events"
home = "north"
partitions = 3
"""

TOPIC = "events"


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def produce(gw: KafkaGateway, per_partition: int, tag: str) -> None:
    from kafka import KafkaProducer

    # Idempotence is kafka23's (InitProducerId); plain produce is all these tests need.
    producer = KafkaProducer(
        bootstrap_servers=gw.bootstrap,
        acks="all",
        request_timeout_ms=20_000,
        enable_idempotence=False,
    )
    try:
        futures = [
            producer.send(TOPIC, value=f"{tag}-{p}-{i}".encode(), partition=p)
            for p in range(3)
            for i in range(per_partition)
        ]
        producer.flush(timeout=30)
        for f in futures:
            f.get(timeout=30)
    finally:
        producer.close(timeout=10)


class Member:
    """A confluent-kafka (librdkafka) consumer of group ``group`` polling in its own thread.

    It commits (synchronously) after every poll that returned a record, so the
    group's committed offsets cover what it has consumed of the partitions it
    still owns.
    """

    def __init__(self, gw: KafkaGateway, group: str, name: str, **extra: Any) -> None:
        from confluent_kafka import Consumer

        self.name = name
        self.consumer = Consumer(
            {
                "bootstrap.servers": gw.bootstrap,
                "group.id": group,
                "client.id": name,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6_000,
                "heartbeat.interval.ms": 500,
                "topic.metadata.refresh.interval.ms": 1_000,
                **extra,
            }
        )
        self.consumer.subscribe([TOPIC])
        self.values: list[bytes] = []
        #: (partition, offset) of every record, in the order consumed
        self.positions: list[tuple[int, int]] = []
        self.assigned: set[int] = set()
        self.errors: list[Any] = []
        #: Commits refused by a rebalance in progress, retried after the next poll.
        self.commit_retries = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        # Offsets read and not yet committed, per partition. A commit that meets a
        # rebalance (REBALANCE_IN_PROGRESS: Kafka refuses commits between JoinGroup and
        # SyncGroup; with cooperative-sticky a member goes on consuming then) is retried
        # after the next poll, for the partitions the member still owns.
        pending: dict[int, int] = {}
        retriable = {
            KafkaError.REBALANCE_IN_PROGRESS,
            KafkaError.ILLEGAL_GENERATION,
            KafkaError.UNKNOWN_MEMBER_ID,
        }
        try:
            while not self._stop.is_set():
                msg = self.consumer.poll(0.2)
                with self._lock:
                    self.assigned = {tp.partition for tp in self.consumer.assignment()}
                    owned = set(self.assigned)
                if msg is not None and msg.error() is not None:
                    self.errors.append(msg.error())
                    continue
                if msg is not None:
                    with self._lock:
                        self.values.append(msg.value())
                        self.positions.append((msg.partition(), msg.offset()))
                    pending[msg.partition()] = msg.offset() + 1
                for p in [p for p in pending if p not in owned]:
                    del pending[p]  # revoked: its new owner reads on from the last commit
                if not pending:
                    continue
                offsets = [TopicPartition(TOPIC, p, o) for p, o in pending.items()]
                try:
                    self.consumer.commit(offsets=offsets, asynchronous=False)
                except KafkaException as exc:
                    if exc.args[0].code() not in retriable:
                        raise
                    self.commit_retries += 1
                else:
                    pending.clear()
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.errors.append(exc)
        finally:
            self.consumer.close()  # LeaveGroup

    def snapshot(self) -> tuple[set[int], list[bytes]]:
        with self._lock:
            return set(self.assigned), list(self.values)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), f"{self.name} did not stop"
        assert not self.errors, f"{self.name} failed: {self.errors!r}"


@contextmanager
def member(gw: KafkaGateway, group: str, name: str, **extra: Any) -> Iterator[Member]:
    m = Member(gw, group, name, **extra)
    try:
        yield m
    finally:
        m.stop()


def committed(gw: KafkaGateway, group: str) -> dict[int, int]:
    with gw.http() as http:
        doc = http.get(f"/v1/groups/{group}/offsets", params={"topic": TOPIC}).json()
    return {o["partition"]: o["offset"] for o in doc["offsets"]}


def expected(tag: str, per_partition: int) -> set[bytes]:
    return {f"{tag}-{p}-{i}".encode() for p in range(3) for i in range(per_partition)}


def test_group_of_two_rebalances_commits_and_resumes_after_restart(tmp_path: Path) -> None:
    with kafka_gateway(tmp_path, topics=TOPICS) as gw:
        produce(gw, 10, "a")
        with member(gw, "readers", "m1") as m1:
            with member(gw, "readers", "m2") as m2:

                def split() -> bool:
                    a1, v1 = m1.snapshot()
                    a2, v2 = m2.snapshot()
                    return (
                        bool(a1)
                        and bool(a2)
                        and not a1 & a2
                        and a1 | a2 == {0, 1, 2}
                        and set(v1) | set(v2) >= expected("a", 10)
                    )

                wait_for("two members sharing the partitions and all of 'a'", split)
            # m2 left (LeaveGroup): m1 takes all three partitions over.
            wait_for("m1 to own every partition", lambda: m1.snapshot()[0] == {0, 1, 2})
            produce(gw, 5, "b")
            wait_for("m1 to read 'b'", lambda: set(m1.snapshot()[1]) >= expected("b", 5))
            wait_for(
                "commits of 15 per partition",
                lambda: committed(gw, "readers") == {0: 15, 1: 15, 2: 15},
            )
            with gw.http() as http:
                groups = http.get("/v1/status").json()["kafka"]["groups"]
                metrics = http.get("/metrics").text
            # m1 and m2 (together, or m1 first), then m1 alone again after m2 left
            assert groups["rebalances_total"] >= 2
            assert groups["by_group"]["readers"]["members"] == 1
            assert "edgegw_kafka_group_members 1.0" in metrics
            shown = subprocess.run(
                [str(EDGEGW), "status", "--url", gw.url],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "COLUMNS": "400"},
                check=False,
            )
            assert shown.returncode == 0, shown.stderr
            assert "kafka groups: 1 groups, 1 members" in shown.stdout
            assert "readers Stable gen" in shown.stdout
            assert (
                f"edgegw_kafka_group_rebalances_total {float(groups['rebalances_total'])}"
                in metrics
            )
    # A new gateway process on the same data directory: the commits survived.
    with kafka_gateway(tmp_path, topics=TOPICS) as gw:
        assert committed(gw, "readers") == {0: 15, 1: 15, 2: 15}
        produce(gw, 2, "c")
        with member(gw, "readers", "m3") as m3:
            wait_for("m3 to read 'c'", lambda: set(m3.snapshot()[1]) >= expected("c", 2))
            time.sleep(0.5)  # room for anything it should not read to show up
            _, values = m3.snapshot()
            # Resumed from the committed offsets: nothing of 'a' or 'b' again.
            assert set(values) == expected("c", 2)
            assert min(off for _, off in m3.positions) == 15


def test_http_commit_is_where_a_kafka_consumer_starts(tmp_path: Path) -> None:
    with kafka_gateway(tmp_path, topics=TOPICS) as gw:
        produce(gw, 4, "x")
        with gw.http() as http:
            r = http.post(
                "/v1/groups/mixed/offsets",
                json={"offsets": [{"topic": TOPIC, "partition": p, "offset": 3} for p in range(3)]},
            )
            assert r.status_code == 200, r.text
        with member(gw, "mixed", "k1") as k1:
            wait_for(
                "k1 to read the last record of each partition", lambda: len(k1.snapshot()[1]) >= 3
            )
            time.sleep(0.5)
            assert sorted(k1.positions) == [(0, 3), (1, 3), (2, 3)]
            wait_for(
                "k1's commit to show over HTTP",
                lambda: committed(gw, "mixed") == {0: 4, 1: 4, 2: 4},
            )


def test_admin_client_lists_and_describes_groups(tmp_path: Path) -> None:
    from kafka import KafkaAdminClient

    with kafka_gateway(tmp_path, topics=TOPICS) as gw:
        produce(gw, 1, "d")
        with member(gw, "watched", "w1") as w1:
            wait_for("w1 to own every partition", lambda: w1.snapshot()[0] == {0, 1, 2})
            admin = KafkaAdminClient(bootstrap_servers=gw.bootstrap, request_timeout_ms=10_000)
            try:
                listed = admin.list_groups()
                assert {
                    "group_id": "watched",
                    "protocol_type": "consumer",
                    "group_state": "Stable",
                } in listed
                desc = admin.describe_groups(["watched"])["watched"]
                assert (desc["group_state"], desc["protocol_type"]) == ("Stable", "consumer")
                (m,) = desc["members"]
                assert m["client_id"] == "w1"
                assert m["member_assignment"]["assigned_partitions"] == [
                    {"topic": TOPIC, "partitions": [0, 1, 2]}
                ]
                wait_for("w1 to commit all three", lambda: len(committed(gw, "watched")) == 3)
                offsets = admin.list_group_offsets("watched")["watched"]
                assert {tp.partition: o.offset for tp, o in offsets.items()} == {0: 1, 1: 1, 2: 1}
            finally:
                admin.close()


def _confluent_producer(gw: KafkaGateway, password: str, errors: list[Any]) -> Any:
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": gw.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "site-7",
            "sasl.password": password,
            "error_cb": errors.append,
            "message.timeout.ms": 20_000,
        }
    )


def test_sasl_plain_with_the_token_and_with_a_wrong_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from confluent_kafka import KafkaError

    token = "s3cret-token-23"
    monkeypatch.setenv("EDGEGW_API_TOKEN", token)
    with kafka_gateway(tmp_path, topics=TOPICS) as gw:
        errors: list[Any] = []
        delivered: list[Any] = []
        good = _confluent_producer(gw, token, errors)
        good.produce(
            TOPIC, b"authenticated", partition=1, on_delivery=lambda e, m: delivered.append((e, m))
        )
        assert good.flush(30) == 0
        assert [e for e, _ in delivered] == [None]
        assert delivered[0][1].offset() == 0

        bad_errors: list[Any] = []
        bad = _confluent_producer(gw, "not-the-token", bad_errors)
        bad.produce(TOPIC, b"refused", partition=1)
        wait_for(
            "librdkafka to report the failed authentication",
            lambda: bad.poll(0.2) >= 0 and bool(bad_errors),
        )
        assert any(e.code() == KafkaError._AUTHENTICATION for e in bad_errors), bad_errors
        assert bad.flush(0) == 1  # still queued: nothing was written
        bad.purge()
        bad.flush(5)
        bad = None  # librdkafka stops retrying before the gateway goes away
        # A client that skips SASL is disconnected at its first other request.
        import socket
        import struct

        host, _, port = gw.bootstrap.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            # Metadata v1, correlation id 7, client id "x", all topics (null array)
            body = struct.pack(">hhih", 3, 1, 7, 1) + b"x" + struct.pack(">i", -1)
            sock.sendall(struct.pack(">i", len(body)) + body)
            assert sock.recv(100) == b""
        headers = {"Authorization": f"Bearer {token}"}
        with gw.http() as http:
            records = http.get(
                f"/v1/topics/{TOPIC}/partitions/1/records", params={"offset": 0}, headers=headers
            )
            assert records.status_code == 200, records.text
            status = http.get("/v1/status", headers=headers).json()
        assert status["kafka"]["errors"].get("sasl_authentication_failed", 0) >= 1
        log = gw.log.read_text(errors="replace")
        assert "SASL authentication failed" in log
        assert "authenticated as 'site-7'" in log
        assert token not in log
        assert "not-the-token" not in log


def test_aiokafka_group_of_two_rebalances_when_one_leaves(tmp_path: Path) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer

    async def run(bootstrap: str) -> tuple[set[int], set[int], set[int], set[bytes]]:
        def consumer(name: str) -> AIOKafkaConsumer:
            return AIOKafkaConsumer(
                TOPIC,
                bootstrap_servers=bootstrap,
                group_id="aio",
                client_id=name,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=6_000,
                heartbeat_interval_ms=500,
                metadata_max_age_ms=1_000,
            )

        seen: set[bytes] = set()

        async def drain(c: AIOKafkaConsumer) -> None:
            batch = await c.getmany(timeout_ms=100)
            for msgs in batch.values():
                seen.update(m.value for m in msgs)
            if batch:
                await c.commit()

        a, b = consumer("aio-a"), consumer("aio-b")
        await a.start()
        await b.start()
        async with asyncio.timeout(60):
            # Both poll (a join phase waits for every member) until they split the partitions.
            while True:
                await asyncio.gather(drain(a), drain(b))
                pa = {tp.partition for tp in a.assignment()}
                pb = {tp.partition for tp in b.assignment()}
                if pa and pb and not pa & pb and pa | pb == {0, 1, 2}:
                    break
            await b.stop()  # LeaveGroup
            while {tp.partition for tp in a.assignment()} != {0, 1, 2}:
                await drain(a)
            while not seen >= expected("a", 3):
                await drain(a)
        after = {tp.partition for tp in a.assignment()}
        await a.stop()
        return pa, pb, after, seen

    with kafka_gateway(tmp_path, topics=TOPICS) as gw:
        produce(gw, 3, "a")
        pa, pb, after, seen = asyncio.run(run(gw.bootstrap))
        assert pa | pb == {0, 1, 2}
        assert after == {0, 1, 2}
        assert seen >= expected("a", 3)
        wait_for("the group's commits", lambda: committed(gw, "aio") == {0: 3, 1: 3, 2: 3})


_KILLED_MEMBER = """
import sys
from confluent_kafka import Consumer

c = Consumer({
    "bootstrap.servers": sys.argv[1],
    "group.id": "crashy",
    "client.id": "doomed",
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 500,
})
c.subscribe(["events"])
told = False
while True:
    c.poll(0.2)
    if c.assignment() and not told:
        print("assigned", flush=True)
        told = True
"""


def test_a_member_killed_without_leaving_is_expired_after_its_session(tmp_path: Path) -> None:
    import sys

    script = tmp_path / "member.py"
    script.write_text(_KILLED_MEMBER)
    with kafka_gateway(tmp_path, topics=TOPICS) as gw:
        produce(gw, 1, "k")
        child = subprocess.Popen(
            [sys.executable, str(script), gw.bootstrap], stdout=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "assigned"
            with member(gw, "crashy", "survivor") as survivor:
                wait_for(
                    "the survivor to get a share",
                    lambda: bool(survivor.snapshot()[0]) and survivor.snapshot()[0] != {0, 1, 2},
                )
                child.kill()  # no LeaveGroup: only the session timeout can tell
                child.wait(timeout=30)
                wait_for(
                    "the survivor to own every partition",
                    lambda: survivor.snapshot()[0] == {0, 1, 2},
                )
                with gw.http() as http:
                    groups = http.get("/v1/status").json()["kafka"]["groups"]
                assert groups["expired_members_total"] >= 1
                assert groups["by_group"]["crashy"]["members"] == 1
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=30)
            if child.stdout is not None:
                child.stdout.close()


@pytest.mark.parametrize("strategy", ["roundrobin", "cooperative-sticky"])
def test_librdkafka_assignors(tmp_path: Path, strategy: str) -> None:
    """The assignment is the client's: eager (roundrobin) and incremental (cooperative-sticky)."""
    cfg = {"partition.assignment.strategy": strategy}
    with kafka_gateway(tmp_path, topics=TOPICS) as gw:
        produce(gw, 2, "s")
        with member(gw, "assigned", "s1", **cfg) as s1:
            with member(gw, "assigned", "s2", **cfg) as s2:

                def split() -> bool:
                    a1, a2 = s1.snapshot()[0], s2.snapshot()[0]
                    return bool(a1) and bool(a2) and not a1 & a2 and a1 | a2 == {0, 1, 2}

                wait_for(f"{strategy} to split the partitions", split)
            wait_for("s1 to own every partition", lambda: s1.snapshot()[0] == {0, 1, 2})
            wait_for(
                "the two to have read everything",
                lambda: set(s1.snapshot()[1]) | set(s2.snapshot()[1]) >= expected("s", 2),
            )
            wait_for("the commits", lambda: committed(gw, "assigned") == {0: 2, 1: 2, 2: 2})


def test_a_group_over_sasl_ssl(tmp_path: Path) -> None:
    """TLS and SASL/PLAIN together: produce, a group member reads and commits."""
    import ssl

    from confluent_kafka import Producer

    from edge_gateway.testing.tls import make_tls_files

    files = make_tls_files(tmp_path / "tls", names=("127.0.0.1",))
    token = "tls-and-sasl-23"
    api = f'token = "{token}"\ntls_cert = "{files.cert}"\ntls_key = "{files.key}"'
    secure = {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(files.ca),
        "sasl.mechanism": "PLAIN",
        "sasl.username": "line-3",
        "sasl.password": token,
    }
    with kafka_gateway(tmp_path, topics=TOPICS, extra_toml=api) as gw:
        producer = Producer({"bootstrap.servers": gw.bootstrap, **secure})
        for p in range(3):
            producer.produce(TOPIC, f"t-{p}-0".encode(), partition=p)
        assert producer.flush(30) == 0
        with member(gw, "secure", "t1", **secure) as t1:
            wait_for("t1 to read everything", lambda: set(t1.snapshot()[1]) >= expected("t", 1))
        ctx = ssl.create_default_context(cafile=str(files.ca))
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=gw.url, verify=ctx, timeout=30, headers=headers) as http:
            doc = http.get("/v1/groups/secure/offsets", params={"topic": TOPIC}).json()
        assert {o["partition"]: o["offset"] for o in doc["offsets"]} == {0: 1, 1: 1, 2: 1}


def test_a_consumer_rides_through_a_gateway_kill_and_restart(tmp_path: Path) -> None:
    """kill -9 of the gateway under a live group: acknowledged commits survive, the member
    rejoins (its member id is unknown to the new process) and goes on from its commits."""
    listen = f"127.0.0.1:{free_port()}"
    with kafka_gateway(tmp_path, topics=TOPICS, listen=listen) as gw:
        produce(gw, 2, "before")
        with member(gw, "riders", "r1", **{"reconnect.backoff.max.ms": 500}) as r1:
            wait_for("r1 to read 'before'", lambda: set(r1.snapshot()[1]) >= expected("before", 2))
            wait_for("r1's commits", lambda: committed(gw, "riders") == {0: 2, 1: 2, 2: 2})
            gw.kill()
            gw.start()
            assert gw.bootstrap == listen
            assert committed(gw, "riders") == {0: 2, 1: 2, 2: 2}
            produce(gw, 3, "after")
            wait_for("r1 to read 'after'", lambda: set(r1.snapshot()[1]) >= expected("after", 3))
            wait_for("r1's new commits", lambda: committed(gw, "riders") == {0: 5, 1: 5, 2: 5})
            # At least once: every record was read; a record read again is one read but
            # not committed when the member had to rejoin (membership does not survive a
            # restart), never one committed before the kill.
            assert len(set(r1.positions)) == 15
            again = {pos for pos in r1.positions if r1.positions.count(pos) > 1}
            assert all(offset >= 2 for _, offset in again), again
