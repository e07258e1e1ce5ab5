"""A journal that lost entries the bucket holds never hands their offsets out again (issue 41).

With real processes: ``edgegw serve``, its HTTP API and a local bucket. A
site produces and ships 300 records and stops; its last journal segment is
moved aside (by an operator: damage in a segment's middle is quarantined by
the gateway itself since issue 45, tests/system/test_journal_damage.py), and
the gateway starts while a producer keeps posting. Before, intake opened
at once: produce answered 200 at
offsets 280, 281, ... -- offsets the bucket held already -- and the claim
passed once those appends had pushed the journal past the log's last LSN,
so the bucket held offsets 280..299 twice and the shipper failed for good.

Now the shipper compares each journal's end with what shipper.json says the
bucket confirmed, or may hold (the LSNs sent), *before* intake opens: the
gateway refuses produce and exits 3 naming ``edgegw restore``, whatever the
producer does; after ``edgegw restore --yes`` the site ships again, and every
acknowledged record is in the bucket exactly once.

With the bucket away (S3 behind a proxy that refuses), an intact journal
still takes writes at once, while one that ends below what it sent answers
produce with 503 and the reason until the bucket answers, then exits 3.

Another test makes the shipper fail on every run (a fail point): status,
its JSON and the metrics say ``failing`` with the error, and the supervisor's
restarts claim no new epoch.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from _serve import Fleet, Gateway, TopicSpec, wait_until

sys.path.insert(0, str(Path(__file__).parents[1] / "cli"))
from _cli_support import run_edgegw

from edge_gateway import failpoints
from edge_gateway.format.logobject import (
    decode_block,
    decode_header,
    iter_block_batches,
    slice_block,
)
from edge_gateway.testing.ports import free_port

TOPIC = "t"
VALUE_BYTES = 900
EXIT_FENCED = 3


def _gateway(tmp_path: Path, *, manifests: bool = True) -> Gateway:
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    sections: dict[str, dict[str, object]] = {
        "journal": {"segment_bytes": "64KiB"},
        # A fixed port: producers reach the API while the gateway starts,
        # before it writes api.addr (once ready).
        "api": {"listen": f"127.0.0.1:{free_port()}"},
    }
    if not manifests:  # none in the test's time: shipper.json's log_lsn stays at the claim's
        sections["shipper"] = {"manifest_interval_ms": 3_600_000, "manifest_every": 100_000}
    return Gateway(
        "north",
        tmp_path,
        {"type": "local", "path": str(bucket)},
        [TopicSpec(TOPIC, "north", partitions=1)],
        sections,
    )


def _value(tag: str, i: int) -> str:
    return f"{tag}-{i:06d}-".ljust(VALUE_BYTES, "x")


def _produce(url: str, values: list[str]) -> dict[int, str]:
    """One POST of ``values``; offset -> value of what it acknowledged."""
    r = httpx.post(
        f"{url}/v1/topics/{TOPIC}/records",
        json={"records": [{"value": v} for v in values]},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return {o["offset"]: v for v, o in zip(values, r.json()["offsets"], strict=True)}


class _ProduceLoop(threading.Thread):
    """Posts batches of 10 records as fast as it can to the gateway's (fixed) address.

    Keeps what was acknowledged (offset -> value) and the answers that were not 200.
    """

    def __init__(self, url: str, tag: str) -> None:
        super().__init__(daemon=True, name=f"produce-{tag}")
        self.url = url
        self.tag = tag
        self.acked: dict[int, str] = {}
        self.refused: list[str] = []
        self.attempts = 0
        self.stopping = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        n = 0
        try:
            with httpx.Client(timeout=10) as c:
                while not self.stopping.is_set():
                    values = [_value(self.tag, n + i) for i in range(10)]
                    self.attempts += 1
                    try:
                        r = c.post(
                            f"{self.url}/v1/topics/{TOPIC}/records",
                            json={"records": [{"value": v} for v in values]},
                        )
                    except httpx.HTTPError:
                        time.sleep(0.002)  # not listening (yet, or any more)
                        continue
                    if r.status_code == 200:
                        for v, o in zip(values, r.json()["offsets"], strict=True):
                            self.acked[o["offset"]] = v
                        n += 10
                    else:
                        self.refused.append(f"{r.status_code} {r.text}")
        except Exception as exc:  # reported to the test
            self.error = f"{type(exc).__name__}: {exc}"

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=60)
        assert not self.is_alive()
        assert self.error is None, self.error


def _log_keys(bucket: Path) -> list[str]:
    return sorted(p.name for p in (bucket / "objects/regions/north/log").iterdir())


def _bucket_records(bucket: Path) -> list[tuple[int, str, str]]:
    """Every record of topic ``t`` in region north's log: (offset, value, object), in seq order."""
    out = []
    for name in _log_keys(bucket):
        obj = (bucket / "objects/regions/north/log" / name).read_bytes()
        header = decode_header(obj, where=name, object_size=len(obj))
        for b in header.blocks:
            assert (b.topic, b.partition) == (TOPIC, 0)
            raw = decode_block(b, slice_block(b, [(0, obj)], where=name), where=name)
            for batch in iter_block_batches(b, raw, where=name):
                out.extend((rec.offset, rec.value.decode(), name) for rec in batch.records())
    return out


