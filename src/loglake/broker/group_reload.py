"""The broker's group coordinator, kept to the groups this broker coordinates.

Which broker coordinates a group is the cluster view's answer (loglake.engine.view): on a single
node always this one; in cluster mode the live broker rendezvous hashing picks. The coordinator
writes through a store from the group-store factory it was given — on a single node the
metadata store's group records (loglake.broker.groups.meta_store), in cluster mode a fenced store
that claims its groups in etcd before loading them (loglake.cluster.groups).

When the live set changes (the view says so) or another broker claimed one of its groups (the
store says so), the coordinator is replaced by one loaded afresh; until then the changed groups
answer COORDINATOR_LOAD_IN_PROGRESS (`gate`). The old one is closed: its parked
JoinGroup/SyncGroup get NOT_COORDINATOR and their clients ask FindCoordinator again; its writes
still in flight are fenced by the new store's claims. Changes that come while a reload runs are
folded into one more; a reload that fails (etcd away) is tried again every RELOAD_RETRY_S.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from loglake.broker.groups import GroupCoordinator
from loglake.broker.groups.store import GroupStoreFactory, ReloadableGroupStore
from loglake.engine.view import ClusterView
from loglake.kafka_errors import ErrorCode

log = logging.getLogger("loglake.broker")

__all__ = ["RELOAD_RETRY_S", "GroupCoordination"]

#: Seconds between attempts to reload the coordinator while etcd does not answer.
RELOAD_RETRY_S = 1.0


class GroupCoordination:
    """The current coordinator and its store (see the module doc)."""

    def __init__(
        self,
        view: ClusterView,
        stores: GroupStoreFactory,
        make_coordinator: Callable[[ReloadableGroupStore], GroupCoordinator],
        off_loop: Callable[[Callable[[], None]], Awaitable[None]],
    ) -> None:
        self.view = view
        self._stores = stores
        self._make = make_coordinator
        self._off_loop = off_loop
        self.coordinator: GroupCoordinator | None = None
        self.store: ReloadableGroupStore | None = None
        #: the live node ids the current store was loaded for; another set means a reload is due
        self.loaded_for: frozenset[int] = frozenset()
        self._retiring: ReloadableGroupStore | None = None  # superseded, being replaced
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Future[None] | None = None
        self._due = False
        self._failing = False
        self._closed = False

    async def start(self) -> GroupCoordinator:
        """The first coordinator (its store prepared off the loop); follows the view from here on."""
        self._loop = loop = asyncio.get_running_loop()
        def changed(_live: set[int]) -> None:  # from the view's thread
            loop.call_soon_threadsafe(self.moved)

        self.view.on_change(changed)
        self.coordinator = self._make(await self._fresh_store())
        return self.coordinator

    async def _fresh_store(self) -> ReloadableGroupStore:
        live = frozenset(self.view.live_ids())
        store = self._stores(self.lost)
        if self.store is not None:  # its writes fenced by the new store's claims are no loss to report
            self.store.supersede()
            self._retiring = self.store
        await self._off_loop(store.prepare)
        old, self.store = self.store, store
        self.loaded_for = live
        if old is not None:
            old.close()
        return store

    def gate(self, group_id: str) -> int:
        """NONE when this broker coordinates `group_id` now; COORDINATOR_NOT_AVAILABLE without a
        coordinator; NOT_COORDINATOR when another live broker coordinates it, or claimed it (the
        client asks FindCoordinator again); COORDINATOR_LOAD_IN_PROGRESS while the coordinator
        reloads after a change of the live set (Kafka's answer while a coordinator loads a group;
        asking for the reload here too means a change that came before the first coordinator was
        installed is not missed)."""
        if self.coordinator is None or self.store is None:
            return int(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if group_id in self.store.lost:
            return int(ErrorCode.NOT_COORDINATOR)
        if self.view.coordinator_of(group_id) != self.view.node_id:
            return int(ErrorCode.NOT_COORDINATOR)
        if self.loaded_for != frozenset(self.view.live_ids()):
            self.moved()
            return int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        return int(ErrorCode.NONE)

    def moved(self) -> None:
        """The live set changed (called on the loop): reload once nothing else reloads."""
        if self._closed:
            return
        self._due = True
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._reload())

    def lost(self, group_id: str, store: ReloadableGroupStore) -> None:
        """Another coordinator claimed `group_id` from `store` (called from a store thread). A
        replaced coordinator's write fenced by its successor's claim on this same broker is the
        fence working as meant: no reload, no warning."""
        if store is not self.store or store is self._retiring:
            log.debug("cluster: a replaced coordinator's write for group %r was fenced", group_id)
            return
        log.warning(
            "cluster: node %d lost group %r to another coordinator; answering NOT_COORDINATOR for it and reloading",
            self.view.node_id,
            group_id,
        )
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.moved)

    async def _reload(self) -> None:
        while self._due and self.coordinator is not None and not self._closed:
            self._due = False
            try:
                fresh = self._make(await self._fresh_store())
            except Exception as exc:  # etcd away: try again shortly (one warning per outage)
                (log.debug if self._failing else log.warning)(
                    "cluster: reloading the group coordinator failed: %s; retrying every %.0f s",
                    exc,
                    RELOAD_RETRY_S,
                )
                self._failing = True
                self._due = True
                await asyncio.sleep(RELOAD_RETRY_S)
                continue
            self._failing = False
            old, self.coordinator = self.coordinator, fresh
            if old is not None:
                old.close()
            log.info("cluster: live brokers changed; this broker now coordinates %d group(s)", len(fresh))

    def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        if self.coordinator is not None:
            self.coordinator.close()
        if self.store is not None:
            self.store.close()
