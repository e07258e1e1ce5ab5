"""A scenario file (TOML, see ``scenarios/README.md``) parsed and checked.

Pure code (no processes, no I/O but reading the file): :func:`parse_scenario`
turns a parsed TOML document into a :class:`Scenario` or raises
:class:`ScenarioError` naming the key at fault (unknown keys included), so a
typo in a scenario is refused before anything starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Final

from edge_gateway.testing.tcpproxy import LinkShape
from edgegw_cli._fleet import FleetTopic

#: Faults against the gateway processes.
PROCESS_ACTIONS: Final = ("kill", "stop", "start", "pause", "resume", "split_brain")
#: Faults against a region's link to the bucket (``bucket = "s3"`` only).
LINK_ACTIONS: Final = ("link_down", "blackhole", "drop_responses", "slow", "lossy", "cap")
#: Faults against a region's link to the metadata server (``metadata = true`` only).
METADATA_ACTIONS: Final = ("metadata_down", "metadata_blackhole")
#: Faults against the bucket: a bad object planted where a region's next log
#: entry goes (``edgegw_cli._plant``).
BUCKET_ACTIONS: Final = ("plant_garbage", "plant_truncated", "plant_foreign")
#: Faults that last ``for_s`` and then heal by themselves.
TIMED_ACTIONS: Final = LINK_ACTIONS + METADATA_ACTIONS
ACTIONS: Final = PROCESS_ACTIONS + LINK_ACTIONS + METADATA_ACTIONS + BUCKET_ACTIONS
#: The keys of a ``[regions.link]`` table.
LINK_KEYS: Final = (
    "up_mbit",
    "down_mbit",
    "latency_ms",
    "jitter_ms",
    "resets_per_min",
    "slow_start_s",
)
#: The parameters a link fault takes (it overrides those of the configured link).
FAULT_PARAMS: Final[dict[str, tuple[str, ...]]] = {
    "slow": ("latency_ms", "jitter_ms"),
    "lossy": ("resets_per_min",),
    "cap": ("up_mbit", "down_mbit"),
}
_TOP_KEYS: Final = (
    "name",
    "description",
    "duration_s",
    "flush_ms",
    "poll_ms",
    "converge_timeout_s",
    "bucket",
    "metadata",
    "quick_scale",
    "regions",
    "topics",
    "workload",
    "faults",
)
_FAULT_KEYS: Final = ("at_s", "action", "region", "for_s")


#: The journal segment size of a region with ``journal_max_mb`` (MiB).
SEGMENT_MB: Final = 1.0
MIN_JOURNAL_MB: Final = 4 * SEGMENT_MB


class ScenarioError(ValueError):
    """A scenario file that cannot run: the message names the key and what is wrong."""


@dataclass(frozen=True)
class LinkSpec:
    """A region's link to the bucket, as the scenario describes it.

    ``latency_ms`` is one way (the round trip is twice it); caps in Mbit/s
    (10^6 bits) of payload; ``resets_per_min`` per open connection.
    """

    up_mbit: float = 0.0
    down_mbit: float = 0.0
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    resets_per_min: float = 0.0
    slow_start_s: float = 0.0

    def shape(self, seed: int) -> LinkShape:
        return LinkShape(
            up_bytes_per_s=self.up_mbit * 125_000,
            down_bytes_per_s=self.down_mbit * 125_000,
            latency_s=self.latency_ms / 1000,
            jitter_s=self.jitter_ms / 1000,
            reset_rate=self.resets_per_min / 60,
            slow_start_s=self.slow_start_s,
            seed=seed,
        )

    def describe(self) -> str:
        parts = []
        if self.up_mbit or self.down_mbit:
            parts.append(f"{self.up_mbit:g}/{self.down_mbit:g} Mbit/s up/down")
        if self.latency_ms:
            rtt = f"RTT {2 * self.latency_ms:g} ms"
            parts.append(rtt + (f" ±{2 * self.jitter_ms:g}" if self.jitter_ms else ""))
        if self.resets_per_min:
            parts.append(f"{self.resets_per_min:g} resets/min")
        if self.slow_start_s:
            parts.append(f"slow start {self.slow_start_s:g}s")
        return ", ".join(parts) or "loopback"


@dataclass(frozen=True)
class Fault:
    at_s: float
    action: str
    #: A region, or ``*`` (every region; link faults only).
    region: str
    for_s: float = 0.0
    #: A link fault's parameters (see :data:`FAULT_PARAMS`), sorted by name.
    params: tuple[tuple[str, float], ...] = ()

    @property
    def is_link(self) -> bool:
        """A fault on the region's link to the bucket."""
        return self.action in LINK_ACTIONS

    @property
    def is_bucket(self) -> bool:
        """A bad object planted in the bucket (:data:`BUCKET_ACTIONS`)."""
        return self.action in BUCKET_ACTIONS

    @property
    def is_metadata(self) -> bool:
        """A fault on the region's link to the metadata server."""
        return self.action in METADATA_ACTIONS

    def label(self) -> str:
        extra = "".join(f" {k}={v:g}" for k, v in self.params)
        span = f" for {self.for_s:g}s" if self.for_s else ""
        return f"t={self.at_s:g}s {self.action} {self.region}{extra}{span}"


