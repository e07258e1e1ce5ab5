"""Deterministic sample telemetry (the reference record of WORKLOADS.md).

Used by the demo, benchmarks and scenarios so runs are comparable: the same
seed gives the same records. Values drift slowly with noise, as real sensors
do, which matters for compression figures.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True, slots=True)
class Reading:
    key: bytes
    value: bytes
    timestamp_ms: int


class TelemetryGenerator:
    """Readings from ``sensors`` sensors of one site, one per sensor in turn."""

    def __init__(
        self,
        *,
        site: str = "north",
        sensors: int = 100,
        seed: int = 42,
        start_ms: int = 1_795_000_000_000,
        step_ms: int = 10,
    ) -> None:
        self._rnd = random.Random(seed)
        self._site = site
        self._ids = [f"s-{i:05d}" for i in range(sensors)]
        self._temp = [self._rnd.uniform(15.0, 25.0) for _ in range(sensors)]
        self._hum = [self._rnd.uniform(30.0, 60.0) for _ in range(sensors)]
        self._now = start_ms
        self._step = step_ms
        self._seq = 0

    def __iter__(self) -> Iterator[Reading]:
        return self

    def __next__(self) -> Reading:
        i = self._seq % len(self._ids)
        rnd = self._rnd
        self._temp[i] += rnd.gauss(0, 0.02)
        self._hum[i] = min(100.0, max(0.0, self._hum[i] + rnd.gauss(0, 0.05)))
        ts = self._now
        doc = {
            "sensor_id": self._ids[i],
            "site": self._site,
            "ts": datetime.fromtimestamp(ts / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
            + f"{ts % 1000:03d}Z",
            "temperature": round(self._temp[i] + rnd.gauss(0, 0.05), 2),
            "humidity": round(self._hum[i], 1),
            "vibration": round(abs(rnd.gauss(0.01, 0.004)), 3),
            "pressure_hpa": round(1013.25 + (self._temp[i] - 20.0) * 0.8 + rnd.gauss(0, 0.1), 2),
            "battery_v": round(3.7 - self._seq * 1e-7, 3),
            "status": "ok",
            "seq": self._seq,
        }
        self._seq += 1
        self._now += self._step
        return Reading(self._ids[i].encode(), json.dumps(doc).encode(), ts)

    def take(self, n: int) -> list[Reading]:
        return [next(self) for _ in range(n)]


def partition_for(key: bytes, partitions: int) -> int:
    """Key-hash partitioning: the same key always lands in the same partition."""
    from edge_gateway._crc import crc32c

    return int(crc32c(key)) % partitions
