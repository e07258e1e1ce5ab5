"""Consume from compressed data as a consumer does: over a gateway's HTTP API (issue 42 item 6).

Usage::

    .venv/bin/python bench/consume.py [--quick] [--records N]

``bench/atrest.py`` measures a fetch at the journal level, in process. A
consumer never reads there: it asks a gateway process over HTTP. This bench
starts four real ``edgegw serve`` processes on one local-directory bucket:

- ``a``: region ``a``, topic ``t`` (4 partitions) homed there, the default
  ``journal.at_rest = "compressed"``: its sealed segments are rewritten as
  compressed (EGWC) segments in the background;
- ``a0``: the same records and config in its own data directory and bucket,
  with ``journal.at_rest = "off"`` (today's uncompressed segments): the
  baseline of ``a``;
- ``b``: mirrors ``a.t`` with the default ``mirror.keep_blocks = true`` (the
  fetched blocks kept as block entries, compressed), ``journal.at_rest =
  "off"`` so the blocks stay block entries;
- ``b0``: mirrors ``a.t`` with ``mirror.keep_blocks = false`` (one
  uncompressed MIRROR entry per batch): the baseline of ``b``.

The reference telemetry records (``edge_gateway.sample_data``) are produced
to ``a`` and ``a0`` in batches of 100 records per request (a producer's
batch; segments of 4 MiB), then the bench waits until ``a`` has rewritten
every sealed segment and ``b``/``b0`` have mirrored everything.

Each fetch is ``GET /v1/topics/{t}/partitions/{p}/records`` (JSON, and the
binary batch format: ``Accept: application/vnd.edgegw.batch``) of one record
at a random offset, and of 10,000 records, measured:

- **cold**: in freshly started gateway processes (no frame cache, no index
  pages cached; the files in the page cache, as for a journal being read),
  each read in its own stretch of the partition, so each touches a frame or
  block no read before it touched;
- **warm**: the same reads again (the frames now in the cache).

Every figure of ``a`` stands beside ``a0``'s and every figure of ``b``
beside ``b0``'s, measured in the same run with the ratio; target <= 1.5x.
The two of a pair run at once (the other pair stopped) and each read goes to
both in turn, so the load of a shared machine falls on both alike.

In process, measured in the same run: the journal level
(``journal_figures``: ``Journal.read`` and the records decoded, from
compressed sealed segments against the same journal as written, with one
record per entry -- a producer of single records -- and 100 per entry; the
garbage collector settled as ``edgegw serve`` settles it), and the figures of
``bench/atrest.py`` (``consume_figures``: a mirror journal's block entries
against MIRROR entries; ``lookups``: one record from an EGWC segment against
today's entry decoded from memory). The last line is one JSON object
with all of them.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    MiB,
    Row,
    emit_json,
    machine_info,
    median,
    percentile,
    progress,
    render_table,
    scratch_dir,
)
from atrest import FRAMES, consume_figures, journal_segment, lookups
from atrest import PARTITIONS as IP_PARTITIONS
from edgegw_cli._fleet import BATCH_TYPE, Site, high_watermarks

from edge_gateway import pygc
from edge_gateway.format import atrest
from edge_gateway.format.batch import encode_batch, iter_batches
from edge_gateway.journal import Journal, JournalConfig, compress_sealed_segment
from edge_gateway.sample_data import TelemetryGenerator

PARTITIONS = 4
PER_REQUEST = 100
#: Only offsets below this share of each partition are read: the rest may sit in
#: the active segment, which is never compressed.
SEALED_SHARE = 0.8


def write_config(
    site: Site,
    bucket: Path,
    *,
    at_rest: str = "compressed",
    keep_blocks: bool = True,
    subscribers: tuple[str, ...] = ("b", "b0"),
) -> None:
    home = "a"
    site.data_dir.mkdir(parents=True, exist_ok=True)
    bucket.mkdir(parents=True, exist_ok=True)
    site.config = site.data_dir.parent / f"{site.name}.toml"
    site.log_path = site.data_dir.parent / f"{site.name}.log"
    subs = ", ".join(f'"{s}"' for s in subscribers)
    site.config.write_text(
        f"""
