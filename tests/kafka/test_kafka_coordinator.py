"""The sans-IO consumer-group coordinator: join/sync/heartbeat/leave, timeouts, fencing.

Time is a number the tests pass in; nothing sleeps.
"""

from __future__ import annotations

import itertools

import pytest
from kio.schema.errors import ErrorCode

from edge_gateway.kafka._coordinator import (
    GroupCoordinator,
    GroupState,
    JoinRequest,
    JoinResult,
    JoinTicket,
    SyncResult,
    SyncTicket,
)

G = "g1"


def coordinator(**kw: int) -> GroupCoordinator:
    ids = itertools.count(1)
    return GroupCoordinator(new_member_id=lambda cid: f"{cid or 'm'}-{next(ids)}", **kw)


def req(
    member_id: str = "",
    *,
    protocols: tuple[tuple[str, bytes], ...] = (("range", b"meta"),),
    session_ms: int = 10_000,
    rebalance_ms: int = 30_000,
    v4: bool = False,
    group: str = G,
    client_id: str = "c",
    protocol_type: str = "consumer",
    instance: str | None = None,
) -> JoinRequest:
    return JoinRequest(
        group_id=group,
        member_id=member_id,
        protocol_type=protocol_type,
        protocols=protocols,
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=rebalance_ms,
        client_id=client_id,
        require_known_member_id=v4,
        group_instance_id=instance,
    )


def done(ticket: JoinTicket) -> JoinResult:
    assert ticket.result is not None, "join still pending"
    return ticket.result


def sdone(ticket: SyncTicket) -> SyncResult:
    assert ticket.result is not None, "sync still pending"
    return ticket.result


def stable_pair(c: GroupCoordinator, now: float = 0.0) -> tuple[str, str, int]:
    """Two members in a stable group: (leader, follower, generation)."""
    a = done(c.join(now, req()))
    assert a.error is ErrorCode.none
    assert sdone(c.sync(now, G, a.generation_id, a.member_id, [(a.member_id, b"A")])).error is (
        ErrorCode.none
    )
    tb = c.join(now, req())  # a second member: a rebalance the first must join
    assert tb.result is None
    assert c.heartbeat(now, G, a.generation_id, a.member_id) is ErrorCode.rebalance_in_progress
    ta = c.join(now, req(a.member_id))
    ra, rb = done(ta), done(tb)
    assert ra.generation_id == rb.generation_id == a.generation_id + 1
    assert ra.leader == rb.leader == a.member_id
    s_b = c.sync(now, G, rb.generation_id, rb.member_id)
    assert s_b.result is None
    s_a = c.sync(
        now, G, ra.generation_id, ra.member_id, [(ra.member_id, b"A"), (rb.member_id, b"B")]
    )
    assert sdone(s_a).assignment == b"A"
    assert sdone(s_b).assignment == b"B"
    return ra.member_id, rb.member_id, ra.generation_id


def test_single_member_joins_syncs_and_heartbeats() -> None:
    c = coordinator()
    r = done(c.join(0.0, req()))
    assert r.error is ErrorCode.none
    assert r.generation_id == 1
    assert r.leader == r.member_id
    assert r.protocol_name == "range"
    assert r.protocol_type == "consumer"
    assert r.members == ((r.member_id, None, b"meta"),)
    assert c.describe(G) is not None
    assert c.describe(G).state is GroupState.COMPLETING_REBALANCE  # type: ignore[union-attr]
    assert c.heartbeat(1.0, G, 1, r.member_id) is ErrorCode.none
    s = sdone(c.sync(1.0, G, 1, r.member_id, [(r.member_id, b"plan")]))
    assert (s.error, s.assignment, s.protocol_name) == (ErrorCode.none, b"plan", "range")
    assert c.describe(G).state is GroupState.STABLE  # type: ignore[union-attr]
    # A retried SyncGroup in a stable group answers the same assignment.
    assert sdone(c.sync(2.0, G, 1, r.member_id)).assignment == b"plan"


