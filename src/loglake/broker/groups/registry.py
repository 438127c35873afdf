"""What every part of the coordinator shares: the groups, the store, the loop, the clock, the limits.

The coordinator is split by request family (`membership.py`: JoinGroup/SyncGroup/Heartbeat/
LeaveGroup; `rebalance.py`: the state machine's timers and transitions; `offsets.py`:
OffsetCommit/OffsetFetch; `admin.py`: list/describe/delete and retention); each part holds this
registry. Everything runs on one event loop, so nothing here locks.

Store changes go through `record`, which keeps them in the group's `ChangeQueue` so that memory
follows durability in order (see changes.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future

from loglake.broker.groups.changes import ChangeQueueFull
from loglake.broker.groups.group import Group, GroupState
from loglake.broker.groups.limits import CoordinatorLimits
from loglake.broker.groups.persistence import encode_empty
from loglake.broker.groups.store import GroupStore, resolved

log = logging.getLogger(__name__)

TopicExists = Callable[[str, int], bool]


class GroupRegistry:
    def __init__(
        self,
        store: GroupStore,
        limits: CoordinatorLimits,
        loop: asyncio.AbstractEventLoop | None,
        clock: Callable[[], float] | None,
        topic_exists: TopicExists | None,
    ) -> None:
        self.store = store
        self.limits = limits
        self.loop = loop
        self.clock = clock or time.time
        self.topic_exists = topic_exists
        self.groups: dict[str, Group] = {}
        self.closed = False

    # ---- time and timers -------------------------------------------------------------------------

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def get_loop(self) -> asyncio.AbstractEventLoop:
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        return self.loop

    def running_loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop if known or running now; None when called outside any loop (embedded use)."""
        if self.loop is None:
            try:
                self.loop = asyncio.get_running_loop()
            except RuntimeError:
                return None
        return self.loop

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return self.get_loop().call_later(max(delay_ms, 0) / 1000.0, callback)

    @staticmethod
    def cancel(handle: asyncio.TimerHandle | None) -> None:
        if handle is not None:
            handle.cancel()

    # ---- groups --------------------------------------------------------------------------------

    def live(self, group: Group) -> bool:
        """Timers and store callbacks capture a group; it may have been deleted (and re-created) since."""
        return not self.closed and self.groups.get(group.group_id) is group and not group.is_(GroupState.DEAD)

    def new_group(self, group_id: str) -> Group | None:
        if len(self.groups) >= self.limits.max_groups:
            log.warning("refusing new group %r: %d groups held (max_groups)", group_id, len(self.groups))
            return None
        group = Group(group_id, self.now_ms())
        self.groups[group_id] = group
        return group

    def forget_if_unused(self, group: Group) -> None:
        """Drop a group that was created for a request that then failed."""
        if (
            self.groups.get(group.group_id) is group
            and group.has_no_members()
            and group.consumer is None
            and not group.offsets
            and group.generation_id == 0
            and not group.changes
        ):
            del self.groups[group.group_id]

    def kill(self, group: Group) -> None:
        """Dead and out of the table (timers cancelled); saves nothing (callers record the deletion)."""
        for handle in group.pending_members.values():
            self.cancel(handle)
        group.pending_members.clear()
        self.cancel(group.join_timer)
        self.cancel(group.sync_timer)
        group.join_timer = group.sync_timer = None
        group.transition_to(GroupState.DEAD, self.now_ms())
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]

    # ---- store changes ---------------------------------------------------------------------------

    def record(
        self,
        group: Group,
        what: str,
        call: Callable[[], Future[None]],
        apply: Callable[[], None] | None = None,
    ) -> asyncio.Future[bool]:
        """Record one change through the store; `apply` runs once it (and all before it) is durable.

        Returns a future: True once applied, False if the store failed it. Raises
        `ChangeQueueFull` (nothing recorded) when the group has too many changes in flight.
        """
        group.changes.check_room()
        try:
            durable = call()
        except Exception as exc:  # a store that raises instead of failing the future
            durable = resolved(exc)
        return group.changes.submit(what, durable, apply, self.get_loop())

    def save_empty_state(self, group: Group) -> None:
        """The group just went Empty: record it (no one waits; a failure is logged by the queue)."""
        try:
            self.record(group, "Empty state", lambda: self.store.save_state(group.group_id, encode_empty(group)))
        except ChangeQueueFull:
            pass  # logged by the queue; the next transition saves again
