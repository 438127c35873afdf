"""The ranked-lock helper (loglake.locks): the order is checked where tests run, and only blocking
acquisitions against it are refused."""

from __future__ import annotations

import threading

import pytest

from loglake import locks
from loglake.locks import CheckedLock, LockOrderError, Rank, held_ranks, ranked_condition, ranked_lock


def test_the_suite_runs_with_the_order_checked() -> None:
    assert locks.CHECKING  # tests/conftest.py sets LOGLAKE_LOCK_ORDER=check before loglake loads
    assert isinstance(ranked_lock(Rank.PARTITION), CheckedLock)


def test_outer_then_inner_is_allowed_and_inner_then_outer_is_refused() -> None:
    partition, wal = CheckedLock(Rank.PARTITION, "p"), CheckedLock(Rank.WAL_QUEUE, "wal")
    with partition, wal:
        assert held_ranks() == [Rank.PARTITION, Rank.WAL_QUEUE]
    assert held_ranks() == []
    with wal, pytest.raises(LockOrderError, match=r"lock p \(rank 20\) taken while holding WAL_QUEUE \(50\)"):
        partition.acquire()
    assert held_ranks() == [] and not partition.locked()


def test_two_locks_of_one_rank_may_not_nest_but_a_try_is_never_refused() -> None:
    a, b = CheckedLock(Rank.PARTITION, "a"), CheckedLock(Rank.PARTITION, "b")
    with a:
        with pytest.raises(LockOrderError):
            b.acquire()
        assert b.acquire(blocking=False)  # cannot wait, so cannot deadlock
        b.release()
    assert held_ranks() == []


def test_ranks_are_per_thread_and_a_condition_keeps_its_rank_across_wait() -> None:
    cond = ranked_condition(Rank.HIGH_WATERMARK, "hw")
    outer = CheckedLock(Rank.PARTITION, "p")
    seen: list[list[Rank]] = []
    waiting = threading.Event()

    def waiter() -> None:
        with outer, cond:
            waiting.set()  # cond is held until wait() lets it go: the notify below comes after
            cond.wait(timeout=5)
            seen.append(held_ranks())

    t = threading.Thread(target=waiter)
    t.start()
    assert waiting.wait(5)
    assert held_ranks() == []  # the other thread's locks are not this one's
    with cond:
        cond.notify_all()
    t.join(5)
    assert seen == [[Rank.PARTITION, Rank.HIGH_WATERMARK]]
