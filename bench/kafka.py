"""The Kafka listener (docs/kafka.md) against the HTTP binary-batch path of the same gateway.

One gateway (``edgegw serve``, journal defaults, a local directory bucket),
each phase on its own topic of 4 partitions, ~150-byte telemetry records:

(a) baseline: the HTTP API's binary batches (``POST .../batches``, 1000
    records each, 4 client threads, one per partition): records per second
    from the first request to the last answer;
(b) confluent-kafka (librdkafka) producing the same records (``linger.ms``
    5, ``acks=all``, idempotence off): records per second from the first
    ``produce`` to the end of ``flush``. ``kafka_ratio`` = (b) / (a), target
    >= 0.8;
(c) the same with ``enable.idempotence=true``: ``idempotent_ratio`` = (c) /
    (b), target >= 0.9 (the cost of idempotence, as a user who turns it on
    sees it);
(c') like with like: (b) with ``max.in.flight.requests.per.connection`` 5,
    the limit librdkafka imposes with idempotence (it then sends fewer,
    larger Produce requests): ``idempotent_ratio_same_inflight`` = (c) / (c'),
    what the gateway's idempotence itself costs. (a), (b), (c') and (c) take
    turns, five rounds each (one with --quick), each on a fresh topic; the
    medians are compared, and the records per Produce request of each
    (from the gateway's request counters) and the CPU per record of the
    gateway (``/proc``) and of this producer process are reported. Each phase starts
    once the gateway has shipped what the previous one wrote, so no
    phase shares the machine with the compression and upload of another's
    records;
(d) single-record produce latency with ``acks=all``: produce one record,
    flush, repeat; p50/p99 in microseconds;
(e) consume: a confluent-kafka consumer assigned to (b)'s topic reads every
    record from offset 0; records per second.

Usage: python bench/kafka.py [--quick]. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    Row,
    emit_json,
    machine_info,
    median,
    percentile,
    progress,
    ratio,
    render_table,
    scratch_dir,
    telemetry,
)
from edgegw_cli._fleet import BATCH_TYPE, FleetTopic, Site

from edge_gateway.format.batch import encode_batch

PARTITIONS = 4
BATCH = 1000


def http_batches(url: str, topic: str, records: list[Any]) -> float:
    """(a): records/s through the binary batch API, one thread per partition."""
    parts: list[list[Any]] = [records[p::PARTITIONS] for p in range(PARTITIONS)]
    errors: list[str] = []

    def run(p: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            rows = parts[p]
            for i in range(0, len(rows), BATCH):
                chunk = rows[i : i + BATCH]
                batch = encode_batch(
                    [r.value for r in chunk],
                    keys=[r.key for r in chunk],
                    timestamps=[r.timestamp for r in chunk],
                )
                r = c.post(
                    f"/v1/topics/{topic}/partitions/{p}/batches",
                    content=batch,
                    headers={"content-type": BATCH_TYPE},
                )
                if r.status_code != 200:
                    errors.append(f"{r.status_code} {r.text}")
                    return

    threads = [threading.Thread(target=run, args=(p,)) for p in range(PARTITIONS)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"HTTP produce failed: {errors[0]}")
    return len(records) / elapsed


def kafka_produce(
    bootstrap: str,
    topic: str,
    records: list[Any],
    *,
    idempotent: bool,
    max_in_flight: int | None = None,
) -> float:
    """(b)/(c)/(c'): records/s with confluent-kafka, batched by librdkafka."""
    from confluent_kafka import Producer

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 5,
        "acks": "all",
        "enable.idempotence": idempotent,
        "queue.buffering.max.messages": 1_000_000,
    }
    if max_in_flight is not None:
        conf["max.in.flight.requests.per.connection"] = max_in_flight
    producer = Producer(conf)
    failed: list[Any] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    producer.list_topics(topic, timeout=10)  # connected and warm before the clock starts
    start = time.perf_counter()
    cpu0 = time.process_time()  # this process: the Python loop and librdkafka's threads
    for i, r in enumerate(records):
        while True:
            try:
                producer.produce(
                    topic,
                    key=r.key,
                    value=r.value,
                    partition=i % PARTITIONS,
                    timestamp=r.timestamp,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(120) != 0:
        raise RuntimeError("records left unacknowledged after 120 s")
    elapsed = time.perf_counter() - start
    CLIENT_CPU_S[topic] = time.process_time() - cpu0
    if failed:
        raise RuntimeError(f"{len(failed)} records failed: {failed[0]}")
    return len(records) / elapsed


#: CPU seconds of this process (the producer: Python and librdkafka) per phase's topic.
CLIENT_CPU_S: dict[str, float] = {}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc``)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settle(url: str, topic: str | None) -> None:
    """Wait until the previous phase's ``topic`` is shipped before the next starts:
    otherwise each phase shares the machine with the shipping of the one before,
    and the phase after a faster one pays more of it."""
    if topic is None:
        return
    deadline = time.monotonic() + 300
    while True:
        doc = httpx.get(f"{url}/v1/topics/{topic}", timeout=30).json()
        if all(p["unshipped"] == 0 for p in doc["partitions"]):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topic} not shipped after 300 s: {doc}")
        time.sleep(0.05)


