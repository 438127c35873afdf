"""The KIP-848 consumer group protocol in the coordinator: assignors, reconciliation, heartbeats, errors,
persistence, offsets and migration between the classic and consumer protocols.

Runs the real coordinator with an in-memory store and a topic catalog held in a dict.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from loglake.broker.config import BrokerConfig
from loglake.broker.groups import GroupCoordinator, InMemoryGroupStore
from loglake.broker.groups import errors as E
from loglake.broker.groups.assignors import range_assign, uniform_assign
from loglake.broker.groups.consumer import HeartbeatRequest, HeartbeatResult
from loglake.broker.groups.limits import ConsumerLimits
from loglake.broker.groups.topic_regex import compile_subscription
from loglake.errors import ConfigError

G = "cg"
T1 = "a" * 32  # topic ids
T2 = "b" * 32
T3 = "c" * 32
FAST = ConsumerLimits(
    session_timeout_ms=200, min_session_timeout_ms=50, heartbeat_interval_ms=50, min_heartbeat_interval_ms=10,
    max_size=3,
)


def run(fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(fn())  # type: ignore[arg-type]


class World:
    """A coordinator, its store and the topics that exist."""

    def __init__(self, store: InMemoryGroupStore | None = None, limits: ConsumerLimits = FAST, **kw: Any) -> None:
        self.topics: dict[str, tuple[str, int]] = {"t1": (T1, 6), "t2": (T2, 3)}
        self.store = store or InMemoryGroupStore()
        self.overrides: dict[str, dict[str, int]] = {}
        self.c = GroupCoordinator(
            self.store, consumer_limits=limits, topic_catalog=lambda: dict(self.topics),
            group_overrides=lambda g: self.overrides.get(g, {}), initial_rebalance_delay_ms=0,
            min_session_timeout_ms=10, **kw,
        )

    async def hb(self, member: str, epoch: int, owned: dict[str, list[int]] | None = None, **kw: Any) -> HeartbeatResult:
        req = HeartbeatRequest(
            group_id=kw.pop("group", G), member_id=member, member_epoch=epoch,
            owned=None if owned is None else list(owned.items()), **kw,
        )
        return await self.c.consumer_heartbeat(req)

    async def join(self, member: str, topics: list[str] | None = None, **kw: Any) -> HeartbeatResult:
        kw.setdefault("rebalance_timeout_ms", 60_000)
        if "subscribed_regex" not in kw:
            kw["subscribed_names"] = topics if topics is not None else ["t1"]
        return await self.hb(member, 0, **kw)


def parts(result: HeartbeatResult, tid: str = T1) -> list[int]:
    assert result.assignment is not None
    return sorted(result.assignment.get(tid, ()))


def owned_of(result: HeartbeatResult) -> dict[str, list[int]]:
    assert result.assignment is not None
    return {t: sorted(p) for t, p in result.assignment.items()}


# ---- assignors ------------------------------------------------------------------------------------


def test_uniform_is_balanced_and_sticky() -> None:
    topics = {T1: ("t1", 6), T2: ("t2", 3)}
    subs = {m: frozenset({T1, T2}) for m in ("m1", "m2")}
    first = uniform_assign(subs, topics, {})
    assert sorted(sum(len(p) for p in a.values()) for a in first.values()) == [4, 5]
    subs3 = {**subs, "m3": frozenset({T1, T2})}
    second = uniform_assign(subs3, topics, first)
    assert sorted(sum(len(p) for p in a.values()) for a in second.values()) == [3, 3, 3]
    for m in ("m1", "m2"):  # only partitions of overloaded members moved: the rest stayed put
        for tid, kept in second[m].items():
            assert kept <= first[m].get(tid, frozenset())
    every = sorted((t, p) for a in second.values() for t, ps in a.items() for p in ps)
    assert every == sorted([(T1, p) for p in range(6)] + [(T2, p) for p in range(3)])


def test_uniform_respects_heterogeneous_subscriptions() -> None:
    topics = {T1: ("t1", 4), T2: ("t2", 4)}
    out = uniform_assign({"m1": frozenset({T1}), "m2": frozenset({T1, T2})}, topics, {})
    assert set(out["m1"]) == {T1}
    assert len(out["m1"][T1]) + len(out["m2"].get(T1, ())) == 4 and len(out["m2"][T2]) == 4


def test_range_gives_consecutive_ranges_per_topic() -> None:
    topics = {T1: ("t1", 5), T2: ("t2", 2)}
    out = range_assign({m: frozenset({T1, T2}) for m in ("b", "a")}, topics)
    assert out["a"] == {T1: frozenset({0, 1, 2}), T2: frozenset({0})}
    assert out["b"] == {T1: frozenset({3, 4}), T2: frozenset({1})}


# ---- reconciliation -------------------------------------------------------------------------------


def test_partition_moves_only_after_the_owner_revoked_it() -> None:
    async def body() -> None:
        w = World()
        a = await w.join("A")
        assert (a.error_code, a.member_epoch, parts(a)) == (E.NONE, 1, [0, 1, 2, 3, 4, 5])
        b = await w.join("B")
        assert b.error_code == E.NONE and b.member_epoch == 2 and parts(b) == []  # waits: A still owns them
        a2 = await w.hb("A", 1, {T1: [0, 1, 2, 3, 4, 5]})
        assert a2.member_epoch == 1 and len(parts(a2)) == 3  # must revoke first, epoch unchanged
        kept = parts(a2)
        b2 = await w.hb("B", 2, {})
        assert b2.assignment is None  # still nothing free
        a3 = await w.hb("A", 1, {T1: kept})  # revoked
        assert a3.member_epoch == 2
        b3 = await w.hb("B", 2, {})
        assert sorted(parts(b3) + kept) == list(range(6))
        d = w.c.consumer_describe(G)
        assert (d.state, d.group_epoch, d.assignment_epoch) == ("Stable", 2, 2)

    run(body)


def test_epochs_are_checked() -> None:
    async def body() -> None:
        w = World()
        a = await w.join("A")
        assert (await w.hb("A", 5)).error_code == E.FENCED_MEMBER_EPOCH
        assert (await w.hb("nobody", 1)).error_code == E.UNKNOWN_MEMBER_ID
        await w.join("B")
        r = await w.hb("A", 1, owned_of(a))
        kept = owned_of(r)
        r = await w.hb("A", 1, kept)
        assert r.member_epoch == 2
        # The previous epoch is still accepted while what it owns is a subset (a lost response).
        assert (await w.hb("A", 1, kept)).error_code == E.NONE
        assert (await w.hb("A", 1, {T1: [0, 1, 2, 3, 4, 5]})).error_code == E.FENCED_MEMBER_EPOCH

    run(body)


# ---- requests refused -----------------------------------------------------------------------------


def test_errors_as_kafka_answers() -> None:
    async def body() -> None:
        w = World()
        assert (await w.join("A", server_assignor="sticky")).error_code == E.UNSUPPORTED_ASSIGNOR
        assert (await w.hb("A", 0, rebalance_timeout_ms=1000)).error_code == E.INVALID_REQUEST  # no subscription
        assert (await w.join("", version=1)).error_code == E.INVALID_REQUEST  # v1: the client names itself
        assert (await w.join("A", subscribed_regex="(")).error_code == E.INVALID_REGULAR_EXPRESSION
        assert (await w.join("A", subscribed_regex="x" * 5000)).error_code == E.INVALID_REGULAR_EXPRESSION
        assert (await w.join("A", subscribed_regex="(t+)+$")).error_code == E.INVALID_REGULAR_EXPRESSION
        for m in ("A", "B", "C"):
            assert (await w.join(m)).error_code == E.NONE
        assert (await w.join("D")).error_code == E.GROUP_MAX_SIZE_REACHED
        v0 = await w.join("", group="other", version=0)
        assert v0.error_code == E.NONE and v0.member_id  # v0: the broker makes the id

    run(body)


def test_static_member_leaves_and_comes_back_without_a_rebalance() -> None:
    async def body() -> None:
        w = World()
        a = await w.join("A1", instance_id="i-a")
        await w.join("B", instance_id="i-b")
        mine = owned_of(await w.hb("A1", 1, owned_of(a)))  # revokes half
        assert (await w.hb("A1", 1, mine)).member_epoch == 2
        assert (await w.hb("B", 2, {})).member_epoch == 2
        assert (await w.join("A2", instance_id="i-a")).error_code == E.UNRELEASED_INSTANCE_ID
        assert (await w.hb("B", 2, instance_id="i-a")).error_code == E.FENCED_INSTANCE_ID
        left = await w.hb("A1", -2, instance_id="i-a")
        assert (left.error_code, left.member_epoch) == (E.NONE, -2)
        epoch = w.c.consumer_describe(G).group_epoch
        back = await w.join("A2", instance_id="i-a")
        assert back.error_code == E.NONE and owned_of(back) == mine and back.member_epoch == 2
        assert w.c.consumer_describe(G).group_epoch == epoch  # no rebalance

    run(body)


def test_expired_session_fences_the_member_and_frees_its_partitions() -> None:
    async def body() -> None:
        w = World()
        a = await w.join("A")
        b = await w.join("B")
        await w.hb("A", 1, owned_of(a))
        await asyncio.sleep(0.05)
        for _ in range(8):  # B keeps heartbeating, A goes silent
            b = await w.hb("B", b.member_epoch, owned_of(b) if b.assignment else {})
            await asyncio.sleep(0.05)
        assert (await w.hb("A", 1)).error_code == E.UNKNOWN_MEMBER_ID
        b = await w.hb("B", b.member_epoch, {})
        assert b.assignment is not None and parts(b) == list(range(6))

    run(body)


def test_member_that_does_not_revoke_in_time_is_removed() -> None:
    async def body() -> None:
        w = World()
        a = await w.join("A", rebalance_timeout_ms=60)
        b = await w.join("B")
        a = await w.hb("A", 1, owned_of(a))  # asked to revoke half; never reports it
        for _ in range(6):
            b = await w.hb("B", b.member_epoch, {})
            await asyncio.sleep(0.03)
        assert (await w.hb("A", 1)).error_code == E.UNKNOWN_MEMBER_ID
        b = await w.hb("B", b.member_epoch, {})
        assert parts(b) == list(range(6))

    run(body)


def test_member_may_ask_for_the_range_assignor() -> None:
    async def body() -> None:
        w = World()
        await w.join("A", server_assignor="range", topics=["t1", "t2"])
        b = await w.join("B", server_assignor="range", topics=["t1", "t2"])
        assert w.c.consumer_describe(G).assignor == "range"
        assert b.member_epoch == 2  # waits for A to release its range

    run(body)


def test_heartbeat_interval_and_session_follow_group_overrides() -> None:
    async def body() -> None:
        w = World()
        w.overrides[G] = {"consumer.heartbeat.interval.ms": 77}
        assert (await w.join("A")).heartbeat_interval_ms == 77
        assert (await w.join("B", group="plain")).heartbeat_interval_ms == FAST.heartbeat_interval_ms

    run(body)


# ---- subscriptions --------------------------------------------------------------------------------


def test_regexes_that_could_backtrack_without_bound_are_refused() -> None:
    ok = ["^rx-.*", "rx-.*", "(foo|bar)-.*", "[a-z]+-(x|y)", "a{2,5}", "(ab){3}", "t.*"]
    refused = ["(a+)+$", "(a|ab)*", "(a*)*", "(?=a)b", r"(a)\1", "(?>a+)+", "("]
    assert all(compile_subscription(p) is not None for p in ok)
    assert all(compile_subscription(p) is None for p in refused)


async def join_regex(w: World, member: str, **kw: Any) -> HeartbeatResult:
    """Join with a regex new to the group (nothing from it yet: Kafka resolves it asynchronously),
    and the heartbeat after, which has its matches."""
    joined = await w.join(member, **kw)
    assert joined.error_code == E.NONE and owned_of(joined) == {}, joined
    kw.pop("subscribed_regex")
    return await w.hb(member, joined.member_epoch, {}, **kw)


def test_literal_topics_first_a_new_regex_a_heartbeat_later() -> None:
    async def body() -> None:
        w = World()
        a = await w.join("A", subscribed_names=["t1"], subscribed_regex="t2|t3")
        assert owned_of(a) == {T1: list(range(6))} and a.member_epoch == 1
        a = await w.hb("A", a.member_epoch, owned_of(a))
        assert owned_of(a) == {T1: list(range(6)), T2: [0, 1, 2]} and a.member_epoch == 2
        b = await w.join("B", subscribed_regex="t2|t3")  # the group has resolved it: no wait
        assert b.error_code == E.NONE and b.member_epoch == 3

    run(body)


def test_regex_matches_topics_created_later() -> None:
    async def body() -> None:
        w = World()
        a = await join_regex(w, "A", subscribed_regex="t.*")
        assert set(owned_of(a)) == {T1, T2}
        w.topics["t3"] = (T3, 2)
        w.topics["other"] = ("d" * 32, 1)
        a = await w.hb("A", a.member_epoch, owned_of(a))
        assert set(owned_of(a)) == {T1, T2, T3} and a.member_epoch == 3

    run(body)


def test_regex_matches_are_narrowed_to_topics_the_member_may_describe() -> None:
    """With ACLs on, a regex selects only what the heartbeat's principal may DESCRIBE; an ACL change
    (the filter's generation) re-resolves it on the next heartbeat, even when another member names
    the topic, so the group's topic set stays the same."""

    async def body() -> None:
        w = World()
        may: dict[str, set[str]] = {"User:alice": {"t1", "t2"}, "User:bob": {"t1"}}
        gen = [0]
        asked: list[str] = []

        def describable(principal: str, host: str, names: list[str]) -> list[str]:
            asked.append(principal)
            return [n for n in names if n in may.get(principal, set())]

        w.c.set_topic_filter(describable, lambda: gen[0])
        alice = ("User:alice", "127.0.0.1")
        bob = ("User:bob", "127.0.0.1")
        b = await join_regex(w, "B", subscribed_regex="t.*", principal=bob)
        assert owned_of(b) == {T1: list(range(6))}  # alone, and still never t2
        owned: dict[str, dict[str, list[int]]] = {"B": owned_of(b)}
        calls = len(asked)
        b = await w.hb("B", b.member_epoch, owned["B"], principal=bob)
        assert len(asked) == calls  # decisions cached while neither topics nor ACLs change

        epochs = {"B": b.member_epoch}
        who = {"A": alice, "B": bob, "C": None}

        async def beat(m: str) -> None:
            r = await w.hb(m, epochs[m], owned[m], principal=who[m])
            assert r.error_code == E.NONE, r
            epochs[m] = r.member_epoch
            if r.assignment is not None:
                owned[m] = owned_of(r)

        for m, r in (("A", await w.join("A", subscribed_regex="t.*", principal=alice)),
                     ("C", await w.join("C", ["t2"]))):
            epochs[m], owned[m] = r.member_epoch, owned_of(r) if r.assignment is not None else {}
        for _ in range(4):
            for m in "ABC":
                await beat(m)
        assert T2 not in owned["B"]
        assert len(owned["A"].get(T2, [])) + len(owned["C"].get(T2, [])) == 3
        assert owned["A"].get(T2), owned  # alice shares t2 with carol
        # alice loses t2 (carol still names it, so the group's topics do not change)
        may["User:alice"] = {"t1"}
        gen[0] += 1
        for _ in range(4):
            for m in "ABC":
                await beat(m)
        assert T2 not in owned["A"] and T2 not in owned["B"]
        assert owned["C"].get(T2) == [0, 1, 2]

    run(body)


def test_without_a_filter_a_regex_takes_every_match() -> None:
    async def body() -> None:
        w = World()
        a = await join_regex(w, "A", subscribed_regex="t.*", principal=("User:x", ""))
        assert set(owned_of(a)) == {T1, T2}

    run(body)


def test_new_partitions_are_assigned_and_deleted_topics_revoked() -> None:
    async def body() -> None:
        w = World()
        a = await w.join("A", topics=["t1", "t2"])
        assert len(parts(a, T2)) == 3
        w.topics["t1"] = (T1, 8)  # CreatePartitions
        del w.topics["t2"]  # DeleteTopics
        a = await w.hb("A", 1, owned_of(a))
        assert a.member_epoch == 1 and set(owned_of(a)) == {T1}  # revoke t2 first
        a = await w.hb("A", 1, owned_of(a))
        assert a.member_epoch == 2 and parts(a) == list(range(8))

    run(body)


# ---- persistence ----------------------------------------------------------------------------------


def test_group_comes_back_after_a_restart() -> None:
    async def body() -> None:
        w = World()
        a = await w.join("A")
        b = await w.join("B")
        a = await w.hb("A", 1, owned_of(a))
        a = await w.hb("A", 1, owned_of(a))
        b = await w.hb("B", 2, {})
        w.c.close()
        doc = w.store.load()[G].state
        assert doc is not None and doc["version"] == 2
        w2 = World(store=w.store)
        d = w2.c.consumer_describe(G)
        assert (d.group_epoch, d.assignment_epoch, sorted(m.member_id for m in d.members)) == (2, 2, ["A", "B"])
        again = await w2.hb("B", 2, owned_of(b))
        assert again.error_code == E.NONE and again.member_epoch == 2 and again.assignment is None
        assert w2.c.consumer_describe(G).group_epoch == 2  # no rebalance storm
        for _ in range(10):  # B keeps heartbeating; A never comes back and is fenced
            again = await w2.hb("B", again.member_epoch)
            await asyncio.sleep(0.05)
        assert (await w2.hb("A", 2)).error_code == E.UNKNOWN_MEMBER_ID
        assert w2.c.consumer_describe(G).group_epoch == 3 and len(w2.c.consumer_describe(G).members) == 1
        w2.c.close()

    run(body)


def test_unusable_version_2_document_loads_empty() -> None:
    store = InMemoryGroupStore()
    store.save_state(G, {"version": 2, "type": "consumer", "group_epoch": "x"})
    w = World(store=store)
    assert w.c.consumer_describe(G).error_code == E.GROUP_ID_NOT_FOUND  # an Empty classic group now


# ---- offsets ------------------------------------------------------------------------------------


def test_offset_commit_and_fetch_use_member_epochs() -> None:
    async def body() -> None:
        w = World()
        await w.join("A")

        async def commit(member: str, epoch: int) -> int:
            out = await w.c.commit_offsets(G, epoch, member, None, [("t1", 0, 5, -1, "")],
                                           topic_exists=lambda t, p: True)
            return out[0][2]

        assert await commit("A", 1) == E.NONE
        assert await commit("A", 0) == E.STALE_MEMBER_EPOCH
        assert await commit("Z", 1) == E.UNKNOWN_MEMBER_ID
        assert await commit("", -1) == E.UNKNOWN_MEMBER_ID  # admin commit while it has members
        assert await commit("assigner", -1) == E.UNKNOWN_MEMBER_ID  # a standalone commit, too
        assert w.c.fetch_offsets(G, [("t1", 0)], "A", 1)[1][0][2] == 5
        assert w.c.fetch_offsets(G, [("t1", 0)], "A", 7)[0] == E.STALE_MEMBER_EPOCH
        assert w.c.fetch_offsets(G, [("t1", 0)], "Z", 1)[0] == E.UNKNOWN_MEMBER_ID
        assert w.c.fetch_offsets(G, [("t1", 0)])[0] == E.NONE  # admin fetch
        await w.hb("A", -1)
        assert await commit("", -1) == E.NONE
        assert await commit("assigner", -1) == E.NONE  # empty: an assign()ing consumer's simple commit

    run(body)


# ---- classic and consumer groups --------------------------------------------------------------------


async def classic_join(c: GroupCoordinator, group: str) -> int:
    result = await c.join_group(group, "", None, "consumer", [("range", b"")], 10_000, 10_000, "c", "/h",
                                require_known_member_id=False)
    return result.error_code


def test_groups_convert_only_when_empty_and_allowed() -> None:
    async def body() -> None:
        w = World()
        assert await classic_join(w.c, "classic") == E.NONE
        r = await w.join("A", group="classic")
        assert r.error_code == E.GROUP_ID_NOT_FOUND  # a non-empty classic group is not a consumer group
        await w.join("A")
        assert await classic_join(w.c, G) == E.INCONSISTENT_GROUP_PROTOCOL
        assert (await w.c.delete_groups([G]))[0][1] == E.NON_EMPTY_GROUP
        await w.hb("A", -1)
        assert await classic_join(w.c, G) == E.NONE  # Empty: taken over by the classic protocol
        assert w.c.list_groups_typed(types_filter=["classic"])[-1][0] == G
        w.c.close()

    run(body)


def test_empty_classic_group_becomes_a_consumer_group_keeping_offsets() -> None:
    async def body() -> None:
        w = World()
        await w.c.commit_offsets("old", -1, "", None, [("t1", 1, 9, -1, "")], topic_exists=lambda t, p: True)
        r = await w.join("A", group="old")
        assert r.error_code == E.NONE
        assert w.c.fetch_offsets("old", [("t1", 1)])[1][0][2] == 9
        assert w.c.list_groups_typed(types_filter=["consumer"])[0][:4] == ("old", "consumer", "Stable", "consumer")

    run(body)


def test_migration_policy_disabled_refuses_both_ways() -> None:
    async def body() -> None:
        w = World(limits=ConsumerLimits(**{**FAST.__dict__, "migration_policy": "disabled"}))
        await w.c.commit_offsets("old", -1, "", None, [("t1", 1, 9, -1, "")], topic_exists=lambda t, p: True)
        assert (await w.join("A", group="old")).error_code == E.GROUP_ID_NOT_FOUND
        await w.join("A")
        await w.hb("A", -1)
        assert await classic_join(w.c, G) == E.INCONSISTENT_GROUP_PROTOCOL

    run(body)


def test_describe_unknown_and_classic_groups() -> None:
    async def body() -> None:
        w = World()
        assert w.c.consumer_describe("nope").error_code == E.GROUP_ID_NOT_FOUND
        await classic_join(w.c, "classic")
        assert w.c.consumer_describe("classic").error_code == E.GROUP_ID_NOT_FOUND
        a = await w.join("A", client_id="cli")
        d = w.c.consumer_describe(G)
        assert d.error_code == E.NONE and d.assignor == "uniform"
        (m,) = d.members
        assert (m.client_id, m.member_epoch, m.subscribed_names) == ("cli", 1, ["t1"])
        assert m.assignment == [(T1, "t1", parts(a))] == m.target
        w.c.close()

    run(body)


# ---- settings -------------------------------------------------------------------------------------


def test_broker_settings_reach_the_coordinator_limits() -> None:
    env = {"LOGLAKE_GROUP_CONSUMER_ASSIGNORS": "range,uniform", "LOGLAKE_GROUP_CONSUMER_MAX_SIZE": "7",
           "LOGLAKE_GROUP_CONSUMER_MIGRATION_POLICY": "upgrade"}
    limits = BrokerConfig.load(env=env).consumer_group_limits()
    assert (limits.assignors, limits.max_size, limits.migration_policy) == (("range", "uniform"), 7, "upgrade")
    assert limits.session_timeout_ms == 45_000 and limits.heartbeat_interval_ms == 5_000
    for bad in ({"LOGLAKE_GROUP_CONSUMER_ASSIGNORS": "sticky"}, {"LOGLAKE_GROUP_CONSUMER_MIGRATION_POLICY": "x"},
                {"LOGLAKE_GROUP_CONSUMER_SESSION_TIMEOUT_MS": "1000"}):
        with pytest.raises(ConfigError):
            BrokerConfig.load(env=bad)


def test_a_commit_that_raced_the_epoch_bump_is_taken_for_partitions_still_owned() -> None:
    """KIP-1251: assignment epoch <= the commit's epoch <= the member's epoch, for every partition
    in the commit; anything else is STALE_MEMBER_EPOCH, as before."""
    from loglake.broker.groups.consumer_admin import validate_commit

    async def body() -> None:
        w = World()
        a = await w.join("A")
        await w.join("B")
        kept = owned_of(await w.hb("A", 1, owned_of(a)))  # A revokes half, still at epoch 1
        assert (await w.hb("A", 1, kept)).member_epoch == 2
        b = await w.hb("B", 2, {})
        cg = w.c._reg.groups[G].consumer
        assert cg is not None
        mine, theirs = kept[T1][0], parts(b)[0]
        assert validate_commit(cg, "A", 2, [("t1", mine)]) == E.NONE
        assert validate_commit(cg, "A", 1, [("t1", mine)]) == E.NONE  # assigned at 1, member now at 2
        assert validate_commit(cg, "A", 1, [("t1", mine), ("t1", theirs)]) == E.STALE_MEMBER_EPOCH
        assert validate_commit(cg, "B", 1, [("t1", theirs)]) == E.STALE_MEMBER_EPOCH  # assigned at 2
        assert validate_commit(cg, "A", 3, [("t1", mine)]) == E.STALE_MEMBER_EPOCH
        assert validate_commit(cg, "A", 1, []) == E.STALE_MEMBER_EPOCH

    run(body)