def test_member_id_required_dance_v4() -> None:
    c = coordinator()
    first = done(c.join(0.0, req(v4=True)))
    assert first.error is ErrorCode.member_id_required
    assert first.member_id
    assert c.statistics().pending_members == 1
    second = done(c.join(0.1, req(first.member_id, v4=True)))
    assert second.error is ErrorCode.none
    assert second.member_id == first.member_id
    assert c.statistics().pending_members == 0


def test_pending_member_id_expires_after_session_timeout() -> None:
    c = coordinator()
    first = done(c.join(0.0, req(v4=True, session_ms=5_000)))
    assert c.next_deadline() == pytest.approx(5.0)
    c.tick(4.9)
    assert c.statistics().pending_members == 1
    c.tick(5.0)
    assert c.statistics().groups == 0
    assert done(c.join(5.1, req(first.member_id, v4=True))).error is ErrorCode.unknown_member_id


def test_pending_member_holds_the_join_phase_until_it_joins() -> None:
    c = coordinator()
    a = done(c.join(0.0, req()))
    c.sync(0.0, G, 1, a.member_id, [])
    pend = done(c.join(1.0, req(v4=True)))
    assert pend.error is ErrorCode.member_id_required
    # The group is stable still: a pending id alone does not start a rebalance...
    ta = c.join(1.0, req(a.member_id))  # ...but the leader rejoining does,
    assert ta.result is None  # and the phase waits for the pending member too.
    tb = c.join(1.5, req(pend.member_id, v4=True))
    assert done(ta).generation_id == done(tb).generation_id == 2


def test_unknown_member_id_is_refused() -> None:
    c = coordinator()
    done(c.join(0.0, req()))
    assert done(c.join(0.0, req("nobody"))).error is ErrorCode.unknown_member_id
    assert c.heartbeat(0.0, G, 1, "nobody") is ErrorCode.unknown_member_id
    assert sdone(c.sync(0.0, G, 1, "nobody")).error is ErrorCode.unknown_member_id
    assert c.heartbeat(0.0, "other", 1, "nobody") is ErrorCode.unknown_member_id
    assert c.leave(0.0, G, ["nobody"]) == [ErrorCode.unknown_member_id]
    assert c.leave(0.0, "other", ["nobody"]) == [ErrorCode.unknown_member_id]


def test_second_member_rebalances_and_leader_hands_out_assignments() -> None:
    c = coordinator()
    leader, follower, gen = stable_pair(c)
    assert gen == 2
    view = c.describe(G)
    assert view is not None
    assert view.state is GroupState.STABLE
    assert [m[0] for m in view.members] == [leader, follower]
    assert [m[4] for m in view.members] == [b"A", b"B"]
    assert c.statistics().rebalances_total == 2


def test_only_the_leader_gets_the_member_list() -> None:
    c = coordinator()
    a = done(c.join(0.0, req()))
    tb = c.join(0.0, req(protocols=(("range", b"mb"),)))
    ta = c.join(0.0, req(a.member_id, protocols=(("range", b"ma"),)))
    ra, rb = done(ta), done(tb)
    assert ra.members == ((ra.member_id, None, b"ma"), (rb.member_id, None, b"mb"))
    assert rb.members == ()


def test_illegal_generation_is_fenced() -> None:
    c = coordinator()
    _leader, follower, gen = stable_pair(c)
    assert c.heartbeat(0.0, G, gen - 1, follower) is ErrorCode.illegal_generation
    assert sdone(c.sync(0.0, G, gen + 1, follower)).error is ErrorCode.illegal_generation
    assert c.check_commit(G, gen - 1, follower) is ErrorCode.illegal_generation
    assert c.check_commit(G, gen, follower) is ErrorCode.none
    assert c.check_commit(G, gen, "stranger") is ErrorCode.unknown_member_id


def test_leave_starts_a_rebalance_for_the_rest() -> None:
    c = coordinator()
    leader, follower, gen = stable_pair(c)
    assert c.leave(1.0, G, [leader]) == [ErrorCode.none]
    assert c.heartbeat(1.0, G, gen, follower) is ErrorCode.rebalance_in_progress
    # Committing the current generation is still allowed while preparing (Kafka's rule:
    # a consumer commits what it has before rejoining).
    assert c.check_commit(G, gen, follower) is ErrorCode.none
    r = done(c.join(1.0, req(follower)))
    assert r.generation_id == gen + 1
    assert r.leader == follower
    assert r.members == ((follower, None, b"meta"),)


