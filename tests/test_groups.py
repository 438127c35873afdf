"""Consumer-group coordinator: Kafka classic-protocol semantics, driven directly with asyncio tasks."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest

from loglake.broker.groups import (
    GroupCoordinator,
    GroupState,
    InMemoryGroupStore,
    JoinResult,
    SyncResult,
)
from loglake.broker.groups import errors as E
from loglake.broker.groups.group import Group, IllegalStateTransition

T = TypeVar("T")

G = "g1"
PROTOS = [("range", b"range-meta"), ("roundrobin", b"rr-meta")]
SESSION = 5000
REBALANCE = 5000


def run(test: Callable[[], Coroutine[Any, Any, T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(test(), 10)

    return asyncio.run(bounded())


def coordinator(store: Any = None, **kw: Any) -> GroupCoordinator:
    opts: dict[str, Any] = {"initial_rebalance_delay_ms": 0, "min_session_timeout_ms": 10}
    opts.update(kw)
    return GroupCoordinator(store if store is not None else InMemoryGroupStore(), **opts)


async def join(
    c: GroupCoordinator,
    member_id: str = "",
    *,
    group: str = G,
    instance: str | None = None,
    protocols: list[tuple[str, bytes]] | None = None,
    session: int = SESSION,
    rebalance: int = REBALANCE,
    client: str = "client",
    require: bool = True,
    skip: bool = False,
) -> JoinResult:
    return await c.join_group(
        group, member_id, instance, "consumer", PROTOS if protocols is None else protocols,
        session, rebalance, client, "/127.0.0.1",
        require_known_member_id=require, supports_skip_assignment=skip,
    )


async def member_id_for(c: GroupCoordinator, client: str = "client", group: str = G) -> str:
    r = await join(c, client=client, group=group)
    assert r.error_code == E.MEMBER_ID_REQUIRED and r.member_id.startswith(client + "-")
    assert r.generation_id == -1
    return r.member_id


async def sync(
    c: GroupCoordinator, r: JoinResult, assignments: list[tuple[str, bytes]] | None = None,
    group: str = G, instance: str | None = None,
) -> SyncResult:
    return await c.sync_group(group, r.generation_id, r.member_id, instance, "consumer", r.protocol_name,
                              assignments or [])


async def stable_group(c: GroupCoordinator, n: int, **kw: Any) -> list[JoinResult]:
    """n dynamic members through MEMBER_ID_REQUIRED, join and sync; returns their JoinResults."""
    ids = [await member_id_for(c, f"c{i}") for i in range(n)]
    results = list(await asyncio.gather(*(join(c, mid, client=f"c{i}", **kw) for i, mid in enumerate(ids))))
    leader = next(r for r in results if r.leader_id == r.member_id)
    plan = [(r.member_id, f"assign-{r.member_id}".encode()) for r in results]
    syncs = await asyncio.gather(*(sync(c, r, plan if r is leader else None) for r in results))
    assert all(s.error_code == E.NONE for s in syncs)
    assert c.group_state(G) == "Stable"
    return results


async def wait_for(cond: Callable[[], bool], timeout: float = 3.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


async def heartbeat_until(c: GroupCoordinator, r: JoinResult, stop: asyncio.Event, every: float = 0.03) -> list[int]:
    codes = []
    while not stop.is_set():
        codes.append(c.heartbeat(G, r.generation_id, r.member_id, None))
        await asyncio.sleep(every)
    return codes


# ==== join / sync ==================================================================================


def test_three_members_join_leader_gets_metadata_and_sync_distributes() -> None:
    async def body() -> None:
        c = coordinator()
        ids = [await member_id_for(c, f"c{i}") for i in range(3)]
        assert c.group_state(G) == "Empty"  # pending members do not start a rebalance
        metas = [[("range", f"m{i}".encode())] for i in range(3)]
        results = await asyncio.gather(
            *(join(c, mid, client=f"c{i}", protocols=metas[i]) for i, mid in enumerate(ids))
        )
        assert {r.member_id for r in results} == set(ids)
        assert {r.generation_id for r in results} == {1}
        assert {r.protocol_name for r in results} == {"range"}
        assert {r.protocol_type for r in results} == {"consumer"}
        leaders = [r for r in results if r.leader_id == r.member_id]
        assert len(leaders) == 1 and len({r.leader_id for r in results}) == 1
        leader = leaders[0]
        assert sorted(leader.members) == sorted((ids[i], None, f"m{i}".encode()) for i in range(3))
        assert all(r.members == [] for r in results if r is not leader)
        assert c.group_state(G) == "CompletingRebalance"

        followers = [r for r in results if r is not leader]
        parked = [asyncio.ensure_future(sync(c, r)) for r in followers]
        await asyncio.sleep(0.02)
        assert not any(t.done() for t in parked)  # followers wait for the leader's assignment
        plan = [(r.member_id, r.member_id.encode()[:2] + b"!") for r in results]
        mine = await sync(c, leader, [*plan, ("stranger", b"ignored")])
        assert mine == SyncResult(E.NONE, "consumer", "range", leader.member_id.encode()[:2] + b"!")
        for r, t in zip(followers, parked, strict=True):
            assert (await t).assignment == r.member_id.encode()[:2] + b"!"
        assert c.group_state(G) == "Stable"

        # A follower re-sending SyncGroup in Stable gets its assignment again.
        again = await sync(c, followers[0])
        assert again.assignment == followers[0].member_id.encode()[:2] + b"!"
        desc = c.describe_group(G)
        assert (desc.error_code, desc.state, desc.protocol_type, desc.protocol) == (E.NONE, "Stable", "consumer", "range")
        assert {m.member_id: m.assignment for m in desc.members} == dict(plan)
        assert {m.metadata for m in desc.members} == {b"m0", b"m1", b"m2"}
        assert desc.members[0].client_host == "/127.0.0.1"
        assert c.list_groups() == [(G, "consumer", "Stable")]
        assert c.list_groups(["stable"]) == [(G, "consumer", "Stable")]
        assert c.list_groups(["Empty"]) == []

    run(body)


def test_protocol_vote_and_inconsistent_protocols() -> None:
    async def body() -> None:
        c = coordinator()
        a, b, d = [await member_id_for(c, n) for n in ("a", "b", "d")]
        results = await asyncio.gather(
            join(c, a, protocols=[("cooperative-sticky", b"1"), ("range", b"1")]),
            join(c, b, protocols=[("cooperative-sticky", b"2"), ("range", b"2")]),
            join(c, d, protocols=[("range", b"3"), ("roundrobin", b"3")]),
        )
        assert {r.protocol_name for r in results} == {"range"}  # the only one all members support
        leader = next(r for r in results if r.leader_id == r.member_id)
        assert {m[2] for m in leader.members} == {b"1", b"2", b"3"}
        # A new member supporting none of the group's protocols, or another protocol type.
        x = await join(c, protocols=[("roundrobin", b"")], require=False)
        assert (x.error_code, x.member_id) == (E.INCONSISTENT_GROUP_PROTOCOL, "")
        y = await c.join_group(G, "", None, "connect", PROTOS, SESSION, REBALANCE, "c", "h",
                               require_known_member_id=False)
        assert y.error_code == E.INCONSISTENT_GROUP_PROTOCOL
        z = await c.join_group("g2", "", None, "", PROTOS, SESSION, REBALANCE, "c", "h", require_known_member_id=False)
        assert z.error_code == E.INCONSISTENT_GROUP_PROTOCOL  # empty protocol type
        assert c.group_state("g2") is None  # a failed first join leaves no group behind

        # Votes: two members prefer "b", one "a": "b" wins; ties go to the leader's preference.
        c2 = coordinator()
        ids = [await member_id_for(c2, n, group="v") for n in ("x", "y", "z")]
        prefs = [[("a", b""), ("b", b"")], [("b", b""), ("a", b"")], [("b", b""), ("a", b"")]]
        rs = await asyncio.gather(*(join(c2, i, group="v", protocols=p) for i, p in zip(ids, prefs, strict=True)))
        assert {r.protocol_name for r in rs} == {"b"}

    run(body)


def test_join_validation_errors() -> None:
    async def body() -> None:
        c = coordinator(min_session_timeout_ms=100, max_session_timeout_ms=1000)
        assert (await join(c, group="")).error_code == E.INVALID_GROUP_ID
        assert (await join(c, session=99)).error_code == E.INVALID_SESSION_TIMEOUT
        assert (await join(c, session=1001)).error_code == E.INVALID_SESSION_TIMEOUT
        r = await join(c, "made-up-id", session=500)
        assert (r.error_code, r.member_id) == (E.UNKNOWN_MEMBER_ID, "made-up-id")  # unknown group
        assert c.group_state(G) is None
        r = await join(c, protocols=[("range", b"x" * (2 << 20))], session=500)
        assert r.error_code == E.INVALID_REQUEST  # member metadata above member_metadata_max_bytes
        # v0-3 clients (require_known_member_id=False) join directly with a generated id.
        r = await join(c, session=500, require=False, client="old")
        assert r.error_code == E.NONE and r.member_id.startswith("old-") and r.generation_id == 1

    run(body)


def test_heartbeat_during_rebalance_then_leave_gives_remaining_members_new_generation() -> None:
    async def body() -> None:
        c = coordinator()
        r0, r1, r2 = await stable_group(c, 3)
        assert c.heartbeat(G, 1, r0.member_id, None) == E.NONE
        assert c.heartbeat(G, 0, r0.member_id, None) == E.ILLEGAL_GENERATION
        assert c.heartbeat(G, 1, "nobody", None) == E.UNKNOWN_MEMBER_ID
        assert c.heartbeat("other", 1, r0.member_id, None) == E.UNKNOWN_MEMBER_ID
        assert c.heartbeat("", 1, r0.member_id, None) == E.INVALID_GROUP_ID

        err, per_member = c.leave_group(G, [(r2.member_id, None), ("ghost", None)])
        assert err == E.NONE and per_member == [(r2.member_id, None, E.NONE), ("ghost", None, E.UNKNOWN_MEMBER_ID)]
        assert c.group_state(G) == "PreparingRebalance"
        assert c.heartbeat(G, 1, r0.member_id, None) == E.REBALANCE_IN_PROGRESS
        assert c.heartbeat(G, 1, r2.member_id, None) == E.UNKNOWN_MEMBER_ID
        assert (await sync(c, r0)).error_code == E.REBALANCE_IN_PROGRESS

        n0, n1 = await asyncio.gather(join(c, r0.member_id), join(c, r1.member_id))
        assert n0.generation_id == n1.generation_id == 2
        leader = n0 if n0.leader_id == n0.member_id else n1
        assert {m[0] for m in leader.members} == {r0.member_id, r1.member_id}
        s0, s1 = await asyncio.gather(sync(c, n0, [(r0.member_id, b"p0")] if leader is n0 else None),
                                      sync(c, n1, [(r0.member_id, b"p0")] if leader is n1 else None))
        assert (s0.assignment, s1.assignment) == (b"p0", b"")  # no assignment given: empty bytes
        assert c.heartbeat(G, 2, r1.member_id, None) == E.NONE
        assert (await sync(c, r0)).error_code == E.ILLEGAL_GENERATION  # old generation

        # The last members leave: the group becomes Empty with a bumped generation.
        c.leave_group(G, [(r0.member_id, None), (r1.member_id, None)])
        assert c.group_state(G) == "Empty" and c.generation(G) == 3
        assert c.heartbeat(G, 3, r0.member_id, None) == E.UNKNOWN_MEMBER_ID
        assert c.leave_group("nope", [("m", None)]) == (E.NONE, [("m", None, E.UNKNOWN_MEMBER_ID)])

    run(body)


def test_cooperative_style_repeated_rebalances() -> None:
    """Cooperative-sticky: members rejoin right after a rebalance with new owned partitions."""

    async def body() -> None:
        c = coordinator()
        r0, r1 = await stable_group(c, 2, protocols=[("cooperative-sticky", b"owned=")])
        gen = 1
        for round_no in range(2):
            meta = f"owned={round_no}".encode()
            # Followers with unchanged metadata in Stable just get the current generation back.
            results = await asyncio.gather(*(join(c, r.member_id, protocols=[("cooperative-sticky", meta)])
                                             for r in (r0, r1)))
            gen += 1
            assert {r.generation_id for r in results} == {gen}
            leader = next(r for r in results if r.leader_id == r.member_id)
            assert {m[2] for m in leader.members} == {meta}
            plan = [(r.member_id, meta) for r in results]
            syncs = await asyncio.gather(*(sync(c, r, plan if r is leader else None) for r in results))
            assert [s.assignment for s in syncs] == [meta, meta]
        follower = r0 if r0.member_id != results[0].leader_id else r1
        same = await join(c, follower.member_id, protocols=[("cooperative-sticky", b"owned=1")])
        assert (same.error_code, same.generation_id, same.members) == (E.NONE, gen, [])
        assert c.group_state(G) == "Stable"

    run(body)


# ==== timeouts =====================================================================================


def test_session_timeout_removes_silent_member() -> None:
    async def body() -> None:
        c = coordinator()
        r0, r1 = await stable_group(c, 2, session=200)
        stop = asyncio.Event()
        beats = asyncio.ensure_future(heartbeat_until(c, r0, stop))
        await wait_for(lambda: c.group_state(G) == "PreparingRebalance")  # r1 went silent
        await wait_for(lambda: c.heartbeat(G, 1, r0.member_id, None) == E.REBALANCE_IN_PROGRESS)
        assert c.heartbeat(G, 1, r1.member_id, None) == E.UNKNOWN_MEMBER_ID
        n0 = await join(c, r0.member_id, session=200)
        assert (n0.generation_id, n0.leader_id, [m[0] for m in n0.members]) == (2, r0.member_id, [r0.member_id])
        assert (await sync(c, n0, [(r0.member_id, b"all")])).assignment == b"all"
        stop.set()
        codes = await beats
        assert set(codes) <= {E.NONE, E.REBALANCE_IN_PROGRESS, E.ILLEGAL_GENERATION}
        desc = c.describe_group(G)
        assert [m.member_id for m in desc.members] == [r0.member_id]

    run(body)


def test_member_not_rejoining_within_rebalance_timeout_is_dropped() -> None:
    async def body() -> None:
        c = coordinator()
        r0, r1 = await stable_group(c, 2, session=5000, rebalance=300)
        leader, other = (r0, r1) if r0.leader_id == r0.member_id else (r1, r0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        parked = asyncio.ensure_future(join(c, leader.member_id, rebalance=300))  # leader JoinGroup: rebalance
        await asyncio.sleep(0.05)
        assert not parked.done()
        # The other member keeps heartbeating (so its session is fine) but never rejoins.
        assert c.heartbeat(G, 1, other.member_id, None) == E.REBALANCE_IN_PROGRESS
        n = await parked
        assert loop.time() - started >= 0.25
        assert n.generation_id == 2 and [m[0] for m in n.members] == [leader.member_id]
        assert c.heartbeat(G, 1, other.member_id, None) == E.UNKNOWN_MEMBER_ID
        late = await join(c, other.member_id)
        assert late.error_code == E.UNKNOWN_MEMBER_ID

    run(body)


def test_sync_timeout_removes_members_that_never_sync() -> None:
    async def body() -> None:
        c = coordinator()
        ids = [await member_id_for(c, n) for n in ("a", "b")]
        r = await asyncio.gather(*(join(c, i, rebalance=200) for i in ids))
        leader, follower = (r[0], r[1]) if r[0].leader_id == r[0].member_id else (r[1], r[0])
        parked = asyncio.ensure_future(sync(c, follower))
        # The leader never sends SyncGroup: after the rebalance timeout it is removed and the
        # parked follower is told to rejoin.
        assert (await parked).error_code == E.REBALANCE_IN_PROGRESS
        assert c.group_state(G) == "PreparingRebalance"
        n = await join(c, follower.member_id, rebalance=200)
        assert (n.generation_id, n.leader_id) == (2, follower.member_id)
        assert c.heartbeat(G, 2, leader.member_id, None) == E.UNKNOWN_MEMBER_ID

    run(body)


def test_pending_member_that_never_returns_expires_and_blocks_join_until_then() -> None:
    async def body() -> None:
        c = coordinator()
        (r0,) = await stable_group(c, 1)
        await member_id_for(c, "flaky")  # MEMBER_ID_REQUIRED, then gone (session 200 ms below)
        r = await join(c, client="flaky2", session=200)
        assert r.error_code == E.MEMBER_ID_REQUIRED
        loop = asyncio.get_running_loop()
        started = loop.time()
        # Leader rejoins: the join phase waits for the pending members (5000 ms and 200 ms sessions)...
        parked = asyncio.ensure_future(join(c, r0.member_id, rebalance=400))
        n = await parked
        # ...until the rebalance timeout (400 ms) completes it with who joined.
        assert loop.time() - started >= 0.35
        assert n.generation_id == 2 and [m[0] for m in n.members] == [r0.member_id]
        # The expired pending member id is no longer known.
        assert (await join(c, r.member_id, session=200)).error_code == E.UNKNOWN_MEMBER_ID

    run(body)


def test_new_member_parked_too_long_is_removed() -> None:
    async def body() -> None:
        c = coordinator(new_member_join_timeout_ms=150)
        (r0,) = await stable_group(c, 1)
        # A new member triggers a rebalance that r0 never joins (rebalance timeout 5 s): the
        # newcomer is dropped after the new-member join timeout and told to start over.
        newcomer = await join(c, require=False, client="late")
        assert (newcomer.error_code, newcomer.member_id) == (E.UNKNOWN_MEMBER_ID, "")
        assert [m.member_id for m in c.describe_group(G).members] == [r0.member_id]
        assert c.heartbeat(G, 1, r0.member_id, None) == E.REBALANCE_IN_PROGRESS
        again = await join(c, r0.member_id)
        assert again.generation_id == 2

    run(body)


def test_initial_rebalance_delay_collects_members_into_one_generation() -> None:
    async def body() -> None:
        c = coordinator(initial_rebalance_delay_ms=150)
        first = asyncio.ensure_future(join(c, require=False, client="a"))
        await asyncio.sleep(0.08)
        second = asyncio.ensure_future(join(c, require=False, client="b"))
        await asyncio.sleep(0.08)
        third = asyncio.ensure_future(join(c, require=False, client="c"))
        results = await asyncio.gather(first, second, third)
        assert {r.generation_id for r in results} == {1}
        leader = next(r for r in results if r.leader_id == r.member_id)
        assert len(leader.members) == 3

    run(body)


# ==== static membership (KIP-345) ==================================================================


def test_static_member_restart_keeps_assignment_and_fences_old_id() -> None:
    async def body() -> None:
        c = coordinator()
        a, b = await asyncio.gather(join(c, instance="inst-a", client="a"), join(c, instance="inst-b", client="b"))
        assert a.error_code == b.error_code == E.NONE  # static members never get MEMBER_ID_REQUIRED
        assert a.member_id.startswith("inst-a-")
        leader = a if a.leader_id == a.member_id else b
        plan = [(a.member_id, b"A"), (b.member_id, b"B")]
        await asyncio.gather(sync(c, a, plan if leader is a else None, instance="inst-a"),
                             sync(c, b, plan if leader is b else None, instance="inst-b"))
        assert c.group_state(G) == "Stable"

        # inst-a restarts: unknown member id, same protocols -> no rebalance, same generation.
        a2 = await join(c, instance="inst-a", client="a")
        assert a2.error_code == E.NONE and a2.member_id != a.member_id
        assert a2.generation_id == 1 and c.group_state(G) == "Stable" and c.generation(G) == 1
        assert a2.members == [] and a2.leader_id == leader.member_id  # old clients: previous leader id
        s = await c.sync_group(G, 1, a2.member_id, "inst-a", "consumer", "range", [])
        assert (s.error_code, s.assignment) == (E.NONE, b"A")
        # The old incarnation is fenced everywhere.
        assert c.heartbeat(G, 1, a.member_id, "inst-a") == E.FENCED_INSTANCE_ID
        assert (await sync(c, a, instance="inst-a")).error_code == E.FENCED_INSTANCE_ID
        assert await c.commit_offsets(G, 1, a.member_id, "inst-a", [("t", 0, 5, -1, "")],
                                topic_exists=lambda t, p: True) == [("t", 0, E.FENCED_INSTANCE_ID)]
        assert (await join(c, a.member_id, instance="inst-a")).error_code == E.FENCED_INSTANCE_ID
        assert c.leave_group(G, [(a.member_id, "inst-a")])[1] == [(a.member_id, "inst-a", E.FENCED_INSTANCE_ID)]
        assert c.heartbeat(G, 1, a2.member_id, "inst-a") == E.NONE
        assert c.heartbeat(G, 1, a2.member_id, "inst-zzz") == E.UNKNOWN_MEMBER_ID
        assert c.generation(G) == 1

        # KIP-814: a v9+ static leader that restarts gets the member list but must skip assignment.
        lead_inst = "inst-a" if leader is a else "inst-b"
        l2 = await join(c, instance=lead_inst, client="x", skip=True)
        assert l2.skip_assignment and l2.leader_id == l2.member_id and len(l2.members) == 2
        assert c.group_state(G) == "Stable" and c.generation(G) == 1

        # A restart with different protocols does rebalance.
        b_id = next(m.member_id for m in c.describe_group(G).members if m.group_instance_id == "inst-b")
        a_id = next(m.member_id for m in c.describe_group(G).members if m.group_instance_id == "inst-a")
        changed, other = await asyncio.gather(
            join(c, instance="inst-b", protocols=[("roundrobin", b"new")]),  # changes the group's protocol
            join(c, a_id, instance="inst-a"),
        )
        assert changed.member_id != b_id and changed.generation_id == other.generation_id == 2
        assert changed.protocol_name == "roundrobin"

        # Admin removal by instance id (member id "").
        err, res = c.leave_group(G, [("", "inst-b"), ("", "inst-none")])
        assert err == E.NONE and res == [("", "inst-b", E.NONE), ("", "inst-none", E.UNKNOWN_MEMBER_ID)]
        assert c.group_state(G) == "PreparingRebalance"

    run(body)


def test_static_member_rejoining_while_old_one_is_parked_fences_it() -> None:
    async def body() -> None:
        c = coordinator()
        a, b, d = await asyncio.gather(
            join(c, instance="i", client="a"), join(c, require=False, client="b"), join(c, require=False, client="d")
        )
        leader = next(r for r in (a, b, d) if r.leader_id == r.member_id)
        await asyncio.gather(*(sync(c, r, [] if r is leader else None, instance="i" if r is a else None)
                               for r in (a, b, d)))
        assert c.group_state(G) == "Stable"
        # b changes its subscription: rebalance; the old incarnation of "i" rejoins and parks...
        parked_b = asyncio.ensure_future(join(c, b.member_id, protocols=[("range", b"v2")]))
        parked_old = asyncio.ensure_future(join(c, a.member_id, instance="i"))
        await asyncio.sleep(0.01)
        assert not parked_old.done()
        # ...then "i" restarts under a new member id: the parked old request is fenced.
        new = asyncio.ensure_future(join(c, instance="i", client="a"))
        assert (await parked_old).error_code == E.FENCED_INSTANCE_ID
        rd = await join(c, d.member_id)
        res, rb = await asyncio.gather(new, parked_b)
        assert res.error_code == E.NONE and res.generation_id == rb.generation_id == rd.generation_id == 2
        leader_view = next(r for r in (res, rb, rd) if r.members)
        assert {m[0] for m in leader_view.members} == {res.member_id, b.member_id, d.member_id}

    run(body)


# ==== limits =======================================================================================


def test_group_max_size() -> None:
    async def body() -> None:
        c = coordinator(group_max_size=2)
        await stable_group(c, 2)
        r = await join(c, require=False, client="third")
        assert (r.error_code, r.member_id) == (E.GROUP_MAX_SIZE_REACHED, "")
        assert c.group_state(G) == "Stable" and len(c.describe_group(G).members) == 2
        c2 = coordinator(max_groups=1)
        assert (await join(c2, require=True, group="one")).error_code == E.MEMBER_ID_REQUIRED
        assert (await join(c2, require=True, group="two")).error_code == E.UNKNOWN_SERVER_ERROR

    run(body)


# ==== offsets ======================================================================================


def exists(topic: str, partition: int) -> bool:
    return topic != "missing" and partition < 4


def test_offset_commit_errors_and_simple_commits() -> None:
    async def body() -> None:
        store = InMemoryGroupStore()
        c = coordinator(store, offset_metadata_max_bytes=10)
        # Simple (standalone) commit to an unknown group creates an Empty group with offsets.
        res = await c.commit_offsets("simple", -1, "", None,
                               [("t", 0, 42, 3, "meta"), ("missing", 0, 1, -1, None), ("t", 1, 7, -1, "x" * 11)],
                               topic_exists=exists)
        assert res == [("t", 0, E.NONE), ("missing", 0, E.UNKNOWN_TOPIC_OR_PARTITION),
                       ("t", 1, E.OFFSET_METADATA_TOO_LARGE)]
        assert store.count("commit") == 1
        assert c.list_groups() == [("simple", "", "Empty")]
        assert c.fetch_offsets("simple", [("t", 0), ("t", 1)]) == (
            E.NONE, [("t", 0, 42, 3, "meta", E.NONE), ("t", 1, -1, -1, "", E.NONE)])
        assert c.fetch_offsets("unknown", None) == (E.NONE, [])
        assert await c.commit_offsets("ghost", 3, "m", None, [("t", 0, 1, -1, "")], topic_exists=exists) == [
            ("t", 0, E.ILLEGAL_GENERATION)]
        assert await c.commit_offsets("ghost", -1, "", None, [("missing", 0, 1, -1, "")], topic_exists=exists) == [
            ("missing", 0, E.UNKNOWN_TOPIC_OR_PARTITION)]
        assert await c.commit_offsets("ghost", -1, "m", None, [("missing", 0, 1, -1, "")], topic_exists=exists) == [
            ("missing", 0, E.UNKNOWN_TOPIC_OR_PARTITION)]
        assert c.group_state("ghost") is None
        # Kafka 4.0: a negative generation with a (client-generated) member id is a simple commit too.
        assert await c.commit_offsets("ghost", -1, "m", None, [("t", 0, 1, -1, "")], topic_exists=exists) == [
            ("t", 0, E.NONE)]
        assert c.group_state("ghost") == "Empty"

        r0, r1 = await stable_group(c, 2)
        ok = await c.commit_offsets(G, 1, r0.member_id, None, [("t", 2, 100, 1, "")], topic_exists=exists)
        assert ok == [("t", 2, E.NONE)]
        assert await c.commit_offsets(G, 0, r0.member_id, None, [("t", 2, 1, -1, "")], topic_exists=exists) == [
            ("t", 2, E.ILLEGAL_GENERATION)]
        assert await c.commit_offsets(G, 1, "stranger", None, [("t", 2, 1, -1, "")], topic_exists=exists) == [
            ("t", 2, E.UNKNOWN_MEMBER_ID)]
        # Simple commits into a group with members are refused.
        assert await c.commit_offsets(G, -1, "", None, [("t", 2, 1, -1, "")], topic_exists=exists) == [
            ("t", 2, E.UNKNOWN_MEMBER_ID)]
        # While PreparingRebalance commits are allowed; while CompletingRebalance they are not.
        leader, follower = (r0, r1) if r0.leader_id == r0.member_id else (r1, r0)
        parked = asyncio.ensure_future(join(c, leader.member_id))  # a leader JoinGroup forces a rebalance
        await asyncio.sleep(0.01)
        assert c.group_state(G) == "PreparingRebalance"
        assert await c.commit_offsets(G, 1, follower.member_id, None, [("t", 3, 9, -1, "")], topic_exists=exists) == [
            ("t", 3, E.NONE)]
        n = await join(c, follower.member_id)
        await parked
        assert c.group_state(G) == "CompletingRebalance"
        assert await c.commit_offsets(G, n.generation_id, n.member_id, None, [("t", 3, 10, -1, "")],
                                topic_exists=exists) == [("t", 3, E.REBALANCE_IN_PROGRESS)]
        assert [o[:3] for o in c.fetch_offsets(G, None)[1]] == [("t", 2, 100), ("t", 3, 9)]

        # A failing store: nothing applied, retriable error.
        store.fail = OSError("disk full")
        assert await c.commit_offsets("simple", -1, "", None, [("t", 0, 43, -1, "")], topic_exists=exists) == [
            ("t", 0, E.COORDINATOR_NOT_AVAILABLE)]
        assert c.fetch_offsets("simple", [("t", 0)])[1][0][2] == 42
        assert await c.commit_offsets("fresh", -1, "", None, [("t", 0, 1, -1, "")], topic_exists=exists) == [
            ("t", 0, E.COORDINATOR_NOT_AVAILABLE)]
        assert c.group_state("fresh") is None

    run(body)


def test_offset_retention_expires_empty_groups_only() -> None:
    async def body() -> None:
        now = [1000.0]
        c = coordinator(clock=lambda: now[0], offsets_retention_ms=60_000)
        await c.commit_offsets("idle", -1, "", None, [("t", 0, 1, -1, "")], topic_exists=exists)
        (r,) = await stable_group(c, 1)
        await c.commit_offsets(G, 1, r.member_id, None, [("t", 0, 1, -1, "")], topic_exists=exists)
        now[0] += 30
        assert await c.cleanup_expired() == 0
        now[0] += 31
        assert await c.cleanup_expired() == 1  # "idle" expired and was removed; the active group kept its offset
        assert c.group_state("idle") is None and c.fetch_offsets(G, None)[1][0][2] == 1

    run(body)


# ==== lifecycle and state table ====================================================================


def test_close_answers_parked_requests_and_refuses_new_ones() -> None:
    async def body() -> None:
        c = coordinator()
        r0, r1 = await stable_group(c, 2)
        parked = asyncio.ensure_future(join(c, r0.member_id, protocols=[("range", b"changed")]))
        await asyncio.sleep(0.01)
        c.close()
        assert (await parked).error_code == E.NOT_COORDINATOR
        assert (await join(c)).error_code == E.COORDINATOR_NOT_AVAILABLE
        assert c.heartbeat(G, 1, r1.member_id, None) == E.COORDINATOR_NOT_AVAILABLE
        assert (await sync(c, r1)).error_code == E.COORDINATOR_NOT_AVAILABLE
        assert c.fetch_offsets(G, None) == (E.COORDINATOR_NOT_AVAILABLE, [])
        assert await c.delete_groups([G]) == [(G, E.COORDINATOR_NOT_AVAILABLE)]
        assert c.describe_group(G).error_code == E.COORDINATOR_NOT_AVAILABLE

    run(body)


def test_transition_table_refuses_illegal_moves() -> None:
    g = Group("x", 0)
    with pytest.raises(IllegalStateTransition):
        g.transition_to(GroupState.STABLE, 0)
    g.transition_to(GroupState.PREPARING_REBALANCE, 0)
    g.transition_to(GroupState.COMPLETING_REBALANCE, 0)
    with pytest.raises(IllegalStateTransition):
        g.transition_to(GroupState.EMPTY, 0)
    g.transition_to(GroupState.STABLE, 0)
    g.transition_to(GroupState.DEAD, 0)
    assert g.state is GroupState.DEAD


def test_describe_unknown_and_rebalancing_groups() -> None:
    async def body() -> None:
        c = coordinator()
        d = c.describe_group("nope")
        assert (d.error_code, d.state, d.members) == (E.NONE, "Dead", [])
        r0, _r1 = await stable_group(c, 2)
        parked: Awaitable[JoinResult] = asyncio.ensure_future(join(c, r0.member_id, protocols=[("range", b"v2")]))
        await asyncio.sleep(0.01)
        d = c.describe_group(G)
        assert (d.state, d.protocol) == ("PreparingRebalance", "")
        assert all(m.metadata == b"" and m.assignment == b"" for m in d.members)
        assert c.list_groups(["preparingrebalance", "stable"]) == [(G, "consumer", "PreparingRebalance")]
        c.close()
        await parked

    run(body)
