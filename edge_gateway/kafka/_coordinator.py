"""The classic Kafka consumer-group coordinator as a sans-IO state machine.

The gateway is the one broker of its cluster, so it coordinates every group.
This module holds the membership protocol only — JoinGroup, SyncGroup,
Heartbeat, LeaveGroup and the membership check of OffsetCommit — with no I/O
and no clock of its own: every call takes ``now`` (seconds on a monotonic
clock) and :meth:`GroupCoordinator.tick` expires sessions and ends join phases.
The trio glue (:mod:`edge_gateway.kafka._groups`) calls ``tick`` at
:meth:`GroupCoordinator.next_deadline` and wakes the requests whose ticket got
a result. Committed offsets are not kept here: they live in the gateway's
:class:`~edge_gateway.groups.GroupStore`, shared with the HTTP API.

A group moves through Kafka's states::

    (absent) ─join─► PreparingRebalance ─all joined / rebalance timeout─► CompletingRebalance
                        ▲      ▲                                             │ leader's
                        │      └────── join with new metadata, leave, ───────┤ SyncGroup
                        │              session expiry                        ▼
                        └──────────────────────────────────────────────── Stable

A group with no members and no pending member is dropped (its committed
offsets stay in the store); the next join starts it again at generation 1.

Invariants:

* a member holding an unanswered JoinGroup or SyncGroup is never expired (its
  session restarts when it gets its answer), as in Kafka;
* every ticket gets exactly one result; a result is never changed after it is
  set;
* the generation only grows while a group exists.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from kio.schema.errors import ErrorCode

from edge_gateway.errors import InvalidInput
from edge_gateway.names import validate_group

__all__ = [
    "CoordinatorStatistics",
    "GroupCoordinator",
    "GroupState",
    "GroupView",
    "JoinRequest",
    "JoinResult",
    "JoinTicket",
    "SyncResult",
    "SyncTicket",
]

#: Longest client id kept in a member id (the id is echoed in every request).
_MAX_CLIENT_ID_IN_MEMBER_ID = 64


class GroupState(Enum):
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    EMPTY = "Empty"


@dataclass(frozen=True, slots=True)
class JoinRequest:
    """A JoinGroup request, whatever its version (the glue fills the fields)."""

    group_id: str
    member_id: str
    protocol_type: str
    #: (name, metadata) in the member's order of preference.
    protocols: tuple[tuple[str, bytes], ...]
    session_timeout_ms: int
    #: -1 (or a v0 request): the session timeout.
    rebalance_timeout_ms: int = -1
    group_instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    #: JoinGroup v4+: a new member first gets MEMBER_ID_REQUIRED with its id.
    require_known_member_id: bool = False


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    #: (member id, group instance id, metadata of the chosen protocol): for the leader only.
    members: tuple[tuple[str, str | None, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(slots=True, eq=False)
class JoinTicket:
    """The answer to one JoinGroup: ``result`` is None until the join phase ends."""

    result: JoinResult | None = None

    def _resolve(self, result: JoinResult) -> None:
        if self.result is None:
            self.result = result


@dataclass(slots=True, eq=False)
class SyncTicket:
    """The answer to one SyncGroup: ``result`` is None until the leader's assignment."""

    result: SyncResult | None = None

    def _resolve(self, result: SyncResult) -> None:
        if self.result is None:
            self.result = result


@dataclass(slots=True, eq=False)
class _Member:
    member_id: str
    client_id: str
    client_host: str
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    session_timeout: float
    rebalance_timeout: float
    #: When the session ends without a heartbeat (ignored while a ticket is held).
    deadline: float
    join: JoinTicket | None = None
    sync: SyncTicket | None = None
    assignment: bytes = b""

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata_for(self, protocol: str) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""  # unreachable: the protocol was chosen among this member's


@dataclass(slots=True, eq=False)
class _Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, _Member] = field(default_factory=dict)
    #: Member ids handed out with MEMBER_ID_REQUIRED, not yet joined → expiry.
    pending: dict[str, float] = field(default_factory=dict)
    rebalance_deadline: float | None = None

    def candidates(self) -> set[str] | None:
        """Protocols every member supports (None: no member)."""
        names: set[str] | None = None
        for m in self.members.values():
            mine = set(m.protocol_names())
            names = mine if names is None else names & mine
        return names