def test_last_member_leaving_drops_the_group() -> None:
    c = coordinator()
    r = done(c.join(0.0, req()))
    assert c.leave(0.0, G, [r.member_id]) == [ErrorCode.none]
    assert c.statistics().groups == 0
    assert c.describe(G) is None
    # Simple (generation -1) commits are allowed again.
    assert c.check_commit(G, -1, "") is ErrorCode.none


def test_simple_commit_refused_while_the_group_has_members() -> None:
    c = coordinator()
    assert c.check_commit(G, -1, "") is ErrorCode.none
    done(c.join(0.0, req()))
    assert c.check_commit(G, -1, "") is ErrorCode.rebalance_in_progress
    r = c.describe(G)
    assert r is not None
    c.sync(0.0, G, r.generation, r.leader or "", [])
    assert c.check_commit(G, -1, "") is ErrorCode.unknown_member_id


def test_commit_refused_while_completing_rebalance() -> None:
    c = coordinator()
    r = done(c.join(0.0, req()))
    assert c.check_commit(G, r.generation_id, r.member_id) is ErrorCode.rebalance_in_progress


def test_session_timeout_evicts_a_silent_member() -> None:
    c = coordinator()
    leader, follower, gen = stable_pair(c)
    # The leader heartbeats, the follower is silent.
    for t in (3.0, 6.0, 9.0, 12.0, 15.0, 18.0):
        c.tick(t)
        assert c.heartbeat(t, G, gen, leader) is ErrorCode.none
        if t == 9.0:
            c.tick(9.99)
            assert c.heartbeat(9.99, G, gen, follower) is ErrorCode.none  # just in time
    c.tick(19.98)
    assert c.describe(G).state is GroupState.STABLE  # type: ignore[union-attr]
    c.tick(20.0)  # the follower's session (10 s from 9.99) has ended
    assert c.heartbeat(20.0, G, gen, follower) is ErrorCode.unknown_member_id
    assert c.heartbeat(20.0, G, gen, leader) is ErrorCode.rebalance_in_progress
    assert c.statistics().expired_members_total == 1
    r = done(c.join(20.0, req(leader)))
    assert r.members == ((leader, None, b"meta"),)


def test_rebalance_timeout_drops_members_that_do_not_rejoin() -> None:
    c = coordinator()
    leader, follower, gen = stable_pair(c)
    tc = c.join(1.0, req())  # a third member: the others must rejoin within 30 s
    tl = c.join(2.0, req(leader))
    # The follower keeps heartbeating (so its session lives) but never rejoins.
    for t in range(3, 31, 3):
        c.tick(float(t))
        assert c.heartbeat(float(t), G, gen, follower) is ErrorCode.rebalance_in_progress
    assert tc.result is None
    deadline = c.next_deadline()
    assert deadline is not None
    assert deadline <= 32.0
    c.tick(32.0)  # the rebalance timeout (30 s from the first join at 1.0, extended at 2.0)
    rl, rc = done(tl), done(tc)
    assert rl.generation_id == rc.generation_id == gen + 1
    assert {m[0] for m in rl.members} == {leader, rc.member_id}
    assert c.heartbeat(32.0, G, gen + 1, follower) is ErrorCode.unknown_member_id


def test_member_waiting_in_join_is_not_expired() -> None:
    c = coordinator()
    leader, follower, gen = stable_pair(c)
    tl = c.join(1.0, req(leader, session_ms=2_000))  # waits for the follower
    for t in range(2, 26, 2):  # the follower heartbeats (its session lives), not rejoining yet
        c.tick(float(t))
        assert c.heartbeat(float(t), G, gen, follower) is ErrorCode.rebalance_in_progress
    # Far past the leader's 2 s session: it is held by its pending join.
    assert tl.result is None
    assert c.describe(G) is not None
    tf = c.join(26.0, req(follower))
    assert done(tl).error is ErrorCode.none
    assert done(tf).error is ErrorCode.none


