"""Kafka consumer groups on the listener: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups; and SASL/PLAIN.

The membership protocol is the sans-IO :class:`~._coordinator.GroupCoordinator`;
this module turns kio's requests of every served version into its calls and
its results into kio's responses, and waits (trio) for join phases and the
leader's assignment. Committed offsets go through the gateway's group store
(:meth:`Gateway.commit_offsets`), the one the HTTP API uses: a group's offsets
are the same whichever door committed or reads them, and durable alike.

Time: the coordinator runs on ``trio.current_time()``. There is no background
task: each request first applies what time has done (``tick``), and a request
waiting for a join phase or an assignment wakes at the coordinator's next
deadline and ticks. Sessions of members nobody asks about expire when the
next request (or ``edgegw status``) looks — which nobody can tell apart from
expiring on time.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NoReturn

import trio
from kio.schema.errors import ErrorCode

from edge_gateway.errors import ClosedError, DiskFull, EdgeGatewayError, InvalidInput, Unavailable
from edge_gateway.kafka._coordinator import (
    CoordinatorStatistics,
    GroupCoordinator,
    GroupState,
    JoinRequest,
    JoinTicket,
    SyncTicket,
)
from edge_gateway.kafka._handlers import NODE_ID
from edge_gateway.kafka._protocol import RequestFrame
from edge_gateway.kafka._registry import (
    CloseConnection,
    Connection,
    error_for,
    register,
    response_for,
)
from edge_gateway.kafka._sasl import SaslOutcome, SaslPlain
from edge_gateway.names import validate_group

if TYPE_CHECKING:
    from edge_gateway.kafka._core import GatewayCore

__all__ = ["GroupsStatistics", "KafkaGroups", "groups_for", "groups_statistics"]

log = logging.getLogger("edgegw.kafka")

OFFSET_COMMIT: Final = 8
OFFSET_FETCH: Final = 9
FIND_COORDINATOR: Final = 10
JOIN_GROUP: Final = 11
HEARTBEAT: Final = 12
LEAVE_GROUP: Final = 13
SYNC_GROUP: Final = 14
DESCRIBE_GROUPS: Final = 15
LIST_GROUPS: Final = 16
SASL_HANDSHAKE: Final = 17
SASL_AUTHENTICATE: Final = 36

#: Longest committed metadata string (the group store's limit).
_MAX_METADATA: Final = 4096


@dataclass(frozen=True, slots=True)
class GroupsStatistics:
    """The Kafka groups of one gateway (status ``kafka.groups``, Prometheus)."""

    groups: int
    members: int
    pending_members: int
    rebalances_total: int
    expired_members_total: int
    #: group -> (state, generation, members)
    by_group: dict[str, tuple[str, int, int]]

    def to_json(self) -> dict[str, Any]:
        return {
            "groups": self.groups,
            "members": self.members,
            "pending_members": self.pending_members,
            "rebalances_total": self.rebalances_total,
            "expired_members_total": self.expired_members_total,
            "by_group": {
                g: {"state": s, "generation": gen, "members": n}
                for g, (s, gen, n) in sorted(self.by_group.items())
            },
        }


class KafkaGroups:
    """One gateway's coordinator and the trio waiting around it."""

    def __init__(self, coordinator: GroupCoordinator | None = None) -> None:
        self.coordinator = coordinator or GroupCoordinator()
        self._changed = trio.Event()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def tick(self) -> None:
        if self.coordinator.tick(trio.current_time()):
            self._poke()

    async def _wait(self, ticket: JoinTicket | SyncTicket) -> None:
        while ticket.result is None:
            deadline = self.coordinator.next_deadline()
            changed = self._changed
            with trio.move_on_at(math.inf if deadline is None else deadline) as scope:
                await changed.wait()
            if scope.cancelled_caught:
                self.tick()

    async def join(self, req: JoinRequest) -> JoinTicket:
        self.tick()
        ticket = self.coordinator.join(trio.current_time(), req)
        self._poke()
        await self._wait(ticket)
        return ticket

    async def sync(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        assignments: Iterable[tuple[str, bytes]],
        *,
        protocol_type: str | None,
        protocol_name: str | None,
    ) -> SyncTicket:
        self.tick()
        ticket = self.coordinator.sync(
            trio.current_time(),
            group_id,
            generation_id,
            member_id,
            assignments,
            protocol_type=protocol_type,
            protocol_name=protocol_name,
        )
        self._poke()
        await self._wait(ticket)
        return ticket

    def heartbeat(self, group_id: str, generation_id: int, member_id: str) -> ErrorCode:
        self.tick()
        error = self.coordinator.heartbeat(trio.current_time(), group_id, generation_id, member_id)
        self._poke()  # a refreshed session moves the next deadline
        return error

    def leave(self, group_id: str, member_ids: list[str]) -> list[ErrorCode]:
        self.tick()
        errors = self.coordinator.leave(trio.current_time(), group_id, member_ids)
        self._poke()
        return errors

    def check_commit(self, group_id: str, generation_id: int, member_id: str) -> ErrorCode:
        self.tick()
        return self.coordinator.check_commit(group_id, generation_id, member_id)

    def statistics(self) -> GroupsStatistics:
        self.tick()
        s: CoordinatorStatistics = self.coordinator.statistics()
        return GroupsStatistics(
            groups=s.groups,
            members=s.members,
            pending_members=s.pending_members,
            rebalances_total=s.rebalances_total,
            expired_members_total=s.expired_members_total,
            by_group={
                v.group_id: (v.state.value, v.generation, len(v.members))
                for v in self.coordinator.groups()
            },
        )