def _assert_exactly_once(bucket: Path, acked: dict[int, str]) -> None:
    """The bucket holds offsets 0..n-1 of t/0 once each, and every acknowledged record."""
    records = _bucket_records(bucket)
    seen: dict[int, list[str]] = {}
    for offset, _, name in records:
        seen.setdefault(offset, []).append(name)
    twice = {o: names for o, names in seen.items() if len(names) > 1}
    assert not twice, f"offsets in the bucket twice: {dict(list(twice.items())[:5])}"
    assert sorted(seen) == list(range(len(seen))), "a gap in the bucket's offsets"
    values = {offset: value for offset, value, _ in records}
    missing = sorted(o for o in acked if values.get(o) != acked[o])
    assert not missing, f"acknowledged records missing or different in the bucket: {missing[:10]}"


def _listen_url(g: Gateway) -> str:
    listen = re.search(r'^listen = "([^"]+)"$', g.config.read_text(), re.MULTILINE)
    assert listen, "no fixed api.listen"
    return f"http://{listen.group(1)}"


def _last_segment(g: Gateway) -> Path:
    return max((g.data_dir / "journal").glob("*.wal"))


@pytest.mark.parametrize(
    "summarised",
    [
        # shipper.json's log_lsn (the last manifest) covers the moved segment:
        # the start refuses from local state alone, before any bucket request.
        pytest.param(True, id="confirmed-by-a-manifest"),
        # Only the LSNs sent (written before each create) cover it: intake
        # waits for the claim, which finds the log's head above the journal.
        pytest.param(False, id="sent-only"),
    ],
)
def test_a_segment_moved_aside_is_refused_whatever_a_producer_does(
    tmp_path: Path, summarised: bool
) -> None:
    g = _gateway(tmp_path, manifests=summarised)
    bucket = tmp_path / "bucket"
    acked: dict[int, str] = {}
    try:
        g.start()
        for i in range(30):
            acked |= _produce(g.url, [_value("first", 10 * i + j) for j in range(10)])
        assert sorted(acked) == list(range(300))
        wait_until(lambda: g.status()["shipper"]["pending_lsns"] == 0, 60, "everything shipped")
        last_lsn = g.status()["journal"]["next_lsn"] - 1
        state = g.data_dir / "journal/shipper.json"
        if summarised:
            wait_until(
                lambda: json.loads(state.read_text())["log_lsn"] == last_lsn, 60, "a manifest"
            )
        assert g.stop() == 0
        keys_before = _log_keys(bucket)
        _assert_exactly_once(bucket, acked)

        # The last segment is lost (an operator moved it aside by hand; damage in
        # its middle is quarantined by the gateway itself: test_journal_damage.py).
        segment = _last_segment(g)
        assert segment.name != "00000000000000000001.wal", "the journal must have rolled"
        first_moved = int(segment.stem)
        confirmed = json.loads(state.read_text())["log_lsn"]
        assert (confirmed >= first_moved) == summarised, confirmed

        # The operator moves it aside, a producer keeps posting, the gateway starts.
        aside = tmp_path / "aside"
        aside.mkdir()
        shutil.move(segment, aside / segment.name)
        loop = _ProduceLoop(_listen_url(g), "during")
        loop.start()
        try:
            time.sleep(0.2)  # the producer is posting (to nothing yet) when serve starts
            g.spawn()
            assert g.proc is not None
            code = g.proc.wait(timeout=60)
            time.sleep(0.2)
        finally:
            loop.stop()
        log = g.tail(200)
        assert code == EXIT_FENCED, log
        # (a) no offset or LSN the bucket holds was handed out again: nothing
        # was acknowledged, the bucket is as it was, and the error names the
        # cause and the remedy.
        assert loop.acked == {}, f"produce acknowledged offsets {sorted(loop.acked)[:10]}"
        # (It may or may not reach the API in the moments the start lasts: the
        # test with the bucket away below sees the refusals themselves.)
        assert loop.attempts > 0
        assert all(r.startswith("503") for r in loop.refused), loop.refused[:3]
        assert _log_keys(bucket) == keys_before
        _assert_exactly_once(bucket, acked)
        fenced = [line for line in log.splitlines() if line.startswith("error: fenced: ")]
        assert len(fenced) == 1, log
        assert "the journal lost entries the bucket holds" in fenced[0], log
        assert ("but the bucket confirmed it through LSN" in fenced[0]) == summarised, log
        assert "Run `edgegw restore`" in fenced[0], log

        # (b) restore, and the site ships again: every acknowledged record once.
        done = run_edgegw("restore", "--config", g.config, "--yes")
        assert done.returncode == 0, done.stderr
        loop = _ProduceLoop(_listen_url(g), "after")
        loop.start()
        try:
            g.start()
            wait_until(lambda: len(loop.acked) >= 100, 60, "produce after the restore")
        finally:
            loop.stop()
        assert min(loop.acked) == 300  # offsets continue after the bucket's, none reused
        acked |= loop.acked
        wait_until(lambda: g.status()["shipper"]["pending_lsns"] == 0, 60, "everything shipped")
        shipper = g.status()["shipper"]
        assert shipper["state"] == "shipping"
        assert shipper["last_error"] is None
        assert g.stop() == 0
        _assert_exactly_once(bucket, acked)
        assert len(_bucket_records(bucket)) == len(acked)
    finally:
        g.kill()