def test_leader_that_never_syncs_expires_and_followers_rebalance() -> None:
    c = coordinator()
    a = done(c.join(0.0, req(session_ms=5_000)))
    c.sync(0.0, G, 1, a.member_id, [])
    tb = c.join(1.0, req(session_ms=60_000))
    ta = c.join(1.0, req(a.member_id, session_ms=5_000))
    ra, rb = done(ta), done(tb)
    sb = c.sync(1.0, G, rb.generation_id, rb.member_id)
    assert sb.result is None
    c.tick(6.0)  # the leader (5 s) never sent its SyncGroup
    assert sdone(sb).error is ErrorCode.rebalance_in_progress
    r = done(c.join(6.0, req(rb.member_id, session_ms=60_000)))
    assert r.leader == rb.member_id
    assert ra.member_id not in {m[0] for m in r.members}


def test_sync_during_rebalance_and_leave_during_sync() -> None:
    c = coordinator()
    leader, follower, gen = stable_pair(c)
    tl = c.join(0.0, req(leader, protocols=(("range", b"new"),)))  # new metadata → rebalance
    assert tl.result is None
    assert sdone(c.sync(0.0, G, gen, follower)).error is ErrorCode.rebalance_in_progress
    tf = c.join(0.0, req(follower))
    gen2 = done(tf).generation_id
    sf = c.sync(0.0, G, gen2, follower)
    assert c.leave(0.0, G, [leader]) == [ErrorCode.none]
    assert sdone(sf).error is ErrorCode.rebalance_in_progress


def test_inconsistent_protocols_are_refused() -> None:
    c = coordinator()
    done(c.join(0.0, req(protocols=(("range", b""), ("roundrobin", b"")))))
    bad = done(c.join(0.0, req(protocols=(("sticky", b""),))))
    assert bad.error is ErrorCode.inconsistent_group_protocol
    other_type = done(c.join(0.0, req(protocol_type="connect")))
    assert other_type.error is ErrorCode.inconsistent_group_protocol
    assert done(c.join(0.0, req(protocols=()))).error is ErrorCode.inconsistent_group_protocol


def test_protocol_vote_picks_what_most_members_prefer() -> None:
    c = coordinator()
    a = done(c.join(0.0, req(protocols=(("range", b"1"), ("roundrobin", b"2")))))
    tb = c.join(0.0, req(protocols=(("roundrobin", b"3"), ("range", b"4"))))
    tc = c.join(0.0, req(protocols=(("roundrobin", b"5"), ("range", b"6"))))
    ta = c.join(0.0, req(a.member_id, protocols=(("range", b"1"), ("roundrobin", b"2"))))
    ra = done(ta)
    assert ra.protocol_name == done(tb).protocol_name == done(tc).protocol_name == "roundrobin"
    assert [m[2] for m in ra.members] == [b"2", b"3", b"5"]
    s = sdone(c.sync(0.0, G, ra.generation_id, ra.member_id, [], protocol_name="range"))
    assert s.error is ErrorCode.inconsistent_group_protocol


def test_bad_session_timeout_group_name_and_static_membership() -> None:
    c = coordinator(min_session_timeout_ms=6_000)
    assert done(c.join(0.0, req(session_ms=5_999))).error is ErrorCode.invalid_session_timeout
    assert done(c.join(0.0, req(session_ms=1_800_001))).error is ErrorCode.invalid_session_timeout
    assert done(c.join(0.0, req(group=""))).error is ErrorCode.invalid_group_id
    assert done(c.join(0.0, req(group="a/b"))).error is ErrorCode.invalid_group_id
    assert done(c.join(0.0, req(instance="host-1"))).error is ErrorCode.invalid_request
    assert c.statistics().groups == 0


def test_group_size_is_bounded() -> None:
    c = coordinator(max_group_size=2)
    done(c.join(0.0, req(v4=True)))
    done(c.join(0.0, req(v4=True)))
    assert done(c.join(0.0, req(v4=True))).error is ErrorCode.group_max_size_reached


def test_rebalance_timeout_is_capped_at_the_longest_session() -> None:
    c = coordinator(max_session_timeout_ms=60_000)
    leader, follower, _gen = stable_pair(c)
    tl = c.join(0.0, req(leader, rebalance_ms=2**31 - 1))  # "wait 24 days for the others"
    for t in range(5, 60, 5):  # the follower stays alive but never rejoins
        c.heartbeat(float(t), G, _gen, follower)
        c.tick(float(t))
    assert tl.result is None
    c.tick(60.0)
    assert done(tl).members == ((leader, None, b"meta"),)


