"""The gateway's topic table: which topics it writes, which it mirrors, and their lanes.

A gateway knows three kinds of topic names:

* topics **homed here** (``[[topics]]`` or the routing table with ``home`` this
  region): writable, each in the journal lane of its priority and ``on_full``;
* **mirrors** ``<home>.<topic>`` of topics homed elsewhere that this region
  subscribes to: read-only;
* topics **auto-created here** (``auto_create = true``): homed here, kept in
  ``<data_dir>/topics.json`` so that the next start knows them before any
  record is read back.

:class:`TopicTable` holds the three, rebuilds them when the topology changes
(a routing table from the metadata server) and answers the questions every
front door asks: may this name be written (:meth:`TopicTable.writable`, which
auto-creates), read (:meth:`TopicTable.readable`), in which lane. It does no
I/O but the one small ``topics.json`` write of an auto-creation; the gateway
owns the journal, the tailers and what a change starts or stops.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edge_gateway.config import TopicConfig
from edge_gateway.durable import replace_file
from edge_gateway.errors import (
    CorruptData,
    DiskFull,
    InvalidInput,
    ReadOnlyTopic,
    Unavailable,
    UnknownTopic,
    WrongRegion,
)
from edge_gateway.journal import MAIN_LANE, Lane, Priority
from edge_gateway.names import split_mirror_topic, validate_home_topic, validate_topic
from edge_gateway.statefile import StateFiles, seal, unseal

__all__ = ["AUTO_TOPICS_FILE", "Topic", "TopicTable"]

log = logging.getLogger("edge_gateway.gateway")

#: Topics auto-created here, under the data directory.
AUTO_TOPICS_FILE = "topics.json"
#: ``topics.json``'s version (the form without ``v`` and a checksum reads as 1).
AUTO_TOPICS_VERSION = 1


@dataclass(slots=True)
class Topic:
    """A topic as this gateway serves it."""

    name: str
    kind: Literal["local", "mirror"]
    home: str
    partitions: int
    #: For mirrors: the topic's name in its home region (else ``name``).
    source_topic: str
    subscribers: tuple[str, ...]

    def check_partition(self, partition: int) -> int:
        """``partition`` if the topic has it; else :class:`InvalidInput` naming the range."""
        if not 0 <= partition < self.partitions:
            raise InvalidInput(
                f"topic {self.name!r} has partitions 0..{self.partitions - 1}, not {partition}"
            )
        return partition


class TopicTable:
    """The topics of one region's gateway (see the module docstring)."""

    def __init__(
        self,
        region: str,
        data_dir: Path,
        topology: Sequence[TopicConfig],
        *,
        auto_create: bool,
        default_partitions: int,
        metadata_enabled: bool,
    ) -> None:
        self.region = region
        self.path = data_dir / AUTO_TOPICS_FILE
        self._auto_create = auto_create
        self._default_partitions = default_partitions
        self._metadata_enabled = metadata_enabled
        self._topics: dict[str, Topic] = {}
        #: The fleet's topics as this gateway knows them (config, or routing table).
        self._topology: tuple[TopicConfig, ...] = ()
        #: Topic name -> home region, for every topic of the topology.
        self._homes: dict[str, str] = {}
        #: Topics auto-created here (name -> partitions), kept in topics.json.
        self._auto: dict[str, int] = {}
        self._lane_of: dict[str, Lane] = {}
        self.set_topology(topology)

    # ------------------------------------------------------------ the table

    @property
    def topology(self) -> tuple[TopicConfig, ...]:
        """The fleet's topics as this gateway applies them now."""
        return self._topology

    def __len__(self) -> int:
        return len(self._topics)

    def __iter__(self) -> Iterator[str]:
        """The names, sorted."""
        return iter(sorted(self._topics))

    def get(self, name: str) -> Topic | None:
        return self._topics.get(name)

    def priority_of(self, topic: str) -> Priority:
        """The priority of a topic homed here (``normal`` unless ``[[topics]]`` says else)."""
        lane = self._lane_of.get(topic)
        return Priority.NORMAL if lane is None else lane.priority

    def lane_of(self, topic: str) -> Lane:
        """The journal lane of a topic homed here: its priority and ``on_full`` policy."""
        return self._lane_of.get(topic, MAIN_LANE)

    def home_lanes(self) -> set[Lane]:
        """The lanes the topology's topics homed here use."""
        return set(self._lane_of.values())

    def _add(self, t: TopicConfig) -> None:
        if t.home == self.region:
            self._topics[t.name] = Topic(
                t.name, "local", t.home, t.partitions, t.name, t.subscribers
            )
        elif t.subscribed_by(self.region):
            name = f"{t.home}.{t.name}"
            self._topics[name] = Topic(name, "mirror", t.home, t.partitions, t.name, ())

    def set_topology(self, topology: Sequence[TopicConfig]) -> None:
        """Rebuild the table from ``topology`` (plus the topics auto-created here)."""
        self._topology = tuple(topology)
        self._homes = {t.name: t.home for t in self._topology}
        self._lane_of = {
            t.name: Lane(t.priority, t.on_full) for t in self._topology if t.home == self.region
        }
        self._topics = {}
        for t in self._topology:
            self._add(t)
        for name, partitions in self._auto.items():
            home = self._homes.get(name)
            if home is not None and home != self.region:
                log.warning(
                    "auto-created topic %s is homed in region %s by the routing table: its "
                    "local data stays in the journal, new writes go to %s",
                    name,
                    home,
                    home,
                )
            if name not in self._topics and home is None:
                self._add(TopicConfig(name=name, home=self.region, partitions=partitions))

    def apply(self, topology: Sequence[TopicConfig], open_lanes: Container[Lane] | None) -> None:
        """Switch to ``topology`` while running, logging what changed: topics added and
        removed, partition counts, lanes (``open_lanes``: the lanes with a journal in this
        run, to warn about a topic whose lane has none)."""
        before, lanes_before = self._topics, self._lane_of
        self.set_topology(topology)
        self._log_lane_changes(lanes_before, before, open_lanes)
        for name in sorted(self._topics.keys() - before.keys()):
            t = self._topics[name]
            log.info(
                "topic %s added (%s, %d partitions)",
                name,
                "writable here" if t.kind == "local" else f"mirror of {t.home}",
                t.partitions,
            )
        for name in sorted(before.keys() - self._topics.keys()):
            log.info("topic %s removed from this gateway's topology", name)
        for name in sorted(before.keys() & self._topics.keys()):
            old, new = before[name].partitions, self._topics[name].partitions
            if old != new:
                log.info("topic %s: %d -> %d partitions", name, old, new)

    def _log_lane_changes(
        self,
        before: Mapping[str, Lane],
        topics_before: Mapping[str, object],
        open_lanes: Container[Lane] | None,
    ) -> None:
        """Say which local topics changed lane (priority or ``on_full``), and when one's
        lane is not open (its journal opens at the next start; until then the topic stays
        in the normal lane)."""
        for name, lane in sorted(self._lane_of.items()):
            was = before.get(name, MAIN_LANE)
            if name in topics_before and lane == was:
                continue
            if name in topics_before:
                if lane.priority != was.priority:
                    log.info("topic %s: priority %s -> %s", name, was.priority, lane.priority)
                if lane.on_full != was.on_full:
                    log.info("topic %s: on_full %s -> %s", name, was.on_full, lane.on_full)
            if open_lanes is not None and lane not in open_lanes:
                log.warning(
                    "topic %s: lane %s (priority %s, on_full %s) has no journal in this run: "
                    "its records go to the normal lane until the gateway restarts (then it "
                    "moves, once the normal lane has shipped it)",
                    name,
                    lane,
                    lane.priority,
                    lane.on_full,
                )

    # ------------------------------------------------------------ auto-created topics

    def load_auto_created(self, state_files: StateFiles | None = None) -> bool:
        """Add the topics auto-created by earlier runs (``topics.json``).

        A damaged file (unreadable, not JSON, the wrong shape) is reported to
        ``state_files`` (quarantine, a WARNING; without one: a WARNING) and
        False returned: call :meth:`rebuild_auto_created` with the journal's
        partitions once it is open, so that the records of those topics stay
        readable. True when the file was read (or there is none).
        """
        try:
            rows = _read_auto_created(self.path)
        except CorruptData as exc:
            action = "auto-created topics rebuilt from the journal's partitions"
            if state_files is not None:
                # Left in place until rebuild_auto_created writes over it: a
                # missing file would forget the topics at a crash in between.
                state_files.damaged(self.path, exc.reason, action, remove=False)
            else:
                log.warning("damaged %s (%s): %s", self.path, exc.reason, action)
            return False
        for name, partitions in rows:
            if name not in self._topics and name not in self._homes:
                self._auto[name] = partitions
                self._add(TopicConfig(name=name, home=self.region, partitions=partitions))
        return True

    def rebuild_auto_created(self, partitions: Iterable[tuple[str, int]]) -> list[str]:
        """Re-create, from the journal's (topic, partition) pairs, the topics that are
        neither configured nor routed here (the auto-created ones), and save
        ``topics.json``. The names re-created.

        Each gets ``default_partitions`` partitions, or more if the journal
        holds a higher partition. Mirror topics of other regions are not topics
        of this one: they are skipped.
        """
        found: dict[str, int] = {}
        for topic, partition in partitions:
            source = split_mirror_topic(topic)
            if source is not None and source[0] != self.region:
                continue  # a mirror of another region's topic, never auto-created
            if topic not in self._topics and topic not in self._homes:
                found[topic] = max(found.get(topic, self._default_partitions), partition + 1)
        for name, n in sorted(found.items()):
            self._auto[name] = n
            self._add(TopicConfig(name=name, home=self.region, partitions=n))
        rows = [{"name": name, "partitions": n} for name, n in self._auto.items()]
        replace_file(self.path, _auto_created_doc(rows))
        log.warning(
            "%s rebuilt from the journal: %d auto-created topics (%s)",
            self.path,
            len(found),
            ", ".join(sorted(found)) or "none",
        )
        return sorted(found)

    def _create(self, topic: str) -> Topic:
        """Auto-create ``topic`` here: saved to ``topics.json`` first, or not created."""
        self._auto[topic] = self._default_partitions
        rows = [{"name": name, "partitions": n} for name, n in self._auto.items()]
        try:
            replace_file(self.path, _auto_created_doc(rows))
        except OSError as exc:
            # Not created: a topic the next start would not know must not
            # take records now. The producer retries (503).
            del self._auto[topic]
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            kind = DiskFull if full else Unavailable
            raise kind(f"cannot auto-create topic {topic!r}: saving {self.path}: {exc}") from exc
        self._add(TopicConfig(name=topic, home=self.region, partitions=self._default_partitions))
        log.info("auto-created topic %s (%d partitions)", topic, self._default_partitions)
        return self._topics[topic]

    # ------------------------------------------------------------ what a request may do

    def writable(self, topic: str) -> Topic:
        """The topic homed here that ``topic`` names, auto-created when allowed; else
        :class:`WrongRegion`, :class:`ReadOnlyTopic`, :class:`UnknownTopic` or
        :class:`InvalidName`, each saying where to produce instead."""
        t = self._topics.get(topic)
        if t is None:
            validate_topic(topic)
            home = self._homes.get(topic)
            if home is not None and home != self.region:
                raise WrongRegion(
                    f"topic {topic!r} is homed in region {home!r}, not in {self.region!r}: "
                    f"produce to it in region {home!r}",
                    home,
                )
            # One rule (edge_gateway/names.py): a name with '.' is a mirror topic
            # <region>.<topic>, never a topic homed here, so it is not auto-created.
            source = split_mirror_topic(topic)
            if source is not None:
                region, name = source
                there = "here" if region == self.region else f"in region {region!r}"
                raise ReadOnlyTopic(
                    f"topic {topic!r} is a mirror topic name (<region>.<topic>; mirrors are "
                    f"read-only and topics homed here may not contain '.'): produce to "
                    f"{name!r} {there}"
                )
            validate_home_topic(topic)
            if not self._auto_create:
                where = (
                    "create it on the metadata server (edgegw topics create)"
                    if self._metadata_enabled
                    else "define it in the config"
                )
                raise UnknownTopic(f"unknown topic {topic!r} ({where}, or set auto_create = true)")
            t = self._create(topic)
        if t.kind != "local":
            raise ReadOnlyTopic(
                f"topic {topic!r} is a read-only mirror of {t.source_topic!r} homed in region "
                f"{t.home!r}; produce to it there"
            )
        return t

    def readable(self, topic: str) -> Topic:
        """The topic ``topic`` names; :class:`UnknownTopic` (or :class:`InvalidName`)."""
        t = self._topics.get(topic)
        if t is None:
            validate_topic(topic)
            raise UnknownTopic(f"unknown topic {topic!r}")
        return t

    def kind(self, topic: str) -> Literal["local", "mirror"] | None:
        """``local``, ``mirror``, or None when this gateway has no such topic."""
        t = self._topics.get(topic)
        return None if t is None else t.kind


