"""What the broker does differently in cluster mode (docs/CLUSTER.md): its engine, joining
the cluster once its listeners are bound, and its group coordinators.

Each group has one coordinator, the live broker `loglake.cluster.coordinators.coordinator_of`
picks; the handlers answer NOT_COORDINATOR for the others' groups. This module keeps the broker's
`GroupCoordinator` holding exactly its own groups: it writes through a `FencedGroupStore`
(loglake.broker.cluster_groups), which claims them in etcd before loading them, and when the live
set changes (or another broker claimed one of its groups) the coordinator is replaced by one
loaded afresh from etcd; until then its groups answer COORDINATOR_LOAD_IN_PROGRESS.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loglake.engine import Engine

if TYPE_CHECKING:
    from loglake.broker.config import BrokerConfig
    from loglake.broker.context import BrokerContext

log = logging.getLogger("loglake.broker")

__all__ = ["CoordinatorReloader", "fenced_store", "join", "make_engine"]

#: Seconds between attempts to reload the coordinator while etcd does not answer.
RELOAD_RETRY_S = 1.0


def make_engine(config: BrokerConfig) -> Engine:
    """The single-node engine, or in cluster mode (`cluster` set) the one over etcd and the bucket."""
    if config.cluster is None:
        return Engine(config.data_dir, config.engine_config())
    from loglake.cluster.engine import ClusterEngine

    return ClusterEngine.from_config(config)


async def join(ctx: BrokerContext, listeners: list[str], make_coordinator: Callable[[Any], Any]) -> None:
    """Cluster mode: register advertising `listeners` (PROTOCOL://HOST:PORT), start leading, and
    move group coordinators whenever the live set changes. Nothing on a single-node broker.
    `make_coordinator(store)` makes a coordinator over `store` (a prepared FencedGroupStore)."""
    engine_join = getattr(ctx.engine, "join", None)
    if engine_join is None:
        return
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, engine_join, listeners)
    ctx.cluster = ctx.engine.leadership  # type: ignore[attr-defined]
    reloader = CoordinatorReloader(ctx, make_coordinator, loop)
    ctx.group_reloader = reloader
    ctx.cluster.on_live_change(lambda _live: loop.call_soon_threadsafe(reloader.moved))


async def fenced_store(ctx: BrokerContext) -> Any:
    """Cluster mode: a FencedGroupStore that claimed and loaded this broker's groups (the etcd I/O
    off the loop), now the one the handlers' gate reads; None on a single-node broker."""
    if ctx.cluster is None:
        return None
    from loglake.broker.cluster_groups import FencedGroupStore

    reloader = ctx.group_reloader
    store = FencedGroupStore(ctx.engine.etcd, ctx.cluster,  # type: ignore[attr-defined]
                              reloader.lost if reloader is not None else None)
    if ctx.group_fence is not None:  # its writes fenced by the claims below are no loss to report
        ctx.group_fence.superseded = True
    await ctx.off_loop(store.prepare)
    old, ctx.group_fence = ctx.group_fence, store
    if old is not None:
        old.close()
    return store


class CoordinatorReloader:
    """Replaces `ctx.coordinator` after a change of the live set (`moved`, called on the loop),
    or after another broker claimed one of its groups (`lost`, from any thread).

    The new coordinator claims its groups in etcd, then loads them once every record committed
    so far is applied here: exactly the groups this broker coordinates now, with their
    generations, members and committed offsets, whoever wrote them. The old one is closed: its
    parked JoinGroup/SyncGroup get NOT_COORDINATOR and their clients ask FindCoordinator again;
    its writes still in flight are fenced by the claims. Changes that come while a reload runs
    are folded into one more; a reload that fails (etcd away) is tried again every RELOAD_RETRY_S.
    """

    def __init__(self, ctx: Any, make: Callable[[Any], Any], loop: asyncio.AbstractEventLoop) -> None:
        self.ctx = ctx
        self.make = make
        self.loop = loop
        self._task: asyncio.Future[None] | None = None
        self._due = False
        self._failing = False

    def moved(self) -> None:
        self._due = True
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._reload())

    def lost(self, group_id: str, store: Any) -> None:
        """Another coordinator claimed `group_id` from `store` (called from a store thread). A
        replaced coordinator's write fenced by its successor's claim on this same broker is the
        fence working as meant: no reload, no warning."""
        if store is not self.ctx.group_fence or store.superseded:
            log.debug("cluster: a replaced coordinator's write for group %r was fenced", group_id)
            return
        log.warning(
            "cluster: node %d lost group %r to another coordinator; answering NOT_COORDINATOR for it and reloading",
            store.node_id,
            group_id,
        )
        self.loop.call_soon_threadsafe(self.moved)

    async def _reload(self) -> None:
        while self._due and self.ctx.coordinator is not None:
            self._due = False
            try:
                fresh = self.make(await fenced_store(self.ctx))
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
            old, self.ctx.coordinator = self.ctx.coordinator, fresh
            old.close()
            log.info("cluster: live brokers changed; this broker now coordinates %d group(s)", len(fresh))