def produce_request_count(url: str) -> float:
    """Produce requests the gateway's Kafka listener has answered (``/v1/status``)."""
    doc = httpx.get(f"{url}/v1/status", timeout=30).json()
    return float(doc["kafka"]["requests"].get("produce", 0))


def kafka_latency(bootstrap: str, topic: str, samples: int) -> list[float]:
    """(d): microseconds per single-record produce with acks=all (produce + flush)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    producer.list_topics(topic, timeout=10)
    out = []
    for i in range(samples + 10):
        start = time.perf_counter()
        producer.produce(topic, value=b"probe %d" % i, partition=0)
        if producer.flush(30) != 0:
            raise RuntimeError("a probe was not acknowledged")
        if i >= 10:  # warm-up
            out.append((time.perf_counter() - start) * 1e6)
    return out


def kafka_consume(bootstrap: str, topic: str, n: int) -> float:
    """(e): records/s reading ``n`` records from offset 0 of every partition."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        got = 0
        start = time.perf_counter()
        deadline = time.monotonic() + 300
        while got < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"consumed {got} of {n} records in 300 s")
            for m in consumer.consume(num_messages=10_000, timeout=0.5):
                if m.error() is not None:
                    raise RuntimeError(str(m.error()))
                got += 1
        return n / (time.perf_counter() - start)
    finally:
        consumer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="fewer records (a smoke run)")
    args = ap.parse_args()
    n = 40_000 if args.quick else 200_000
    samples = 200 if args.quick else 1000
    rounds = 1 if args.quick else 5
    records = telemetry(n)

    with scratch_dir("kafka") as root:
        kinds = ("http", "kafka", "inflight5", "idem")
        names = ("lat", *(f"{k}{r}" for r in range(rounds) for k in kinds))
        topics = [FleetTopic(name, "a", PARTITIONS, ()) for name in names]
        site = Site("a", root / "a")
        site.extra_toml = '[log]\nlevel = "warning"\n[kafka]\nlisten = "127.0.0.1:0"\n'
        site.write_config(root / "bucket", topics, flush_ms=250, poll_ms=100)
        figures: dict[str, Any] = {"records": n, **machine_info(root)}
        try:
            site.start()
            site.wait_ready()
            addr = site.data_dir / "kafka.addr"  # written just after api.addr
            deadline = time.monotonic() + 30
            while not addr.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no {addr}; see {site.log_path}")
                time.sleep(0.02)
            bootstrap = addr.read_text().strip()
            # (a), (b) and (c) take turns, ``rounds`` times each on fresh
            # topics, and the medians are compared: on a shared machine one run of each
            # measures the neighbours' load as much as the code.
            https, plain, same, idem = [], [], [], []
            produce_requests = {"kafka": 0.0, "inflight5": 0.0, "idem": 0.0}
            gateway_cpu = {"kafka": 0.0, "inflight5": 0.0, "idem": 0.0}
            client_cpu = {"kafka": 0.0, "inflight5": 0.0, "idem": 0.0}
            assert site.proc is not None
            gw_pid = site.proc.pid

            last: list[str | None] = [None]  # the previous phase's topic

            def counted(kind: str, topic: str, run: Any) -> float:
                settle(site.url, last[0])
                last[0] = topic
                before = produce_request_count(site.url)
                cpu0 = cpu_seconds(gw_pid)
                rate = float(run())
                gateway_cpu[kind] += cpu_seconds(gw_pid) - cpu0
                client_cpu[kind] += CLIENT_CPU_S[topic]
                produce_requests[kind] += produce_request_count(site.url) - before
                return rate

            for r in range(rounds):
                progress(f"(a) HTTP binary batches: {n} records ({r + 1}) ...")
                settle(site.url, last[0])
                last[0] = f"http{r}"
                https.append(http_batches(site.url, f"http{r}", records))
                progress(f"(b) confluent-kafka, linger.ms 5, acks=all: {n} records ({r + 1}) ...")
                plain.append(
                    counted(
                        "kafka",
                        f"kafka{r}",
                        lambda r=r: kafka_produce(
                            bootstrap, f"kafka{r}", records, idempotent=False
                        ),
                    )
                )
                progress(f"(c') the same, max.in.flight 5 ({r + 1}) ...")
                same.append(
                    counted(
                        "inflight5",
                        f"inflight5{r}",
                        lambda r=r: kafka_produce(
                            bootstrap, f"inflight5{r}", records, idempotent=False, max_in_flight=5
                        ),
                    )
                )
                progress(f"(c) the same, enable.idempotence=true ({r + 1}) ...")
                idem.append(
                    counted(
                        "idem",
                        f"idem{r}",
                        lambda r=r: kafka_produce(bootstrap, f"idem{r}", records, idempotent=True),
                    )
                )
            http_rate, kafka_rate, idem_rate = median(https), median(plain), median(idem)
            same_rate = median(same)
            per_request = {k: (n * rounds / v if v else None) for k, v in produce_requests.items()}
            # CPU per record over all rounds: the gateway's (it also ships the
            # phase's records meanwhile) and the producer process's.
            gw_us = {k: v / (n * rounds) * 1e6 for k, v in gateway_cpu.items()}
            client_us = {k: v / (n * rounds) * 1e6 for k, v in client_cpu.items()}
            progress(f"(d) single-record produce, acks=all: {samples} samples ...")
            lat = kafka_latency(bootstrap, "lat", samples)
            progress(f"(e) consume {n} records ...")
            consume_rate = kafka_consume(bootstrap, "kafka0", n)
        finally:
            code = site.stop()
        if code != 0:
            raise RuntimeError(f"the gateway exited with {code}; see {site.log_path}")

    kafka_ratio = ratio(kafka_rate, http_rate)
    idem_ratio = ratio(idem_rate, kafka_rate)
    same_ratio = ratio(idem_rate, same_rate)
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    rows: list[Row | str] = [
        "produce (records/s)",
        Row(
            "confluent-kafka (b)",
            kafka_rate,
            "rec/s",
            "HTTP batches (a)",
            http_rate,
            ">= 0.8x",
            kafka_ratio is not None and kafka_ratio >= 0.8,
        ),
        Row(
            "idempotent (c)",
            idem_rate,
            "rec/s",
            "plain Kafka (b)",
            kafka_rate,
            ">= 0.9x",
            idem_ratio is not None and idem_ratio >= 0.9,
        ),
        Row(
            "plain, max.in.flight 5 (c')",
            same_rate,
            "rec/s",
            "plain Kafka (b)",
            kafka_rate,
        ),
        Row(
            "idempotent (c), like with like",
            idem_rate,
            "rec/s",
            "max.in.flight 5 (c')",
            same_rate,
            ">= 0.9x",
            same_ratio is not None and same_ratio >= 0.9,
        ),
        "records per Produce request (librdkafka's batching)",
        Row("plain (b)", per_request["kafka"] or 0.0, "rec"),
        Row("max.in.flight 5 (c')", per_request["inflight5"] or 0.0, "rec"),
        Row("idempotent (c)", per_request["idem"] or 0.0, "rec"),
        "CPU per record (all rounds)",
        Row("gateway, plain (b)", gw_us["kafka"], "us"),
        Row("gateway, max.in.flight 5 (c')", gw_us["inflight5"], "us"),
        Row(
            "gateway, idempotent (c)",
            gw_us["idem"],
            "us",
            "max.in.flight 5 (c')",
            gw_us["inflight5"],
        ),
        Row("producer process, plain (b)", client_us["kafka"], "us"),
        Row("producer process, max.in.flight 5 (c')", client_us["inflight5"], "us"),
        Row(
            "producer process, idempotent (c)",
            client_us["idem"],
            "us",
            "max.in.flight 5 (c')",
            client_us["inflight5"],
        ),
        "single-record produce, acks=all",
        Row("p50", p50, "us"),
        Row("p99", p99, "us"),
        "consume",
        Row("consumer (e)", consume_rate, "rec/s", "Kafka produce (b)", kafka_rate),
    ]
    print(render_table(f"Kafka listener vs HTTP batches ({n:,} records)", rows))
    figures.update(
        kafka_produce_rec_per_s=kafka_rate,
        http_batch_rec_per_s=http_rate,
        kafka_ratio=kafka_ratio,
        idempotent_rec_per_s=idem_rate,
        idempotent_ratio=idem_ratio,
        inflight5_rec_per_s=same_rate,
        idempotent_ratio_same_inflight=same_ratio,
        records_per_produce_request=per_request,
        gateway_cpu_us_per_record=gw_us,
        producer_cpu_us_per_record=client_us,
        rounds=rounds,
        kafka_p50_us=p50,
        kafka_p99_us=p99,
        consume_rec_per_s=consume_rate,
    )
    emit_json(figures)


if __name__ == "__main__":
    main()
