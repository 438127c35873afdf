"""Compaction runs in a worker process (no GIL taken from produce); a worker that dies mid-job
leaves nothing behind, and the next round starts a new one."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from loglake.engine import Engine, EngineConfig
from loglake.engine.verify import verify_data_dir

from enginekit import read_all


def engine_at(path: Path, **options: object) -> Engine:
    engine = Engine(str(path), EngineConfig(cleaner_threads=0, merge_min_segments=0, wal_shards=1, **options))  # type: ignore[arg-type]
    engine.open()
    return engine


def fill(engine: Engine, keys: int = 20, rounds: int = 40) -> None:
    engine.create_topic("kv", 1, {"cleanup.policy": "compact", "segment.records": "100"})
    for r in range(rounds):
        engine.append_records("kv", 0, [(None, b"k%d" % k, b"v%d-%d" % (k, r) + b"x" * 200, []) for k in range(keys)]).result()
    engine.flush()


def newest(engine: Engine) -> dict[bytes | None, bytes | None]:
    return {k: v for _o, k, v in read_all(engine, "kv")[0]}


def test_compaction_runs_in_a_worker_process_that_ends_with_the_engine(tmp_path: Path) -> None:
    engine = engine_at(tmp_path)
    try:
        fill(engine)
        want = newest(engine)
        assert engine.compact("kv") == 1
        (worker,) = engine.cleaner._idle
        proc = worker._proc
        assert proc is not None and proc.poll() is None and proc.pid != os.getpid()
        assert len(read_all(engine, "kv")[0]) == 20 and newest(engine) == want
        assert verify_data_dir(engine).ok
    finally:
        engine.close()
    assert proc.wait(timeout=10) == 0  # stdin closed: the worker left on its own


def test_a_worker_killed_mid_job_leaves_nothing_and_the_next_round_works(tmp_path: Path) -> None:
    engine = engine_at(tmp_path, cleaner_io_max_bytes_per_second=100_000)  # ~2 s for this log
    try:
        fill(engine)
        want = newest(engine)
        before = [s.key for s in engine.segments("kv", 0)]
        done: list[int] = []
        t = threading.Thread(target=lambda: done.append(engine.compact("kv")))
        t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            busy = [w for w in engine.cleaner._busy_workers()]
            if busy and busy[0]._proc is not None:
                time.sleep(0.3)  # let it get into the job
                busy[0]._proc.kill()
                break
            time.sleep(0.01)
        else:
            raise AssertionError("no worker started")
        t.join(timeout=60)
        assert done == [0] and engine.cleaner.stats.errors == 1
        assert [s.key for s in engine.segments("kv", 0)] == before  # nothing switched
        report = verify_data_dir(engine)
        assert report.ok and report.unreferenced == []  # and nothing left behind
        assert engine.compact("kv") == 1  # a new worker
        assert newest(engine) == want and len(read_all(engine, "kv")[0]) == 20
        assert verify_data_dir(engine).ok
    finally:
        engine.close()
