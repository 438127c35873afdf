"""Futures other threads complete, delivered to the broker's event loop in batches.

A produce request waits for its appends to be durable: the WAL writer's thread completes one
`concurrent.futures.Future` per appended batch. `asyncio.wrap_future` would hand each of them to
the event loop on its own — a `call_soon_threadsafe` (a write to the loop's self-pipe, and a
wakeup) per future, then an asyncio future, its state copied under the concurrent future's lock,
and `asyncio.wait`'s waiter and timer on top. A WAL group commit completes many requests' batches
at once; `LoopCompletions` queues their callbacks and wakes the loop once for all that arrive
before it runs them. On a one-record request this was a fifth of the event loop's Python time.

Threads only append to a deque and, if no drain is pending, schedule one; the loop drains. A drain
clears its flag before it empties the deque, so a completion appended after the last pop always
finds the flag clear and schedules the next drain (two threads may both schedule one; the second
finds nothing). This relies on the GIL making deque appends and pops atomic, as CPython 3.11's does.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
#: What a drain runs: a callback with the future it watched.
_Ready = tuple[Callable[[Future[T]], None], Future[T]]


class LoopCompletions:
    """Run callbacks on `loop` when futures completed by other threads are done, in batches; and
    the countdowns that wait for them, with their timeouts."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._ready: deque[_Ready[object]] = deque()
        self._scheduled = False
        #: Drains run (each one wakeup of the loop from another thread, or none if already awake).
        self.drains = 0
        #: Callbacks run.
        self.delivered = 0
        #: The timeouts of this loop's countdowns.
        self.deadlines = Deadlines(loop)

    def countdown(self, count: int) -> Countdown:
        """A countdown of `count` watched futures whose timeout is one of this loop's deadlines."""
        return Countdown(self._loop, count, self.deadlines)

    def watch(self, fut: Future[T], callback: Callable[[Future[T]], None]) -> None:
        """Call `callback(fut)` on the loop once `fut` is done (at once on the next drain if it is)."""
        fut.add_done_callback(lambda completed: self._done(callback, completed))  # type: ignore[arg-type]

    def _done(self, callback: Callable[[Future[object]], None], fut: Future[object]) -> None:
        # any thread: the one that completed `fut`, or the caller of watch() if it was done
        self._ready.append((callback, fut))
        if self._scheduled:
            return
        self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: the broker has stopped, nobody waits
            self._scheduled = False

    def _drain(self) -> None:
        self._scheduled = False
        self.drains += 1
        ready = self._ready
        while ready:
            callback, fut = ready.popleft()
            self.delivered += 1
            try:
                callback(fut)
            except Exception:  # one waiter's bug must not strand the others queued behind it
                log.exception("a completion callback failed")


class Countdown:
    """An asyncio future that is done when `count` watched futures are, or at its timeout.

    What a produce request awaits for its partitions' appends: one asyncio future for the whole
    request, however many partitions it wrote; its timeout is one entry in the loop's `Deadlines`.
    """

    __slots__ = ("_deadlines", "_left", "finished")

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int, deadlines: Deadlines) -> None:
        self._left = count
        self._deadlines = deadlines
        self.finished: asyncio.Future[None] = loop.create_future()
        if count <= 0:
            self.finished.set_result(None)

    def one_done(self, _fut: Future[T]) -> None:
        self._left -= 1
        if self._left <= 0 and not self.finished.done():
            self.finished.set_result(None)

    async def wait(self, timeout_s: float) -> None:
        """Until every watched future is done or `timeout_s` passed (at most the deadlines'
        `slack_s` later); no error either way."""
        if self.finished.done():
            return
        self._deadlines.add(self, timeout_s)
        try:
            await self.finished
        finally:
            self._deadlines.discard(self)

    def expire(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)


#: How late past its deadline a wait in `Deadlines` may end: the timer is re-armed for an earlier
#: deadline only when it would fire this much later (and never sooner than this after the last).
DEADLINE_SLACK_S = 0.05


class Deadlines:
    """The timeouts of a loop's countdowns on one timer, armed for the earliest deadline.

    A timer per request (asyncio's `call_later`, then `cancel` when the appends finish first) was
    ~4 % of a one-record Produce request's event-loop time. Here a wait is a dict entry, added and
    removed; the one timer is re-armed only when a wait's deadline comes before it by more than
    `slack_s` (requests of one client share a timeout, so their deadlines come in order) and, when
    it fires, for the earliest deadline still pending.
    """

    __slots__ = ("_armed_at", "_loop", "_pending", "_timer", "slack_s")

    def __init__(self, loop: asyncio.AbstractEventLoop, slack_s: float = DEADLINE_SLACK_S) -> None:
        self._loop = loop
        self._pending: dict[Countdown, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at = 0.0
        self.slack_s = slack_s

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, countdown: Countdown, timeout_s: float) -> None:
        when = self._loop.time() + timeout_s
        self._pending[countdown] = when
        if self._timer is None or when < self._armed_at - self.slack_s:
            self._arm(when)

    def discard(self, countdown: Countdown) -> None:
        self._pending.pop(countdown, None)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_at = when
        self._timer = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = self._loop.time()
        earliest: float | None = None
        expired: list[Countdown] = []
        for countdown, when in self._pending.items():
            if when <= now:
                expired.append(countdown)
            elif earliest is None or when < earliest:
                earliest = when
        for countdown in expired:
            del self._pending[countdown]
            countdown.expire()
        if earliest is not None:
            self._arm(max(earliest, now + self.slack_s))


__all__ = ["Countdown", "Deadlines", "LoopCompletions"]