def _metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    assert m, f"no {name}{labels} in the metrics"
    return float(m.group(1))


def test_a_shipper_failing_on_every_run_shows_in_status_and_claims_no_new_epochs(
    tmp_path: Path,
) -> None:
    g = _gateway(tmp_path)
    g.env = {failpoints.ENV: "shipper.loop=1000"}
    try:
        g.start()
        acked = _produce(g.url, [_value("stuck", i) for i in range(10)])

        def failing() -> dict[str, Any] | None:
            s: dict[str, Any] = g.status()["shipper"]
            return s if s["state"] == "failing" and s["failures"] >= 3 else None

        shipper = wait_until(failing, 60, "three failed shipper runs")
        assert "FailPointError" in shipper["last_error"]
        assert shipper["pending_lsns"] > 0  # never "nothing pending" while nothing ships
        # A restart resumes this process's epoch: no fence per restart.
        assert shipper["epoch"] == 1
        fences = [
            name
            for name in _log_keys(tmp_path / "bucket")
            if not decode_header(
                data := (tmp_path / "bucket/objects/regions/north/log" / name).read_bytes(),
                where=name,
                object_size=len(data),
            ).blocks
        ]
        assert len(fences) == 1, fences
        text = httpx.get(f"{g.url}/metrics", timeout=10).text
        assert _metric(text, "edgegw_shipper_state", '{state="failing"}') == 1
        assert _metric(text, "edgegw_shipper_state", '{state="shipping"}') == 0
        assert _metric(text, "edgegw_shipper_failed_runs") >= 3
        shown = run_edgegw("status", "--config", g.config)
        assert shown.returncode == 0, shown.stderr
        flat = " ".join(shown.stdout.split())
        assert "FAILING: " in flat, shown.stdout
        assert "FailPointError" in flat, shown.stdout
        assert len(acked) == 10
    finally:
        g.kill()


