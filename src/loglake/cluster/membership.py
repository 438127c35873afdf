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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from loglake.cluster import etcd_client as ec
from loglake.cluster.etcd_client import EtcdClient, prefix_end
from loglake.engine.view import BrokerInfo
from loglake.errors import ConfigError, EtcdUnavailableError, NodeIdInUseError

__all__ = ["BROKER_LEASE_TTL_S_DEFAULT", "BrokerInfo", "Membership"]

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
    ) -> None:
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
                [ec.cmp_absent(key)], [ec.op_put(key, self.me.encode(), lease=lease)], [ec.op_get(key)]
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
        self._spawn(self._keepalive, "loglake-membership-keepalive")
        self._spawn(self._follow, "loglake-membership-follow")
        self._watch = self.client.watch(
            self._k_brokers, prefix_end(self._k_brokers), self._wake.set, name="loglake-membership-watch"
        )
        self.refresh()

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _keepalive(self) -> None:
        interval = self.ttl_s / KEEPALIVES_PER_TTL
        while not self._stop.wait(interval):
            try:
                ttl = self._keepalive_client.lease_keepalive(self.lease)
            except EtcdUnavailableError:
                continue  # the client logged the outage; the next refresh may still be in time
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
        kvs, _ = self.client.range_all(self._k_brokers, prefix_end(self._k_brokers))
        out: dict[int, BrokerInfo] = {}
        for kv in kvs[:BROKERS_MAX]:
            info = BrokerInfo.decode(kv.value, where=kv.key.decode())
            out[info.node_id] = info
        return out

    def refresh(self) -> dict[int, BrokerInfo]:
        """Re-read the live set; tell the listeners when it changed."""
        current = self.live()
        with self._live_lock:
            changed = current != self._live
            self._live = current
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
