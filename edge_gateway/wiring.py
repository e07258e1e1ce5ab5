"""How a gateway's parts are built from its configuration: the bucket, the lanes'
journals, the shipper, the tailers.

:class:`GatewayWiring` holds no running state. :class:`~edge_gateway.gateway.Gateway`
builds its parts with it when it starts (and then runs and supervises them),
and the commands that work on a data directory without serving it (``edgegw
sync``, ``reship``, ``restore``, ``bucket verify``) build the same parts with
the same rules: which bucket (and whether a missing one may be made), which
lanes, what key prefix, which tailers.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager

from edge_gateway.bucket import (
    Bucket,
    BucketUnavailable,
    LinkMeter,
    LocalBucket,
    MeteredBucket,
    NoSuchBucket,
)
from edge_gateway.bucket_repair import BucketRepairSource
from edge_gateway.clock import BucketClock
from edge_gateway.config import GatewayConfig, TopicConfig, topology_sources
from edge_gateway.encryption import Keys
from edge_gateway.errors import Denied
from edge_gateway.journal import Journal, Lane, Lanes, open_lanes
from edge_gateway.mirror import PriorityGate, Tailer, TailerConfig
from edge_gateway.mirror_repair import MirrorRepairSource
from edge_gateway.shipper import Shipper, ShipperConfig
from edge_gateway.topics import TopicTable

__all__ = ["GatewayWiring"]

log = logging.getLogger("edgegw.gateway")


class GatewayWiring:
    """Builds a gateway's parts from its configuration (see the module docstring)."""

    def __init__(
        self, config: GatewayConfig, topic_table: TopicTable, keys: Keys, link: LinkMeter
    ) -> None:
        self.config = config
        self.region = config.region
        self._topic_table = topic_table
        self.keys = keys
        #: the site's link to the bucket (``[link]``): every bucket opened goes through it
        self.link = link

    @property
    def topology(self) -> tuple[TopicConfig, ...]:
        """The fleet's topics as the gateway applies them now."""
        return self._topic_table.topology

    def lane_of(self, topic: str) -> Lane:
        """The journal lane of a topic homed here."""
        return self._topic_table.lane_of(topic)

    @property
    def key_prefix(self) -> str:
        """The prefix the log protocol adds to keys (S3 buckets apply theirs themselves)."""
        cfg = self.config.bucket
        return cfg.prefix if cfg.type == "local" else ""

    # ------------------------------------------------------------ the bucket

    async def open_bucket(self, *, create: bool | None = None) -> Bucket:
        """The configured bucket behind this gateway's :attr:`link` (see :meth:`open_store`)."""
        return MeteredBucket(await self.open_store(create=create), self.link)

    async def open_store(self, *, create: bool | None = None) -> Bucket:
        """Open the configured bucket; :class:`NoSuchBucket` if it is not there.

        ``create`` says whether a missing local bucket may be made. ``None``
        is ``edgegw serve``'s rule: the embedded default (``bucket.path``
        unset: ``<data_dir>/bucket``) is made on first start, an explicit
        ``bucket.path`` must be a bucket directory or an empty directory made
        for one -- a path that does not exist is refused, so a typo never
        becomes a new, empty bucket. S3 buckets are never created; a missing
        one is refused by name.
        """
        cfg = self.config.bucket
        if cfg.type != "local":
            # boto3 (or the Azure or GCS SDK) loads here, and only for such a
            # bucket (docs/operations.md, "Footprint").
            from edge_gateway.bucket import open_cloud_bucket

            bucket: Bucket = await open_cloud_bucket(cfg.cloud_config())
            try:
                await bucket.check_exists()
            except (BucketUnavailable, Denied) as exc:
                # A gateway starts offline or refused (docs/protocol.md,
                # "Offline start"); the shipper reports what it meets.
                log.warning("bucket %s unreachable at start: %s", bucket.name, exc)
            except NoSuchBucket as exc:
                if not self._met_bucket():
                    await bucket.aclose()
                    raise
                # It was there: deleted (or its name now resolves elsewhere).
                # A person must act; meanwhile the site takes data (issue 26).
                log.error("%s; running from the journal until it is back", exc)
            except BaseException:
                await bucket.aclose()
                raise
            return bucket
        path = cfg.local_path(self.config.data_dir)
        if create is not None:
            return await LocalBucket.open(path, create=create)
        if cfg.path and not path.exists():
            raise NoSuchBucket(
                f"bucket.path: local bucket directory {str(path)!r} does not exist; fix the "
                "path, or create the directory (mkdir -p) to start a new bucket there"
            )
        # The default location is made on first start; an existing directory
        # gets the layout only if it is empty (else it must be a bucket).
        return await LocalBucket.open(path, create=True)

    def _met_bucket(self) -> bool:
        """Whether this data directory's shipper has claimed its region before.

        A bucket missing at a first start is most likely a typo (refused);
        one missing after the gateway wrote to it is a refusal to report.
        """
        return (self.config.journal_path / "shipper.json").exists()

    # ------------------------------------------------------------ the journal

    def open_lanes(self, repair_from: Bucket | None = None) -> AbstractAsyncContextManager[Lanes]:
        """Open the journals of this gateway's lanes: those of its topics' priorities and
        every lane on disk (the gateway, and ``edgegw sync``/``reship`` without it).

        ``repair_from``: the bucket the open rebuilds damaged, shipped ranges
        from (``bucket_repair.py``); without it such damage is quarantined.
        """
        cfg = self.config

        def repair_source(lane: Lane) -> BucketRepairSource | None:
            if repair_from is None:
                return None
            return self.repair_source(lane, repair_from)

        return open_lanes(
            cfg.journal_path,
            cfg.journal,
            {Lane(t.priority, t.on_full) for t in self.topology if t.home == self.region},
            self.lane_of,
            repair=repair_source,
        )

    def repair_source(self, lane: Lane, bucket: Bucket) -> BucketRepairSource:
        """Where ``lane``'s damaged, shipped ranges are read back from (its LSNs in the
        log objects' lane tables, ``bucket_repair.py``); the main lane's source also
        reads the source regions' log objects for its mirror entries (the tailers
        append to it, ``mirror_repair.py``)."""
        if lane.is_main:
            return MirrorRepairSource(
                bucket,
                self.key_prefix,
                self.region,
                keyring=self.keys.ring,
                keep_blocks=self.config.mirror.keep_blocks,
            )
        return BucketRepairSource.for_lane(
            lane, bucket, self.key_prefix, self.region, keyring=self.keys.ring
        )

    # ------------------------------------------------------------ shipper, tailers

    def shipper_config(self) -> ShipperConfig:
        """``[shipper]``; with a link cap, objects of about one second of it.

        A capped link moves each object in one slot (see ``LinkMeter``), at
        the line's speed: objects of many seconds of the cap would use the
        link in bursts. So objects are at most ``max(1 MiB, cap)`` bytes
        (never more than configured): evenly used, not too many requests.
        """
        cfg, cap = self.config.shipper, self.config.link.max_bytes_per_s
        if not cap:
            return cfg
        size = max(1 << 20, cap)
        first = min(cfg.max_object_bytes, size)
        backlog = max(first, min(cfg.backlog_object_bytes, size))
        return dataclasses.replace(cfg, max_object_bytes=first, backlog_object_bytes=backlog)

    def shipper(
        self,
        lanes: Lanes,
        bucket: Bucket,
        *,
        on_commit: Callable[[int], None] | None,
        bucket_clock: BucketClock,
    ) -> Shipper:
        """This region's shipper of ``lanes``' journals into ``bucket``."""
        return Shipper(
            lanes.main,
            bucket,
            self.region,
            config=self.shipper_config(),
            prefix=self.key_prefix,
            on_commit=on_commit,
            bucket_clock=bucket_clock,
            lanes=lanes if lanes.multi else None,
            key=self.keys.write,
        )

    def tailer_config(self) -> TailerConfig:
        """``[mirror]`` as the tailers take it."""
        m = self.config.mirror
        return TailerConfig(
            poll_interval_s=m.poll_interval_ms / 1000,
            max_poll_interval_s=m.max_poll_interval_ms / 1000,
            gap_policy=m.gap_policy,  # type: ignore[arg-type]
            prefetch_objects=m.prefetch,
            packs=m.packs,
            keep_blocks=m.keep_blocks,
            cursor_interval_s=m.cursor_interval_ms / 1000,
            retry_cap_s=m.retry_cap_ms / 1000,
            relay_safety_poll_s=self.config.metadata.relay_safety_poll_ms / 1000,
        )

    def tailers(self, journal: Journal, bucket: Bucket) -> dict[str, Tailer]:
        """A tailer of every source region this gateway mirrors, sharing one priority gate."""
        gate = PriorityGate()
        return {
            source: self.tailer(journal, bucket, source, topics, gate)
            for source, topics in sorted(topology_sources(self.topology, self.region).items())
        }

    def tailer(
        self,
        journal: Journal,
        bucket: Bucket,
        source: str,
        topics: Iterable[str],
        gate: PriorityGate,
    ) -> Tailer:
        """A tailer of ``source``, taking its turn by priority with the others (``gate``)."""
        return Tailer(
            journal,
            bucket,
            source,
            topics,
            self.region,
            self.tailer_config(),
            prefix=self.key_prefix,
            priorities={t.name: t.priority for t in self.topology if t.home == source},
            gate=gate,
            keyring=self.keys.ring,
        )
