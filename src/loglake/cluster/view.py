"""Cluster mode's `ClusterView` (loglake.engine.view): register, follow the live set, lead what
`assign` gives this broker.

One thread per broker. Whenever the live set changes (a membership watch), a topic appears or
goes, another broker takes a partition (a `plog_leader` record), or REBALANCE_INTERVAL_S passed,
it computes `assign(partitions, live brokers, previous leaders)` — the same pure function over
the same shared state on every broker — then releases what it no longer gets and acquires what
it gets but does not lead (also a partition whose appends stopped on a failed flush: acquiring
is what restarts it).

Two brokers may briefly both think they should lead a partition (their views of etcd differ by
a watch event). Acquiring bumps the leader epoch with a compare in etcd, so exactly one bump
wins and the loser gets MetaFencedError: it leads nothing, logs one debug line and looks again
at the next round, by which time the views agree. A leader that lost a partition that way has
its commits fenced by the epoch, so its pending produces fail (NOT_LEADER_OR_FOLLOWER).

Losing the lease (paused or cut off past the TTL: the keep-alive finds it gone) stops leading
everything at once — appends are refused with NOT_LEADER_OR_FOLLOWER — and the broker registers
again under a new lease; the assignment then gives it partitions again, acquired with new epochs.

The view answers the broker's questions about the cluster: the live brokers for Metadata, each
partition's leader, each group's coordinator. Until `join` (the broker's listeners are bound) it
is not registered and leads nothing. The lowest live node id also sweeps the bucket and copies
the metadata into it (`publishes`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from loglake.cluster.assign import assign
from loglake.cluster.coordinators import coordinator_of
from loglake.cluster.etcd import EtcdMetaStore
from loglake.cluster.etcd_client import EtcdClient
from loglake.cluster.membership import Membership
from loglake.cluster.plog_maint import merge, sweep
from loglake.cluster.shared_log import ClusterSettings, SharedPartitionLog
from loglake.engine.catalog import TOPIC_KINDS
from loglake.engine.view import BrokerInfo, LiveListener
from loglake.errors import EtcdUnavailableError, LoglakeError, MetaFencedError
from loglake.meta.records import RecordKind
from loglake.meta.state import MetaState

__all__ = ["REBALANCE_INTERVAL_S", "EtcdClusterView"]

log = logging.getLogger(__name__)

#: Rounds without a wake-up (the watches are the fast path).
REBALANCE_INTERVAL_S = 1.0
#: A partition is merged once it has this many unmerged ranges (well below the 10,000 at which
#: commits are refused: RANGES_PER_PARTITION_MAX), or at every maintenance round if it has any.
MERGE_RANGES_MIN = 1
#: Partitions merged per maintenance round (the rest wait for the next round).
MERGES_PER_ROUND_MAX = 1000

TP = tuple[str, int]


class EtcdClusterView:
    def __init__(
        self, log: SharedPartitionLog, etcd: EtcdMetaStore, client: EtcdClient, settings: ClusterSettings
    ) -> None:
        self.log = log
        self.etcd = etcd
        self.client = client
        self.settings = settings
        self._node_id = settings.node_id
        self.me = BrokerInfo(self._node_id, (), settings.rack)
        self.membership: Membership | None = None
        self.held: set[TP] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._maint: threading.Thread | None = None
        self._last_error = ""
        self.rounds = 0
        #: called with the live node ids whenever they change (the broker moves group coordinators)
        self._live_listeners: list[LiveListener] = []
        etcd.watch(self._on_record)

    @property
    def node_id(self) -> int:
        return self._node_id

    def _membership(self) -> Membership:
        m = Membership(self.client, self.etcd.prefix, self.me, ttl_s=self.settings.lease_ttl_s)
        m.subscribe(self._live_changed)
        return m

    def _live_changed(self, live: dict[int, BrokerInfo]) -> None:
        self._wake.set()
        for listener in list(self._live_listeners):
            listener(set(live))

    def on_change(self, listener: LiveListener) -> None:
        """Call `listener(live node ids)` (from the membership thread) whenever the live set changes."""
        self._live_listeners.append(listener)

    def _on_record(self, seq: int, kind: RecordKind, body: dict[str, Any], raw: bytes) -> None:
        # under the store's lock: only a wake-up
        if kind in TOPIC_KINDS or (kind == RecordKind.PLOG_LEADER and int(body.get("leader", -1)) != self.node_id):
            self._wake.set()

    def join(self, listeners: list[str]) -> None:
        """Register advertising `listeners` (NodeIdInUseError: refuse to start), then lead what
        the assignment gives this broker; rounds run on the view's own thread from here on."""
        self.me = BrokerInfo(self._node_id, tuple(listeners), self.settings.rack)
        self.membership = self._membership()
        self.membership.start()
        self.rebalance()
        self._thread = threading.Thread(target=self._run, name="loglake-cluster-leadership", daemon=True)
        self._thread.start()
        self._maint = threading.Thread(target=self._maintain, name="loglake-cluster-maintenance", daemon=True)
        self._maint.start()

    def leave(self) -> None:
        """Release every partition (their buffered appends flush first) and revoke the lease, so
        the other brokers take over at once instead of after the TTL."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(60)
        if self._maint is not None:
            self._maint.join(60)
        self._release_all()
        if self.membership is not None:
            self.membership.stop(revoke=True)

    # ---- the loop --------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(REBALANCE_INTERVAL_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.rebalance()
            except Exception as exc:  # etcd away, a bug: one line per distinct error, keep going
                self._say(f"leadership round failed: {exc}")

    def _say(self, text: str) -> None:
        if text != self._last_error:
            log.warning("node %d: %s", self.node_id, text)
            self._last_error = text

    def rebalance(self) -> None:
        self.rounds += 1
        if self.membership is None:
            return  # not joined yet
        if self.membership.lost.is_set():
            self._release_all()
            self._rejoin()
            return
        live = self.membership.known
        if self.node_id not in live:
            self._release_all()
            return
        target = assign(*self._inputs(live))
        mine = {tp for tp, b in target.items() if b == self.node_id}
        dropped = sorted(self.held - mine)
        for tp in dropped:
            self._release(tp)
        before = len(self.held)
        self._acquire(mine)
        if dropped or len(self.held) != before:
            log.info(
                "node %d leads %d partition(s) (%d released) of %d over %d live broker(s)",
                self.node_id, len(self.held), len(dropped), len(target), len(live),
            )  # fmt: skip
        self._last_error = ""

    def _acquire(self, mine: set[TP]) -> None:
        for tp in sorted(mine):
            if self._stop.is_set() or (self.membership is not None and self.membership.lost.is_set()):
                return
            if tp in self.held and self.log.leads(*tp):
                continue
            try:
                epoch = self.log.acquire(*tp)
            except MetaFencedError:
                log.debug(
                    "node %d: %s-%d was taken by another broker first; looking again", self.node_id, *tp
                )
                self._wake.set()
                continue
            except LoglakeError as exc:
                self._say(f"acquiring {tp[0]}-{tp[1]} failed: {exc}")
                continue
            self.held.add(tp)
            log.debug("node %d leads %s-%d at epoch %d", self.node_id, tp[0], tp[1], epoch)

    def _inputs(self, live: dict[int, BrokerInfo]) -> tuple[list[TP], list[int], dict[TP, int]]:
        def read(s: MetaState) -> tuple[list[TP], dict[TP, int]]:
            parts = sorted((tm.topic_id.hex(), i) for tm in s.topics.values() for i in range(tm.partitions))
            prev = {(tid.hex(), p): pl.leader for (tid, p), pl in s.plogs.parts.items() if pl.leader >= 0}
            return parts, prev

        parts, prev = self.etcd.read(read)
        return parts, sorted(live), prev

    def _release(self, tp: TP) -> None:
        try:
            self.log.release(*tp)
        except LoglakeError as exc:
            self._say(f"releasing {tp[0]}-{tp[1]}: {exc}")
        self.held.discard(tp)

    def _release_all(self) -> None:
        for tp in sorted(self.held):
            self._release(tp)

    def _rejoin(self) -> None:
        """Register again under a new lease after losing the old one."""
        old = self.membership
        if old is not None:
            old.stop(revoke=False)
        fresh = self._membership()
        try:
            fresh.start()
        except (EtcdUnavailableError, LoglakeError) as exc:
            self._say(f"registering again failed ({exc}); retrying")
            return
        self.membership = fresh
        log.warning(
            "node %d registered again under a new lease; it leads what the assignment gives it", self.node_id
        )
        self._wake.set()

    # ---- background merge and sweep ----------------------------------------------------------------

    def _maintain(self) -> None:
        interval = self.settings.maintenance_interval_ms / 1000.0
        while not self._stop.wait(interval):
            try:
                self.maintain_once()
            except Exception as exc:  # etcd or the bucket away: the next round tries again
                self._say(f"merge/sweep round failed: {exc}")

    def maintain_once(self) -> int:
        """Apply retention to the partitions this broker leads, merge their ranges, then sweep;
        returns partitions merged."""
        plog = self.log.plog
        self.log.apply_retention()  # first: what it drops is not merged in vain

        def names(s: MetaState) -> dict[str, str]:
            return {tm.topic_id.hex(): tm.name for tm in s.topics.values()}

        topic_names = self.etcd.read(names)
        merged = 0
        for tid, p in sorted(self.held):
            if self._stop.is_set() or merged >= MERGES_PER_ROUND_MAX:
                break
            name = topic_names.get(tid)
            if name is None or not self.log.leads(tid, p):
                continue
            if len(self.log.plog_of(tid, p).ranges) < MERGE_RANGES_MIN:
                continue
            try:
                merge(plog, tid, p, name)
                merged += 1
            except LoglakeError as exc:
                log.info("node %d: merging %s-%d: %s (next round)", self.node_id, name, p, exc)
        if not self._stop.is_set() and self.publishes():
            sweep(plog)  # one sweeper (the lowest live node id): sweeps racing on the same keys waste work
        return merged

    # ---- the view the handlers use -------------------------------------------------------------------

    def _known(self) -> dict[int, BrokerInfo]:
        return self.membership.known if self.membership is not None else {}

    def brokers(self) -> list[BrokerInfo]:
        return [info for _, info in sorted(self._known().items())]

    def live_ids(self) -> set[int]:
        return set(self._known())

    def leader_of(self, topic_id: bytes, partition: int) -> int:
        """The partition's leader as the shared state names it, or -1 when it is not live."""

        def read(s: MetaState) -> int:
            pl = s.plogs.parts.get((topic_id, partition))
            return pl.leader if pl is not None else -1

        leader = self.etcd.read(read)
        return leader if leader in self._known() else -1

    def coordinator_of(self, key: str) -> int:
        return coordinator_of(key, self.live_ids())

    def publishes(self) -> bool:
        """Whether this broker sweeps the bucket and copies the metadata into it: the lowest live
        node id does (two that both think so for a moment write the same deterministic state)."""
        live = self.live_ids()
        return bool(live) and self._node_id == min(live)
