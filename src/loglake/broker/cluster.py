"""What the broker does differently in cluster mode (docs/CLUSTER.md): its engine, joining
the cluster once its listeners are bound, and its group coordinators.

Each group has one coordinator, the live broker `loglake.cluster.coordinators.coordinator_of`
picks; the handlers answer NOT_COORDINATOR for the others' groups. This module keeps the broker's
`GroupCoordinator` holding exactly its own groups: the store it loads from is filtered to them,
and when the live set changes the coordinator is replaced by one loaded afresh from etcd.
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

__all__ = ["CoordinatorReloader", "join", "make_engine", "owned_groups_only"]


def make_engine(config: BrokerConfig) -> Engine:
    """The single-node engine, or in cluster mode (`cluster` set) the one over etcd and the bucket."""
    if config.cluster is None:
        return Engine(config.data_dir, config.engine_config())
    from loglake.cluster.engine import ClusterEngine

    return ClusterEngine.from_config(config)


async def join(ctx: BrokerContext, listeners: list[str], make_coordinator: Callable[[], Any]) -> None:
    """Cluster mode: register advertising `listeners` (PROTOCOL://HOST:PORT), start leading, and
    move group coordinators whenever the live set changes. Nothing on a single-node broker."""
    engine_join = getattr(ctx.engine, "join", None)
    if engine_join is None:
        return
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, engine_join, listeners)
    ctx.cluster = ctx.engine.leadership  # type: ignore[attr-defined]
    reloader = CoordinatorReloader(ctx, make_coordinator)
    ctx.cluster.on_live_change(lambda _live: loop.call_soon_threadsafe(reloader.moved))


def owned_groups_only(store: Any, cluster: Any) -> Any:
    """`store` whose `load` returns only the groups this broker coordinates now."""
    full_load = store.load
    store.load = lambda: {g: s for g, s in full_load().items() if cluster.coordinates(g)}
    return store


class CoordinatorReloader:
    """Replaces `ctx.coordinator` after a change of the live set (`moved`, called on the loop).

    The new coordinator is loaded from etcd once every record committed so far is applied here:
    exactly the groups this broker coordinates now, with their committed offsets and saved states,
    whoever wrote them. The old one is closed: its parked JoinGroup/SyncGroup get NOT_COORDINATOR
    and their clients ask FindCoordinator again; groups that stay here resume from their saved
    state, as after a restart. Changes that come while a reload runs are folded into one more.
    """

    def __init__(self, ctx: Any, make: Callable[[], Any]) -> None:
        self.ctx = ctx
        self.make = make
        self._task: asyncio.Future[None] | None = None
        self._due = False

    def moved(self) -> None:
        self._due = True
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._reload())

    async def _reload(self) -> None:
        while self._due and self.ctx.coordinator is not None:
            self._due = False
            try:
                await self.ctx.off_loop(self.ctx.engine.meta.sync)
                fresh = self.make()
            except Exception as exc:  # etcd away: the next change (or the next start) tries again
                log.warning("cluster: reloading the group coordinator failed: %s", exc)
                return
            old, self.ctx.coordinator = self.ctx.coordinator, fresh
            old.close()
            log.info("cluster: live brokers changed; this broker now coordinates %d group(s)", len(fresh))
