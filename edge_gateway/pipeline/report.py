"""A pipeline run's figures as a Prometheus text file (node_exporter's textfile collector).

A pipeline run is a batch job (cron, a systemd timer), not a server to
scrape, so ``edgegw pipeline run --metrics-file PATH`` leaves its figures in
a file that node_exporter's textfile collector (or any agent reading the
Prometheus text format) exports. The file is replaced atomically. It says
when the last run ended and whether it succeeded, when the last successful
run ended (carried over from the previous file when a run fails), and per
topic what the run read and wrote, and how far each region's log head is
ahead of the table's committed position (the pipeline's lag, in log
entries). Alert on ``time() - edgegw_pipeline_last_success_timestamp_seconds``
and on the lag.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, write_to_textfile
from prometheus_client.parser import text_string_to_metric_families

from edge_gateway.pipeline.job import JobPlan

LAST_SUCCESS = "edgegw_pipeline_last_success_timestamp_seconds"


def write_metrics(
    path: Path, plan: JobPlan | None, *, ok: bool, started: float, finished: float
) -> None:
    """Write the run's figures to ``path`` (``plan`` is None when the run failed before it)."""
    registry = CollectorRegistry()

    def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, doc, labels, registry=registry)

    gauge("edgegw_pipeline_last_run_timestamp_seconds", "When the last run ended.").set(finished)
    gauge("edgegw_pipeline_last_run_success", "1 if the last run succeeded, else 0.").set(ok)
    gauge("edgegw_pipeline_last_run_duration_seconds", "How long the last run took.").set(
        finished - started
    )
    last_success = finished if ok else _previous(path, LAST_SUCCESS)
    if last_success is not None:
        gauge(LAST_SUCCESS, "When the last successful run ended.").set(last_success)
    if plan is not None:
        head = gauge("edgegw_pipeline_log_head_seq", "Newest log entry of the region.", ("region",))
        for region, rp in plan.regions.items():
            head.labels(region).set(rp.last_seq)
        labels = ("topic",)
        rows = gauge("edgegw_pipeline_rows", "Rows the last run committed.", labels)
        rejects = gauge("edgegw_pipeline_rejects", "Records the last run rejected.", labels)
        read = gauge("edgegw_pipeline_records_read", "Records the last run read.", labels)
        cpu = gauge("edgegw_pipeline_task_cpu_seconds", "CPU time of the write tasks.", labels)
        committed = gauge(
            "edgegw_pipeline_committed_seq",
            "Last log entry of the region committed to the topic's table.",
            ("topic", "region"),
        )
        lag = gauge(
            "edgegw_pipeline_lag_entries",
            "Log entries of the region not yet in the topic's table (head - committed).",
            ("topic", "region"),
        )
        for topic, res in plan.topics.items():
            rows.labels(topic).set(res.rows)
            rejects.labels(topic).set(res.rejects)
            read.labels(topic).set(res.rows + res.rejects)
            cpu.labels(topic).set(res.task_cpu_seconds)
            for region, rp in plan.regions.items():
                position = res.positions.get(region, 0)
                committed.labels(topic, region).set(position)
                lag.labels(topic, region).set(max(rp.last_seq - position, 0))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), registry)


def _previous(path: Path, name: str) -> float | None:
    """A metric's value in the file a previous run wrote, if it is there and readable."""
    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name:
                    return float(sample.value)
    except ValueError:
        return None
    return None