_BY_GATEWAY: weakref.WeakKeyDictionary[GatewayCore, KafkaGroups] = weakref.WeakKeyDictionary()


def groups_for(gateway: GatewayCore) -> KafkaGroups:
    """The gateway's Kafka groups (made at the first group request)."""
    groups = _BY_GATEWAY.get(gateway)
    if groups is None:
        groups = _BY_GATEWAY[gateway] = KafkaGroups()
    return groups


def groups_statistics(gateway: GatewayCore) -> GroupsStatistics:
    """The gateway's Kafka group figures (zeros before any group request)."""
    groups = _BY_GATEWAY.get(gateway)
    if groups is None:
        return GroupsStatistics(0, 0, 0, 0, 0, {})
    return groups.statistics()


def _ms(value: Any) -> int:
    """A kio timedelta field (or an int) in milliseconds."""
    if isinstance(value, int):
        return value
    seconds: float = value.total_seconds()
    return round(seconds * 1000)


def _store_error(exc: EdgeGatewayError) -> ErrorCode:
    """The error code for a failed read or write of committed offsets."""
    if isinstance(exc, DiskFull):
        return ErrorCode.kafka_storage_error  # retriable
    if isinstance(exc, ClosedError | Unavailable):
        # Stopping, or not started: retriable, and clients look the coordinator up again.
        return ErrorCode.coordinator_not_available
    return error_for(exc)


def _group_error(group_id: str | None) -> ErrorCode | None:
    try:
        validate_group(group_id)
    except InvalidInput:
        return ErrorCode.invalid_group_id
    return None


# ------------------------------------------------------------------ FindCoordinator


@register(FIND_COORDINATOR, 0, 5)
async def find_coordinator(conn: Connection, req: RequestFrame) -> Any:
    r = req.request
    key_type = int(getattr(r, "key_type", 0))
    keys = list(r.coordinator_keys) if req.api_version >= 4 else [r.key]
    host, port = conn.advertised
    answers = []
    for key in keys:
        error, message = ErrorCode.none, None
        if key_type != 0:
            # Transactions are not served: no transaction coordinator.
            error, message = ErrorCode.coordinator_not_available, "transactions are not supported"
        elif _group_error(key) is not None:
            error, message = ErrorCode.invalid_group_id, "bad consumer group name"
        answers.append(
            {
                "key": key,
                "node_id": NODE_ID if error is ErrorCode.none else -1,
                "host": host if error is ErrorCode.none else "",
                "port": port if error is ErrorCode.none else -1,
                "error_code": error,
                "error_message": message,
            }
        )
    if req.api_version >= 4:
        return response_for(req, {"throttle_time": 0, "coordinators": answers})
    return response_for(req, {"throttle_time": 0, **answers[0]})


# ------------------------------------------------------------------ JoinGroup


