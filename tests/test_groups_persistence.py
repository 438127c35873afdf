"""Consumer-group persistence: changes recorded through the store, applied once durable, and
groups resumed from their saved state after a coordinator restart.

`FakeGroupLog` has the engine's group-metadata calls; with `hold` set its futures stay
pending until the test releases them, so overlapping and failing records can be driven exactly.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest

from loglake.broker.groups import (
    GroupCoordinator,
    InMemoryGroupStore,
    JoinResult,
    MetaGroupLog,
    MetaGroupStore,
    OffsetEntry,
    StoredGroup,
    StoreFormatError,
)
from loglake.broker.groups import errors as E
from loglake.broker.groups.changes import ChangeQueue, ChangeQueueFull
from loglake.broker.groups.group import Group, GroupState, Member
from loglake.broker.groups.limits import CoordinatorLimits
from loglake.broker.groups.persistence import (
    GroupStateError,
    decode_state,
    encode_empty,
    encode_stable,
    restore_group,
)
from loglake.engine import Engine

T = TypeVar("T")
G = "g1"
PROTOS = [("range", b"range-meta"), ("roundrobin", b"rr-meta")]


def run(test: Callable[[], Coroutine[Any, Any, T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(test(), 10)

    return asyncio.run(bounded())


def exists(topic: str, partition: int) -> bool:
    return topic != "missing" and partition < 4


class FakeGroupLog:
    """The engine's group-metadata calls, in memory. `hold`: futures wait for `release`."""

    def __init__(self) -> None:
        self.groups: dict[str, dict[str, Any]] = {}
        self.hold = False
        self.fail: Exception | None = None
        self.pending: list[tuple[Future[None], Callable[[], None]]] = []
        self.calls: list[tuple[str, str, Any]] = []

    def _entry(self, group_id: str) -> dict[str, Any]:
        return self.groups.setdefault(group_id, {"offsets": {}, "state": None})

    def _change(self, apply: Callable[[], None]) -> Future[None]:
        fut: Future[None] = Future()
        if self.hold:
            self.pending.append((fut, apply))
        elif self.fail is not None:
            fut.set_exception(self.fail)
        else:
            apply()
            fut.set_result(None)
        return fut

    def release(self, index: int = 0, error: Exception | None = None) -> None:
        fut, apply = self.pending.pop(index)
        if error is not None:
            fut.set_exception(error)
        else:
            apply()
            fut.set_result(None)

    def group_metadata(self) -> dict[str, dict[str, Any]]:
        return {
            g: {"offsets": {k: list(v) for k, v in d["offsets"].items()}, "state": json.loads(json.dumps(d["state"]))}
            for g, d in self.groups.items()
        }

    def commit_group_offsets(self, group_id: str, rows: list[tuple[str, int, int, int, str, int]]) -> Future[None]:
        self.calls.append(("commit", group_id, list(rows)))

        def apply() -> None:
            for t, p, offset, epoch, meta, ts in rows:
                self._entry(group_id)["offsets"][(t, p)] = [offset, epoch, meta, ts]

        return self._change(apply)

    def expire_group_offsets(self, group_id: str, partitions: list[tuple[str, int]]) -> Future[None]:
        self.calls.append(("expire", group_id, list(partitions)))

        def apply() -> None:
            for tp in partitions:
                self._entry(group_id)["offsets"].pop(tp, None)

        return self._change(apply)

    def delete_group_metadata(self, group_id: str) -> Future[None]:
        self.calls.append(("delete", group_id, None))

        def apply() -> None:
            self.groups.pop(group_id, None)

        return self._change(apply)

    def save_group_state(self, group_id: str, state: dict[str, Any] | None) -> Future[None]:
        self.calls.append(("state", group_id, state))
        text = json.dumps(state)  # must be JSON-able, as the engine requires

        def apply() -> None:
            self._entry(group_id)["state"] = json.loads(text)

        return self._change(apply)


def coordinator(store: Any, **kw: Any) -> GroupCoordinator:
    opts: dict[str, Any] = {"initial_rebalance_delay_ms": 0, "min_session_timeout_ms": 10}
    opts.update(kw)
    return GroupCoordinator(store, **opts)


async def join(c: GroupCoordinator, member_id: str = "", *, client: str = "client", session: int = 5000,
               instance: str | None = None) -> JoinResult:
    return await c.join_group(G, member_id, instance, "consumer", PROTOS, session, 5000, client, "/127.0.0.1",
                              require_known_member_id=True)


