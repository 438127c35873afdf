"""LoopCompletions: futures completed by other threads reach the event loop in batches, none lost.

Real threads complete real `concurrent.futures.Future`s while the loop is busy; every callback
runs on the loop's thread, exactly once, and the completions that arrived while the loop was busy
cost one wakeup between them, not one each.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest

from loglake.broker.completions import DEADLINE_SLACK_S, LoopCompletions

#: Futures completed per thread in the stress test.
PER_THREAD = 2000
THREADS = 4


def test_completions_while_the_loop_is_busy_cost_one_wakeup() -> None:
    async def run() -> tuple[int, int, set[int]]:
        loop = asyncio.get_running_loop()
        hub = LoopCompletions(loop)
        futures: list[Future[int]] = [Future() for _ in range(100)]
        seen: list[int] = []
        threads: set[int] = set()

        def on_done(fut: Future[int]) -> None:
            seen.append(fut.result())
            threads.add(threading.get_ident())

        for fut in futures:
            hub.watch(fut, on_done)
        completer = threading.Thread(target=lambda: [f.set_result(i) for i, f in enumerate(futures)])
        completer.start()
        completer.join()  # the loop is blocked here: all 100 complete before it runs again
        assert seen == [], "callbacks run on the loop, not on the completing thread"
        for _ in range(3):
            await asyncio.sleep(0)
        assert sorted(seen) == list(range(100))
        return hub.drains, hub.delivered, threads

    drains, delivered, threads = asyncio.run(run())
    assert (drains, delivered) == (1, 100)
    assert threads == {threading.get_ident()}


def test_many_threads_completing_lose_nothing_and_run_each_callback_once() -> None:
    async def run() -> tuple[int, int, dict[int, int]]:
        hub = LoopCompletions(asyncio.get_running_loop())
        counts: dict[int, int] = {}
        all_done = asyncio.get_running_loop().create_future()
        total = PER_THREAD * THREADS

        def on_done(fut: Future[int]) -> None:
            key = fut.result()
            counts[key] = counts.get(key, 0) + 1
            if len(counts) == total and not all_done.done():
                all_done.set_result(None)

        batches = [[Future[int]() for _ in range(PER_THREAD)] for _ in range(THREADS)]
        for batch in batches:
            for fut in batch:
                hub.watch(fut, on_done)

        def complete(t: int) -> None:
            for i, fut in enumerate(batches[t]):
                fut.set_result(t * PER_THREAD + i)
                if i % 97 == 0:
                    time.sleep(0)  # let the loop drain between bursts: drains interleave with appends

        workers = [threading.Thread(target=complete, args=(t,)) for t in range(THREADS)]
        for w in workers:
            w.start()
        while not all_done.done():
            await asyncio.sleep(0.001)  # the loop turns while the threads complete
        for w in workers:
            w.join()
        for _ in range(3):
            await asyncio.sleep(0)
        return hub.drains, hub.delivered, counts

    drains, delivered, counts = asyncio.run(run())
    assert delivered == PER_THREAD * THREADS
    assert len(counts) == PER_THREAD * THREADS and set(counts.values()) == {1}
    assert 1 <= drains <= delivered


def test_a_future_already_done_is_delivered_on_the_next_drain() -> None:
    async def run() -> list[str]:
        hub = LoopCompletions(asyncio.get_running_loop())
        fut: Future[str] = Future()
        fut.set_result("ready")
        got: list[str] = []
        hub.watch(fut, lambda f: got.append(f.result()))
        assert got == []  # not synchronously inside watch()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return got

    assert asyncio.run(run()) == ["ready"]


def test_a_failing_callback_does_not_strand_the_others(caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> list[int]:
        hub = LoopCompletions(asyncio.get_running_loop())
        got: list[int] = []

        def bad(_fut: Future[int]) -> None:
            raise ValueError("boom")

        futures: list[Future[int]] = [Future() for _ in range(3)]
        hub.watch(futures[0], lambda f: got.append(f.result()))
        hub.watch(futures[1], bad)
        hub.watch(futures[2], lambda f: got.append(f.result()))
        for i, f in enumerate(futures):
            f.set_result(i)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return got

    assert asyncio.run(run()) == [0, 2]
    assert "a completion callback failed" in caplog.text


def test_countdown_finishes_when_all_are_done_or_at_its_timeout() -> None:
    async def run() -> tuple[float, float, bool]:
        loop = asyncio.get_running_loop()
        hub = LoopCompletions(loop)
        futures: list[Future[None]] = [Future() for _ in range(3)]
        countdown = hub.countdown(len(futures))
        for f in futures:
            hub.watch(f, countdown.one_done)
        threading.Timer(0.05, lambda: [f.set_result(None) for f in futures]).start()
        started = time.monotonic()
        await countdown.wait(10.0)
        all_done = time.monotonic() - started
        # one never completes: the wait ends at its timeout, without an error
        stuck: Future[None] = Future()
        late = hub.countdown(1)
        hub.watch(stuck, late.one_done)
        started = time.monotonic()
        await late.wait(0.1)
        timed_out = time.monotonic() - started
        return all_done, timed_out, all(f.done() for f in futures)

    all_done, timed_out, done = asyncio.run(run())
    assert done and all_done < 5.0
    assert 0.09 <= timed_out < 5.0


def test_a_closed_loop_is_not_an_error_for_the_completing_thread(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    hub = LoopCompletions(loop)
    loop.close()
    fut: Future[int] = Future()
    hub.watch(fut, lambda f: None)
    fut.set_result(1)  # the broker has stopped: nobody waits, and the WAL thread must not fail
    assert hub.delivered == 0
    # concurrent.futures logs a callback's exception ("exception calling callback for ...")
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")], caplog.text


def test_deadlines_end_each_wait_at_its_timeout_on_one_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waits sharing a timeout arm the timer once; a wait with an earlier deadline re-arms it; a
    wait that finishes first leaves nothing behind; each timed-out wait ends within the slack."""

    async def run() -> tuple[int, list[float], int]:
        loop = asyncio.get_running_loop()
        armed = 0
        call_at = loop.call_at

        def counting(when: float, callback: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
            nonlocal armed
            armed += callback == hub.deadlines._fire  # asyncio's own timers (wait_for) go by too
            return call_at(when, callback, *args, **kw)

        monkeypatch.setattr(loop, "call_at", counting)
        hub = LoopCompletions(loop)
        # 50 requests with the same 0.3 s timeout that finish first: one timer, no entries left
        finished = []
        futures: list[Future[None]] = []
        for _ in range(50):
            c = hub.countdown(1)
            futures.append(Future())
            hub.watch(futures[-1], c.one_done)
            finished.append(asyncio.ensure_future(c.wait(0.3)))
        await asyncio.sleep(0)  # every wait has its deadline now
        assert len(hub.deadlines) == 50
        for f in futures:
            f.set_result(None)
        await asyncio.wait_for(asyncio.gather(*finished), 0.25)  # before the timeout
        assert len(hub.deadlines) == 0 and armed == 1
        # stuck waits: 0.4 s, then 0.1 s (earlier: re-arms), then 0.4 s again (does not)
        ended: list[float] = []
        started = loop.time()

        async def stuck(timeout_s: float) -> None:
            await hub.countdown(1).wait(timeout_s)
            ended.append(loop.time() - started - timeout_s)

        waits = [asyncio.ensure_future(stuck(t)) for t in (0.4, 0.1, 0.4)]
        await asyncio.sleep(0)
        await asyncio.wait_for(asyncio.gather(*waits), 5.0)  # never ended: fails, not hangs
        return armed, ended, len(hub.deadlines)

    armed, late_by, left = asyncio.run(run())
    assert left == 0
    assert all(-0.001 <= d < DEADLINE_SLACK_S + 0.5 for d in late_by), late_by  # 0.5: a loaded machine's loop
    assert len(late_by) == 3
    # the first 0.3 s timer (never fired in time to matter, fires once), the 0.4 s, the 0.1 s
    # re-arm, then the re-arm for the 0.4 s ones after it fired: never one per wait
    assert armed <= 5
