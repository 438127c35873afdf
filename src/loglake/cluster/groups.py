"""Cluster mode: one coordinator per group at a time, its writes fenced in etcd (docs/CLUSTER.md).

Which broker coordinates a group is computed from each broker's own view of the live set
(loglake.cluster.coordinators), and views differ for a moment after a change: a broker that
restarted, or one whose watch lagged, may believe it coordinates a group another broker is
running. Two coordinators answering one group let a stale one accept commits of its own members,
so a committed offset could go backwards. So every coordinator instance writes through a
`FencedGroupStore`:

* it holds a random token; before it loads a group it *claims* it — puts its token in the group's
  claim key (`groups/coordinator/<group>` under the cluster prefix) — and only then catches up
  with the metadata log and loads the group's generation, members and offsets. Every record a
  previous holder committed is before the claim in the log, so the load sees all of them;
* every group record it writes (commit, state, expiry, deletion) is an `append_if` guarded by the
  claim key still holding its token. Once another coordinator claimed the group, nothing the old
  one writes commits: the write fails (the client sees COORDINATOR_NOT_AVAILABLE and asks
  FindCoordinator again), the group is marked lost (NOT_COORDINATOR from here on) and the broker
  reloads its coordinator from etcd at once, which drops the stale in-memory group;
* a group it did not load (a new group) is claimed at its first write, guarded on the claim key
  being as it was when the coordinator loaded; a claim that finds the group already has stored
  state (another coordinator wrote it meanwhile) is treated as lost too.

Generations continue across a move because the new coordinator loads the stored state, so members
of the old generation are refused with ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID (classic) or
FENCED_MEMBER_EPOCH (KIP-848) as after a restart.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from loglake.broker.groups.meta_store import MetaGroupLog, MetaGroupStore
from loglake.broker.groups.store import OffsetEntry, ReloadableGroupStore, StoredGroup, TopicPartition
from loglake.cluster import etcd_client as ec
from loglake.cluster.coordinators import coordinator_of
from loglake.cluster.etcd import EtcdMetaStore, Guard
from loglake.engine.view import ClusterView
from loglake.errors import MetaFencedError
from loglake.meta.records import GroupDeleted, GroupState, MetaRecord, OffsetCommit, OffsetExpire, OffsetRow

log = logging.getLogger("loglake.broker")  # its lines are the broker's (docs/CLUSTER.md quotes them)

__all__ = ["CLAIM_KEY_PREFIX", "FencedGroupStore", "fenced_stores"]

#: Claim keys live under this (relative to the cluster prefix); one key per group ever coordinated.
CLAIM_KEY_PREFIX = "groups/coordinator/"
#: Claims put by one etcd transaction at load (etcd's --max-txn-ops default is 128).
CLAIMS_PER_TXN_MAX = 100
#: How long a group write waits for its claim and commit before failing (the coordinator answers
#: COORDINATOR_NOT_AVAILABLE and the client retries).
WRITE_WAIT_S = 30.0


class FencedGroupStore(MetaGroupStore):
    """The `GroupStore` of one cluster coordinator instance (see the module doc).

    `prepare()` does the etcd I/O (claims, catching up) and must run off the event loop;
    `load()` then returns what it loaded. Writes never block the caller: a write of a group already
    claimed is one guarded append; the first write of a new group runs its claim on this store's
    one writer thread, so writes stay in the order they were made.
    """

    def __init__(
        self,
        etcd: EtcdMetaStore,
        cluster: ClusterView,
        on_lost: Callable[[str, ReloadableGroupStore], None] | None = None,
    ) -> None:
        self.records = MetaGroupLog(etcd)
        super().__init__(self.records)
        self.etcd = etcd
        self.cluster = cluster
        self.node_id: int = cluster.node_id
        self.token = f"{self.node_id}:{uuid.uuid4().hex}".encode()
        self.on_lost = on_lost
        #: the live node ids this instance was loaded for; another set means a reload is due
        self.live: frozenset[int] = frozenset()
        self.claimed: set[str] = set()
        #: a newer instance on this broker is claiming (its claims fence this one's writes)
        self.superseded = False
        self.lost: set[str] = set()  # type: ignore[assignment]  # a set, growing: MetaGroupStore's is empty
        self._seen: dict[str, int] = {}  # claim key mod revision at load, for groups not claimed then
        self._loaded: dict[str, StoredGroup] | None = None
        self._lock = threading.Lock()  # claimed / lost / _claiming: the loop and the writer thread
        self._claiming: dict[str, Future[None]] = {}
        self._guards: dict[str, tuple[Guard, ...]] = {}  # the guard of each group's writes (built once)
        # One thread: claims and the writes queued behind them stay in order. Its queue is bounded
        # by the coordinator's own limit on changes in flight per group (PENDING_CHANGES_MAX).
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="loglake-group-claims")

    # ---- loading -------------------------------------------------------------------------------

    def _claim_key(self, group_id: str) -> str:
        return CLAIM_KEY_PREFIX + group_id

    def owns(self, group_id: str) -> bool:
        return coordinator_of(group_id, self.live) == self.node_id

    def prepare(self) -> None:
        """Claim the groups this broker coordinates now, then load them from etcd (blocking I/O)."""
        self.live = frozenset(self.cluster.live_ids())
        client = self.etcd.client
        base = self.etcd.keys.key(CLAIM_KEY_PREFIX)
        kvs, _ = client.range_all(base, ec.prefix_end(base))
        seen = {kv.key[len(base) :].decode(): kv.mod_revision for kv in kvs}
        self.etcd.sync()
        owned = sorted(g for g in self.records.group_metadata() if self.owns(g))
        for i in range(0, len(owned), CLAIMS_PER_TXN_MAX):
            chunk = owned[i : i + CLAIMS_PER_TXN_MAX]
            client.txn([], [ec.op_put(self.etcd.keys.key(self._claim_key(g)), self.token) for g in chunk], [])
        # Every record a previous holder committed is before the claims: catch up, then load.
        self.etcd.sync()
        loaded = super().load()
        self._loaded = {g: s for g, s in loaded.items() if g in set(owned)}
        with self._lock:
            self.claimed = set(owned)
            self._seen = {g: m for g, m in seen.items() if g not in self.claimed}
        if owned:
            log.info(
                "cluster: node %d claimed %d group(s) as their coordinator (live brokers %s)",
                self.node_id, len(owned), sorted(self.live),
            )  # fmt: skip

    def load(self) -> dict[str, StoredGroup]:
        if self._loaded is None:
            self.prepare()
        assert self._loaded is not None
        out, self._loaded = self._loaded, {}
        return out

    def supersede(self) -> None:
        self.superseded = True

    def close(self) -> None:
        self._writer.shutdown(wait=False)

    # ---- fenced writes ---------------------------------------------------------------------------

    def commit(self, group_id: str, offsets: Mapping[TopicPartition, OffsetEntry]) -> Future[None]:
        rows: list[OffsetRow] = [
            (t, p, e.offset, e.leader_epoch, e.metadata, e.commit_ts_ms)
            for (t, p), e in sorted(offsets.items())
        ]
        return self._write(group_id, OffsetCommit(group_id, rows))

    def expire(self, group_id: str, partitions: list[TopicPartition]) -> Future[None]:
        return self._write(group_id, OffsetExpire(group_id, partitions))

    def delete_group(self, group_id: str) -> Future[None]:
        return self._write(group_id, GroupDeleted(group_id))

    def save_state(self, group_id: str, state: dict[str, Any] | None) -> Future[None]:
        return self._write(group_id, GroupState(group_id, state))

    def _write(self, group_id: str, record: MetaRecord) -> Future[None]:
        with self._lock:
            if group_id in self.lost:
                return _failed(MetaFencedError(f"group {group_id!r} is coordinated by another broker now"))
            claimed = group_id in self.claimed and group_id not in self._claiming
        if claimed:
            return self._guarded(group_id, record)
        with self._lock:
            if group_id not in self._claiming:
                self._claiming[group_id] = self._writer.submit(self._claim_new, group_id)
        return self._writer.submit(self._after_claim, group_id, record)

    def _guarded(self, group_id: str, record: MetaRecord) -> Future[None]:
        out: Future[None] = Future()
        try:
            guards = self._guards.get(group_id)
            if guards is None:
                guards = self._guards[group_id] = (Guard(self._claim_key(group_id), value=self.token),)
            inner = self.etcd.append_if(record, guards)
        except Exception as exc:  # the store closed or failed: the coordinator answers retriably
            out.set_exception(exc)
            return out

        def done(f: Future[int]) -> None:
            exc = f.exception()
            if isinstance(exc, MetaFencedError):
                self._lose(group_id)
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(None)

        inner.add_done_callback(done)
        return out

    def _claim_new(self, group_id: str) -> None:
        """Claim a group this instance did not load (on the writer thread). No record: the claim
        is a plain put compared on the key being as it was at load; etcd orders it."""
        key = self.etcd.keys.key(self._claim_key(group_id))
        ok = False
        try:  # etcd away: the error fails this write (retriable); the next write claims again
            ok, _, _ = self.etcd.client.txn(
                [ec.cmp_mod(key, self._seen.get(group_id, 0))], [ec.op_put(key, self.token)], []
            )
            if ok:
                self.etcd.sync()  # records committed before the claim are applied here now
                ok = group_id not in self.records.group_metadata()  # nobody wrote it meanwhile
            if not ok:
                self._lose(group_id)
        finally:
            with self._lock:
                self._claiming.pop(group_id, None)
                if ok:
                    self.claimed.add(group_id)

    def _after_claim(self, group_id: str, record: MetaRecord) -> None:
        with self._lock:
            if group_id in self.lost or group_id not in self.claimed:
                raise MetaFencedError(f"group {group_id!r} is coordinated by another broker now")
        self._guarded(group_id, record).result(WRITE_WAIT_S)

    def _lose(self, group_id: str) -> None:
        with self._lock:
            if group_id in self.lost:
                return
            self.lost.add(group_id)
            self.claimed.discard(group_id)
        if self.on_lost is not None:
            self.on_lost(group_id, self)


def _failed(exc: Exception) -> Future[None]:
    fut: Future[None] = Future()
    fut.set_exception(exc)
    return fut


def fenced_stores(etcd: EtcdMetaStore, view: ClusterView) -> Callable[[Callable[[str, ReloadableGroupStore], None]], FencedGroupStore]:
    """The group-store factory of a cluster broker (loglake.broker.group_reload)."""

    def make(on_lost: Callable[[str, ReloadableGroupStore], None]) -> FencedGroupStore:
        return FencedGroupStore(etcd, view, on_lost)

    return make
