"""A cluster broker's leadership: register, follow the live set, lead what `assign` gives it.

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

The thread also answers the broker's questions about the cluster (`ClusterView`): the live
brokers for Metadata, each partition's leader, each group's coordinator.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loglake.cluster.assign import assign
from loglake.cluster.coordinators import coordinator_of
from loglake.cluster.membership import BrokerInfo, Membership
from loglake.cluster.plog_maint import merge, sweep
from loglake.engine.catalog import TOPIC_KINDS
from loglake.errors import EtcdUnavailableError, LoglakeError, MetaFencedError
from loglake.meta.state import MetaState

if TYPE_CHECKING:
    from loglake.cluster.engine import ClusterEngine

__all__ = ["REBALANCE_INTERVAL_S", "Leadership"]

log = logging.getLogger(__name__)

#: Rounds without a wake-up (the watches are the fast path).
REBALANCE_INTERVAL_S = 1.0
#: A partition is merged once it has this many unmerged ranges (well below the 10,000 at which
#: commits are refused: RANGES_PER_PARTITION_MAX), or at every maintenance round if it has any.
MERGE_RANGES_MIN = 1
#: Partitions merged per maintenance round (the rest wait for the next round).
MERGES_PER_ROUND_MAX = 1000

TP = tuple[str, int]


class Leadership:
    def __init__(self, engine: ClusterEngine, listeners: list[str]) -> None:
        self.engine = engine
        self.node_id = engine.cluster.node_id
        self.me = BrokerInfo(self.node_id, tuple(listeners), engine.cluster.rack)
        self.membership = self._membership()
        self.held: set[TP] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._maint: threading.Thread | None = None
        self._last_error = ""
        self.rounds = 0
        #: called with the live node ids whenever they change (the server moves group coordinators)
        self._live_listeners: list[Callable[[set[int]], None]] = []
        engine.etcd.watch(self._on_record)

    def _membership(self) -> Membership:
        m = Membership(
            self.engine.client, self.engine.cluster.prefix, self.me, ttl_s=self.engine.cluster.lease_ttl_s
        )
        m.subscribe(self._live_changed)
        return m

    def _live_changed(self, live: dict[int, BrokerInfo]) -> None:
        self._wake.set()
        for listener in list(self._live_listeners):
            listener(set(live))

    def on_live_change(self, listener: Callable[[set[int]], None]) -> None:
        """Call `listener(live node ids)` (from the membership thread) whenever the live set changes."""
        self._live_listeners.append(listener)

    def _on_record(self, seq: int, kind: str, body: dict[str, Any], raw: bytes) -> None:
        # under the store's lock: only a wake-up
        if kind in TOPIC_KINDS or (kind == "plog_leader" and int(body.get("leader", -1)) != self.node_id):
            self._wake.set()

    def start(self) -> None:
        self.membership.start()  # NodeIdInUseError: refuse to start
        self.rebalance()
        self._thread = threading.Thread(target=self._run, name="loglake-cluster-leadership", daemon=True)
        self._thread.start()
        self._maint = threading.Thread(target=self._maintain, name="loglake-cluster-maintenance", daemon=True)
        self._maint.start()

    def stop(self) -> None:
        """Release every partition (their buffered appends flush first) and revoke the lease, so
        the other brokers take over at once instead of after the TTL."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(60)
        if self._maint is not None:
            self._maint.join(60)
        self._release_all()
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
            if self._stop.is_set() or self.membership.lost.is_set():
                return
            if tp in self.held and self.engine.leads(*tp):
                continue
            try:
                epoch = self.engine.acquire(*tp)
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

        parts, prev = self.engine.etcd.read(read)
        return parts, sorted(live), prev

    def _release(self, tp: TP) -> None:
        try:
            self.engine.release(*tp)
        except LoglakeError as exc:
            self._say(f"releasing {tp[0]}-{tp[1]}: {exc}")
        self.held.discard(tp)

    def _release_all(self) -> None:
        for tp in sorted(self.held):
            self._release(tp)

    def _rejoin(self) -> None:
        """Register again under a new lease after losing the old one."""
        old = self.membership
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
        interval = self.engine.cluster.maintenance_interval_ms / 1000.0
        while not self._stop.wait(interval):
            try:
                self.maintain_once()
            except Exception as exc:  # etcd or the bucket away: the next round tries again
                self._say(f"merge/sweep round failed: {exc}")

    def maintain_once(self) -> int:
        """Merge the ranges of partitions this broker leads, then sweep; returns partitions merged."""
        plog = self.engine.plog
        assert plog is not None

        def names(s: MetaState) -> dict[str, str]:
            return {tm.topic_id.hex(): tm.name for tm in s.topics.values()}

        topic_names = self.engine.etcd.read(names)
        merged = 0
        for tid, p in sorted(self.held):
            if self._stop.is_set() or merged >= MERGES_PER_ROUND_MAX:
                break
            name = topic_names.get(tid)
            if name is None or not self.engine.leads(tid, p):
                continue
            if len(self.engine._plog_of(tid, p).ranges) < MERGE_RANGES_MIN:
                continue
            try:
                merge(plog, tid, p, name)
                merged += 1
            except LoglakeError as exc:
                log.info("node %d: merging %s-%d: %s (next round)", self.node_id, name, p, exc)
        live = self.membership.known
        if not self._stop.is_set() and live and self.node_id == min(live):
            sweep(plog)  # one sweeper (the lowest live node id): sweeps racing on the same keys waste work
        return merged

    # ---- the view the handlers use -------------------------------------------------------------------

    def brokers(self) -> list[BrokerInfo]:
        return [info for _, info in sorted(self.membership.known.items())]

    def live_ids(self) -> set[int]:
        return set(self.membership.known)

    def leader_of(self, topic_id: str, partition: int) -> tuple[int, int]:
        """(leader node id or -1 when it is not live, leader epoch) of a partition."""
        tid = bytes.fromhex(topic_id)

        def read(s: MetaState) -> tuple[int, int]:
            pl = s.plogs.parts.get((tid, partition))
            return (pl.leader, pl.epoch) if pl is not None else (-1, 0)

        leader, epoch = self.engine.etcd.read(read)
        return (leader if leader in self.membership.known else -1), epoch

    def coordinator_of(self, group: str) -> int:
        return coordinator_of(group, self.live_ids())

    def coordinates(self, group: str) -> bool:
        return self.coordinator_of(group) == self.node_id


def endpoint_of(info: BrokerInfo, protocol: str) -> tuple[str, int] | None:
    """(host, port) a broker advertises for `protocol` (its first listener when none matches)."""
    chosen = None
    for url in info.listeners:
        proto, _, hostport = url.partition("://")
        host, _, port = hostport.rpartition(":")
        if not port.isdigit():
            continue
        if chosen is None or proto == protocol:
            chosen = (host.strip("[]"), int(port))
            if proto == protocol:
                break
    return chosen
