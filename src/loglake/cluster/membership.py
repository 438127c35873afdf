"""Broker membership under etcd leases (docs/CLUSTER.md).

A broker registers `PREFIX/brokers/<node id>` = {node_id, listeners, rack} attached to a lease of
`ttl_s` seconds, in a transaction that succeeds only when the key does not exist: a node id held
by a live broker is refused (NodeIdInUseError) instead of silently taking over its partitions.
A keep-alive thread refreshes the lease every ttl/3; while it lives the key stays, and when the
process dies or pauses past the TTL etcd deletes the key, which every other broker sees.

Failover time: a dead broker's key disappears between `ttl_s` and `ttl_s` + one etcd lease check
after its last keep-alive (etcd checks leases every 500 ms), the other brokers notice within a
watch event (or one POLL_INTERVAL_S at worst), then move its partitions. So failover scales
linearly with the TTL: measured about TTL + 0.5 s from the keep-alives stopping. The default of
3 s keeps failover within issue 18's 5 s target; a longer TTL trades failover time against a
broker being declared dead by a pause (swap storm, SIGSTOP, a VM migration).

A broker whose own keep-alive finds its lease gone (it was paused, or etcd was unreachable past
the TTL) has lost its registration: it is reported once (`lost` is set and `on_lost` called) and
does not re-register by itself — its partitions have moved and its leader epochs are stale, so
the server decides (restart its cluster role with a fresh lease).

A registration also says whether the broker stands for leadership now (`"leads"`, absent in a
registration of an earlier release: true). A broker that cannot reach the bucket stays registered
— it still answers Metadata and coordinates groups, which need etcd only — but puts `"leads":
false` (`set_leads`), and every broker's assignment leaves it out (loglake.cluster.view,
loglake.cluster.health).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

from loglake.cluster import etcd_client as ec
from loglake.cluster.etcd_client import EtcdClient, prefix_end
from loglake.engine.view import BrokerInfo
from loglake.errors import ConfigError, EtcdUnavailableError, NodeIdInUseError

__all__ = ["BROKER_LEASE_TTL_S_DEFAULT", "POLL_INTERVAL_S", "BrokerInfo", "Membership"]

log = logging.getLogger(__name__)

#: Default lease TTL of a broker's registration (seconds). A dead broker is noticed about 0.5 s after
#: its lease lapses (measured: 2.5 s at TTL 2, 4.4 s at TTL 4), leaving room within issue 18's
#: p99 failover target of 5 s for moving its partitions and clients refreshing Metadata.
BROKER_LEASE_TTL_S_DEFAULT = 3
#: Shortest TTL accepted (etcd's own minimum lease TTL with default timings is about 1.5 s).
BROKER_LEASE_TTL_S_MIN = 2
#: Keep-alives per TTL: a refresh may fail this many times minus one before the lease lapses.
KEEPALIVES_PER_TTL = 3
#: How often the live set is re-read without a watch event (the watch is the fast path).
POLL_INTERVAL_S = 1.0
#: Most live brokers read (one range page; a loglake cluster is far smaller).
BROKERS_MAX = 1000


Listener = Callable[[dict[int, BrokerInfo]], None]


class Membership:
    def __init__(
        self,
        client: EtcdClient,
        prefix: str,
        me: BrokerInfo,
        *,
        ttl_s: int = BROKER_LEASE_TTL_S_DEFAULT,
        on_lost: Callable[[], None] | None = None,
        leads: bool = True,
    ) -> None:
        """`leads`: whether to stand for leadership from the start (see the module doc)."""
        if ttl_s < BROKER_LEASE_TTL_S_MIN:
            raise ConfigError(f"broker lease TTL must be at least {BROKER_LEASE_TTL_S_MIN} s, not {ttl_s}")
        self.client = client
        # Keep-alives get their own client whose requests time out within one keep-alive interval:
        # a hung etcd member (accepting connections, answering nothing) must not hold a refresh
        # past the TTL when another member would answer.
        self._keepalive_client = EtcdClient(
            client.endpoints,
            unavailable_s=ttl_s / KEEPALIVES_PER_TTL,
            request_timeout_s=min(client.request_timeout_s, ttl_s / KEEPALIVES_PER_TTL / 2),
        )
        self.prefix = "/" + prefix.strip("/")
        self.me = me
        self.ttl_s = ttl_s
        self.on_lost = on_lost
        self._k_brokers = f"{self.prefix}/brokers/".encode()
        self.lease = 0
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._listeners: list[Listener] = []
        self._live: dict[int, BrokerInfo] = {}
        self._leaders: set[int] = set()  # of the live set, those standing for leadership
        self._refusals: dict[int, list[str]] = {}  # of the live set, the partitions each refuses now
        self.leads = leads
        #: partitions this broker refuses now (its registration names them; opaque to membership)
        self.refuses: list[str] = []
        #: monotonic time the lease lapses unless a keep-alive lands (0: no lease)
        self.expires_at = 0.0
        self.keepalive_failures = 0
        self._live_lock = threading.Lock()
        self._wake = threading.Event()
        self._watch: ec.Watch | None = None
        self._last_error = ""

    def key_of(self, node_id: int) -> bytes:
        return self._k_brokers + str(node_id).encode()

    # ---- registering ---------------------------------------------------------------------------

    def start(self) -> None:
        """Register under a new lease (NodeIdInUseError if the node id is live) and keep it alive."""
        lease = self.client.lease_grant(self.ttl_s)
        key = self.key_of(self.me.node_id)
        try:
            ok, responses, _ = self.client.txn(
                [ec.cmp_absent(key)],
                [ec.op_put(key, _encode(self.me, self.leads, self.refuses), lease=lease)],
                [ec.op_get(key)],
            )
        except BaseException:
            self._revoke(lease)
            raise
        if not ok:
            self._revoke(lease)
            holder = ec.response_kvs(responses[0])
            other = BrokerInfo.decode(holder[0].value, where=key.decode()) if holder else None
            raise NodeIdInUseError(
                f"node id {self.me.node_id} is held by a live broker ({', '.join(other.listeners) if other else 'unknown'}); "
                f"it frees within {self.ttl_s} s of that broker stopping"
            )
        self.lease = lease
        self.expires_at = time.monotonic() + self.ttl_s
        self._spawn(self._keepalive, "loglake-membership-keepalive")
        self._spawn(self._follow, "loglake-membership-follow")
        self._watch = self.client.watch(
            self._k_brokers, prefix_end(self._k_brokers), self._wake.set, name="loglake-membership-watch"
        )
        self.refresh()

    def set_leads(self, leads: bool, refuses: list[str]) -> None:
        """Stand for leadership or not, refusing `refuses`: rewrite the registration under the
        same lease (every broker's watch sees it). EtcdUnavailableError when etcd does not answer."""
        if leads == self.leads and refuses == self.refuses:
            return
        if self.lease and not self.lost.is_set():
            self.client.put(self.key_of(self.me.node_id), _encode(self.me, leads, refuses), lease=self.lease)
        self.leads, self.refuses = leads, list(refuses)
        self._wake.set()

    def expires_in(self) -> float:
        """Seconds until the lease lapses unless a keep-alive lands (0: none held)."""
        if not self.lease or self.lost.is_set():
            return 0.0
        return max(0.0, self.expires_at - time.monotonic())

    def etcd_answered(self) -> float | None:
        """Monotonic time etcd last answered this broker (any request, keep-alives included)."""
        times = [t for t in (self.client.last_answer, self._keepalive_client.last_answer) if t is not None]
        return max(times) if times else None

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _keepalive(self) -> None:
        interval = self.ttl_s / KEEPALIVES_PER_TTL
        while not self._stop.wait(interval):
            sent = time.monotonic()
            try:
                ttl = self._keepalive_client.lease_keepalive(self.lease)
            except EtcdUnavailableError:
                self.keepalive_failures += 1
                continue  # the client logged the outage; the next refresh may still be in time
            if ttl > 0:
                self.expires_at = sent + ttl
            if ttl <= 0:
                if not self.lost.is_set():
                    log.error(
                        "broker %d lost its etcd lease (paused or cut off past %d s): its registration is gone",
                        self.me.node_id,
                        self.ttl_s,
                    )
                    self.lost.set()
                    if self.on_lost is not None:
                        self.on_lost()
                return

    # ---- the live set ----------------------------------------------------------------------------

    def live(self) -> dict[int, BrokerInfo]:
        """The brokers registered now (read from etcd)."""
        return self._read()[0]

    def _read(self) -> tuple[dict[int, BrokerInfo], set[int], dict[int, list[str]]]:
        """(the brokers registered now, those of them standing for leadership, what each refuses), from etcd."""
        kvs, _ = self.client.range_all(self._k_brokers, prefix_end(self._k_brokers))
        out: dict[int, BrokerInfo] = {}
        leaders: set[int] = set()
        refusals: dict[int, list[str]] = {}
        for kv in kvs[:BROKERS_MAX]:
            info = BrokerInfo.decode(kv.value, where=kv.key.decode())
            out[info.node_id] = info
            stands, refuses = _candidacy(kv.value)
            if stands:
                leaders.add(info.node_id)
            if refuses:
                refusals[info.node_id] = refuses
        return out, leaders, refusals

    def refresh(self) -> dict[int, BrokerInfo]:
        """Re-read the live set; tell the listeners when it (or who stands for leadership) changed."""
        current, leaders, refusals = self._read()
        with self._live_lock:
            changed = current != self._live or leaders != self._leaders or refusals != self._refusals
            self._live = current
            self._leaders = leaders
            self._refusals = refusals
            listeners = list(self._listeners)
        if changed:
            for listener in listeners:
                listener(dict(current))
        return current

    @property
    def known(self) -> dict[int, BrokerInfo]:
        """The live set as last read (no I/O)."""
        with self._live_lock:
            return dict(self._live)

    @property
    def leaders(self) -> set[int]:
        """Of the live set as last read, the brokers standing for leadership (no I/O)."""
        with self._live_lock:
            return set(self._leaders)

    @property
    def refusals(self) -> dict[int, list[str]]:
        """Of the live set as last read, the partitions each broker refuses now (no I/O)."""
        with self._live_lock:
            return {node: list(names) for node, names in self._refusals.items()}

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(live set)` whenever the live set changes (from the follower thread)."""
        with self._live_lock:
            self._listeners.append(listener)

    def _follow(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(POLL_INTERVAL_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.refresh()
            except EtcdUnavailableError:
                pass  # logged once by the client; the live set is kept as last read
            except Exception as exc:  # a registration that does not parse: said once, not every poll
                if str(exc) != self._last_error:
                    log.error("broker %d: reading the live brokers failed: %s", self.me.node_id, exc)
                    self._last_error = str(exc)

    # ---- stopping --------------------------------------------------------------------------------

    def stop(self, *, revoke: bool = True) -> None:
        """Stop keeping the lease alive; `revoke` deletes the registration now (a clean shutdown)
        instead of after the TTL."""
        self._stop.set()
        self._wake.set()
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        for t in self._threads:
            t.join(ec.WATCH_IDLE_S + 1)
        self._threads = []
        if revoke and self.lease and not self.lost.is_set():
            self._revoke(self.lease)
        self.lease = 0
        self._keepalive_client.close()

    def _revoke(self, lease: int) -> None:
        try:
            self.client.lease_revoke(lease)
        except EtcdUnavailableError as exc:
            log.warning(
                "broker %d: could not revoke its lease (%s); it lapses in %d s",
                self.me.node_id,
                exc,
                self.ttl_s,
            )



def _encode(me: BrokerInfo, leads: bool, refuses: list[str]) -> bytes:
    """A registration: the broker as Metadata describes it, whether it stands for leadership and
    the partitions it refuses now (the cluster view's names)."""
    doc = json.loads(me.encode())
    doc["leads"] = leads
    if refuses:
        doc["refuses"] = refuses
    return json.dumps(doc).encode()


def _candidacy(raw: bytes) -> tuple[bool, list[str]]:
    """(whether a registration stands for leadership, what it refuses); one of an earlier release,
    without the fields, stands and refuses nothing."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return False, []  # BrokerInfo.decode refused it already
    if not isinstance(doc, dict):
        return False, []
    refuses = doc.get("refuses")
    names = [str(x) for x in refuses] if isinstance(refuses, list) else []
    return doc.get("leads", True) is not False, names
