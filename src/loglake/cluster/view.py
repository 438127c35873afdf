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

Leadership is gated by health (loglake.cluster.health): a broker stands for leadership (its
registration says `"leads": true`) only while it reaches the bucket, and the assignment is over
the live brokers that stand. A broker that has not reached the bucket for
`cluster_unreachable_release_ms` withdraws (the others take its partitions at their next round)
and releases what it led; one that has not reached etcd that long releases everything at once (its
lease lapses and the others take over). A partition whose acquire fails is handed back: the
broker releases it, names it in its registration's `"refuses"` for a while (ACQUIRE_BACKOFF_S,
doubling), and every broker's assignment gives it to another broker meanwhile.

The view answers the broker's questions about the cluster: the live brokers for Metadata, each
partition's leader, each group's coordinator. Until `join` (the broker's listeners are bound) it
is not registered and leads nothing. The lowest live node id also sweeps the bucket and copies
the metadata into it (`publishes`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection
from typing import Any, NamedTuple

from loglake.cluster.assign import assign, taken_from_waiting
from loglake.cluster.coordinators import coordinator_of
from loglake.cluster.etcd import EtcdMetaStore
from loglake.cluster.etcd_client import EtcdClient
from loglake.cluster.health import PROBE_OBJECT, ClusterHealth, probe_prefix
from loglake.cluster.membership import POLL_INTERVAL_S, Membership
from loglake.cluster.plog import ClusterPartitionLog
from loglake.cluster.plog_maint import merge, sweep
from loglake.cluster.shared_log import ClusterSettings, SharedPartitionLog
from loglake.engine.catalog import TOPIC_KINDS
from loglake.engine.telemetry import Family, HistogramFamily
from loglake.engine.view import BrokerInfo, LiveListener, read_replica_among, replicas_among
from loglake.errors import EngineClosedError, EtcdUnavailableError, LoglakeError, MetaFencedError
from loglake.logsafe import RateLimitedLog
from loglake.meta.records import RecordKind
from loglake.meta.state import MetaState

__all__ = ["REBALANCE_INTERVAL_S", "EtcdClusterView"]

log = logging.getLogger(__name__)
#: failed acquires: one line per kind of error per window, however many partitions and rounds
_limited = RateLimitedLog(log)

#: Rounds without a wake-up (the watches are the fast path).
REBALANCE_INTERVAL_S = 1.0
#: A partition is merged once it has this many unmerged ranges (well below the 10,000 at which
#: commits are refused: RANGES_PER_PARTITION_MAX), or at every maintenance round if it has any.
MERGE_RANGES_MIN = 1
#: Partitions merged per maintenance round (the rest wait for the next round).
MERGES_PER_ROUND_MAX = 1000
#: A partition whose acquire failed is refused (handed to another broker) for the first value,
#: doubling per failure in a row up to the second; then this broker may be given it again.
ACQUIRE_BACKOFF_S = (5.0, 300.0)
#: Most partitions one broker refuses at once (its registration names them).
REFUSED_MAX = 100

TP = tuple[str, int]


_Inputs = tuple[list[TP], list[int], dict[TP, int], dict[TP, set[int]]]
"""assign's arguments: partitions, the brokers standing, previous leaders, refusals."""


class _Plan(NamedTuple):
    """One rebalance round's reading: who is live, who stands, assign's inputs, and this
    broker's share of the partitions."""

    live: dict[int, BrokerInfo]
    leaders: set[int]
    inputs: _Inputs
    mine: set[TP]

    def takes_from_live(self, node_id: int) -> bool:
        """Whether this broker's share takes a partition another live broker leads now."""
        prev = self.inputs[2]
        return any(prev.get(tp, node_id) != node_id and prev[tp] in self.live for tp in self.mine)


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
        #: whether etcd and the bucket answer (made at `join`, once the log is open)
        self.health: ClusterHealth | None = None
        #: partitions whose acquire failed: (refused until, last backoff) — handed to other brokers
        self._refusing: dict[TP, tuple[float, float]] = {}
        #: until when this broker, standing again after withdrawing, leaves the partitions of live
        #: brokers not standing yet to them (`_stand`)
        self._back_until = 0.0
        #: leadership changes of this broker, by kind (/metrics)
        self.changes = {"acquired": 0, "released": 0, "acquire_failed": 0}
        #: called with the live node ids whenever they change (the broker moves group coordinators)
        self._live_listeners: list[LiveListener] = []
        self._live_ids: frozenset[int] = frozenset()  # as last told to those listeners
        etcd.watch(self._on_record)

    @property
    def node_id(self) -> int:
        return self._node_id

    def _membership(self, leads: bool) -> Membership:
        m = Membership(self.client, self.etcd.prefix, self.me, ttl_s=self.settings.lease_ttl_s, leads=leads)
        m.subscribe(self._live_changed)
        return m

    def _live_changed(self, live: dict[int, BrokerInfo]) -> None:
        self._wake.set()
        ids = frozenset(live)
        if ids == self._live_ids:  # who stands for leadership changed, not who is live
            return
        self._live_ids = ids
        for listener in list(self._live_listeners):
            listener(set(live))

    def _health(self) -> ClusterHealth:
        bucket = self.log.bucket
        assert bucket is not None  # the engine is open before it joins
        prefix = probe_prefix(self.log.catalog.cluster_id)
        key = f"{prefix}node-{self.node_id}"

        def probe_write() -> None:
            bucket.put(key, [PROBE_OBJECT])
            bucket.delete(key)

        def etcd_answered() -> float | None:
            m = self.membership
            return m.etcd_answered() if m is not None else self.client.last_answer

        health = ClusterHealth(
            self.node_id,
            self.settings.unreachable_release_ms / 1000.0,
            bucket_url=bucket.url,
            etcd_url=self.settings.url,
            probe_list=lambda: bucket.list(prefix),
            probe_write=probe_write,
            etcd_answered=etcd_answered,
        )

        def put_done(error: BaseException | None) -> None:
            if error is None:
                health.bucket_answered(write=True)
            else:
                health.bucket_failed(error, write=True)

        self.log.plog.flusher.on_put = put_done
        return health

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
        self.health = health = self._health()
        # a broker that reaches the bucket stands from its first round
        health.start(first_wait_s=health.release_s)
        health.standing = health.check()[1]
        self.membership = self._membership(leads=health.standing)
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
        if self.health is not None:
            self.health.stop()
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
        if self.membership is None or self.health is None:
            return  # not joined yet
        if self.membership.lost.is_set():
            self._release_all()
            self._rejoin()
            return
        etcd_ok, bucket_ok = self.health.check()
        if not etcd_ok:
            # nothing commits without etcd: appends fail fast instead of waiting for a commit; the
            # lease lapses and the others take the partitions (registering again follows the loss)
            self._abandon_all()
            return
        self._stand(bucket_ok)
        if not bucket_ok:
            self._abandon_all()
            return
        plan = self._plan(self.membership)
        if plan is not None and plan.takes_from_live(self.node_id):
            # Taking a partition from another live broker, on a live set read up to POLL_INTERVAL_S
            # ago: read it again first. A broker that stood again meanwhile would otherwise lose its
            # partitions to this one and take them back a round later, each move a leader change
            # its producers follow (librdkafka can stay on the wrong broker after quick changes).
            self.membership.refresh()
            plan = self._plan(self.membership)
        if plan is None:
            self._release_all()
            return
        live, leaders, inputs, mine = plan
        if time.monotonic() < self._back_until:
            waiting = taken_from_waiting(mine, inputs[2], live, leaders, self.node_id)
            if waiting:
                log.debug(
                    "node %d stood again just now: leaves %d partition(s) of live brokers not standing yet to them for now",
                    self.node_id, len(waiting),
                )  # fmt: skip
                mine -= waiting
        dropped = sorted(self.held - mine)
        for tp in dropped:
            self._release(tp)
        before = len(self.held)
        self._acquire(mine)
        if dropped or len(self.held) != before:
            log.info(
                "node %d leads %d partition(s) (%d released) of %d over %d live broker(s)",
                self.node_id, len(self.held), len(dropped), len(inputs[0]), len(live),
            )  # fmt: skip
        self._last_error = ""

    def _plan(self, membership: Membership) -> _Plan | None:
        """This round's plan from the live set as last read; None when this broker does not
        stand for leadership."""
        live = membership.known
        leaders = membership.leaders & set(live)
        if self.node_id not in leaders:
            return None
        inputs = self._inputs(leaders)
        mine = {tp for tp, b in assign(*inputs).items() if b == self.node_id}
        return _Plan(live, leaders, inputs, mine)

    def _stand(self, bucket_ok: bool) -> None:
        """Stand for leadership (or withdraw) as the bucket's health says, naming the partitions
        this broker refuses now; re-reads the live set after a change, so this round sees it."""
        assert self.membership is not None and self.health is not None
        now = time.monotonic()
        for tp, (until, _delay) in list(self._refusing.items()):
            if now - until > ACQUIRE_BACKOFF_S[1]:  # quiet for the longest backoff: start again from the first
                del self._refusing[tp]
        refuses = sorted(f"{tid}:{p}" for (tid, p), (until, _) in self._refusing.items() if until > now)[:REFUSED_MAX]
        if bucket_ok == self.membership.leads and refuses == self.membership.refuses:
            return
        if bucket_ok and not self.membership.leads:
            # Back after withdrawing. An outage of the bucket itself withdrew every broker, and the
            # others notice its end within one probe interval and are seen standing one membership
            # poll later: until then their partitions are left to them, not taken
            # and handed back — after a shared outage each partition returns to its own leader.
            self._back_until = now + self.health.probe_interval_s + POLL_INTERVAL_S
        self.membership.set_leads(bucket_ok, refuses)
        self.health.standing = bucket_ok
        self.membership.refresh()

    def _acquire(self, mine: set[TP]) -> None:
        now = time.monotonic()
        for tp in sorted(mine):
            if self._stop.is_set() or (self.membership is not None and self.membership.lost.is_set()):
                return
            if tp in self.held and self.log.leads(*tp):
                continue
            if self._refusing.get(tp, (0.0, 0.0))[0] > now:
                continue  # handed back: another broker gets it once they read the registration
            try:
                epoch = self.log.acquire(*tp)
            except MetaFencedError:
                log.debug(
                    "node %d: %s-%d was taken by another broker first; looking again", self.node_id, *tp
                )
                self._wake.set()
                continue
            except LoglakeError as exc:
                self._hand_back(tp, exc)
                continue
            self.held.add(tp)
            self.changes["acquired"] += 1
            log.debug("node %d leads %s-%d at epoch %d", self.node_id, tp[0], tp[1], epoch)

    def _hand_back(self, tp: TP, exc: LoglakeError) -> None:
        """An acquire failed: release what it left (its epoch bump may have landed) and refuse the
        partition for a while, so the assignment gives it to another broker instead of this one
        retrying every round; probe the bucket at once (the cause may be this broker's reach)."""
        self.changes["acquire_failed"] += 1
        try:
            self.log.release(*tp)
        except LoglakeError as release_error:
            log.debug("node %d: releasing %s-%d after a failed acquire: %s", self.node_id, *tp, release_error)
        self.held.discard(tp)
        _until, last = self._refusing.get(tp, (0.0, 0.0))
        delay = min(ACQUIRE_BACKOFF_S[1], last * 2) if last else ACQUIRE_BACKOFF_S[0]
        self._refusing[tp] = (time.monotonic() + delay, delay)
        if self.health is not None:
            self.health.probe_now()
        _limited.warning(
            ("acquire failed", type(exc).__name__),
            "node %d could not acquire %s-%d (%s): it hands the partition to another broker for %.0f s; "
            "a broker that cannot reach the bucket or etcd for cluster_unreachable_release_ms leads nothing",
            self.node_id, tp[0], tp[1], exc, delay,
        )  # fmt: skip
        self._wake.set()

    def _inputs(self, live: Collection[int]) -> _Inputs:
        def read(s: MetaState) -> tuple[list[TP], dict[TP, int]]:
            parts = sorted((tm.topic_id.hex(), i) for tm in s.topics.values() for i in range(tm.partitions))
            prev = {(tid.hex(), p): pl.leader for (tid, p), pl in s.plogs.parts.items() if pl.leader >= 0}
            return parts, prev

        parts, prev = self.etcd.read(read)
        refused: dict[TP, set[int]] = {}
        assert self.membership is not None
        for node, names in self.membership.refusals.items():
            for name in names:
                tid, _, p = name.rpartition(":")
                if p.isdigit():
                    refused.setdefault((tid, int(p)), set()).add(node)
        return parts, sorted(live), prev, refused

    def _release(self, tp: TP) -> None:
        try:
            self.log.release(*tp)
        except LoglakeError as exc:
            self._say(f"releasing {tp[0]}-{tp[1]}: {exc}")
        self.held.discard(tp)
        self.changes["released"] += 1

    def _release_all(self) -> None:
        for tp in sorted(self.held):
            self._release(tp)

    def _abandon_all(self) -> None:
        """Stop leading everything because etcd or the bucket does not answer: appends not
        committed fail now (their clients go to the next leader at once), then each partition is
        released (which waits for its flush in flight to settle)."""
        if not self.held:
            return
        failed = sum(self.log.abandon(*tp) for tp in sorted(self.held))
        log.info("node %d stops leading %d partition(s); %d append(s) not committed fail", self.node_id, len(self.held), failed)
        self._release_all()

    def _rejoin(self) -> None:
        """Register again under a new lease after losing the old one."""
        old = self.membership
        if old is not None:
            old.stop(revoke=False)
        stand = self.health.check()[1] if self.health is not None else True
        fresh = self._membership(leads=stand)
        try:
            fresh.start()
        except (EtcdUnavailableError, LoglakeError) as exc:
            self._say(f"registering again failed ({exc}); retrying")
            return
        self.membership = fresh
        if self.health is not None:
            self.health.standing = stand
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
        """Apply retention to the partitions this broker leads, merge their ranges, compact the
        compacted topics' merged segments that are due, then sweep; returns partitions merged."""
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
        if not self._stop.is_set():
            try:
                self.log.compact(None, False)  # what was merged is compacted in the same round
            except LoglakeError as exc:  # the sweep below runs regardless
                self._say(f"compaction round failed: {exc}")
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

    def _serving_ids(self) -> set[int]:
        """The live brokers that can serve a partition's committed data: those reaching the bucket
        (standing for leadership); all live ones before membership is known."""
        live = self.live_ids()
        m = self.membership
        return live if m is None else (m.leaders & live) or live

    def replicas_of(self, topic_id: bytes, partition: int, factor: int) -> list[int]:
        """Any broker reaching the bucket can serve the partition's committed data: `factor` of
        them, the leader first (engine.view.replicas_among)."""
        return replicas_among(self.leader_of(topic_id, partition), self._serving_ids(), factor, partition)

    def read_replica_for(self, topic_id: bytes, partition: int, factor: int, rack: str) -> int:
        leader = self.leader_of(topic_id, partition)
        replicas = replicas_among(leader, self._serving_ids(), factor, partition)
        return read_replica_among(replicas, leader, self.brokers(), rack, partition)

    def publishes(self) -> bool:
        """Whether this broker sweeps the bucket and copies the metadata into it: the lowest live
        node id standing for leadership (reaching the bucket) does (two that both think so for a
        moment write the same deterministic state)."""
        m = self.membership
        able = (m.leaders if m is not None else set()) & self.live_ids()
        return bool(able) and self._node_id == min(able)

    # ---- what /metrics and /readyz show (loglake.engine.telemetry) -----------------------------------

    def families(self) -> list[Family | HistogramFamily]:
        m = self.membership
        out: list[Family | HistogramFamily] = [
            Family.gauge("loglake_cluster_partitions_led", "Partitions this broker leads now.", len(self.held)),
            Family(
                "loglake_cluster_leadership_changes_total",
                "Leadership changes of this broker: partitions acquired, released, and acquires that failed (handed back).",
                "counter",
                tuple(((kind,), float(n)) for kind, n in sorted(self.changes.items())),
                ("change",),
            ),
            Family.gauge(
                "loglake_cluster_leader_candidate",
                "1 while this broker stands for leadership (registered, reaching etcd and the bucket), else 0.",
                1 if m is not None and m.lease and not m.lost.is_set() and m.leads else 0,
            ),
            Family.gauge("loglake_cluster_partitions_refused", "Partitions handed back after a failed acquire, refused for now.",
                         sum(1 for until, _ in self._refusing.values() if until > time.monotonic())),
        ]
        if m is not None:
            out.append(Family.gauge(
                "loglake_cluster_lease_expires_in_seconds",
                "Seconds until this broker's etcd lease lapses unless a keep-alive lands (0: no lease).",
                m.expires_in(),
            ))  # fmt: skip
            out.append(Family.counter(
                "loglake_cluster_lease_keepalive_failures_total", "Lease keep-alives etcd did not answer.",
                m.keepalive_failures,
            ))  # fmt: skip
        try:
            plog: ClusterPartitionLog | None = self.log.plog
        except EngineClosedError:
            plog = None
        if plog is not None:
            out.append(plog.flusher.put_seconds.family(
                "loglake_cluster_flush_put_seconds",
                "Seconds from a flush object's first PUT attempt to it being in the bucket (retries included).",
            ))  # fmt: skip
            out.append(plog.commit_seconds.family(
                "loglake_cluster_etcd_commit_seconds", "Seconds from a flush's range commit being queued to etcd's answer.",
            ))  # fmt: skip
        if self.health is not None:
            out += self.health.families()
        return out

    def not_ready(self) -> list[str]:
        """Why this broker should get no traffic (etcd or the bucket unreachable): /readyz."""
        return self.health.not_ready() if self.health is not None else []