def test_with_the_bucket_away_a_start_holds_produce_only_when_the_journal_may_have_lost_entries(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str, s3_admin: Any
) -> None:
    """An intact journal starts and takes writes with the bucket unreachable, as promised.
    One that ends below what it sent refuses produce (503, naming the cause and the
    remedy) until the bucket answers, and then stops with exit 3."""
    port = int(moto_endpoint.rsplit(":", 1)[1])
    fleet = Fleet(
        tmp_path,
        ["north"],
        [TopicSpec(TOPIC, "north", partitions=1)],
        s3=(port, s3_bucket_name),
        sections={
            "journal": {"segment_bytes": "64KiB"},
            # No manifest in the test's time: only the sent LSNs tell (the
            # confirmed ones would stop the start without waiting).
            "shipper": {"manifest_interval_ms": 3_600_000, "manifest_every": 100_000},
            "api": {"listen": f"127.0.0.1:{free_port()}"},
        },
    )
    g, proxy = fleet["north"], fleet.proxies["north"]

    def log_keys() -> list[str]:
        got = s3_admin.list_objects_v2(Bucket=s3_bucket_name, Prefix="regions/north/log/")
        return sorted(o["Key"] for o in got.get("Contents", []))

    def shipped() -> bool:
        return bool(g.status()["shipper"]["pending_lsns"] == 0)

    try:
        g.start()
        for i in range(30):
            _produce(g.url, [_value("first", 10 * i + j) for j in range(10)])
        wait_until(shipped, 60, "everything shipped")
        assert g.stop() == 0

        # The promise kept: with the bucket away, an intact journal takes writes at once.
        proxy.set_mode("refuse")
        g.spawn()
        url = g.url = _listen_url(g)
        acked = wait_until(
            lambda: _try_produce(url, [_value("offline", i) for i in range(10)]),
            60,
            "produce with the bucket away",
        )
        assert sorted(acked) == list(range(300, 310))
        proxy.set_mode("pass")
        wait_until(shipped, 60, "everything shipped")
        # (The claim, and the first manifest after it, confirm the log up to
        # there: more, in a new segment, that only the sent LSNs cover.)
        segment = _last_segment(g)
        while _last_segment(g) == segment:
            _produce(g.url, [_value("more", i) for i in range(10)])
        _produce(g.url, [_value("more", i) for i in range(10)])
        wait_until(shipped, 60, "everything shipped")
        assert g.stop() == 0
        keys_before = log_keys()

        segment = _last_segment(g)
        state = json.loads((g.data_dir / "journal/shipper.json").read_text())
        # Not confirmed by shipper.json: the start cannot refuse it from local state alone.
        assert state["log_lsn"] < int(segment.stem), state
        aside = tmp_path / "aside"
        aside.mkdir()
        shutil.move(segment, aside / segment.name)
        proxy.set_mode("refuse")
        g.spawn()
        url = g.url = _listen_url(g)
        refusals: list[str] = []

        def refused() -> bool:
            try:
                r = httpx.post(
                    f"{url}/v1/topics/{TOPIC}/records",
                    json={"records": [{"value": "never"}]},
                    timeout=10,
                )
            except httpx.ConnectError:
                return False  # not listening yet
            assert r.status_code != 200, f"produce acknowledged: {r.text}"
            refusals.append(r.text)
            return "does not accept writes yet" in r.text

        wait_until(refused, 60, "produce refused with the reason", interval=0.1)
        assert r"edgegw restore" in refusals[-1], refusals[-1]
        assert "sent LSNs up to" in refusals[-1], refusals[-1]
        for _ in range(20):  # it keeps refusing while the bucket is away
            refused()
            time.sleep(0.05)
        assert g.status()["shipper"]["intake_hold"] is not None
        assert g.proc is not None
        assert g.proc.poll() is None

        # The bucket answers: its head is above the journal's end.
        proxy.set_mode("pass")
        assert g.proc.wait(timeout=60) == EXIT_FENCED, g.tail()
        assert "the journal lost entries the bucket holds" in g.tail(), g.tail()
        assert log_keys() == keys_before
    finally:
        fleet.close()


def _try_produce(url: str, values: list[str]) -> dict[int, str] | None:
    try:
        return _produce(url, values)
    except (AssertionError, httpx.HTTPError):
        return None