@dataclass(frozen=True)
class Workload:
    region: str
    topic: str
    rate: float
    batch: int


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    duration_s: float
    flush_ms: int
    poll_ms: int
    regions: tuple[str, ...]
    topics: tuple[FleetTopic, ...]
    workloads: tuple[Workload, ...]
    faults: tuple[Fault, ...]
    converge_timeout_s: float
    #: ``local`` (a shared directory) or ``s3`` (moto, one link per region).
    bucket: str = "local"
    #: Per region; regions not named get a plain (unshaped) link.
    links: tuple[tuple[str, LinkSpec], ...] = ()
    #: ``--quick`` multiplies every time on the timeline by this.
    quick_scale: float = 0.5
    #: Routing from a metadata server (one link to it per region) instead of
    #: static topics in each gateway's config.
    metadata: bool = False
    #: Per region: a small journal disk budget (MiB), so that an outage fills it.
    journal_max_mb: tuple[tuple[str, float], ...] = ()
    #: Per region: its wall clock this many hours off (libfaketime).
    clock_skew_h: tuple[tuple[str, float], ...] = ()

    def link(self, region: str) -> LinkSpec:
        return dict(self.links).get(region, LinkSpec())

    def quick(self) -> Scenario:
        """The ``--quick`` form: the same story with the timeline scaled down."""
        k = self.quick_scale
        return replace(
            self,
            duration_s=self.duration_s * k,
            faults=tuple(replace(f, at_s=f.at_s * k, for_s=f.for_s * k) for f in self.faults),
        )


def _table(
    value: object, where: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()
) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ScenarioError(f"{where}: expected a table, got {type(value).__name__} {value!r}")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise ScenarioError(
            f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
            f"(allowed: {', '.join(allowed)})"
        )
    missing = [k for k in required if k not in value]
    if missing:
        raise ScenarioError(f"{where}: missing {', '.join(missing)}")
    return value


def _tables(doc: dict[str, Any], key: str, *, required: bool) -> list[dict[str, Any]]:
    value = doc.get(key, [])
    if required and key not in doc:
        raise ScenarioError(f"missing [[{key}]]")
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ScenarioError(f"{key}: expected an array of tables ([[{key}]]), got {value!r}")
    return value


def _number(
    table: dict[str, Any], key: str, where: str, default: float, *, positive: bool = False
) -> float:
    value = table.get(key, default)
    ok = (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and (value > 0 if positive else value >= 0)
    )
    if not ok:
        bound = "> 0" if positive else ">= 0"
        raise ScenarioError(f"{where}.{key}: expected a number {bound}, got {value!r}")
    return float(value)


def _integer(table: dict[str, Any], key: str, where: str, default: int) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ScenarioError(f"{where}.{key}: expected an integer >= 1, got {value!r}")
    return value