def test_number_of_groups_is_bounded() -> None:
    c = coordinator(max_groups=2)
    done(c.join(0.0, req(group="a", v4=True)))
    done(c.join(0.0, req(group="b")))
    assert done(c.join(0.0, req(group="c"))).error is ErrorCode.coordinator_not_available
    assert c.statistics().groups == 2
    c.tick(11.0)  # a's pending id and b's member expire: room again
    assert done(c.join(11.0, req(group="c"))).error is ErrorCode.none


def test_follower_rejoin_with_same_metadata_gets_current_generation() -> None:
    c = coordinator()
    leader, follower, gen = stable_pair(c)
    r = done(c.join(0.0, req(follower)))
    assert (r.error, r.generation_id, r.leader) == (ErrorCode.none, gen, leader)
    assert c.describe(G).state is GroupState.STABLE  # type: ignore[union-attr]


def test_retried_join_replaces_the_first_ticket() -> None:
    c = coordinator()
    leader, follower, gen = stable_pair(c)
    t1 = c.join(0.0, req(leader))
    t2 = c.join(0.0, req(leader))
    assert done(t1).error is ErrorCode.rebalance_in_progress
    assert t2.result is None
    c.join(0.0, req(follower))
    assert done(t2).generation_id == gen + 1


def test_leave_of_a_member_waiting_in_join_resolves_its_ticket() -> None:
    c = coordinator()
    leader, follower, _gen = stable_pair(c)
    tl = c.join(0.0, req(leader))
    assert c.leave(0.0, G, [leader]) == [ErrorCode.none]
    assert done(tl).error is ErrorCode.unknown_member_id
    # The follower alone completes the next generation at once.
    r = done(c.join(0.0, req(follower)))
    assert r.leader == follower


def test_all_members_expire_group_disappears_and_restarts_at_generation_one() -> None:
    c = coordinator()
    _leader, _follower, _gen = stable_pair(c)
    c.tick(100.0)
    assert c.statistics().groups == 0
    assert c.next_deadline() is None
    r = done(c.join(100.0, req()))
    assert r.generation_id == 1


@pytest.mark.parametrize("seed", [23, 7, 2026])
def test_every_ticket_gets_exactly_one_result(seed: int) -> None:
    """A random walk of requests and ticks: invariants hold; no ticket is left pending."""
    import random

    rnd = random.Random(seed)
    c = coordinator()
    tickets: list[JoinTicket | SyncTicket] = []
    known: list[str] = []
    now = 0.0
    last_gen = 0
    for _ in range(3000):
        now += rnd.choice((0.0, 0.1, 1.0, 7.0))
        op = rnd.randrange(6)
        if op == 0:
            t = c.join(now, req(rnd.choice([*known, ""]), v4=rnd.random() < 0.5, session_ms=8_000))
            tickets.append(t)
            if t.result is not None and t.result.member_id:
                known.append(t.result.member_id)
        elif op == 1 and known:
            view = c.describe(G)
            gen = view.generation if view else 0
            mid = rnd.choice(known)
            tickets.append(c.sync(now, G, gen, mid, [(mid, b"x")]))
        elif op == 2 and known:
            view = c.describe(G)
            c.heartbeat(now, G, view.generation if view else 0, rnd.choice(known))
        elif op == 3 and known:
            c.leave(now, G, [rnd.choice(known)])
        else:
            c.tick(now)
        view = c.describe(G)
        if view is None:
            last_gen = 0
            continue
        # The generation only grows while the group exists; a settled group has a leader
        # among its members; a member is listed once.
        assert view.generation >= last_gen
        last_gen = view.generation
        ids = [m[0] for m in view.members]
        assert len(ids) == len(set(ids))
        if view.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            assert view.leader in ids
    # Everyone stops talking: after the longest timeout, every ticket has its answer.
    c.tick(now + 31.0)
    c.tick(now + 62.0)
    assert all(t.result is not None for t in tickets)
    assert c.statistics().groups == 0