@register(JOIN_GROUP, 0, 9)
async def join_group(conn: Connection, req: RequestFrame) -> Any:
    r = req.request
    rebalance_ms = _ms(getattr(r, "rebalance_timeout", -1))
    host = conn.peer.rpartition(":")[0]
    join = JoinRequest(
        group_id=r.group_id,
        member_id=r.member_id,
        protocol_type=r.protocol_type,
        protocols=tuple((p.name, bytes(p.metadata)) for p in r.protocols),
        session_timeout_ms=_ms(r.session_timeout),
        rebalance_timeout_ms=rebalance_ms,
        group_instance_id=getattr(r, "group_instance_id", None),
        client_id=conn.client_id or "",
        client_host=host,
        require_known_member_id=req.api_version >= 4,
    )
    if join.group_instance_id is not None:
        log.warning(
            "kafka: %s: JoinGroup of %r with group.instance.id %r refused: static membership "
            "is not supported (docs/kafka.md)",
            conn.peer,
            r.group_id,
            join.group_instance_id,
        )
    ticket = await groups_for(conn.gateway).join(join)
    res = ticket.result
    assert res is not None
    protocol_name = res.protocol_name
    if req.api_version < 7 and protocol_name is None:
        protocol_name = ""  # not nullable before v7
    return response_for(
        req,
        {
            "throttle_time": 0,
            "error_code": res.error,
            "generation_id": res.generation_id,
            "protocol_type": res.protocol_type,
            "protocol_name": protocol_name,
            "leader": res.leader,
            "skip_assignment": False,
            "member_id": res.member_id,
            "members": [
                {"member_id": m, "group_instance_id": inst, "metadata": meta}
                for m, inst, meta in res.members
            ],
        },
    )


# ------------------------------------------------------------------ SyncGroup


@register(SYNC_GROUP, 0, 5)
async def sync_group(conn: Connection, req: RequestFrame) -> Any:
    r = req.request
    ticket = await groups_for(conn.gateway).sync(
        r.group_id,
        int(r.generation_id),
        r.member_id,
        [(a.member_id, bytes(a.assignment)) for a in r.assignments],
        protocol_type=getattr(r, "protocol_type", None),
        protocol_name=getattr(r, "protocol_name", None),
    )
    res = ticket.result
    assert res is not None
    return response_for(
        req,
        {
            "throttle_time": 0,
            "error_code": res.error,
            "protocol_type": res.protocol_type,
            "protocol_name": res.protocol_name,
            "assignment": res.assignment,
        },
    )


# ------------------------------------------------------------------ Heartbeat, LeaveGroup


@register(HEARTBEAT, 0, 4)
async def heartbeat(conn: Connection, req: RequestFrame) -> Any:
    r = req.request
    error = groups_for(conn.gateway).heartbeat(r.group_id, int(r.generation_id), r.member_id)
    return response_for(req, {"throttle_time": 0, "error_code": error})


@register(LEAVE_GROUP, 0, 5)
async def leave_group(conn: Connection, req: RequestFrame) -> Any:
    r = req.request
    groups = groups_for(conn.gateway)
    if req.api_version < 3:
        (error,) = groups.leave(r.group_id, [r.member_id])
        return response_for(req, {"throttle_time": 0, "error_code": error})
    ids = [m.member_id for m in r.members]
    errors = groups.leave(r.group_id, ids)
    return response_for(
        req,
        {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "members": [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "error_code": e,
                }
                for m, e in zip(r.members, errors, strict=True)
            ],
        },
    )


# ------------------------------------------------------------------ OffsetCommit / OffsetFetch