def _string(table: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = table.get(key, default)
    if not isinstance(value, str) or (default is None and not value):
        raise ScenarioError(f"{where}.{key}: expected a string, got {value!r}")
    return value


def _link(value: object, where: str) -> LinkSpec:
    table = _table(value, where, LINK_KEYS)
    spec = LinkSpec(**{k: _number(table, k, where, 0.0) for k in LINK_KEYS})
    _check_shape(spec, where)
    return spec


def _check_shape(spec: LinkSpec, where: str) -> None:
    try:
        spec.shape(0)
    except ValueError as exc:
        raise ScenarioError(f"{where}: {exc} (jitter_ms must not exceed latency_ms)") from None


def parse_scenario(doc: dict[str, Any], default_name: str) -> Scenario:
    """Check a parsed scenario document; raises :class:`ScenarioError` on the first problem."""
    _table(doc, "scenario", _TOP_KEYS, ("regions", "topics"))
    bucket = _string(doc, "bucket", "scenario", "local")
    if bucket not in ("local", "s3"):
        raise ScenarioError(f'bucket: expected "local" or "s3", got {bucket!r}')
    duration = _number(doc, "duration_s", "scenario", 10, positive=True)
    metadata = doc.get("metadata", False)
    if not isinstance(metadata, bool):
        raise ScenarioError(f"scenario.metadata: expected true or false, got {metadata!r}")

    regions: list[str] = []
    links: list[tuple[str, LinkSpec]] = []
    budgets: list[tuple[str, float]] = []
    skews: list[tuple[str, float]] = []
    for i, raw in enumerate(_tables(doc, "regions", required=True)):
        where = f"regions[{i}]"
        r = _table(raw, where, ("name", "link", "journal_max_mb", "clock_skew_h"), ("name",))
        name = _string(r, "name", where)
        if name in regions or name == "*":
            raise ScenarioError(f"{where}.name: {name!r} is taken")
        regions.append(name)
        if "journal_max_mb" in r:
            budget = _number(r, "journal_max_mb", where, 0, positive=True)
            if budget < MIN_JOURNAL_MB:
                raise ScenarioError(
                    f"{where}.journal_max_mb: at least {MIN_JOURNAL_MB:g} (4 segments of "
                    f"{SEGMENT_MB:g} MiB), got {budget:g}"
                )
            budgets.append((name, budget))
        if "clock_skew_h" in r:
            skew = r["clock_skew_h"]
            if isinstance(skew, bool) or not isinstance(skew, int | float) or not abs(skew) < 1e5:
                raise ScenarioError(f"{where}.clock_skew_h: expected hours (+/-), got {skew!r}")
            skews.append((name, float(skew)))
        if "link" in r:
            if bucket != "s3":
                raise ScenarioError(f'{where}.link: links need bucket = "s3"')
            links.append((name, _link(r["link"], f"{where}.link")))
    if not regions:
        raise ScenarioError("regions: at least one region")

    topics: list[FleetTopic] = []
    for i, raw in enumerate(_tables(doc, "topics", required=True)):
        where = f"topics[{i}]"
        t = _table(raw, where, ("name", "home", "partitions", "subscribers"), ("name", "home"))
        home = _string(t, "home", where)
        if home not in regions:
            raise ScenarioError(f"{where}.home: {home!r} is not a region ({', '.join(regions)})")
        subs = t.get("subscribers", ["*"])
        if not isinstance(subs, list) or not all(s == "*" or s in regions for s in subs):
            raise ScenarioError(
                f'{where}.subscribers: expected a list of regions or ["*"], got {subs!r}'
            )
        name = _string(t, "name", where)
        if any(x.name == name for x in topics):
            raise ScenarioError(f"{where}.name: topic {name!r} twice")
        topics.append(FleetTopic(name, home, _integer(t, "partitions", where, 1), tuple(subs)))

    workloads: list[Workload] = []
    for i, raw in enumerate(_tables(doc, "workload", required=False)):
        where = f"workload[{i}]"
        w = _table(raw, where, ("region", "topic", "rate", "batch"), ("region", "topic", "rate"))
        topic = _string(w, "topic", where)
        home = next((t.home for t in topics if t.name == topic), None)
        if home is None:
            raise ScenarioError(f"{where}.topic: {topic!r} is not a topic")
        region = _string(w, "region", where)
        if region != home:
            raise ScenarioError(f"{where}: workload {topic} must run in its home region ({home})")
        if any(x.topic == topic for x in workloads):
            raise ScenarioError(f"{where}: one workload per topic ({topic} has two)")
        workloads.append(
            Workload(
                region,
                topic,
                _number(w, "rate", where, 0, positive=True),
                _integer(w, "batch", where, 50),
            )
        )

    faults: list[Fault] = []
    for i, raw in enumerate(_tables(doc, "faults", required=False)):
        fault = _fault(raw, f"faults[{i}]", regions, bucket, duration)
        if fault.is_metadata and not metadata:
            raise ScenarioError(f"faults[{i}]: {fault.action} needs metadata = true")
        for r in regions if fault.region == "*" else [fault.region]:
            # The fault's parameters override the region's link: still a valid shape?
            _check_shape(
                replace(dict(links).get(r, LinkSpec()), **dict(fault.params)), f"faults[{i}]"
            )
        faults.append(fault)

    quick_scale = _number(doc, "quick_scale", "scenario", 0.5, positive=True)
    if quick_scale > 1:
        raise ScenarioError(f"scenario.quick_scale: expected at most 1, got {quick_scale!r}")
    return Scenario(
        name=_string(doc, "name", "scenario", default_name) or default_name,
        description=_string(doc, "description", "scenario", ""),
        duration_s=duration,
        flush_ms=_integer(doc, "flush_ms", "scenario", 250),
        poll_ms=_integer(doc, "poll_ms", "scenario", 100),
        regions=tuple(regions),
        topics=tuple(topics),
        workloads=tuple(workloads),
        faults=tuple(sorted(faults, key=lambda f: f.at_s)),
        converge_timeout_s=_number(doc, "converge_timeout_s", "scenario", 60, positive=True),
        bucket=bucket,
        links=tuple(links),
        quick_scale=quick_scale,
        metadata=metadata,
        journal_max_mb=tuple(budgets),
        clock_skew_h=tuple(skews),
    )


def _fault(
    raw: dict[str, Any], where: str, regions: list[str], bucket: str, duration: float
) -> Fault:
    action = raw.get("action")
    if action not in ACTIONS:
        raise ScenarioError(f"{where}.action: expected one of {', '.join(ACTIONS)}, got {action!r}")
    params = FAULT_PARAMS.get(action, ())
    f = _table(raw, where, _FAULT_KEYS + params, ("at_s", "action", "region"))
    region = _string(f, "region", where)
    if region not in regions and not (region == "*" and action in TIMED_ACTIONS):
        allowed = regions + (["*"] if action in TIMED_ACTIONS else [])
        raise ScenarioError(f"{where}.region: expected one of {', '.join(allowed)}, got {region!r}")
    at_s = _number(f, "at_s", where, 0)
    if at_s > duration:
        raise ScenarioError(f"{where}.at_s: {at_s:g} is after the end (duration_s = {duration:g})")
    if action in TIMED_ACTIONS:
        if action in LINK_ACTIONS and bucket != "s3":
            raise ScenarioError(f'{where}: link fault {action} needs bucket = "s3"')
        if "for_s" not in f:
            raise ScenarioError(f"{where}: link fault {action} needs for_s (how long it lasts)")
        for_s = _number(f, "for_s", where, 0, positive=True)
    elif "for_s" in f and action != "pause":
        raise ScenarioError(f"{where}.for_s: only pause, link and metadata faults last for_s")
    else:
        for_s = _number(f, "for_s", where, 0)
    values = tuple(sorted((k, _number(f, k, where, 0)) for k in params if k in f))
    if params and not values:
        raise ScenarioError(f"{where}: {action} needs {' or '.join(params)}")
    return Fault(at_s, action, region, for_s, values)