async def stable_group(c: GroupCoordinator, n: int, session: int = 5000) -> list[JoinResult]:
    ids = []
    for i in range(n):
        r = await join(c, client=f"c{i}", session=session)
        assert r.error_code == E.MEMBER_ID_REQUIRED
        ids.append(r.member_id)
    results = list(await asyncio.gather(*(join(c, m, client=f"c{i}", session=session) for i, m in enumerate(ids))))
    leader = next(r for r in results if r.leader_id == r.member_id)
    plan = [(r.member_id, f"assign-{r.member_id}".encode()) for r in results]
    syncs = await asyncio.gather(*(
        c.sync_group(G, r.generation_id, r.member_id, None, "consumer", r.protocol_name, plan if r is leader else [])
        for r in results
    ))
    assert all(s.error_code == E.NONE for s in syncs)
    assert c.group_state(G) == "Stable"
    return results


async def settle() -> None:
    """Let callbacks scheduled by resolved futures run (store futures resolve via the loop)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def wait_for(cond: Callable[[], bool], timeout: float = 3.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


# ==== offset commits through the store ============================================================


def test_commit_records_only_its_entries_and_answers_once_durable() -> None:
    async def body() -> None:
        engine = FakeGroupLog()
        c = coordinator(MetaGroupStore(engine))
        assert await c.commit_offsets("s", -1, "", None, [("t", 0, 5, -1, "a")], topic_exists=exists) == [
            ("t", 0, E.NONE)]
        engine.hold = True
        task = asyncio.ensure_future(
            c.commit_offsets("s", -1, "", None, [("t", 1, 7, 2, "b"), ("missing", 0, 1, -1, "")], topic_exists=exists)
        )
        await settle()
        assert not task.done()  # waits for durability...
        assert c.fetch_offsets("s", [("t", 1)])[1][0][2] == -1  # ...and memory shows only what is durable
        assert [row[:3] for row in engine.calls[-1][2]] == [("t", 1, 7)]  # only this request's valid entry
        engine.release()
        assert await task == [("t", 1, E.NONE), ("missing", 0, E.UNKNOWN_TOPIC_OR_PARTITION)]
        assert [o[:3] for o in c.fetch_offsets("s", None)[1]] == [("t", 0, 5), ("t", 1, 7)]

    run(body)


def test_two_overlapping_commits_of_one_group_are_both_kept() -> None:
    async def body() -> None:
        engine = FakeGroupLog()
        c = coordinator(MetaGroupStore(engine))
        engine.hold = True
        first = asyncio.ensure_future(c.commit_offsets("s", -1, "", None, [("t", 0, 10, -1, "")], topic_exists=exists))
        second = asyncio.ensure_future(c.commit_offsets("s", -1, "", None, [("t", 1, 20, -1, "")], topic_exists=exists))
        await settle()
        assert len(engine.pending) == 2
        # The later record resolves first: it is applied only after the earlier one (recorded order).
        engine.release(1)
        await settle()
        assert not second.done() and c.fetch_offsets("s", None)[1] == []
        engine.release(0)
        assert await first == [("t", 0, E.NONE)] and await second == [("t", 1, E.NONE)]
        assert [o[:3] for o in c.fetch_offsets("s", None)[1]] == [("t", 0, 10), ("t", 1, 20)]
        # Same partition twice, resolved in order: the later commit wins, as in the store.
        a = asyncio.ensure_future(c.commit_offsets("s", -1, "", None, [("t", 0, 11, -1, "")], topic_exists=exists))
        b = asyncio.ensure_future(c.commit_offsets("s", -1, "", None, [("t", 0, 12, -1, "")], topic_exists=exists))
        await settle()
        engine.release(0)
        engine.release(0)
        await asyncio.gather(a, b)
        assert c.fetch_offsets("s", [("t", 0)])[1][0][2] == 12 == engine.groups["s"]["offsets"][("t", 0)][0]

    run(body)


def test_failed_durability_answers_coordinator_not_available_and_changes_nothing() -> None:
    async def body() -> None:
        store = InMemoryGroupStore()
        c = coordinator(store)
        (r,) = await stable_group(c, 1)
        assert await c.commit_offsets(G, 1, r.member_id, None, [("t", 0, 42, -1, "")], topic_exists=exists) == [
            ("t", 0, E.NONE)]
        store.fail = OSError("disk full")
        assert await c.commit_offsets(G, 1, r.member_id, None, [("t", 0, 43, -1, ""), ("missing", 0, 1, -1, "")],
                                      topic_exists=exists) == [
            ("t", 0, E.COORDINATOR_NOT_AVAILABLE), ("missing", 0, E.UNKNOWN_TOPIC_OR_PARTITION)]
        assert c.fetch_offsets(G, None)[1] == [("t", 0, 42, -1, "", E.NONE)]
        assert await c.commit_offsets("fresh", -1, "", None, [("t", 0, 1, -1, "")], topic_exists=exists) == [
            ("t", 0, E.COORDINATOR_NOT_AVAILABLE)]
        assert c.group_state("fresh") is None  # no group kept for a failed first commit

        # A failing record between two good ones: its neighbours apply, it does not.
        engine = FakeGroupLog()
        c2 = coordinator(MetaGroupStore(engine))
        engine.hold = True
        tasks = [asyncio.ensure_future(c2.commit_offsets("s", -1, "", None, [("t", p, 100 + p, -1, "")],
                                                         topic_exists=exists)) for p in range(3)]
        await settle()
        engine.release(0)
        engine.release(0, OSError("fsync failed"))
        engine.release(0)
        assert [await t for t in tasks] == [[("t", 0, E.NONE)], [("t", 1, E.COORDINATOR_NOT_AVAILABLE)],
                                             [("t", 2, E.NONE)]]
        assert [o[:3] for o in c2.fetch_offsets("s", None)[1]] == [("t", 0, 100), ("t", 2, 102)]

    run(body)


def test_a_store_that_raises_is_a_failed_record() -> None:
    class Raising(InMemoryGroupStore):
        def commit(self, group_id: str, offsets: Any) -> Future[None]:
            raise RuntimeError("engine closed")

    async def body() -> None:
        c = coordinator(Raising())
        assert await c.commit_offsets("s", -1, "", None, [("t", 0, 1, -1, "")], topic_exists=exists) == [
            ("t", 0, E.COORDINATOR_NOT_AVAILABLE)]

    run(body)


def test_change_queue_is_bounded_and_applies_in_order() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        q = ChangeQueue("g", max_pending=2)
        seen: list[int] = []
        futs: list[Future[None]] = [Future(), Future()]
        done = [q.submit(f"c{i}", f, lambda i=i: seen.append(i), loop) for i, f in enumerate(futs)]  # type: ignore[misc]
        with pytest.raises(ChangeQueueFull):
            q.check_room()
        futs[1].set_result(None)
        await settle()
        assert seen == [] and not done[1].done()
        futs[0].set_exception(OSError("x"))
        assert await done[0] is False and await done[1] is True
        assert seen == [1] and len(q) == 0
        q.check_room()

    run(body)


# ==== deletion and expiry through the store =======================================================


def test_delete_groups_waits_for_durability_and_refuses_requests_meanwhile() -> None:
    async def body() -> None:
        engine = FakeGroupLog()
        c = coordinator(MetaGroupStore(engine))
        await c.commit_offsets("doomed", -1, "", None, [("t", 0, 1, -1, "")], topic_exists=exists)
        engine.hold = True
        deleting = asyncio.ensure_future(c.delete_groups(["doomed", "never"]))
        await settle()
        assert not deleting.done()
        assert c.fetch_offsets("doomed", None)[1][0][2] == 1  # still durable until the deletion is
        assert await c.commit_offsets("doomed", -1, "", None, [("t", 0, 2, -1, "")], topic_exists=exists) == [
            ("t", 0, E.COORDINATOR_NOT_AVAILABLE)]
        r = await c.join_group("doomed", "", None, "consumer", PROTOS, 5000, 5000, "c", "h",
                               require_known_member_id=True)
        assert r.error_code == E.COORDINATOR_NOT_AVAILABLE
        assert await c.delete_groups(["doomed"]) == [("doomed", E.COORDINATOR_NOT_AVAILABLE)]
        engine.release(0, OSError("log full"))
        assert await deleting == [("doomed", E.COORDINATOR_NOT_AVAILABLE), ("never", E.GROUP_ID_NOT_FOUND)]
        assert c.fetch_offsets("doomed", None)[1][0][2] == 1  # a failed deletion changes nothing
        engine.hold = False
        assert await c.delete_groups(["doomed"]) == [("doomed", E.NONE)]
        assert c.group_state("doomed") is None and "doomed" not in engine.groups
        assert ("delete", "doomed", None) in engine.calls

    run(body)


def test_retention_and_deleted_topics_expire_through_the_store() -> None:
    async def body() -> None:
        now = [1000.0]
        topics = {"t", "gone"}
        store = InMemoryGroupStore()
        c = coordinator(store, clock=lambda: now[0], offsets_retention_ms=60_000,
                        topic_exists=lambda t, p: t in topics)
        await c.commit_offsets("idle", -1, "", None, [("t", 0, 1, -1, "")], topic_exists=exists)
        now[0] += 50
        await c.commit_offsets("idle", -1, "", None, [("t", 1, 1, -1, "")], topic_exists=exists)
        (r,) = await stable_group(c, 1)
        await c.commit_offsets(G, 1, r.member_id, None, [("t", 0, 1, -1, ""), ("gone", 0, 9, -1, "")],
                               topic_exists=exists)
        assert await c.cleanup_expired() == 0
        topics.discard("gone")  # the topic was deleted: its offsets go, even in a Stable group
        now[0] += 11  # idle's (t, 0) is 61 s old, (t, 1) 11 s
        assert await c.cleanup_expired() == 2
        assert store.count("expire", G) == 1 and store.count("expire", "idle") == 1
        assert [o[:2] for o in c.fetch_offsets(G, None)[1]] == [("t", 0)]
        assert [o[:2] for o in c.fetch_offsets("idle", None)[1]] == [("t", 1)]
        assert store.load()["idle"].offsets.keys() == {("t", 1)}
        now[0] += 60  # the rest of idle expires: the whole group is deleted (one record)
        assert await c.cleanup_expired() == 1
        assert c.group_state("idle") is None and "idle" not in store.load()
        assert store.count("delete_group", "idle") == 1
        assert c.group_state(G) == "Stable"

    run(body)


def test_cleanup_skips_a_group_with_a_commit_in_flight() -> None:
    async def body() -> None:
        now = [1000.0]
        engine = FakeGroupLog()
        c = coordinator(MetaGroupStore(engine), clock=lambda: now[0], offsets_retention_ms=1000)
        await c.commit_offsets("s", -1, "", None, [("t", 0, 1, -1, "")], topic_exists=exists)
        now[0] += 5
        engine.hold = True
        fresh = asyncio.ensure_future(c.commit_offsets("s", -1, "", None, [("t", 0, 2, -1, "")], topic_exists=exists))
        await settle()
        assert await c.cleanup_expired() == 0  # the old entry is expired, but a commit is in flight
        engine.release()
        assert await fresh == [("t", 0, E.NONE)]
        assert c.fetch_offsets("s", None)[1][0][2] == 2

    run(body)


# ==== group state: what is saved when ==============================================================


def test_state_is_saved_at_stable_and_empty_transitions_only() -> None:
    async def body() -> None:
        store = InMemoryGroupStore()
        c = coordinator(store)
        r0, r1 = await stable_group(c, 2)
        assert store.count("save_state", G) == 1
        state = store.load()[G].state
        assert state is not None and state["state"] == "Stable" and state["generation"] == 1
        by_id = {m["member_id"]: m for m in state["members"]}
        assert base64.b64decode(by_id[r0.member_id]["assignment"]) == f"assign-{r0.member_id}".encode()
        assert base64.b64decode(by_id[r1.member_id]["metadata"]) == b"range-meta"
        for _ in range(5):
            assert c.heartbeat(G, 1, r0.member_id, None) == E.NONE
        await c.commit_offsets(G, 1, r0.member_id, None, [("t", 0, 1, -1, "")], topic_exists=exists)
        assert store.count("save_state", G) == 1  # neither heartbeats nor commits save the state
        c.leave_group(G, [(r0.member_id, None), (r1.member_id, None)])
        await settle()
        assert store.count("save_state", G) == 2
        empty = store.load()[G].state
        assert empty is not None and (empty["state"], empty["generation"], empty["protocol_type"]) == (
            "Empty", 2, "consumer")

    run(body)


def test_sync_group_hands_out_the_assignment_only_once_it_is_durable() -> None:
    async def body() -> None:
        engine = FakeGroupLog()
        c = coordinator(MetaGroupStore(engine))
        first = await join(c, client="a")
        r = await join(c, first.member_id, client="a")
        engine.hold = True
        sync = asyncio.ensure_future(c.sync_group(G, 1, r.member_id, None, "consumer", "range", [(r.member_id, b"x")]))
        await settle()
        assert not sync.done() and c.group_state(G) == "CompletingRebalance"
        engine.release()
        assert (await sync).assignment == b"x" and c.group_state(G) == "Stable"
        # A failed save: the members are told to rejoin and the group rebalances.
        again = asyncio.ensure_future(join(c, r.member_id, client="a"))  # leader JoinGroup: rebalance
        r2 = await again
        sync2 = asyncio.ensure_future(c.sync_group(G, 2, r2.member_id, None, "consumer", "range", [(r.member_id, b"y")]))
        await settle()
        engine.release(0, OSError("log full"))
        assert (await sync2).error_code == E.COORDINATOR_NOT_AVAILABLE
        assert c.group_state(G) == "PreparingRebalance"
        c.close()

    run(body)


def test_state_round_trip() -> None:
    limits = CoordinatorLimits()
    g = Group("rt", 0)
    for i, instance in enumerate([None, "inst-b"]):
        g.add(Member(f"m{i}", instance, f"client{i}", f"/10.0.0.{i}", 30_000 + i, 10_000 + i, "consumer",
                     [("roundrobin", b"rr%d" % i), ("range", b"\x00\xff%d" % i)], assignment=b"a%d" % i), None)
    g.protocol_name = "range"
    g.generation_id = 7
    doc = json.loads(json.dumps(encode_stable(g, {"m0": b"\x01new", "m1": b""})))
    back = restore_group("rt", StoredGroup({("t", 0): OffsetEntry(5, -1, "", 1)}, doc), limits, 1000)
    assert (back.state, back.generation_id, back.protocol_type, back.protocol_name, back.leader_id) == (
        GroupState.STABLE, 7, "consumer", "range", "m0")
    assert [(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
             m.session_timeout_ms, m.protocols, m.assignment) for m in back.members.values()] == [
        ("m0", None, "client0", "/10.0.0.0", 30_000, 10_000, [("range", b"\x00\xff0")], b"\x01new"),
        ("m1", "inst-b", "client1", "/10.0.0.1", 30_001, 10_001, [("range", b"\x00\xff1")], b""),
    ]
    assert back.static_members == {"inst-b": "m1"} and back.offsets == {("t", 0): OffsetEntry(5, -1, "", 1)}
    assert encode_stable(back) == doc  # a resumed group saves the same document again

    e = Group("e", 0)
    e.generation_id, e.protocol_type, e.empty_since_ms = 3, "consumer", 500
    empty = restore_group("e", StoredGroup({}, json.loads(json.dumps(encode_empty(e)))), limits, 1000)
    assert (empty.state, empty.generation_id, empty.protocol_type, empty.empty_since_ms) == (
        GroupState.EMPTY, 3, "consumer", 500)


# ==== restart ======================================================================================


def test_restarted_coordinator_resumes_a_stable_group_without_rebalance() -> None:
    async def body() -> None:
        store = InMemoryGroupStore()
        c1 = coordinator(store)
        r0, r1 = await stable_group(c1, 2, session=300)
        assert await c1.commit_offsets(G, 1, r0.member_id, None, [("t", 0, 10, -1, "")], topic_exists=exists) == [
            ("t", 0, E.NONE)]
        c1.close()

        c2 = coordinator(store)
        assert c2.group_state(G) == "Stable" and c2.generation(G) == 1
        assert c2.heartbeat(G, 1, r0.member_id, None) == E.NONE
        assert c2.heartbeat(G, 1, r1.member_id, None) == E.NONE
        assert await c2.commit_offsets(G, 1, r1.member_id, None, [("t", 1, 20, -1, "")], topic_exists=exists) == [
            ("t", 1, E.NONE)]
        assert [o[:3] for o in c2.fetch_offsets(G, None)[1]] == [("t", 0, 10), ("t", 1, 20)]
        s = await c2.sync_group(G, 1, r1.member_id, None, "consumer", "range", [])
        assert (s.error_code, s.assignment) == (E.NONE, f"assign-{r1.member_id}".encode())
        desc = c2.describe_group(G)
        assert (desc.state, desc.protocol, desc.protocol_type) == ("Stable", "range", "consumer")
        assert {m.member_id for m in desc.members} == {r0.member_id, r1.member_id}
        assert r0.leader_id == desc.members[0].member_id or r0.leader_id == desc.members[1].member_id
        # A follower rejoining with unchanged metadata gets the current generation: no rebalance.
        follower = r0 if r0.leader_id != r0.member_id else r1
        again = await c2.join_group(G, follower.member_id, None, "consumer", [("range", b"range-meta")], 300, 5000,
                                    "c", "h", require_known_member_id=True)
        assert (again.error_code, again.generation_id, c2.group_state(G)) == (E.NONE, 1, "Stable")

        # Only r0 keeps heartbeating: r1's fresh session (300 ms) expires and a normal rebalance starts.
        stop = asyncio.Event()

        async def beat() -> list[int]:
            codes = []
            while not stop.is_set():
                codes.append(c2.heartbeat(G, 1, r0.member_id, None))
                await asyncio.sleep(0.03)
            return codes

        beats = asyncio.ensure_future(beat())
        await wait_for(lambda: c2.group_state(G) == "PreparingRebalance")
        assert c2.heartbeat(G, 1, r1.member_id, None) == E.UNKNOWN_MEMBER_ID
        n = await c2.join_group(G, r0.member_id, None, "consumer", PROTOS, 300, 5000, "c0", "h",
                                require_known_member_id=True)
        assert n.generation_id == 2 and [m[0] for m in n.members] == [r0.member_id]
        stop.set()
        assert set(await beats) <= {E.NONE, E.REBALANCE_IN_PROGRESS}
        c2.close()

    run(body)


def test_static_member_replaced_in_stable_is_saved_and_survives_restart() -> None:
    async def body() -> None:
        store = InMemoryGroupStore()
        c1 = coordinator(store)
        a = await join(c1, instance="inst-a", client="a")
        await c1.sync_group(G, a.generation_id, a.member_id, "inst-a", "consumer", "range", [(a.member_id, b"A")])
        a2 = await join(c1, instance="inst-a", client="a")  # the instance restarted: new member id, no rebalance
        assert a2.error_code == E.NONE and a2.member_id != a.member_id and c1.generation(G) == 1
        c1.close()
        c2 = coordinator(store)
        assert c2.heartbeat(G, 1, a2.member_id, "inst-a") == E.NONE
        assert c2.heartbeat(G, 1, a.member_id, "inst-a") == E.FENCED_INSTANCE_ID
        s = await c2.sync_group(G, 1, a2.member_id, "inst-a", "consumer", "range", [])
        assert s.assignment == b"A"
        c2.close()

    run(body)


def test_garbled_state_loads_the_group_empty_with_its_offsets(caplog: pytest.LogCaptureFixture) -> None:
    good = encode_stable_doc()
    garbled: dict[str, Any] = {
        "version": {"version": 99, "state": "Stable"},
        "state": {**good, "state": "Rebalancing"},
        "members": {**good, "members": "all of them"},
        "b64": {**good, "members": [{**good["members"][0], "assignment": "%%%"}]},
        "leader": {**good, "leader": "nobody"},
        "type": {**good, "generation": "7"},
        "dupes": {**good, "members": [good["members"][0], good["members"][0]]},
        "too-many": {**good, "members": [{**good["members"][0], "member_id": f"m{i}"} for i in range(3)]},
    }
    store = InMemoryGroupStore({
        name: StoredGroup({("t", 0): OffsetEntry(9, -1, "", 1)}, doc) for name, doc in garbled.items()
    })
    with caplog.at_level(logging.WARNING, logger="loglake.broker.groups"):
        c = coordinator(store, group_max_size=2)
    for name in garbled:
        assert c.group_state(name) == "Empty", name
        assert c.fetch_offsets(name, None)[1] == [("t", 0, 9, -1, "", E.NONE)]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(garbled)  # one line per bad group
    for name in garbled:
        with pytest.raises(GroupStateError):
            decode_state(garbled[name], CoordinatorLimits(group_max_size=2))


def encode_stable_doc() -> dict[str, Any]:
    g = Group("x", 0)
    g.add(Member("m0", None, "c", "/h", 5000, 5000, "consumer", [("range", b"m")], assignment=b"a"), None)
    g.protocol_name = "range"
    g.generation_id = 4
    doc: dict[str, Any] = json.loads(json.dumps(encode_stable(g)))
    return doc


# ==== engine stores ================================================================================


def test_engine_group_store_translates_and_refuses_bad_offsets(caplog: pytest.LogCaptureFixture) -> None:
    engine = FakeGroupLog()
    store = MetaGroupStore(engine)
    store.commit("g", {("t", 1): OffsetEntry(5, 2, "m", 77), ("t", 0): OffsetEntry(4, -1, "", 76)}).result()
    assert engine.calls[-1] == ("commit", "g", [("t", 0, 4, -1, "", 76), ("t", 1, 5, 2, "m", 77)])
    store.save_state("g", {"version": 1}).result()
    assert store.load() == {"g": StoredGroup({("t", 0): OffsetEntry(4, -1, "", 76), ("t", 1): OffsetEntry(5, 2, "m", 77)},
                                             {"version": 1})}
    store.expire("g", [("t", 0)]).result()
    assert set(store.load()["g"].offsets) == {("t", 1)}
    store.delete_group("g").result()
    assert store.load() == {}

    class Raw:
        def __init__(self, value: Any) -> None:
            self.value = value

        def group_metadata(self) -> Any:
            return self.value

    for bad in ([1], {"g": [1]}, {"g": {"offsets": {("t", "0"): [1, -1, "", 0]}}},
                {"g": {"offsets": {("t", 0): [1, -1, None, 0]}}}):
        with pytest.raises(StoreFormatError):
            MetaGroupStore(Raw(bad)).load()  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        loaded = MetaGroupStore(Raw({"g": {"offsets": {}, "state": "garbage"}})).load()  # type: ignore[arg-type]
    assert loaded == {"g": StoredGroup({}, None)} and len(caplog.records) == 1


def test_offsets_and_state_survive_a_real_engine_restart(tmp_path: Path) -> None:
    def store_for(engine: Any) -> MetaGroupStore:
        return MetaGroupStore(MetaGroupLog(engine.meta))  # as the broker does

    async def first_life(engine: Engine) -> str:
        c = coordinator(store_for(engine))
        (r,) = await stable_group(c, 1)
        assert await c.commit_offsets(G, 1, r.member_id, None, [("orders", 0, 10, 2, "m"), ("orders", 1, 20, -1, None)],
                                      topic_exists=exists) == [("orders", 0, E.NONE), ("orders", 1, E.NONE)]
        assert await c.commit_offsets("solo", -1, "", None, [("orders", 0, 5, -1, "")], topic_exists=exists) == [
            ("orders", 0, E.NONE)]
        assert await c.commit_offsets("doomed", -1, "", None, [("orders", 3, 1, -1, "")], topic_exists=exists) == [
            ("orders", 3, E.NONE)]
        assert await c.delete_groups(["doomed", G, "never"]) == [
            ("doomed", E.NONE), (G, E.NON_EMPTY_GROUP), ("never", E.GROUP_ID_NOT_FOUND)]
        c.close()
        return r.member_id

    async def second_life(engine: Engine, member_id: str) -> None:
        c = coordinator(store_for(engine))
        assert sorted(c.list_groups()) == [(G, "consumer", "Stable"), ("solo", "", "Empty")]
        assert c.heartbeat(G, 1, member_id, None) == E.NONE  # resumed: same member, same generation
        assert c.fetch_offsets(G, None) == (E.NONE, [("orders", 0, 10, 2, "m", E.NONE), ("orders", 1, 20, -1, "", E.NONE)])
        assert c.fetch_offsets("doomed", None) == (E.NONE, [])
        assert await c.commit_offsets(G, 1, member_id, None, [("orders", 0, 11, 2, "m")], topic_exists=exists) == [
            ("orders", 0, E.NONE)]
        c.leave_group(G, [(member_id, None)])
        assert c.group_state(G) == "Empty"
        assert await c.delete_groups([G]) == [(G, E.NONE)]
        c.close()

    engine = Engine(str(tmp_path))
    engine.open()
    member_id = run(lambda: first_life(engine))
    engine.close()
    engine = Engine(str(tmp_path))
    engine.open()
    run(lambda: second_life(engine, member_id))
    engine.close()
    engine = Engine(str(tmp_path))
    engine.open()
    try:
        assert set(store_for(engine).load()) == {"solo"}
    finally:
        engine.close()
