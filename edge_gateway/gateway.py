"""The gateway: one object that owns the journal, the shipper, the tailers and the API.

:class:`Gateway` is also the in-process API for embedding edgegw in a Python
program (a function runtime, a device agent): ``produce``, ``fetch`` and
consumer-group offsets are plain async methods, each component reports its
``statistics()``; the HTTP API in ``edge_gateway.api`` is a thin layer over them
(``edge_gateway.api.status_document`` builds the status from the statistics).
The front doors attach from outside with :meth:`Gateway.add_service` (``edgegw
serve`` attaches the API, the Kafka listener and the MQTT bridges).

Lifecycle (``run``): open the bucket, the journal and the group store (built
by :class:`~edge_gateway.wiring.GatewayWiring` from the configuration); start
the journal, the shipper, the tailers and the API with ``nursery.start``, each
reporting ready; then wait for :meth:`request_shutdown` (SIGTERM/SIGINT in
``edgegw serve``). Shutdown stops accepting requests, then — shielded and
bounded by ``shutdown_grace_s`` — flushes the journal and ships what is
pending, then closes everything. A fatal error in any task (``Fenced``, a
corrupt journal) cancels the rest and propagates out of ``run``.

Topology: in static mode the topics come from the config file's
``[[topics]]``. With ``[metadata] url`` they come from the metadata server's
routing table (``edge_gateway.metadata.agent``): the cached table is used at
once at start, and every new version is applied live by
:meth:`Gateway.apply_topology` — topics become writable or go, partitions
grow, and a tailer starts or stops (in its own cancel scope; its progress is
in the journal, so a later restart resumes exactly where it stopped).
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import trio

from edge_gateway._crc import crc32c
from edge_gateway.bucket import (
    Bucket,
    LinkGate,
    LinkMeter,
)
from edge_gateway.bucketgc import BucketGc
from edge_gateway.clock import BucketClock
from edge_gateway.config import (
    GatewayConfig,
    TopicConfig,
    topology_sources,
    topology_subscribers,
)
from edge_gateway.datadir import DirectoryLock, lock_directory
from edge_gateway.encryption import Keys
from edge_gateway.errors import (
    ClosedError,
    CorruptData,
    InvalidInput,
    Unavailable,
)
from edge_gateway.format.batch import Headers, Record, encode_batch, iter_batches, peek_count
from edge_gateway.format.batch import read_header as read_batch_header
from edge_gateway.groups import CommittedOffset, GroupStore
from edge_gateway.idempotence import ProducerRegistry, ProducerSeq, ProducerTable
from edge_gateway.journal import (
    MAIN_LANE,
    Journal,
    Lane,
    Lanes,
    Priority,
    RepairSource,
    Scrubber,
    lane_by_id,
)
from edge_gateway.mirror import PriorityGate, SourceGap, Tailer
from edge_gateway.shipper import Shipper, ShipperStats
from edge_gateway.site_link import SiteLink
from edge_gateway.statefile import StateFiles
from edge_gateway.supervisor import Supervisor, TaskHealth
from edge_gateway.topics import Topic, TopicTable
from edge_gateway.wiring import GatewayWiring

if TYPE_CHECKING:
    from pathlib import Path

    from edge_gateway.metadata.agent import MetadataAgent
    from edge_gateway.metadata.routing import RoutingTable

__all__ = [
    "FetchResult",
    "Gateway",
    "ProduceRecord",
    "ProduceResult",
    "TopicInfo",
    "mirror_task",
]

log = logging.getLogger("edgegw.gateway")

Ack = Literal["local", "shipped"]


@dataclass(frozen=True, slots=True)
class ProduceRecord:
    """One record to produce. ``partition`` None: by key hash, or round robin if no key."""

    value: bytes | None
    key: bytes | None = None
    headers: Headers = ()
    timestamp: int | None = None
    partition: int | None = None


@dataclass(frozen=True, slots=True)
class ProduceResult:
    """Where each produced record landed: ``offsets[i]`` is record ``i``'s."""

    topic: str
    partitions: list[int]
    offsets: list[int]
    #: The journal LSN of the last entry written (``ack=shipped`` waits for it).
    last_lsn: int
    shipped: bool
    #: With topic priorities: per lane, the LSN of the last entry written
    #: there (a partition moving between lanes can touch two); empty: the
    #: normal lane only, at ``last_lsn``.
    lane_lsns: dict[Lane, int] = field(default_factory=dict)
    #: True: an idempotent produce that repeated an append already written
    #: (same producer id, epoch, sequence and count): nothing was appended and
    #: ``offsets`` are the original append's.
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class FetchResult:
    topic: str
    partition: int
    records: list[Record]
    #: The offset to fetch next.
    next_offset: int
    #: The partition's next offset to be written (the high watermark).
    high_watermark: int
    #: The raw batches covering the records (the binary fetch format); the
    #: first may start before the requested offset.
    batches: list[bytes] = field(repr=False, default_factory=list)
    #: The requested offset is in a hole of the partition (a mirror of a source
    #: gap: offsets the source dropped or lost): the first offset after it, where
    #: the records start. None when the records start at the requested offset.
    gap_end: int | None = None


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    #: ``local`` (homed here, writable) or ``mirror`` (read-only copy).
    kind: Literal["local", "mirror"]
    home: str
    partitions: int
    #: For mirrors: the topic's name in its home region.
    source_topic: str
    #: Per partition: first offset still in the journal, next offset.
    first_offsets: list[int]
    next_offsets: list[int]
    #: Per partition (local topics): the next offset not yet in the bucket.
    shipped_offsets: list[int]
    subscribers: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "home": self.home,
            "partitions": [
                {
                    "partition": p,
                    "first_offset": self.first_offsets[p],
                    "next_offset": self.next_offsets[p],
                    **(
                        {
                            "shipped_offset": self.shipped_offsets[p],
                            "unshipped": self.next_offsets[p] - self.shipped_offsets[p],
                        }
                        if self.kind == "local"
                        else {}
                    ),
                }
                for p in range(self.partitions)
            ],
            "source_topic": self.source_topic,
            "subscribers": list(self.subscribers),
        }


