"""The serve process's garbage collector (edge_gateway.pygc): settled once the gateway is ready.

``edgegw serve`` freezes startup's objects and raises the young threshold, and
reports the collections and their pauses in ``/v1/status`` (``python_gc``),
the ``edgegw_gc_*`` metrics and ``edgegw status``. The settling itself is
checked in a child interpreter (it changes process-wide state), including that
garbage cycles made afterwards are still collected.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
from _serve import Server, write_config
from edgegw_cli.status import _gc_line, _heap_line

from edge_gateway import heap, pygc


def test_serve_settles_the_collector_and_reports_its_pauses(tmp_path: Path) -> None:
    server = Server(write_config(tmp_path))
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            for i in range(50):
                r = client.post("/v1/topics/t/records", json={"records": [{"value": f"v{i}"}]})
                assert r.status_code == 200, r.text
            status = client.get("/v1/status").json()
            doc = status["python_gc"]
            metrics = client.get("/metrics").text
    finally:
        assert server.stop(signal.SIGTERM)[0] == 0
    assert doc["settled"] is True
    assert doc["thresholds"][0] == pygc.GEN0_THRESHOLD
    assert doc["frozen_objects"] > 1000  # modules, config, the gateway's own objects
    assert len(doc["collections"]) == len(doc["pause_seconds"]) == len(doc["max_pause_ms"]) == 3
    assert 'edgegw_gc_collections_total{generation="2"}' in metrics
    assert 'edgegw_gc_pause_seconds_total{generation="0"}' in metrics
    assert "startup objects frozen; collections: gen0" in _gc_line(doc)
    # The serve process caps glibc's arenas too (edge_gateway.heap).
    if sys.platform.startswith("linux"):
        assert status["heap"]["arena_max"] == heap.ARENA_MAX
        assert _heap_line(status["heap"]).startswith(f"arenas capped at {heap.ARENA_MAX}; ")


def test_settle_freezes_counts_and_still_collects_cycles() -> None:
    code = textwrap.dedent(
        """
        import gc, weakref
        from edge_gateway import pygc

        assert pygc.statistics()["settled"] is False
        pygc.settle()
        before = pygc.statistics()
        assert before["settled"] and before["frozen_objects"] > 0, before
        assert before["thresholds"][0] == pygc.GEN0_THRESHOLD, before
        assert before["collections"] == [0, 0, 0], before

        class Node:
            pass

        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None, "a cycle made after settle() was not collected"
        after = pygc.statistics()
        assert after["collections"][2] == 1, after
        assert after["pause_seconds"][2] > 0, after
        assert after["max_pause_ms"][2] > 0, after
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_full_collections_still_run_after_settle() -> None:
    """Cycles that outlive two young collections reach the old generation; a
    full collection must still come every tenth middle one. Before the
    collection after the freeze, CPython measured the old generation's growth
    against everything startup had built, and none came for a long time."""
    code = textwrap.dedent(
        """
        import gc
        from edge_gateway import pygc

        startup = [[i] for i in range(300_000)]  # a large heap at settle()
        pygc.settle(gen0_threshold=2_000)

        class Node:
            def __init__(self):
                self.me = self  # a cycle: only the collector frees it

        live = []
        for i in range(400_000):
            node = Node()
            if i % 50 == 0:
                live.append(node)  # some live a while, then go
            if len(live) > 2_000:
                live = live[1_000:]
        stats = pygc.statistics()
        old = len(gc.get_objects(generation=2))
        assert stats["collections"][2] >= 1, stats
        assert old < 20_000, old
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_raise_young_threshold_collects_and_freezes_nothing() -> None:
    """What serve does at ready while its mirrors catch up: settle() comes later."""
    code = textwrap.dedent(
        """
        import gc
        from edge_gateway import pygc

        counts = gc.get_count()
        pygc.raise_young_threshold()
        doc = pygc.statistics()
        assert doc["thresholds"][0] == pygc.GEN0_THRESHOLD, doc
        assert doc["settled"] is False and doc["frozen_objects"] == 0, doc
        assert gc.get_count()[2] == counts[2], (counts, gc.get_count())  # no full collection
        pygc.settle()
        assert pygc.statistics()["settled"] is True
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
