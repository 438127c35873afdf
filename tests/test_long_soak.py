"""Long soak runs (make test-long): many more crash points, seeds and kill cycles.

These repeat the crash tests of the normal suite at a scale that takes many minutes, with a
multi-threaded producer mix; run them before resolving reliability work.
"""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import pytest

import loglake
from loglake.engine import Engine
from loglake.fs.faulty import FaultyFileSystem, SimulatedCrash
from longreport import record

from enginekit import DATA_DIR, abandon, read_all, small_config

pytestmark = pytest.mark.long


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("seed", range(5))
def test_crash_sweep_many_seeds_torn(seed: int) -> None:
    import test_crash_sweep as sweep  # the workload and oracle of the normal sweep

    for k in range(1, sweep.TOTAL_CALLS + 1):
        _check_seeded(sweep, k, seed)
    record("crash_sweep_torn", {"seeds_total": 1, "points_total": sweep.TOTAL_CALLS, "lost_total": 0})


def _check_seeded(sweep: object, k: int, seed: int) -> None:
    fs = FaultyFileSystem(seed=seed * 100_003 + k, crash_after=k)
    acked, written = sweep.workload(fs)  # type: ignore[attr-defined]
    after = fs.crash(torn=True)
    engine, state = sweep.recover_state(after)  # type: ignore[attr-defined]
    try:
        recovered = {(p, off, v) for p, recs in state.items() for off, _k, v in recs}
        assert not (acked - recovered), f"seed={seed} k={k}: acknowledged records lost"
        assert all(v in written for _p, _o, v in recovered)
    finally:
        abandon(engine)


def threaded_workload(fs: FaultyFileSystem, threads: int = 4, per_thread: int = 40) -> set[tuple[int, int, bytes]]:
    """Several producer threads at once (group commit with many frames per group)."""
    acked: set[tuple[int, int, bytes]] = set()
    lock = threading.Lock()
    engine = Engine(DATA_DIR, small_config(), fs=fs, start_background=False)
    try:
        engine.open()
        engine.create_topic("m", 3, {"segment.bytes": "16384"})
    except (SimulatedCrash, Exception):
        abandon(engine)
        return acked

    def producer(tid: int) -> None:
        for i in range(per_thread):
            value = f"t{tid}-{i}-".encode() * 20
            p = (tid + i) % 3
            try:
                r = engine.append_records("m", p, [(i, None, value, [])]).result()
            except (SimulatedCrash, Exception):
                return
            with lock:
                acked.add((p, r.base_offset, value))

    workers = [threading.Thread(target=producer, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    try:
        for _ in range(5):
            engine.flush()
    except (SimulatedCrash, Exception):
        pass
    for w in workers:
        w.join()
    abandon(engine)
    return acked


@pytest.mark.timeout(3600)
def test_threaded_crash_points() -> None:
    """Crash points are not deterministic with threads: sample many k at random, torn and not."""
    rng = random.Random(int(os.environ.get("LOGLAKE_SEED", "7")))
    probe = FaultyFileSystem(seed=0)
    threaded_workload(probe)
    total = probe.mutating_calls
    trials = 300
    acked_total = 0
    for trial in range(trials):
        k = rng.randrange(1, total + 1)
        fs = FaultyFileSystem(seed=trial, crash_after=k)
        acked = threaded_workload(fs)
        after = fs.crash(torn=trial % 2 == 0)
        engine = Engine(DATA_DIR, small_config(), fs=after, start_background=False)
        engine.open()
        try:
            state = read_all(engine, "m") if engine.has_topic("m") else {}
            recovered = {(p, off, v) for p, recs in state.items() for off, _k, v in recs}
            lost = acked - recovered
            assert not lost, f"trial={trial} k={k}: {len(lost)} acknowledged records lost"
            acked_total += len(acked)
            for p, recs in state.items():
                assert [o for o, _k, _v in recs] == list(range(len(recs))), f"trial={trial}: gap in {p}"
        finally:
            abandon(engine)
    record("threaded_crash_points", {"trials": trials, "mutating_calls": total, "acked_checked": acked_total, "lost": 0})


@pytest.mark.timeout(3600)
def test_kill_minus_nine_200_cycles(tmp_path: Path) -> None:
    import test_crash_process_kill as kill

    rng = random.Random(int(os.environ.get("LOGLAKE_SEED", "11")))
    data_dir = tmp_path / "data"
    acked: dict[tuple[int, int], bytes] = {}
    for cycle in range(200):
        for partition, offset, c, seq in kill.run_cycle(data_dir, cycle, rng):
            acked[(partition, offset)] = kill.value_for(c, seq)
        with loglake.open(str(data_dir), wal_shards=2, wal_file_bytes=256 * 1024) as log:
            seen = {(r.partition, r.offset): r.value for r in log.consume("k")}
        lost = [key for key, value in acked.items() if seen.get(key) != value]
        assert not lost, f"cycle {cycle}: {len(lost)} acknowledged records lost"
    record("kill9_cycles", {"cycles": 200, "acked": len(acked), "lost": 0})