@dataclass(frozen=True, slots=True)
class GroupView:
    """One group as ``edgegw status`` and DescribeGroups show it."""

    group_id: str
    state: GroupState
    generation: int
    protocol_type: str | None
    protocol_name: str | None
    leader: str | None
    #: (member id, client id, client host, metadata, assignment)
    members: tuple[tuple[str, str, str, bytes, bytes], ...]
    pending_members: int


@dataclass(frozen=True, slots=True)
class CoordinatorStatistics:
    groups: int
    members: int
    pending_members: int
    #: Join phases completed (each one a new generation of some group).
    rebalances_total: int
    #: Members removed because their session timed out or they missed a rebalance.
    expired_members_total: int


class GroupCoordinator:
    """Membership of every Kafka consumer group of this gateway (sans-IO)."""

    def __init__(
        self,
        *,
        min_session_timeout_ms: int = 1_000,
        max_session_timeout_ms: int = 1_800_000,
        max_group_size: int = 1_000,
        max_groups: int = 10_000,
        new_member_id: Callable[[str], str] | None = None,
    ) -> None:
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.max_group_size = max_group_size
        self.max_groups = max_groups
        self._new_member_id = new_member_id or _random_member_id
        self._groups: dict[str, _Group] = {}
        self._rebalances = 0
        self._expired = 0

    # ------------------------------------------------------------------ requests

    def join(self, now: float, req: JoinRequest) -> JoinTicket:
        """Handle a JoinGroup; the ticket resolves when the join phase ends (or at once)."""
        ticket = JoinTicket()
        error = self._check_join(req)
        if error is not None:
            ticket._resolve(JoinResult(error, member_id=req.member_id))
            return ticket
        group = self._groups.get(req.group_id)
        if group is None:
            if len(self._groups) >= self.max_groups:
                # Memory is bounded by groups x members; a client retries later.
                ticket._resolve(JoinResult(ErrorCode.coordinator_not_available))
                return ticket
            group = self._groups[req.group_id] = _Group(req.group_id)
        if not self._protocols_fit(group, req):
            ticket._resolve(
                JoinResult(ErrorCode.inconsistent_group_protocol, member_id=req.member_id)
            )
            self._drop_if_empty(group)
            return ticket
        if not req.member_id:
            self._join_new(now, group, req, ticket)
        elif req.member_id in group.pending:
            del group.pending[req.member_id]
            self._add_member(now, group, req, req.member_id, ticket)
        elif req.member_id in group.members:
            self._join_existing(now, group, group.members[req.member_id], req, ticket)
        else:
            ticket._resolve(JoinResult(ErrorCode.unknown_member_id, member_id=req.member_id))
            self._drop_if_empty(group)
        return ticket

    def sync(
        self,
        now: float,
        group_id: str,
        generation_id: int,
        member_id: str,
        assignments: Iterable[tuple[str, bytes]] = (),
        *,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> SyncTicket:
        """Handle a SyncGroup; the ticket resolves when the leader's assignment arrives."""
        ticket = SyncTicket()
        group = self._groups.get(group_id)
        if group is None or member_id not in group.members:
            ticket._resolve(SyncResult(ErrorCode.unknown_member_id))
            return ticket
        if generation_id != group.generation:
            ticket._resolve(SyncResult(ErrorCode.illegal_generation))
            return ticket
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            ticket._resolve(SyncResult(ErrorCode.inconsistent_group_protocol))
            return ticket
        member = group.members[member_id]
        if group.state is GroupState.PREPARING_REBALANCE:
            ticket._resolve(SyncResult(ErrorCode.rebalance_in_progress))
        elif group.state is GroupState.STABLE:
            member.deadline = now + member.session_timeout
            ticket._resolve(self._sync_ok(group, member.assignment))
        else:  # CompletingRebalance: wait for the leader
            if member.sync is not None:  # a retried SyncGroup replaces the first
                member.sync._resolve(SyncResult(ErrorCode.rebalance_in_progress))
            member.sync = ticket
            if member_id == group.leader:
                given = dict(assignments)
                for m in group.members.values():
                    m.assignment = given.get(m.member_id, b"")
                group.state = GroupState.STABLE
                for m in group.members.values():
                    m.deadline = now + m.session_timeout
                    if m.sync is not None:
                        m.sync._resolve(self._sync_ok(group, m.assignment))
                        m.sync = None
        return ticket

    def heartbeat(self, now: float, group_id: str, generation_id: int, member_id: str) -> ErrorCode:
        group = self._groups.get(group_id)
        if group is None or member_id not in group.members:
            return ErrorCode.unknown_member_id
        if generation_id != group.generation:
            return ErrorCode.illegal_generation
        member = group.members[member_id]
        member.deadline = now + member.session_timeout
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave(self, now: float, group_id: str, member_ids: Sequence[str]) -> list[ErrorCode]:
        """Remove members; one error code per member id, in order."""
        group = self._groups.get(group_id)
        errors: list[ErrorCode] = []
        left = False
        for member_id in member_ids:
            if group is None:
                errors.append(ErrorCode.unknown_member_id)
            elif member_id in group.pending:
                del group.pending[member_id]
                errors.append(ErrorCode.none)
                left = True
            elif member_id in group.members:
                self._remove_member(group, group.members[member_id], ErrorCode.unknown_member_id)
                errors.append(ErrorCode.none)
                left = True
            else:
                errors.append(ErrorCode.unknown_member_id)
        if group is not None and left:
            self._after_removal(now, group)
        return errors

    def check_commit(self, group_id: str, generation_id: int, member_id: str) -> ErrorCode:
        """May this member commit offsets now? (Kafka's rules for OffsetCommit.)

        A commit with generation -1 is a "simple" commit (no membership), allowed
        only while the group has no members, like an HTTP commit.
        """
        group = self._groups.get(group_id)
        if generation_id < 0 and (group is None or not group.members):
            return ErrorCode.none
        if group is None:
            return ErrorCode.unknown_member_id
        if group.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
        if generation_id != group.generation:
            return ErrorCode.illegal_generation
        return ErrorCode.none

    # ------------------------------------------------------------------ time

    def tick(self, now: float) -> bool:
        """Expire sessions and pending member ids; end join phases past their timeout.

        Returns whether anything changed (a ticket may have got its result).
        """
        changed = False
        for group in list(self._groups.values()):
            removed = False
            for member_id, deadline in list(group.pending.items()):
                if deadline <= now:
                    del group.pending[member_id]
                    removed = True
            for member in list(group.members.values()):
                if member.join is None and member.sync is None and member.deadline <= now:
                    self._remove_member(group, member, ErrorCode.unknown_member_id)
                    self._expired += 1
                    removed = True
            if removed:
                self._after_removal(now, group)
            if (
                group.state is GroupState.PREPARING_REBALANCE
                and group.rebalance_deadline is not None
                and group.rebalance_deadline <= now
            ):
                self._complete_join(now, group)
                removed = True
            self._drop_if_empty(group)
            changed = changed or removed
        return changed

    def next_deadline(self) -> float | None:
        """When :meth:`tick` next has something to do (None: nothing scheduled)."""
        best: float | None = None
        for group in self._groups.values():
            times = list(group.pending.values())
            times.extend(
                m.deadline for m in group.members.values() if m.join is None and m.sync is None
            )
            if (
                group.state is GroupState.PREPARING_REBALANCE
                and group.rebalance_deadline is not None
            ):
                times.append(group.rebalance_deadline)
            for t in times:
                if best is None or t < best:
                    best = t
        return best

    # ------------------------------------------------------------------ views

    def statistics(self) -> CoordinatorStatistics:
        return CoordinatorStatistics(
            groups=len(self._groups),
            members=sum(len(g.members) for g in self._groups.values()),
            pending_members=sum(len(g.pending) for g in self._groups.values()),
            rebalances_total=self._rebalances,
            expired_members_total=self._expired,
        )

    def groups(self) -> list[GroupView]:
        return [self._view(g) for _, g in sorted(self._groups.items())]

    def describe(self, group_id: str) -> GroupView | None:
        group = self._groups.get(group_id)
        return None if group is None else self._view(group)

    # ------------------------------------------------------------------ internals

    def _check_join(self, req: JoinRequest) -> ErrorCode | None:
        try:
            validate_group(req.group_id)
        except InvalidInput:
            return ErrorCode.invalid_group_id
        if req.group_instance_id is not None:
            # Static membership (KIP-345) is not implemented: refused, not ignored,
            # so a client that relies on it learns at once (docs/kafka.md).
            return ErrorCode.invalid_request
        if not (
            self.min_session_timeout_ms <= req.session_timeout_ms <= self.max_session_timeout_ms
        ):
            return ErrorCode.invalid_session_timeout
        if not req.protocol_type or not req.protocols:
            return ErrorCode.inconsistent_group_protocol
        return None

    def _rebalance_timeout(self, req: JoinRequest) -> float:
        """Seconds a join phase waits for this member: its rebalance timeout (v0 and -1:
        the session timeout), at most the longest session timeout accepted, so one
        client cannot hold its group's join phase for days."""
        ms = req.rebalance_timeout_ms if req.rebalance_timeout_ms >= 0 else req.session_timeout_ms
        return min(ms, self.max_session_timeout_ms) / 1000

    def _protocols_fit(self, group: _Group, req: JoinRequest) -> bool:
        others = [m for m in group.members.values() if m.member_id != req.member_id]
        if not others:
            return True
        if req.protocol_type != group.protocol_type:
            return False
        names: set[str] = set(others[0].protocol_names())
        for m in others[1:]:
            names &= set(m.protocol_names())
        return bool(names & {name for name, _ in req.protocols})

    def _join_new(self, now: float, group: _Group, req: JoinRequest, ticket: JoinTicket) -> None:
        if len(group.members) + len(group.pending) >= self.max_group_size:
            ticket._resolve(JoinResult(ErrorCode.group_max_size_reached))
            self._drop_if_empty(group)
            return
        member_id = self._new_member_id(req.client_id)
        if req.require_known_member_id:
            group.pending[member_id] = now + req.session_timeout_ms / 1000
            ticket._resolve(JoinResult(ErrorCode.member_id_required, member_id=member_id))
            return
        self._add_member(now, group, req, member_id, ticket)

    def _add_member(
        self, now: float, group: _Group, req: JoinRequest, member_id: str, ticket: JoinTicket
    ) -> None:
        session = req.session_timeout_ms / 1000
        rebalance = self._rebalance_timeout(req)
        member = _Member(
            member_id=member_id,
            client_id=req.client_id,
            client_host=req.client_host,
            protocol_type=req.protocol_type,
            protocols=req.protocols,
            session_timeout=session,
            rebalance_timeout=rebalance,
            deadline=now + session,
            join=ticket,
        )
        group.members[member_id] = member
        group.protocol_type = req.protocol_type
        if group.state is GroupState.PREPARING_REBALANCE:
            self._extend_rebalance(now, group, member)
            self._maybe_complete_join(now, group)
        else:
            self._prepare_rebalance(now, group)

    def _join_existing(
        self, now: float, group: _Group, member: _Member, req: JoinRequest, ticket: JoinTicket
    ) -> None:
        same = member.protocols == req.protocols
        member.protocols = req.protocols
        member.session_timeout = req.session_timeout_ms / 1000
        member.rebalance_timeout = self._rebalance_timeout(req)
        if group.state is GroupState.PREPARING_REBALANCE:
            if member.join is not None:  # a retried JoinGroup replaces the first
                member.join._resolve(JoinResult(ErrorCode.rebalance_in_progress))
            member.join = ticket
            self._extend_rebalance(now, group, member)
            self._maybe_complete_join(now, group)
        elif same and (
            group.state is GroupState.COMPLETING_REBALANCE or member.member_id != group.leader
        ):
            # A follower that lost its JoinGroup answer (or any member before the
            # leader's SyncGroup): the current generation, unchanged.
            member.deadline = now + member.session_timeout
            ticket._resolve(self._join_ok(group, member))
        else:
            # New metadata, or the leader rejoining a stable group (its view of the
            # topics may have changed): a new generation.
            member.join = ticket
            self._prepare_rebalance(now, group)

    def _prepare_rebalance(self, now: float, group: _Group) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:
            for m in group.members.values():
                if m.sync is not None:
                    m.sync._resolve(SyncResult(ErrorCode.rebalance_in_progress))
                    m.sync = None
        for m in group.members.values():
            m.assignment = b""
        group.state = GroupState.PREPARING_REBALANCE
        timeout = max((m.rebalance_timeout for m in group.members.values()), default=0.0)
        group.rebalance_deadline = now + timeout
        self._maybe_complete_join(now, group)

    def _extend_rebalance(self, now: float, group: _Group, member: _Member) -> None:
        # The join phase waits up to the longest rebalance timeout of its members.
        deadline = now + member.rebalance_timeout
        if group.rebalance_deadline is None or deadline > group.rebalance_deadline:
            group.rebalance_deadline = deadline

    def _maybe_complete_join(self, now: float, group: _Group) -> None:
        if group.state is not GroupState.PREPARING_REBALANCE or group.pending:
            return
        if all(m.join is not None for m in group.members.values()):
            self._complete_join(now, group)

    def _complete_join(self, now: float, group: _Group) -> None:
        for m in list(group.members.values()):
            if m.join is None:  # did not rejoin within the rebalance timeout
                self._remove_member(group, m, ErrorCode.unknown_member_id)
                self._expired += 1
        group.pending.clear()
        group.generation += 1
        group.rebalance_deadline = None
        if not group.members:
            group.state = GroupState.EMPTY
            group.protocol_type = group.protocol_name = group.leader = None
            return
        self._rebalances += 1
        group.protocol_name = self._select_protocol(group)
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.state = GroupState.COMPLETING_REBALANCE
        for m in group.members.values():
            ticket, m.join = m.join, None
            m.deadline = now + m.session_timeout
            if ticket is not None:
                ticket._resolve(self._join_ok(group, m))

    def _select_protocol(self, group: _Group) -> str:
        candidates = group.candidates() or set()
        votes: dict[str, int] = {}
        for m in group.members.values():
            for name in m.protocol_names():
                if name in candidates:
                    votes[name] = votes.get(name, 0) + 1
                    break
        # Most votes wins; ties go to the leader-to-be's (first member's) preference.
        first = next(iter(group.members.values()))
        order = {name: i for i, name in enumerate(first.protocol_names())}
        return max(votes, key=lambda n: (votes[n], -order.get(n, len(order))))

    def _join_ok(self, group: _Group, member: _Member) -> JoinResult:
        proto = group.protocol_name or ""
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        if member.member_id == group.leader:
            members = tuple(
                (m.member_id, None, m.metadata_for(proto)) for m in group.members.values()
            )
        return JoinResult(
            ErrorCode.none,
            generation_id=group.generation,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader=group.leader or "",
            member_id=member.member_id,
            members=members,
        )

    def _sync_ok(self, group: _Group, assignment: bytes) -> SyncResult:
        return SyncResult(
            ErrorCode.none,
            assignment=assignment,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
        )

    def _remove_member(self, group: _Group, member: _Member, error: ErrorCode) -> None:
        del group.members[member.member_id]
        if member.join is not None:
            member.join._resolve(JoinResult(error, member_id=member.member_id))
            member.join = None
        if member.sync is not None:
            member.sync._resolve(SyncResult(error))
            member.sync = None

    def _after_removal(self, now: float, group: _Group) -> None:
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            if group.members:
                self._prepare_rebalance(now, group)
            else:
                group.state = GroupState.EMPTY
                group.generation += 1
                group.protocol_type = group.protocol_name = group.leader = None
        elif group.state is GroupState.PREPARING_REBALANCE:
            if group.members:
                self._maybe_complete_join(now, group)
            elif not group.pending:
                self._complete_join(now, group)
        self._drop_if_empty(group)

    def _drop_if_empty(self, group: _Group) -> None:
        # Nothing of an empty group needs keeping: its offsets are in the store.
        if not group.members and not group.pending:
            self._groups.pop(group.group_id, None)

    def _view(self, group: _Group) -> GroupView:
        proto = group.protocol_name or ""
        return GroupView(
            group_id=group.group_id,
            state=group.state,
            generation=group.generation,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader=group.leader,
            members=tuple(
                (m.member_id, m.client_id, m.client_host, m.metadata_for(proto), m.assignment)
                for m in group.members.values()
            ),
            pending_members=len(group.pending),
        )


def _random_member_id(client_id: str) -> str:
    prefix = "".join(c for c in client_id[:_MAX_CLIENT_ID_IN_MEMBER_ID] if c.isprintable())
    return f"{prefix or 'member'}-{uuid.uuid4()}"