@dataclass(slots=True, eq=False)
class _TailerTask:
    """A running tailer: cancelling ``scope`` stops it; ``done`` is set once it has.

    ``tailer`` is replaced by a fresh one when the supervisor restarts it.
    """

    source: str
    tailer: Tailer
    topics: frozenset[str]
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Gateway:
    """One region's gateway. Use ``async with trio.open_nursery() as n: await n.start(gw.run)``."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.region = config.region
        #: ``[encryption]``'s keys, read now: a missing or exposed key file
        #: stops the start with a ConfigError naming it.
        self.keys: Keys = config.encryption.load(config.region)
        #: The topics homed here, mirrored here and auto-created here.
        #: The damaged state files found in this run (docs/operations.md, "A damaged disk").
        self.state_files = StateFiles(config.data_dir)
        self.topic_table = TopicTable(
            config.region,
            config.data_dir,
            config.topics,
            auto_create=config.auto_create,
            default_partitions=config.default_partitions,
            metadata_enabled=config.metadata.enabled,
        )
        self._metadata: MetadataAgent | None = None
        self._workers: trio.Nursery | None = None
        self._tailer_lock: trio.Lock | None = None
        self._tailer_tasks: dict[str, _TailerTask] = {}
        #: The tailers' catch-up order across sources (docs/mirroring.md, "Priorities").
        self._priority_gate = PriorityGate()
        self._journal: Journal | None = None
        self._lanes: Lanes | None = None
        self._shipper: Shipper | None = None
        self._bucket: Bucket | None = None
        self._groups: GroupStore | None = None
        #: ``[link]``: the meter, the policy gate and its watch.
        self.site_link = SiteLink(config.link, config.data_dir, state_files=self.state_files)
        #: Builds the bucket, the lanes' journals, the shipper and the tailers from the
        #: configuration (also for the commands that do not serve: sync, reship, restore).
        self.wiring = GatewayWiring(config, self.topic_table, self.keys, self.site_link.meter)
        #: This gateway's clock against the bucket's (fed by the shipper's writes).
        self._bucket_clock = BucketClock(config.clock)
        #: Bucket GC of this region's log (``[gc]``), run once the core is up.
        self.gc = BucketGc(
            config.gc,
            config.region,
            bucket=lambda: self.bucket,
            prefix=self.key_prefix,
            clock=self._bucket_clock,
            subscribers=self._gc_subscribers,
            head=self._log_head,
            wait_claimed=self._wait_claimed,
        )
        #: The background scrub of the journal's sealed segments
        #: (``journal.scrub_interval``; None: off), run once the core is up.
        scrub_s = config.journal.scrub_interval_s
        self.scrub = Scrubber(config.journal_path, scrub_s) if scrub_s is not None else None
        self._mirror_bucket: Bucket | None = None
        self._round_robin = itertools.count()
        self._shutdown = trio.Event()
        self._ready_hooks: list[Callable[[], Awaitable[None]]] = []
        self._ready = False
        self._starting = trio.CancelScope()
        self._accepting = False
        self._started_ms = 0
        self._started_mono: float | None = None
        self._workers_started = False
        self._api_addr: tuple[str, int] | None = None
        self._supervisor = Supervisor(on_failure=self._task_failed)
        self._task_failures: dict[str, int] = {}
        self._dir_lock: DirectoryLock | None = None
        #: Long-lived tasks attached from outside (the API, the Kafka listener),
        #: started after the core, before the shipper.
        self._services: list[tuple[str, Callable[..., Awaitable[Any]]]] = []
        #: Attached tasks started once produce is accepted (the MQTT bridges).
        self._accepting_services: list[tuple[str, Callable[..., Awaitable[Any]]]] = []
        #: The attached services' blocks of the status document (``kafka``, ``mqtt``).
        self._service_status: dict[str, Callable[[], dict[str, Any] | None]] = {}
        #: Idempotent producers (docs/api.md, "Idempotent produce"); rebuilt
        #: from the journal when the gateway starts.
        self._registry = ProducerRegistry(
            config.data_dir,
            max_producers=config.idempotence.max_producers,
            expiry_ms=config.idempotence.producer_expiry_ms,
            state_files=self.state_files,
        )

    # ------------------------------------------------------------ topology

    def priority_of(self, topic: str) -> Priority:
        """The priority of a topic homed here (``normal`` unless ``[[topics]]`` says else)."""
        return self.topic_table.priority_of(topic)

    def lane_of(self, topic: str) -> Lane:
        """The journal lane of a topic homed here: its priority and ``on_full`` policy."""
        return self.topic_table.lane_of(topic)

    @property
    def topology(self) -> tuple[TopicConfig, ...]:
        """The fleet's topics as this gateway applies them now."""
        return self.topic_table.topology

    @property
    def metadata(self) -> MetadataAgent | None:
        """The metadata server's client (``None`` in static mode)."""
        return self._metadata

    async def apply_routing(self, table: RoutingTable) -> None:
        """Apply a routing table from the metadata server (see :meth:`apply_topology`)."""
        from edge_gateway.metadata.routing import topology

        log.info("routing table version %d: applying", table.version)
        await self.apply_topology(topology(table))

    async def apply_topology(self, topology: Sequence[TopicConfig]) -> None:
        """Switch to a new topology while running.

        Topics homed here become writable (or stop being), partition counts
        change, and tailers start for new sources, stop for sources no longer
        mirrored, and restart when the set of topics mirrored from a source
        changes (each resumes from the progress recorded in the journal).
        """
        self.topic_table.apply(topology, self._lanes)
        if self._lanes is not None:
            self._lanes.priorities_changed()
        if self._workers is not None:
            await self._sync_tailers()

    def ensure_topic(self, topic: str) -> TopicInfo:
        """The topic homed here, auto-created when ``auto_create`` allows it.

        Raises what a produce to it would: :class:`UnknownTopic` (auto_create
        off), :class:`ReadOnlyTopic` (a mirror, or homed elsewhere),
        :class:`InvalidName`. The Kafka listener's Metadata and CreateTopics use it.
        """
        self._check_accepting()
        return self.describe_topic(self.topic_table.writable(topic).name)

    def topic_kind(self, topic: str) -> Literal["local", "mirror"] | None:
        """``local``, ``mirror``, or None when this gateway has no such topic."""
        return self.topic_table.kind(topic)

    # ------------------------------------------------------------ components

    @property
    def lanes(self) -> Lanes:
        """The journals of the lanes (one, the normal lane, without priorities)."""
        if self._lanes is None:
            raise Unavailable("gateway is not running")
        return self._lanes

    async def wait_shipped(self, res: ProduceResult) -> None:
        """Wait until what ``res`` journaled is committed to the bucket (``ack=shipped``)."""
        for lane, lsn in (res.lane_lsns or {MAIN_LANE: res.last_lsn}).items():
            await self.shipper.wait_shipped(lsn, lane)

    @property
    def journal(self) -> Journal:
        if self._journal is None:
            raise ClosedError("the gateway is not running")
        return self._journal

    @property
    def shipper(self) -> Shipper:
        if self._shipper is None:
            raise ClosedError("the gateway is not running")
        return self._shipper

    @property
    def bucket(self) -> Bucket:
        if self._bucket is None:
            raise ClosedError("the gateway is not running")
        return self._bucket

    @property
    def groups(self) -> GroupStore:
        if self._groups is None:
            raise ClosedError("the gateway is not running")
        return self._groups

    @property
    def tailers(self) -> dict[str, Tailer]:
        """Source region → its tailer (empty until the gateway runs)."""
        return {src: task.tailer for src, task in self._tailer_tasks.items()}

    async def _sync_tailers(self) -> None:
        """Start, stop and restart tailers to match the topology (one at a time)."""
        assert self._tailer_lock is not None
        assert self._workers is not None
        async with self._tailer_lock:
            journal, bucket, workers = self.journal, self.mirror_bucket, self._workers
            want = {
                src: frozenset(topics)
                for src, topics in topology_sources(self.topology, self.region).items()
            }
            for src, task in list(self._tailer_tasks.items()):
                if want.get(src) == task.topics:
                    continue
                task.scope.cancel()
                await task.done.wait()
                del self._tailer_tasks[src]
                self._supervisor.forget(mirror_task(src))
                if src not in want:
                    log.info("mirror %s: stopped (no topic of it is subscribed any more)", src)
            for src, topics in sorted(want.items()):
                if src in self._tailer_tasks:
                    continue
                tailer = self.wiring.tailer(journal, bucket, src, topics, self._priority_gate)
                task = _TailerTask(src, tailer, topics)
                self._tailer_tasks[src] = task
                await workers.start(self._run_tailer, task)
                if self._workers_started:
                    log.info("mirror %s: started (%s)", src, ", ".join(sorted(topics)))
            if self._metadata is not None:
                self._metadata.tailers_changed()

    @property
    def api_address(self) -> tuple[str, int] | None:
        return self._api_addr

    @property
    def accepting(self) -> bool:
        """True while produce requests are accepted (False starting or shutting down)."""
        return self._accepting

    def on_ready(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Run ``hook`` once everything has started, before the gateway reports ready."""
        self._ready_hooks.append(hook)

    def not_ready_reason(self) -> str:
        """Why produce is refused now (``/healthz`` and every refused request): starting,
        stopping, or what it waits on -- and what to do."""
        if self._shutdown.is_set():
            return "the gateway is shutting down: retry once it runs again"
        shipper = self._shipper
        if shipper is not None and not shipper.statistics().claimed:
            denied = shipper.denied
            if denied is not None:
                # A first start waits for access (its offsets must continue the
                # region's log); say why and what to do, not just "starting".
                return (
                    "the gateway is starting: a first start learns the region's offsets from the "
                    f"bucket before it accepts records, and the bucket refuses this gateway "
                    f"({denied.code}): {denied.error} -- what to do: {denied.action}"
                )
            err = shipper.statistics().last_error
            if err is None:
                return (
                    "the gateway is starting: a first start learns the region's offsets from "
                    "the bucket before it accepts records; retry after Retry-After"
                )
            return (
                "the gateway is starting: a first start learns the region's offsets from the "
                f"bucket before it accepts records (last attempt: {err}) -- what to do: check "
                "the link to the bucket and [bucket] in the config; it starts by itself once "
                "the bucket answers (retry after Retry-After)"
            )
        return "the gateway is starting: retry after Retry-After"

    @property
    def ready(self) -> bool:
        """True once the gateway has started (and ran its :meth:`on_ready` hooks)."""
        return self._ready

    @property
    def started_ms(self) -> int:
        """Wall-clock ms when the gateway became ready (0 before)."""
        return self._started_ms

    @property
    def uptime_s(self) -> float:
        """Seconds since the gateway became ready, on the monotonic clock (0 before)."""
        return 0.0 if self._started_mono is None else time.monotonic() - self._started_mono

    @property
    def bucket_clock(self) -> BucketClock:
        """This gateway's clock compared with the bucket's (see ``edge_gateway.clock``)."""
        return self._bucket_clock

    def add_service(
        self, name: str, fn: Callable[..., Awaitable[Any]], *, once_accepting: bool = False
    ) -> None:
        """Run ``fn(gateway, task_status=...)`` as a long-lived, supervised task.

        It starts once the core is up, before the shipper (a listener that
        cannot bind stops the start before the region's epoch is claimed); with
        ``once_accepting``, once produce is accepted (a bridge that journals).
        """
        (self._accepting_services if once_accepting else self._services).append((name, fn))

    def add_status(self, name: str, fn: Callable[[], dict[str, Any] | None]) -> None:
        """Report ``fn()`` as the ``name`` block of the status document (an attached service's)."""
        self._service_status[name] = fn

    def service_status(self, name: str) -> dict[str, Any] | None:
        """The ``name`` block of the status document (``kafka``, ``mqtt``); None: not attached."""
        fn = self._service_status.get(name)
        return None if fn is None else fn()

    @property
    def link(self) -> LinkMeter:
        """The site's link to the bucket: cap and bytes per day/month (``[link]``)."""
        return self.site_link.meter

    @property
    def link_gate(self) -> LinkGate:
        """``[link]``'s bulk windows and allowances applied to :attr:`link`."""
        return self.site_link.gate

    def may_ship(self, priority: str = "normal") -> bool:
        """Whether data of ``priority`` (critical, normal, bulk) may go on the link now.

        The shipper asks it per lane (its :attr:`~edge_gateway.shipper.Shipper.may_ship`);
        the tailers' reads of log objects wait through
        :class:`~edge_gateway.bucket.HeldBucket` (as ``normal``).
        """
        return self.site_link.may_ship(priority)

    def held_priorities(self) -> list[str]:
        """Priorities with entries waiting to ship that the link policy holds now."""
        shipped = self.shipper.shipped_lsns()
        return self.site_link.held(
            lane.priority
            for lane, j in self.lanes.journals.items()
            if j.next_lsn - 1 > shipped[lane]
        )

    def ship_opens_in_s(self, priority: str = "normal") -> float:
        """Seconds until data of ``priority`` may go on the link (0: now)."""
        return self.site_link.opens_in_s(priority)

    @property
    def mirror_bucket(self) -> Bucket:
        """The bucket as the tailers use it: reads of log objects wait for the link policy."""
        if self._mirror_bucket is None:
            self._mirror_bucket = self.site_link.hold(self.bucket)
        return self._mirror_bucket

    @property
    def key_prefix(self) -> str:
        """The prefix the log protocol adds to keys (S3 buckets apply theirs themselves)."""
        return self.wiring.key_prefix

    # ------------------------------------------------------------ lifecycle

    @property
    def shutdown_requested(self) -> bool:
        return self._shutdown.is_set()

    def request_shutdown(self) -> None:
        """Begin a graceful shutdown (what SIGTERM does in ``edgegw serve``)."""
        self._accepting = False
        self._shutdown.set()
        if not self._ready:
            self._starting.cancel()

    async def _rewrite_at_rest(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Every lane's journal rewrites its sealed segments compressed (``journal.at_rest``).

        One rewrite at a time for all of them (a shared limiter; each in a child
        process): at most a quarter of one core whatever the number of lanes.
        """
        limiter = trio.CapacityLimiter(1)
        async with trio.open_nursery() as nursery:
            for j in self.lanes.journals.values():
                j.rewriter.limiter = limiter
                await nursery.start(j.rewriter.run)
            task_status.started()

    async def _repair_live(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Each served lane's journal repairs damaged sealed segments from the bucket
        as the scrub or a read finds them (``journal/_live_repair.py``)."""
        bucket = self._bucket
        async with trio.open_nursery() as nursery:
            for lane, j in self.lanes.journals.items():
                if bucket is None:
                    continue
                j.live_repair.attach(functools.partial(self._live_repair_source, lane, bucket))
                await nursery.start(j.live_repair.run)
            if self.scrub is not None:
                self.scrub.on_damage = self._scrub_found
            task_status.started()

    def _live_repair_source(self, lane: Lane, bucket: Bucket) -> RepairSource:
        return self.wiring.repair_source(lane, bucket)

    def _scrub_found(self, path: Path) -> bool:
        """The scrub found ``path`` damaged: True if its journal repairs it."""
        for j in self.lanes.journals.values():
            if j.path == path.parent:
                return j.live_repair.report(path)
        return False

    async def run(
        self, *, task_status: trio.TaskStatus[Gateway] = trio.TASK_STATUS_IGNORED
    ) -> None:
        cfg = self.config
        # One process per data directory, before anything in it is touched
        # (see edge_gateway.datadir); released when run() ends, or by the
        # kernel when the process dies.
        self._dir_lock = lock_directory(cfg.data_dir, "gateway")
        try:
            # A shutdown requested while starting (SIGTERM while the first
            # start waits for the bucket) ends the start at once: there is
            # nothing accepted to drain yet, and what the journal holds ships
            # at the next start.
            with self._starting:
                if self._shutdown.is_set():
                    self._starting.cancel()
                await self._run(task_status)
            if self._starting.cancelled_caught:
                log.info("gateway %s: stopped while starting", self.region)
        finally:
            self._dir_lock.release()

    async def _run(self, task_status: trio.TaskStatus[Gateway]) -> None:
        cfg = self.config
        auto_topics_intact = self.topic_table.load_auto_created(self.state_files)
        self._tailer_lock = trio.Lock()
        sup = self._supervisor
        async with AsyncExitStack() as stack:
            agent = None
            if cfg.metadata.enabled:
                from edge_gateway.metadata.agent import AgentHooks, MetadataAgent

                def shipper_statistics() -> ShipperStats:
                    return self.shipper.statistics()  # the shipper is made below

                def tailers() -> dict[str, Tailer]:
                    return self.tailers

                hooks = AgentHooks(
                    region=self.region,
                    data_dir=cfg.data_dir,
                    apply_routing=self.apply_routing,
                    shipper_statistics=shipper_statistics,
                    tailers=tailers,
                    state_files=self.state_files,
                )
                agent = MetadataAgent(hooks, cfg.metadata)
                self._metadata = agent
                stack.push_async_callback(agent.aclose)
                table = await agent.load()
                if table is not None:
                    from edge_gateway.metadata.routing import topology

                    self.topic_table.set_topology(topology(table))
            wiring = self.wiring
            self._bucket = await wiring.open_bucket()
            self._mirror_bucket = None
            stack.push_async_callback(self._bucket.aclose)
            lanes = await stack.enter_async_context(wiring.open_lanes(repair_from=self._bucket))
            journal = lanes.main
            self._journal = journal
            self._lanes = lanes
            if not auto_topics_intact:
                self.topic_table.rebuild_auto_created(
                    pair for j in lanes.journals.values() for pair in j.partitions()
                )
            self._registry.restore((lane.id, j) for lane, j in lanes.journals.items())
            self._groups = GroupStore(cfg.data_dir / "groups.sqlite")
            stack.callback(self._groups.close)
            self._shipper = wiring.shipper(
                lanes,
                self._bucket,
                on_commit=agent.report_head if agent is not None else None,
                bucket_clock=self._bucket_clock,
            )
            if self.site_link.restricts:
                # The link policy holds lanes back (bulk windows, allowances).
                self._shipper.may_ship = self.may_ship
            try:
                async with trio.open_nursery() as core:
                    await core.start(journal.run)
                    async with trio.open_nursery() as workers:
                        self._workers = workers
                        # Services (the local API) first: a gateway that cannot
                        # bind its port exits before it claims the region's
                        # epoch, so it fences nobody. Requests get 503 until
                        # the gateway accepts.
                        await self._start_services(workers, self._services)
                        shipper = self._shipper
                        await workers.start(
                            functools.partial(
                                sup.supervise, "shipper", shipper.run, before_restart=shipper.reset
                            )
                        )
                        await self._sync_tailers()
                        if self.site_link.restricts:
                            workers.start_soon(
                                self.site_link.watch, self.held_priorities, shipper.policy_changed
                            )
                        if agent is not None:
                            await workers.start(
                                functools.partial(sup.supervise, "metadata", agent.run)
                            )
                        self._workers_started = True
                        if cfg.gc.enabled:
                            await workers.start(functools.partial(sup.supervise, "gc", self.gc.run))
                        await workers.start(
                            functools.partial(sup.supervise, "repair", self._repair_live)
                        )
                        if self.scrub is not None:
                            await workers.start(
                                functools.partial(sup.supervise, "scrub", self.scrub.run)
                            )
                        if cfg.journal.compress_at_rest:
                            await workers.start(
                                functools.partial(sup.supervise, "rewriter", self._rewrite_at_rest)
                            )
                        self._accepting = True
                        await self._start_services(workers, self._accepting_services)
                        for hook in self._ready_hooks:
                            await hook()
                        self._ready = True
                        self._started_ms = _now_ms()
                        self._started_mono = time.monotonic()
                        log.info(
                            "gateway %s ready: %d topics, bucket %s",
                            self.region,
                            len(self.topic_table),
                            cfg.bucket.describe(cfg.data_dir),
                        )
                        task_status.started(self)
                        await self._shutdown.wait()
                        self._accepting = False
                        workers.cancel_scope.cancel()
                    self._workers = None
                    await self._drain()
                    core.cancel_scope.cancel()
            finally:
                self._accepting = False
                self._workers = None
                self._journal = None
                self._lanes = None
                self._shipper = None

    async def _start_services(
        self, workers: trio.Nursery, services: list[tuple[str, Callable[..., Awaitable[Any]]]]
    ) -> None:
        sup = self._supervisor
        for name, fn in services:
            await workers.start(functools.partial(sup.supervise, name, functools.partial(fn, self)))

    def _task_failed(self, name: str) -> None:
        self._task_failures[name] = self._task_failures.get(name, 0) + 1

    def task_health(self) -> list[TaskHealth]:
        """The supervised tasks (shipper, mirrors, GC, metadata, API) and their health."""
        return self._supervisor.health()

    async def _run_tailer(
        self, task: _TailerTask, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async def follow(*, task_status: trio.TaskStatus[None]) -> None:
            try:
                await task.tailer.run(task_status=task_status)
            except SourceGap:
                # Only this source stops (gap policy "fail"): its status says
                # "stopped" with the error, and everything else goes on.
                return

        def fresh_tailer() -> None:
            # A failed run may have stopped half way through an entry; a new
            # tailer resumes from the progress recorded in the journal.
            old = task.tailer
            task.tailer = Tailer(
                self.journal,
                self.mirror_bucket,
                task.source,
                task.topics,
                self.region,
                old.config,
                prefix=self.key_prefix,
                keyring=self.keys.ring,
            )
            if self._metadata is not None:
                self._metadata.tailers_changed()

        try:
            # Its own scope: a routing change stops this tailer alone. Its
            # progress is in the journal, so a new tailer of the source
            # resumes exactly where this one stopped.
            with task.scope:
                await self._supervisor.supervise(
                    mirror_task(task.source),
                    follow,
                    before_restart=fresh_tailer,
                    task_status=task_status,
                )
        finally:
            task.done.set()

    async def _wait_claimed(self) -> None:
        # The shipper of this run (a new one each run): not bound at __init__.
        await self.shipper.wait_claimed()

    def _gc_subscribers(self) -> list[str] | None:
        """The regions GC waits for, from the topology in force now (routing changes move it)."""
        if not self.config.gc.retain_until_mirrored:
            return []
        return topology_subscribers(self.topology, self.region)

    def _log_head(self) -> int | None:
        """The last seq this gateway committed to its log (None before its claim)."""
        s = self.shipper.statistics()
        return s.next_seq - 1 if s.claimed else None

    async def _drain(self) -> None:
        """Flush and ship what is pending, shielded, within the grace period."""
        grace = self.config.shutdown_grace_s
        with trio.move_on_after(grace, shield=True) as scope:
            try:
                await self.lanes.flush()
            except Unavailable as exc:
                # A journal that stopped intake (a failed fsync) cannot flush:
                # what is durable ships, the rest was never acknowledged.
                log.warning("shutdown: journal flush failed (%s)", exc)
            shipper = self.shipper
            denied = shipper.denied
            held = self.held_priorities()
            if denied is not None and shipper.pending():
                # Refused until a person acts: waiting out the grace period
                # would only delay the stop. It is all in the journal.
                log.warning(
                    "shutdown: not shipping, the bucket refuses this gateway (%s); "
                    "pending data ships once access works again",
                    denied.code,
                )
            elif held and not shipper.pending():
                log.warning(
                    "shutdown: not shipping, %s; pending data ships then, after the next start",
                    self.site_link.describe_hold(held),
                )
            elif shipper.statistics().claimed and shipper.pending():
                log.info("shutdown: shipping pending data (up to %.0fs)", grace)
                try:
                    await shipper.ship_pending()
                except Unavailable as exc:
                    log.warning("shutdown: %s; what is pending ships at the next start", exc)
        if scope.cancelled_caught:
            log.warning(
                "shutdown: grace period of %.0fs ended with data unshipped; it ships at next start",
                grace,
            )

    # ------------------------------------------------------------ produce

    def _check_accepting(self) -> None:
        if not self._accepting:
            hold = self._shipper.intake_hold if self._shipper is not None else None
            if hold is not None:
                raise Unavailable(
                    f"the gateway does not accept writes yet: {hold}; it waits for the "
                    "bucket to tell whether the journal lost entries the bucket holds (then it "
                    "stops: run `edgegw restore`)"
                )
            # The reason /healthz gives (a first start waiting for the bucket
            # says so), not just "not started".
            raise Unavailable(self.not_ready_reason())

    def _partition_of(self, t: Topic, rec: ProduceRecord, sticky: int) -> int:
        if rec.partition is not None:
            return t.check_partition(rec.partition)
        if rec.key is not None:
            return int(crc32c(rec.key)) % t.partitions
        return sticky

    async def produce(
        self, topic: str, records: Sequence[ProduceRecord], *, ack: Ack = "local"
    ) -> ProduceResult:
        """Journal records; returns after local durability (``ack='shipped'``: after the bucket)."""
        self._check_accepting()
        t = self.topic_table.writable(topic)
        if not records:
            raise InvalidInput("nothing to produce: no records")
        sticky = next(self._round_robin) % t.partitions
        now = _now_ms()
        by_partition: dict[int, list[int]] = {}
        parts = []
        for i, rec in enumerate(records):
            p = self._partition_of(t, rec, sticky)
            parts.append(p)
            by_partition.setdefault(p, []).append(i)
        offsets = [0] * len(records)
        lanes = self.lanes
        lane_lsns: dict[Lane, int] = {}
        batches = []
        for idx in by_partition.values():
            rs = [records[i] for i in idx]
            batches.append(_encode_records(rs, now))
        # Every partition's entry first, with no checkpoint in between, then
        # one wait per lane: with fsync=always the records of all partitions
        # share one fsync (group commit) instead of one fsync per partition.
        await trio.lowlevel.checkpoint_if_cancelled()
        for (p, idx), batch in zip(by_partition.items(), batches, strict=True):
            res = lanes.append_nowait(t.name, p, batch)
            lane_lsns[res.lane] = max(lane_lsns.get(res.lane, 0), res.lsn)
            for k, i in enumerate(idx):
                offsets[i] = res.base_offset + k
        for lane, lsn in lane_lsns.items():
            await lanes.journals[lane].after_append(lsn)
        return await self._acknowledge(t.name, parts, offsets, lane_lsns, ack)

    def group_by_partition(
        self, topic: str, records: Sequence[ProduceRecord]
    ) -> list[tuple[int, list[ProduceRecord]]]:
        """``records`` grouped by the partition :meth:`produce` would write each to.

        For :meth:`append_groups`: a caller that must retry exactly what the
        journal refused (the MQTT ingest) writes one group per partition.
        """
        self._check_accepting()
        t = self.topic_table.writable(topic)
        sticky = next(self._round_robin) % t.partitions
        groups: dict[int, list[ProduceRecord]] = {}
        for rec in records:
            groups.setdefault(self._partition_of(t, rec, sticky), []).append(rec)
        return list(groups.items())

    async def append_groups(
        self, topic: str, groups: Sequence[tuple[int, Sequence[ProduceRecord]]]
    ) -> int:
        """Journal each (partition, records) group as one entry, in order; wait once per lane.

        Stops at the first group the journal refuses (full, disk full):
        returns how many groups were written and are durable, so the caller
        retries only the rest (no group is written twice). Raises the
        refusal when not even the first group was written.
        """
        self._check_accepting()
        t = self.topic_table.writable(topic)
        lanes = self.lanes
        now = _now_ms()
        lane_lsns: dict[Lane, int] = {}
        written = 0
        refusal: Unavailable | None = None
        await trio.lowlevel.checkpoint_if_cancelled()
        for p, rs in groups:
            t.check_partition(p)
            batch = _encode_records(rs, now)
            try:
                res = lanes.append_nowait(t.name, p, batch)
            except Unavailable as exc:
                if not written:
                    raise
                refusal = exc
                break
            lane_lsns[res.lane] = max(lane_lsns.get(res.lane, 0), res.lsn)
            written += 1
        for lane, lsn in lane_lsns.items():
            await lanes.journals[lane].after_append(lsn)
        if refusal is not None:
            log.debug("append_groups: %d of %d written: %s", written, len(groups), refusal)
        return written

    async def produce_batch(
        self,
        topic: str,
        partition: int,
        batch: bytes,
        *,
        ack: Ack = "local",
        producer: ProducerSeq | None = None,
    ) -> ProduceResult:
        """Journal an encoded batch (the binary produce format) as is.

        ``producer``: an idempotent append (see :meth:`produce_partition`).
        """
        self._check_accepting()
        t = self.topic_table.writable(topic)
        t.check_partition(partition)
        if producer is not None:
            return await self._append_idempotent(t.name, partition, batch, producer, ack)
        res = await self.lanes.append(t.name, partition, batch)
        return await self._acknowledge(
            t.name,
            [partition] * res.count,
            list(range(res.base_offset, res.base_offset + res.count)),
            {res.lane: res.lsn},
            ack,
        )

    async def _acknowledge(
        self,
        topic: str,
        partitions: list[int],
        offsets: list[int],
        lane_lsns: dict[Lane, int],
        ack: Ack,
        *,
        duplicate: bool = False,
    ) -> ProduceResult:
        """The answer to a produce whose entries are durable at ``lane_lsns``.

        With ``ack='shipped'`` it returns once they are in the bucket too.
        """
        result = ProduceResult(
            topic,
            partitions,
            offsets,
            lane_lsns.get(MAIN_LANE, 0),
            ack == "shipped",
            lane_lsns if self.lanes.multi else {},
            duplicate=duplicate,
        )
        if ack == "shipped":
            await self.wait_shipped(result)
        return result

    # ------------------------------------------------------------ idempotence

    @property
    def producers(self) -> ProducerTable:
        """The idempotent producers' state (docs/api.md, "Idempotent produce")."""
        return self._registry.table

    async def init_producer(
        self, producer_id: int | None = None, epoch: int | None = None
    ) -> tuple[int, int]:
        """A producer id and epoch for idempotent produce.

        No ``producer_id``: a new id at epoch 0 (ids are never reused, also
        across restarts). With one: the same id at the next epoch, which
        fences the older epoch (:class:`ProducerFenced` on its next produce);
        ``epoch`` is the caller's current one (older: ``ProducerFenced``;
        None: whatever it is). An id the gateway does not remember raises
        :class:`UnknownProducer`.
        """
        self._check_accepting()
        return await self._registry.init_producer(producer_id, epoch)

    async def produce_partition(
        self,
        topic: str,
        partition: int,
        records: Sequence[ProduceRecord],
        *,
        ack: Ack = "local",
        producer: ProducerSeq | None = None,
    ) -> ProduceResult:
        """Journal ``records`` to one partition as one entry (the records' own
        ``partition`` is ignored).

        With ``producer`` the append is idempotent: ``producer.sequence`` is
        the sequence number of the first record for this (topic, partition).
        A repeat of an append already written (same id, epoch, sequence and
        count) appends nothing and returns the original offsets with
        ``duplicate=True`` (after waiting, like the original, for the
        durability ``ack`` asks). Raises :class:`UnknownProducer`,
        :class:`ProducerFenced` or :class:`OutOfOrderSequence` (see
        :mod:`edge_gateway.idempotence`).
        """
        self._check_accepting()
        t = self.topic_table.writable(topic)
        if not records:
            raise InvalidInput("nothing to produce: no records")
        t.check_partition(partition)
        now = _now_ms()
        batch = _encode_records(records, now)
        if producer is not None:
            return await self._append_idempotent(t.name, partition, batch, producer, ack)
        return await self.produce_batch(t.name, partition, batch, ack=ack)

    async def _append_idempotent(
        self, topic: str, partition: int, batch: bytes, producer: ProducerSeq, ack: Ack
    ) -> ProduceResult:
        lanes = self.lanes
        # The count, for the check; the journal checks the rest of the batch
        # before it writes anything (and nothing is remembered unless it did).
        count = peek_count(batch)
        if count is None:
            try:
                read_batch_header(batch, 0, where=f"produce to {topic}/{partition}")
            except CorruptData as exc:
                raise InvalidInput(f"bad batch: {exc}") from None
            raise InvalidInput(f"produce to {topic}/{partition}: bad batch length or count")
        await trio.lowlevel.checkpoint_if_cancelled()
        # No checkpoint between the check, the append and the record: a
        # retry that arrives while this append waits for its fsync finds it.
        now = _now_ms()
        table = self._registry.table
        dup = table.check(topic, partition, producer, count, now)
        if dup is not None:
            found = lane_by_id(dup.lane)
            lane = found if found is not None and found in lanes else MAIN_LANE
            lsn = dup.lsn
            journal = lanes.journals[lane]
            if lsn >= journal.next_lsn:
                # Remembered from before a restart at an LSN the journal does
                # not hold (cannot happen: the checkpoint is the journal's).
                lsn = journal.next_lsn - 1
            # As durable as the original's answer promised (fsync=always: fsynced).
            await journal.after_append(lsn)
            base, n = dup.base_offset, dup.count
        else:
            res = lanes.append_nowait(topic, partition, batch, producer=producer)
            table.record(
                topic,
                partition,
                producer,
                count,
                res.base_offset,
                lsn=res.lsn,
                lane=res.lane.id,
                now=now,
            )
            await lanes.journals[res.lane].after_append(res.lsn)
            lane, lsn, base, n = res.lane, res.lsn, res.base_offset, res.count
        return await self._acknowledge(
            topic,
            [partition] * n,
            list(range(base, base + n)),
            {lane: lsn},
            ack,
            duplicate=dup is not None,
        )

    # ------------------------------------------------------------ sync

    async def sync_now(self, *, pull: bool = True) -> dict[str, Any]:
        """Ship everything journaled so far and pull every mirrored source up to its head.

        What ``edgegw sync`` does while this gateway runs (it owns the journal,
        so the command asks it through the API instead of opening the files).
        Returns what was shipped and pulled; raises :class:`Unavailable` when
        a source's poll fails (the bucket is away), as the one-shot sync does,
        and when an attempt to ship made after the call fails (the bucket is
        away; :class:`Denied` when it refuses this gateway): it never waits
        through an outage. On a working link it waits as long as shipping
        takes; the caller bounds the wait.
        """
        self._check_accepting()
        shipper, lanes = self.shipper, self.lanes
        if shipper.denied is not None:
            # It would wait until a person fixes access: say so at once.
            raise shipper.cannot_ship()
        held = self.held_priorities()
        if held:
            # It would wait until a window opens or the allowance renews: say so at once.
            raise Unavailable(f"cannot ship now: {self.site_link.describe_hold(held)}")
        targets = {lane: j.next_lsn - 1 for lane, j in lanes.journals.items()}
        before = shipper.statistics()
        failures = shipper.failed_attempts
        await lanes.flush()
        # A shipper waiting out an outage tries again now (the link may just
        # be back); if that attempt fails too, the bucket is away: answer at
        # once, as the one-shot sync does, rather than wait through the
        # outage (the shipper keeps retrying on its own).
        shipper.ship_now()
        for lane, target in targets.items():
            if not await shipper.wait_shipped_or_failed(target, failures, lane):
                raise shipper.cannot_ship()
        after = shipper.statistics()
        pulled: dict[str, dict[str, int]] = {}
        if pull:

            async def one(src: str, tailer: Tailer) -> None:
                res = await tailer.wait_pulled()
                pulled[src] = {
                    "entries": res.entries,
                    "records": res.records,
                    "next_seq": res.next_seq,
                }

            async with trio.open_nursery() as nursery:
                for src, tailer in sorted(self.tailers.items()):
                    nursery.start_soon(one, src, tailer)
        return {
            "region": self.region,
            "shipped": {
                "through_lsn": target,
                "objects": after.objects - before.objects,
                "records": after.records - before.records,
                "wire_bytes": after.wire_bytes - before.wire_bytes,
            },
            "pulled": dict(sorted(pulled.items())),
        }

    # ------------------------------------------------------------ fetch

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 500,
        max_bytes: int = 1 << 20,
        wait_ms: int = 0,
    ) -> FetchResult:
        """Records from ``offset``; with ``wait_ms``, wait that long for the first one."""
        t = self.topic_table.readable(topic)
        t.check_partition(partition)
        if offset < 0 or max_records < 1 or max_bytes < 1:
            raise InvalidInput("offset must be >= 0, max_records and max_bytes >= 1")
        journal = self.lanes
        if wait_ms > 0 and journal.next_offset(t.name, partition) <= offset:
            with trio.move_on_after(wait_ms / 1000):
                await journal.wait_for(t.name, partition, offset)
        entries = journal.read(
            t.name, partition, offset, max_records=max_records, max_bytes=max_bytes
        )
        records: list[Record] = []
        batches: list[bytes] = []
        expected = offset
        for e in entries:
            if batches and e.base_offset > expected:
                # A hole (a mirrored source gap): stop before it, so the next
                # fetch, at the hole, says where the records resume (gap_end).
                break
            expected = e.next_offset
            batches.append(bytes(e.payload))  # bytes already (read() copies): no copy
            for b in iter_batches(e.payload, where=f"{t.name}/{partition}@{e.lsn}", verify=False):
                records.extend(b.records(offset))
        records = records[:max_records]
        next_offset = records[-1].offset + 1 if records else offset
        return FetchResult(
            t.name,
            partition,
            records,
            next_offset,
            journal.next_offset(t.name, partition),
            batches,
            records[0].offset if records and records[0].offset > offset else None,
        )

    # ------------------------------------------------------------ groups

    async def commit_offsets(self, group: str, offsets: Sequence[tuple[str, int, int, str]]) -> int:
        """Store (topic, partition, next offset, metadata) rows for ``group`` durably."""
        for topic, partition, _offset, _ in offsets:
            t = self.topic_table.readable(topic)
            if not 0 <= partition < t.partitions:
                raise InvalidInput(f"topic {topic!r} has no partition {partition}")
        return await self.groups.commit(group, offsets, _now_ms())

    async def fetch_offsets(self, group: str, topic: str | None = None) -> list[CommittedOffset]:
        if topic is not None:
            self.topic_table.readable(topic)
        return await self.groups.fetch(group, topic)

    # ------------------------------------------------------------ status

    def topics(self) -> list[TopicInfo]:
        return [self.describe_topic(name) for name in self.topic_table]

    def describe_topic(self, topic: str) -> TopicInfo:
        t = self.topic_table.readable(topic)
        journal = self.lanes
        shipped = self.shipper.shipped_offsets() if t.kind == "local" else {}
        firsts, nexts, ships = [], [], []
        for p in range(t.partitions):
            nxt = journal.next_offset(t.name, p)
            nexts.append(nxt)
            firsts.append(journal.first_offset(t.name, p) if nxt else 0)
            ships.append(min(shipped.get((t.name, p), 0), nxt))
        return TopicInfo(
            t.name,
            t.kind,
            t.home,
            t.partitions,
            t.source_topic,
            firsts,
            nexts,
            ships,
            t.subscribers,
        )


def _encode_records(records: Sequence[ProduceRecord], now: int) -> bytes:
    """One batch of ``records``; a record without a timestamp gets ``now``."""
    return encode_batch(
        [r.value for r in records],
        keys=[r.key for r in records] if any(r.key is not None for r in records) else None,
        timestamps=[now if r.timestamp is None else r.timestamp for r in records],
        headers=[r.headers for r in records] if any(r.headers for r in records) else None,
    )


def mirror_task(source: str) -> str:
    """The supervised task name of the tailer of ``source``."""
    return f"mirror {source}"
