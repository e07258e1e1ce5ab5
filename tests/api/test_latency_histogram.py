"""``metrics.LatencyHistogram`` (counted without prometheus_client) exposes the
same samples as prometheus_client's own ``Histogram`` fed the same values."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from edge_gateway._metrics_export import _HistogramCollector
from edge_gateway.metrics import LATENCY_BUCKETS, LatencyHistogram

VALUES = [0.0, 0.0001, 0.00010001, 0.001, 0.0025, 0.7, 1.0, 59.9, 60.0, 60.1, 1e6]


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_same_buckets_sum_and_count_as_prometheus_client() -> None:
    theirs = CollectorRegistry(auto_describe=False)
    reference = Histogram("h", "doc", ["route", "code"], registry=theirs, buckets=LATENCY_BUCKETS)
    ours = LatencyHistogram("h", "doc", ["route", "code"], LATENCY_BUCKETS)
    for i, value in enumerate(VALUES):
        labels = ("/a", "200") if i % 3 else ("/b", "503")
        reference.labels(*labels).observe(value)
        ours.observe(labels, value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_HistogramCollector(ours))
    assert _samples(registry) == _samples(theirs)
    text = generate_latest(registry).decode()
    assert 'h_created{code="200",route="/a"}' in text  # as prometheus_client's has