@register(OFFSET_COMMIT, 2, 9)
async def offset_commit(conn: Connection, req: RequestFrame) -> Any:
    r = req.request
    gw = conn.gateway
    # One answer per partition asked about, in the request's order.
    errors: dict[tuple[str, int], ErrorCode] = {}
    rows: list[tuple[str, int, int, str]] = []
    group_error = _group_error(r.group_id)
    if group_error is None:
        group_error = groups_for(gw).check_commit(
            r.group_id, int(r.generation_id_or_member_epoch), r.member_id
        )
    if group_error is ErrorCode.none:
        group_error = None
    for topic in r.topics:
        partitions = _partition_count(gw, topic.name)
        for p in topic.partitions:
            key = (topic.name, int(p.partition_index))
            meta = p.committed_metadata or ""
            if group_error is not None:
                errors[key] = group_error
            elif partitions is None or not 0 <= p.partition_index < partitions:
                errors[key] = ErrorCode.unknown_topic_or_partition
            elif len(meta) > _MAX_METADATA:
                errors[key] = ErrorCode.offset_metadata_too_large
            elif p.committed_offset < 0:
                errors[key] = ErrorCode.invalid_request
            else:
                errors[key] = ErrorCode.none
                rows.append((topic.name, int(p.partition_index), int(p.committed_offset), meta))
    if rows:
        try:
            await gw.commit_offsets(r.group_id, rows)
        except EdgeGatewayError as exc:
            log.info("kafka: %s: OffsetCommit of %r failed: %s", conn.peer, r.group_id, exc)
            failed = _store_error(exc)
            for t, part, _, _ in rows:
                errors[(t, part)] = failed
    return response_for(
        req,
        {
            "throttle_time": 0,
            "topics": [
                {
                    "name": topic.name,
                    "partitions": [
                        {
                            "partition_index": p.partition_index,
                            "error_code": errors[(topic.name, int(p.partition_index))],
                        }
                        for p in topic.partitions
                    ],
                }
                for topic in r.topics
            ],
        },
    )


def _partition_count(gw: GatewayCore, topic: str) -> int | None:
    try:
        return gw.describe_topic(topic).partitions
    except EdgeGatewayError:
        return None


async def _fetch_group(
    gw: GatewayCore, group_id: str, topics: Any
) -> tuple[ErrorCode, list[dict[str, Any]]]:
    """(group error, topics) of one group of an OffsetFetch."""
    if _group_error(group_id) is not None:
        return ErrorCode.invalid_group_id, []
    try:
        committed = await gw.fetch_offsets(group_id)
    except EdgeGatewayError as exc:
        log.info("kafka: OffsetFetch of %r failed: %s", group_id, exc)
        return _store_error(exc), []
    by_key = {(c.topic, c.partition): c for c in committed}
    wanted: list[tuple[str, list[int]]]
    if topics is None:  # every partition the group committed
        names = sorted({c.topic for c in committed})
        wanted = [(n, sorted(p for t, p in by_key if t == n)) for n in names]
    else:
        wanted = [(t.name, [int(i) for i in t.partition_indexes]) for t in topics]
    out = []
    for name, parts in wanted:
        entries = []
        for part in parts:
            c = by_key.get((name, part))
            entries.append(
                {
                    "partition_index": part,
                    "committed_offset": -1 if c is None else c.offset,
                    "committed_leader_epoch": -1,
                    "metadata": "" if c is None else c.metadata,
                    "error_code": ErrorCode.none,
                }
            )
        out.append({"name": name, "partitions": entries})
    return ErrorCode.none, out


@register(OFFSET_FETCH, 1, 9)
async def offset_fetch(conn: Connection, req: RequestFrame) -> Any:
    r = req.request
    gw = conn.gateway
    if req.api_version >= 8:
        answers = []
        for g in r.groups:
            error, topics = await _fetch_group(gw, g.group_id, g.topics)
            answers.append({"group_id": g.group_id, "error_code": error, "topics": topics})
        return response_for(req, {"throttle_time": 0, "groups": answers})
    error, topics = await _fetch_group(gw, r.group_id, r.topics)
    if req.api_version < 2 and error is not ErrorCode.none:
        # v1 has no group-level error: every partition asked about carries it.
        topics = [
            {
                "name": t.name,
                "partitions": [
                    {
                        "partition_index": i,
                        "committed_offset": -1,
                        "metadata": "",
                        "error_code": error,
                    }
                    for i in t.partition_indexes
                ],
            }
            for t in r.topics or ()
        ]
    return response_for(req, {"throttle_time": 0, "error_code": error, "topics": topics})


# ------------------------------------------------------------------ DescribeGroups / ListGroups


