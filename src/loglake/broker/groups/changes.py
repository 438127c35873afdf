"""One group's store changes in flight, applied to memory once durable, strictly in the order made.

Invariant: a group's in-memory offsets are always the result of a prefix of its recorded
changes, in the order they were recorded; since the store makes changes durable in that same
order, memory never shows a state that was not durable, and two overlapping commits can never
undo each other. A change whose future fails is skipped (nothing of it is applied) and its
waiter learns `False`; the changes behind it still apply.

Bounded: at most `PENDING_CHANGES_MAX` changes per group may wait for durability (a stalled
metadata log must not grow memory without bound); past that, `submit` raises `ChangeQueueFull`
and the caller answers a retriable error.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: Changes of one group waiting for durability. A consumer group has one commit in flight per
#: member at most in normal use, so 1000 covers group.max.size-sized groups with room to spare.
PENDING_CHANGES_MAX = 1000


class ChangeQueueFull(RuntimeError):
    """Too many changes of one group wait for durability; the caller answers a retriable error."""


@dataclass(eq=False)
class _Change:
    what: str
    durable: asyncio.Future[None]
    apply: Callable[[], None] | None
    applied: asyncio.Future[bool]


class ChangeQueue:
    def __init__(self, group_id: str, max_pending: int = PENDING_CHANGES_MAX) -> None:
        self._group_id = group_id
        self._max_pending = max_pending
        self._queue: deque[_Change] = deque()
        self._full_logged = False

    def __len__(self) -> int:
        return len(self._queue)

    def check_room(self) -> None:
        """Raise `ChangeQueueFull` if one more change would pass the bound (call before recording it)."""
        if len(self._queue) < self._max_pending:
            self._full_logged = False
            return
        if not self._full_logged:
            log.warning("group %r: %d changes wait for durability; refusing more until they resolve",
                        self._group_id, len(self._queue))
            self._full_logged = True
        raise ChangeQueueFull(self._group_id)

    def submit(
        self,
        what: str,
        durable: Future[None],
        apply: Callable[[], None] | None,
        loop: asyncio.AbstractEventLoop,
    ) -> asyncio.Future[bool]:
        """Track a recorded change; `apply` runs on the loop once it and every earlier one resolved.

        Returns a future that resolves True once applied, False if the change failed.
        """
        change = _Change(what, asyncio.wrap_future(durable, loop=loop), apply, loop.create_future())
        self._queue.append(change)
        change.durable.add_done_callback(self._drain)
        return change.applied

    def _drain(self, _done: object = None) -> None:
        while self._queue and self._queue[0].durable.done():
            change = self._queue.popleft()
            ok = False
            try:
                error = None if change.durable.cancelled() else change.durable.exception()
                if change.durable.cancelled() or error is not None:
                    log.warning("group %r: %s was not recorded durably: %s", self._group_id, change.what,
                                "cancelled" if error is None else f"{type(error).__name__}: {error}")
                else:
                    if change.apply is not None:
                        change.apply()
                    ok = True
            except Exception:  # a bug in `apply`: report it, keep later changes moving
                log.exception("group %r: applying %s failed", self._group_id, change.what)
            finally:
                if not change.applied.done():
                    change.applied.set_result(ok)