region = "{site.region}"
data_dir = "{site.data_dir}"
[journal]
segment_bytes = "4MiB"
at_rest = "{at_rest}"
[shipper]
flush_interval_ms = 250
[mirror]
poll_interval_ms = 100
keep_blocks = {"true" if keep_blocks else "false"}
[bucket]
type = "local"
path = "{bucket}"
[gc]
enabled = false
[api]
listen = "127.0.0.1:0"
[log]
level = "warning"
[[topics]]
name = "t"
home = "{home}"
partitions = {PARTITIONS}
subscribers = [{subs}]
"""
    )


def produce(sites: list[Site], records: int) -> None:
    """The same ``records`` telemetry records, 100 per request, to each of ``sites``."""
    gen = TelemetryGenerator(site="a", sensors=500, seed=11)
    clients = [httpx.Client(base_url=s.url, timeout=60) for s in sites]
    try:
        p = 0
        for _ in range(0, records, PER_REQUEST):
            rs = gen.take(PER_REQUEST)
            batch = encode_batch(
                [r.value for r in rs],
                keys=[r.key for r in rs],
                timestamps=[r.timestamp_ms for r in rs],
            )
            for c in clients:
                c.post(
                    f"/v1/topics/t/partitions/{p}/batches",
                    content=batch,
                    headers={"content-type": BATCH_TYPE},
                ).raise_for_status()
            p = (p + 1) % PARTITIONS
    finally:
        for c in clients:
            c.close()


def wait_for(what: str, done: Callable[[], bool], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def journal_status(site: Site) -> dict[str, object]:
    with httpx.Client(base_url=site.url, timeout=30) as c:
        doc: dict[str, object] = c.get("/v1/status").json()["journal"]
    return doc


def rewritten(site: Site) -> bool:
    """``site`` has rewritten every sealed segment (at least one)."""
    with httpx.Client(base_url=site.url, timeout=30) as c:
        text = c.get("/metrics").text
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in (
            "edgegw_journal_compressed_segments",
            "edgegw_journal_rewrite_pending_segments",
        ):
            values[name] = float(value)
    return (
        values.get("edgegw_journal_compressed_segments", 0) > 0
        and values.get("edgegw_journal_rewrite_pending_segments", 1) == 0
    )


def mirrored(source: Site, mirror: Site) -> bool:
    with (
        httpx.Client(base_url=source.url, timeout=30) as ca,
        httpx.Client(base_url=mirror.url, timeout=30) as cb,
    ):
        r = cb.get("/v1/topics/a.t")
        return r.status_code == 200 and high_watermarks(cb, "a.t") == high_watermarks(ca, "t")


def picks(rng: random.Random, ends: list[int], n: int, span: int) -> list[tuple[int, int]]:
    """``n`` reads (partition, offset) of ``span`` records, each in its own stretch of its
    partition (below :data:`SEALED_SHARE`), so no two touch the same frame or block."""
    per = -(-n // PARTITIONS)
    out = []
    for p in range(PARTITIONS):
        top = int(ends[p] * SEALED_SHARE)
        stretch = top // per
        if stretch < span + 2000:
            raise SystemExit(f"too few records for {n} reads of {span}: use more --records")
        out += [(p, k * stretch + rng.randrange(stretch - span)) for k in range(per)]
    rng.shuffle(out)
    return out[:n]


def fetch_once(
    client: httpx.Client, topic: str, partition: int, offset: int, k: int, binary: bool
) -> float:
    """Latency (us) of one GET of ``k`` records from (``partition``, ``offset``), checked."""
    headers = {"accept": BATCH_TYPE} if binary else {}
    params = {"offset": offset, "max_records": k, "max_bytes": 64 * MiB}
    t0 = time.perf_counter()
    r = client.get(
        f"/v1/topics/{topic}/partitions/{partition}/records", params=params, headers=headers
    )
    t1 = time.perf_counter()
    r.raise_for_status()
    if binary:
        assert int(r.headers["edgegw-next-offset"]) > offset
    else:
        got = r.json()["records"]
        assert got, offset
        assert got[0]["offset"] == offset, (offset, got[:1])
        assert len(got) == k, (k, len(got))
    return (t1 - t0) * 1e6


def measure_pair(
    base: Site, test: Site, topic: str, one: list[tuple[int, int]], many: list[tuple[int, int]]
) -> dict[str, dict[str, float]]:
    """Cold then warm p50s of ``base`` and ``test``, their reads interleaved.

    Both are started fresh before each of the two read sets (one record,
    10,000 records), and each read goes to both, one after the other (which
    one first alternates), so the load of this shared machine falls on both
    alike. Half the reads are JSON, half binary; every read is cold at its
    first touch (its own stretch of the partition), then all are read again,
    warm.
    """
    out: dict[str, dict[str, float]] = {base.name: {}, test.name: {}}
    pair = (base, test)
    for k, reads in ((1, one), (10_000, many)):
        name = "one" if k == 1 else "10k"
        for s in pair:
            s.stop()
        for s in pair:
            s.start()
        for s in pair:
            s.wait_ready()
        clients = [httpx.Client(base_url=s.url, timeout=60) for s in pair]
        try:
            for c in clients:
                c.get("/v1/status")  # the connection is open before the first timed GET
            half = len(reads) // 2
            for binary, part in ((False, reads[:half]), (True, reads[half:])):
                fmt = "bin" if binary else "json"
                for state in ("cold", "warm"):
                    lat: tuple[list[float], list[float]] = ([], [])
                    for n, (p, offset) in enumerate(part):
                        order = (0, 1) if n % 2 == 0 else (1, 0)
                        for i in order:
                            lat[i].append(fetch_once(clients[i], topic, p, offset, k, binary))
                    for s, times in zip(pair, lat, strict=True):
                        out[s.name][f"{name}_{fmt}_{state}_p50_us"] = median(times)
                        if state == "cold":
                            out[s.name][f"{name}_{fmt}_cold_p90_us"] = percentile(times, 90)
        finally:
            for c in clients:
                c.close()
    return out


def journal_figures(records: int, per_entry: int, reads: int, reads_many: int) -> dict[str, float]:
    """The fetch at the journal level, in process, on a journal of ``per_entry`` records
    per entry: ``Journal.read`` and the records decoded (what the gateway's fetch does),
    from compressed sealed segments (``compress_sealed_segment``, default frames and
    chunks) against the same journal left as written; cold = a journal just opened, each
    read in its own stretch; warm = the same reads again. p50 in us."""
    gen = TelemetryGenerator(site="a", sensors=500, seed=13)
    cfg = JournalConfig(segment_bytes=4 * MiB, max_bytes=1 << 34, reserve_bytes=0)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="consume-journal-") as tmp:
        plain, packed = Path(tmp) / "plain", Path(tmp) / "packed"
        j = Journal.open_sync(plain, cfg)
        try:
            p = 0
            for _ in range(0, records, per_entry):
                rs = gen.take(per_entry)
                batch = encode_batch(
                    [r.value for r in rs],
                    keys=[r.key for r in rs],
                    timestamps=[r.timestamp_ms for r in rs],
                )
                j.append_nowait("t", p, batch)
                p = (p + 1) % PARTITIONS
            ends = [j.next_offset("t", q) for q in range(PARTITIONS)]
        finally:
            j.close_sync()
        shutil.copytree(plain, packed)
        segments = sorted(packed.glob("*.wal"))[:-1]  # the last one stays (it is appended to)
        for seg in segments:
            compress_sealed_segment(packed, int(seg.name.split(".")[0]))
        out["segments_compressed"] = len(segments)
        # As `edgegw serve` does once started: what is alive is frozen, young
        # collections are rare; otherwise a full collection lands in a read.
        pygc.settle()
        rng = random.Random(7)
        one = picks(rng, ends, reads, 1)
        many = picks(rng, ends, reads_many, 10_000)

        def fetch(j: Journal, part: int, offset: int, k: int) -> None:
            got = 0
            for e in j.read("t", part, offset, max_records=k, max_bytes=64 * MiB):
                for b in iter_batches(e.payload, where="bench", verify=False):
                    got += len(b.records(offset))
            assert got >= k, (got, k)

        for name, root in (("plain", plain), ("compressed", packed)):
            for k, rd in ((1, one), (10_000, many)):
                j = Journal.open_sync(root, cfg)
                try:
                    for state in ("cold", "warm"):
                        lat = []
                        for part, offset in rd:
                            t0 = time.perf_counter()
                            fetch(j, part, offset, k)
                            lat.append((time.perf_counter() - t0) * 1e6)
                        key = "one" if k == 1 else "10k"
                        out[f"{name}_{key}_{state}_p50_us"] = median(lat)
                finally:
                    j.close_sync()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer records and reads (~2 minutes)")
    ap.add_argument("--records", type=int, default=None, help="records produced (per gateway)")
    ap.add_argument("--dir", type=Path, default=None, help="scratch parent directory")
    args = ap.parse_args()
    records = args.records or (250_000 if args.quick else 800_000)
    reads_one = 80 if args.quick else 240
    reads_many = 16 if args.quick else 48
    in_process_n = 60_000 if args.quick else 250_000
    jrecords = 200_000 if args.quick else 600_000
    figures: dict[str, object] = {"quick": args.quick, "records": records}
    with scratch_dir("consume-", args.dir) as root:
        root = root.resolve()
        figures["machine"] = machine_info(root)
        a = Site("a", root / "a", name="a")
        a0 = Site("a", root / "a0", name="a0")
        b = Site("b", root / "b", name="b")
        b0 = Site("b0", root / "b0", name="b0")
        write_config(a, root / "bucket")
        write_config(a0, root / "bucket0", at_rest="off", subscribers=("nobody",))
        write_config(b, root / "bucket", at_rest="off")
        write_config(b0, root / "bucket", at_rest="off", keep_blocks=False)
        sites = [a, a0, b, b0]
        try:
            progress("starting a, a0, b, b0 ...")
            for s in sites:
                s.start()
            for s in sites:
                s.wait_ready()
            progress(f"producing {records:,} records to a and a0 ...")
            t0 = time.perf_counter()
            produce([a, a0], records)
            progress(f"  {time.perf_counter() - t0:.1f} s; waiting for rewrites and mirrors ...")
            wait_for("a's rewrites", lambda: rewritten(a))
            wait_for("b's mirror", lambda: mirrored(a, b))
            wait_for("b0's mirror", lambda: mirrored(a, b0))
            with httpx.Client(base_url=a.url, timeout=30) as c:
                ends = high_watermarks(c, "t")
            for s in sites:
                j = journal_status(s)
                figures[f"journal_bytes_{s.name}"] = j["bytes"]
            rng = random.Random(42)
            one = picks(rng, ends, reads_one, 1)
            many = picks(rng, ends, reads_many, 10_000)
            results: dict[str, dict[str, float]] = {}
            # Only the measured pair runs: the machine's two cores are theirs
            # and this process's.
            for s in sites:
                s.stop()
            for base, test, topic in ((a0, a, "t"), (b0, b, "a.t")):
                progress(f"fetching from {base.name} and {test.name} ({topic}) ...")
                results.update(measure_pair(base, test, topic, one, many))
                base.stop()
                test.stop()
        finally:
            for s in sites:
                s.stop()

    progress("in process (bench/atrest.py's consume and lookups) ...")
    inproc = consume_figures(in_process_n // 2, 300 if args.quick else 1000)
    wal, _, positions = journal_segment(in_process_n, 1)
    seg = atrest.CompressedSegment(
        atrest.compress_segment(wal, frame_raw_bytes=FRAMES[1]),
        cache=atrest.FrameCache(32 * MiB),
    )
    offsets = [0] * IP_PARTITIONS
    for f in seg.directory.frames:
        offsets[f.partition] = max(offsets[f.partition], f.last_offset + 1)
    look = lookups(seg, wal, positions, offsets, 300 if args.quick else 1000)
    journal: dict[int, dict[str, float]] = {}
    for per_entry in (1, PER_REQUEST):
        progress(f"in process: a journal of {per_entry} record(s) per entry, compressed or not ...")
        journal[per_entry] = journal_figures(
            jrecords, per_entry, 40 if args.quick else 120, 8 if args.quick else 24
        )

    rows: list[Row | str] = []
    for label, s, base in (
        ("compressed segments (a vs a0)", "a", "a0"),
        ("block entries (b vs b0)", "b", "b0"),
    ):
        rows.append(f"API: {label}, GET p50")
        for k in ("one", "10k"):
            for fmt in ("json", "bin"):
                for state in ("cold", "warm"):
                    key = f"{k}_{fmt}_{state}_p50_us"
                    v, bv = results[s][key], results[base][key]
                    figures[f"api_{s}_{key}"] = v
                    figures[f"api_{base}_{key}"] = bv
                    figures[f"api_{s}_{k}_{fmt}_{state}_ratio"] = v / bv
                    rows.append(
                        Row(
                            f"{'1 record' if k == 'one' else '10,000 records'} {fmt} {state}",
                            v,
                            "us",
                            base,
                            bv,
                            "<= 1.5x",
                            v / bv <= 1.5,
                        )
                    )
                figures[f"api_{s}_{k}_{fmt}_cold_p90_us"] = results[s][f"{k}_{fmt}_cold_p90_us"]
    for per_entry, fig in journal.items():
        rows.append(
            f"in process: Journal.read + decode, {per_entry} record(s) per entry, "
            "compressed segments vs entry logs, p50"
        )
        for k in ("one", "10k"):
            for state in ("cold", "warm"):
                v = fig[f"compressed_{k}_{state}_p50_us"]
                bv = fig[f"plain_{k}_{state}_p50_us"]
                label = "1 record" if k == "one" else "10,000 records"
                rows.append(
                    Row(f"{label} {state}", v, "us", "entry logs", bv, "<= 1.5x", v / bv <= 1.5)
                )
                figures[f"inproc_journal_{per_entry}_{k}_{state}_ratio"] = v / bv
        figures.update({f"inproc_journal_{per_entry}_{k}": v for k, v in fig.items()})
    rows.append("in process (bench/atrest.py), p50")
    for k in ("one", "10k"):
        base = inproc[f"consume_{k}_batches_p50_us"]
        for name, state in (("blocks", "warm"), ("blocks_nocache", "cold")):
            v = inproc[f"consume_{k}_{name}_p50_us"]
            rows.append(
                Row(
                    f"block entries, {'1 record' if k == 'one' else '10,000'} {state}",
                    v,
                    "us",
                    "MIRROR entries",
                    base,
                    "<= 1.5x",
                    v / base <= 1.5,
                )
            )
    rows.append(
        Row(
            "EGWC 1 record cold",
            look["cold_p50_us"],
            "us",
            "entry",
            look["journal_p50_us"],
            "<= 1.5x",
            look["cold_p50_us"] / look["journal_p50_us"] <= 1.5,
        )
    )
    rows.append(
        Row(
            "EGWC 1 record warm",
            look["warm_p50_us"],
            "us",
            "entry",
            look["journal_p50_us"],
            "<= 1.5x",
            look["warm_p50_us"] / look["journal_p50_us"] <= 1.5,
        )
    )
    figures.update({f"inproc_{k}": v for k, v in inproc.items()})
    figures.update({f"inproc_egwc_lookup_{k}": v for k, v in look.items()})
    figures["inproc_egwc_cold_ratio"] = look["cold_p50_us"] / look["journal_p50_us"]
    print(render_table("consume over the API and in process (issue 42 item 6)", rows))
    emit_json(figures)


if __name__ == "__main__":
    main()
