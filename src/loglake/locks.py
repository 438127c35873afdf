"""Ranked locks: the order in which the engine's locks may be taken, written once and checked in tests.

A thread may take a lock only while every lock it holds has a lower rank (`Rank`, outermost
first). Two threads that both follow the order can never wait for each other in a circle, so a
deadlock between these locks is ruled out by construction; docs/ARCHITECTURE.md ("Locks") gives
the reasons for each rank.

`ranked_lock(rank)` returns a plain `threading.Lock` — nothing is checked, nothing costs — unless
`LOGLAKE_LOCK_ORDER=check` is set in the environment when this module is first imported (the test
suite sets it: tests/conftest.py). Then it returns a `CheckedLock`, which raises `LockOrderError`
when a thread blocks on it while holding one of the same or a higher rank. A non-blocking try
(`acquire(blocking=False)`) is never refused: it cannot wait, so it cannot deadlock.
`ranked_condition(rank)` is a `threading.Condition` over such a lock.
"""

from __future__ import annotations

import os
import threading
from enum import IntEnum
from types import TracebackType

__all__ = ["CHECKING", "CheckedLock", "LockOrderError", "Rank", "held_ranks", "ranked_condition", "ranked_lock"]

#: Set in the environment to "check" to make ranked locks check the order (tests do).
CHECK_ENV = "LOGLAKE_LOCK_ORDER"
CHECKING = os.environ.get(CHECK_ENV) == "check"


class Rank(IntEnum):
    """Lock ranks, outermost (taken first) to innermost."""

    #: Partition.seal_lock: one seal of a partition at a time; taken before the partition's lock
    SEAL = 10
    #: Partition.lock: the unsealed buffer, the segment list, next_offset, producer state
    PARTITION = 20
    #: SharedPartitionLog's leadership table (cluster mode), taken under the partition's lock
    LEADERSHIP = 25
    #: Catalog.lock: held only while a rebuild swaps the topic maps
    CATALOG = 30
    #: the metadata store's state lock: records are applied and queued under it; it calls out
    #: to watchers (which only note) and to its WAL shard's queue
    META = 40
    #: MemoryPool's condition: reserved before a partition's lock, released under it
    MEMORY = 45
    #: a WAL shard's queue: appends queue entries under the partition's (or the store's) lock
    WAL_QUEUE = 50
    #: Partition.hw_cond: the high watermark and its waiters; innermost
    HIGH_WATERMARK = 60


class LockOrderError(RuntimeError):
    """A thread blocked on a lock while holding one of the same or a higher rank (a programmer
    error: the order in `Rank` rules deadlocks out only if every thread follows it)."""


_held = threading.local()


def held_ranks() -> list[Rank]:
    """The ranks of the checked locks this thread holds, in the order taken."""
    ranks: list[Rank] = getattr(_held, "ranks", [])
    return list(ranks)


class CheckedLock:
    """A lock that checks the rank order (see the module doc); the interface of threading.Lock."""

    __slots__ = ("_lock", "name", "rank")

    def __init__(self, rank: Rank, name: str = "") -> None:
        self._lock = threading.Lock()
        self.rank = rank
        self.name = name or rank.name

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        ranks: list[Rank] = getattr(_held, "ranks", None) or []
        if blocking and ranks and max(ranks) >= self.rank:
            raise LockOrderError(
                f"lock {self.name} (rank {int(self.rank)}) taken while holding "
                f"{', '.join(f'{r.name} ({int(r)})' for r in ranks)}: the order is docs/ARCHITECTURE.md's"
            )
        got = self._lock.acquire(blocking, timeout)
        if got:
            if not hasattr(_held, "ranks"):
                _held.ranks = []
            _held.ranks.append(self.rank)
        return got

    def release(self) -> None:
        ranks: list[Rank] = _held.ranks
        # locks need not be released in reverse order: drop the newest entry of this rank
        for i in range(len(ranks) - 1, -1, -1):
            if ranks[i] == self.rank:
                del ranks[i]
                break
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def ranked_lock(rank: Rank, name: str = "") -> threading.Lock | CheckedLock:
    """A lock of `rank`: a plain threading.Lock, or a CheckedLock under LOGLAKE_LOCK_ORDER=check."""
    return CheckedLock(rank, name) if CHECKING else threading.Lock()


def ranked_condition(rank: Rank, name: str = "") -> threading.Condition:
    """A condition over a lock of `rank` (see `ranked_lock`)."""
    return threading.Condition(ranked_lock(rank, name))  # type: ignore[arg-type]
