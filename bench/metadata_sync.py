"""How metadata server replicas learn the others' head reports: short poll or LISTEN/NOTIFY.

Runs a throwaway PostgreSQL cluster (edge_gateway.testing.postgres) and
measures, side by side:

* **head writes**: transactions/s of the replicas' head batches
  (``PostgresStore.publish_heads``, one report each: the worst case for
  batching) from ``--writers`` threads, without and with a ``NOTIFY`` in
  each transaction (what notifications would add to every batch);
* **wake delay**: from a batch's commit to another replica seeing it, by
  ``LISTEN`` (a notification) and by the short poll at ``--interval-ms``
  (``PostgresStore.poll``), p50 and max;
* **poll cost**: one ``PostgresStore.poll`` round trip (the price per
  replica and interval, whatever the report rate).

    python bench/metadata_sync.py [--writers 4] [--seconds 3] [--rounds 3] [--interval-ms 100]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from edge_gateway.metadata._pg import PostgresStore
from edge_gateway.testing.postgres import Postgres


def head_writes(store: PostgresStore, writers: int, seconds: float, notify: bool) -> float:
    done = 0
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def run(i: int) -> None:
        nonlocal done
        n = 0
        seq = 0
        while time.monotonic() < stop:
            seq += 1
            if notify:
                with store._connection() as conn, conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (0x65677702,))
                    conn.execute(
                        "INSERT INTO heads (region, seq, version) VALUES (%s, %s,"
                        " nextval('head_versions')) ON CONFLICT (region) DO UPDATE"
                        " SET seq = excluded.seq, version = excluded.version"
                        " WHERE heads.seq < excluded.seq",
                        (f"r{i}", seq),
                    )
                    conn.execute("SELECT region, seq, version FROM heads WHERE version > 0")
                    conn.execute("NOTIFY edgegw_heads")
            else:
                store.publish_heads({f"r{i}": seq}, 0)
            n += 1
        with lock:
            done += n

    threads = [threading.Thread(target=run, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done / seconds


def notify_delay(url: str, store: PostgresStore, samples: int) -> list[float]:
    delays = []
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute("LISTEN edgegw_heads")
        for i in range(samples):
            with store._connection() as conn, conn.transaction():
                conn.execute("NOTIFY edgegw_heads")
            committed = time.monotonic()
            for _ in listener.notifies(timeout=5, stop_after=1):
                delays.append(time.monotonic() - committed)
            time.sleep(0.01 * (i % 3))
    return delays


def poll_delay(store: PostgresStore, interval_s: float, samples: int) -> tuple[list[float], float]:
    """Delay from a commit to a poller (every interval_s) seeing it; and one poll's cost."""
    seen: dict[int, float] = {}
    stop = threading.Event()
    costs: list[float] = []

    def poller() -> None:
        since = 0
        while not stop.is_set():
            t0 = time.monotonic()
            _, _, _, heads = store.poll(since)
            costs.append(time.monotonic() - t0)
            for region, seq, version in heads:
                since = max(since, version)
                if region == "probe":
                    seen.setdefault(seq, time.monotonic())
            time.sleep(interval_s)

    t = threading.Thread(target=poller)
    t.start()
    committed: dict[int, float] = {}
    for seq in range(1, samples + 1):
        store.publish_heads({"probe": seq}, 0)
        committed[seq] = time.monotonic()
        while seq not in seen:
            time.sleep(0.001)
        time.sleep(0.037)  # not in step with the poll
    stop.set()
    t.join()
    return [seen[s] - committed[s] for s in committed], statistics.median(costs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--interval-ms", type=float, default=100.0)
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="edgegw-pg-bench-"))
    try:
        pg = Postgres(root)
        try:
            url = pg.create_database("bench")
            store = PostgresStore(url, pool_size=args.writers + 2)
            try:
                # Alternated rounds, the median of each: the machine's load drifts.
                plain_runs, notify_runs = [], []
                for _ in range(args.rounds):
                    plain_runs.append(head_writes(store, args.writers, args.seconds, False))
                    notify_runs.append(head_writes(store, args.writers, args.seconds, True))
                plain = statistics.median(plain_runs)
                with_notify = statistics.median(notify_runs)
                n_delay = notify_delay(url, store, args.samples)
                p_delay, poll_cost = poll_delay(store, args.interval_ms / 1000, args.samples)
            finally:
                store.close()
        finally:
            pg.stop("immediate")
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def ms(xs: list[float]) -> str:
        return f"p50 {statistics.median(xs) * 1000:6.1f} ms  max {max(xs) * 1000:6.1f} ms"

    print(f"head batches, {args.writers} writers:   {plain:8.0f} tx/s")
    print(f"  ... with NOTIFY in each:     {with_notify:8.0f} tx/s ({with_notify / plain:.2f}x)")
    print(f"wake delay, LISTEN/NOTIFY:     {ms(n_delay)}")
    print(f"wake delay, poll every {args.interval_ms:.0f} ms: {ms(p_delay)}")
    print(f"one poll round trip:           {poll_cost * 1000:6.2f} ms")


if __name__ == "__main__":
    main()