@register(DESCRIBE_GROUPS, 0, 5)
async def describe_groups(conn: Connection, req: RequestFrame) -> Any:
    groups = groups_for(conn.gateway)
    groups.tick()
    described = []
    for group_id in req.request.groups:
        view = groups.coordinator.describe(group_id)
        if view is None:
            # No members: offsets may exist (HTTP or an earlier consumer), nobody is in it.
            described.append(
                {
                    "error_code": _group_error(group_id) or ErrorCode.none,
                    "group_id": group_id,
                    "group_state": GroupState.EMPTY.value,
                    "protocol_type": "",
                    "protocol_data": "",
                    "members": [],
                    "authorized_operations": -2147483648,
                }
            )
            continue
        described.append(
            {
                "error_code": ErrorCode.none,
                "group_id": group_id,
                "group_state": view.state.value,
                "protocol_type": view.protocol_type or "",
                "protocol_data": view.protocol_name or "",
                "members": [
                    {
                        "member_id": mid,
                        "group_instance_id": None,
                        "client_id": client_id,
                        "client_host": client_host,
                        "member_metadata": meta,
                        "member_assignment": assignment,
                    }
                    for mid, client_id, client_host, meta, assignment in view.members
                ],
                "authorized_operations": -2147483648,
            }
        )
    return response_for(req, {"throttle_time": 0, "groups": described})


@register(LIST_GROUPS, 0, 4)
async def list_groups(conn: Connection, req: RequestFrame) -> Any:
    gw = conn.gateway
    groups = groups_for(gw)
    groups.tick()
    live = {v.group_id: v for v in groups.coordinator.groups()}
    try:
        stored = await trio.to_thread.run_sync(gw.groups.groups_sync)
    except EdgeGatewayError as exc:
        error = _store_error(exc)
        return response_for(req, {"throttle_time": 0, "error_code": error, "groups": []})
    states_filter = {s.lower() for s in getattr(req.request, "states_filter", ()) or ()}
    listed = []
    for group_id in sorted(set(live) | set(stored)):
        view = live.get(group_id)
        state = view.state.value if view is not None else GroupState.EMPTY.value
        if states_filter and state.lower() not in states_filter:
            continue
        protocol_type = (view.protocol_type if view is not None else None) or "consumer"
        listed.append({"group_id": group_id, "protocol_type": protocol_type, "group_state": state})
    return response_for(req, {"throttle_time": 0, "error_code": ErrorCode.none, "groups": listed})


# ------------------------------------------------------------------ SASL


def _refuse(conn: Connection, outcome: SaslOutcome, response: Any) -> NoReturn:
    # The listener counts error codes of responses it sends normally; a response
    # sent on the way out (CloseConnection) is counted here.
    server = conn.server
    if server is not None:
        server.count_error(outcome.error)
    raise CloseConnection(outcome.message or "SASL refused", response)


def _sasl(conn: Connection) -> SaslPlain:
    sasl = conn.state.get("sasl")
    if not isinstance(sasl, SaslPlain):
        sasl = conn.state["sasl"] = SaslPlain(conn.gateway.config.api.token)
    return sasl


@register(SASL_HANDSHAKE, 1, 1, before_auth=True)
async def sasl_handshake(conn: Connection, req: RequestFrame) -> Any:
    sasl = _sasl(conn)
    outcome = sasl.handshake(req.api_version, req.request.mechanism)
    response = response_for(
        req, {"error_code": outcome.error, "mechanisms": list(sasl.mechanisms())}
    )
    if outcome.close:
        _refuse(conn, outcome, response)
    return response


@register(SASL_AUTHENTICATE, 0, 2, before_auth=True)
async def sasl_authenticate(conn: Connection, req: RequestFrame) -> Any:
    sasl = _sasl(conn)
    outcome = sasl.authenticate(bytes(req.request.auth_bytes))
    response = response_for(
        req,
        {
            "error_code": outcome.error,
            "error_message": outcome.message,
            "auth_bytes": b"",
            "session_lifetime": 0,
        },
    )
    if outcome.close:
        log.warning("kafka: %s: SASL authentication failed: %s", conn.peer, outcome.message)
        _refuse(conn, outcome, response)
    conn.authenticated = True
    conn.principal = sasl.username
    log.info("kafka: %s: authenticated as %r", conn.peer, sasl.username)
    return response