def _auto_created_doc(rows: list[dict[str, object]]) -> bytes:
    return seal({"v": AUTO_TOPICS_VERSION, "auto_created": rows})


def _read_auto_created(path: Path) -> list[tuple[str, int]]:
    """``topics.json``'s (name, partitions) rows ([] when there is none); :class:`CorruptData`."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CorruptData(f"unreadable: {exc}", where=str(path)) from None
    doc = unseal(data, where=str(path), legacy_keys=frozenset({"auto_created"}))
    if doc.get("v", AUTO_TOPICS_VERSION) != AUTO_TOPICS_VERSION:
        raise CorruptData(f"unsupported version {doc.get('v')!r}", where=str(path))
    rows = doc.get("auto_created")
    if not isinstance(rows, list):
        raise CorruptData("no list of auto-created topics", where=str(path))
    out = []
    for row in rows:
        name = row.get("name") if isinstance(row, dict) else None
        n = row.get("partitions") if isinstance(row, dict) else None
        if not isinstance(name, str) or type(n) is not int or not 1 <= n <= 100_000:
            raise CorruptData(f"a bad row {row!r}", where=str(path))
        try:
            validate_topic(name)
        except InvalidInput:
            raise CorruptData(f"a bad topic name {name!r}", where=str(path)) from None
        out.append((name, n))
    return out
