"""Fuzzing the decoders in-process: every API and version of the request codec, the frame
decoder, produce record batches (each codec), WAL frames, segments, metadata records,
checkpoints and snapshots. See fuzzkit for the properties and docs/RELIABILITY.md ("Fuzzing").

- `make test` runs a seeded sample (`SAMPLE_CASES` per target, seed DEFAULT_SAMPLE_SEED or
  LOGLAKE_FUZZ_SEED);
- `make test-long` runs `LONG_CASES` in all over 2 worker processes with a fresh seed (printed);
- one case replays with LOGLAKE_FUZZ_SEED=<seed> LOGLAKE_FUZZ_CASE=<target>:<index>.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

import fuzz_protocol
import fuzz_storage
from fuzzkit import (
    CASE_ENV,
    DEFAULT_SAMPLE_SEED,
    SEED_ENV,
    Target,
    TargetResult,
    case_rng,
    describe_failures,
    hang_alarm,
    merge_results,
    run_case,
    run_seed,
    run_target,
    write_report,
)

TARGETS: list[Target] = [*fuzz_protocol.TARGETS, *fuzz_storage.TARGETS]
#: Cases per target in `make test`'s sample.
SAMPLE_CASES = 10_000
#: Cases in all in `make test-long` (the live-broker fuzz in test_fuzz_broker.py adds its own).
LONG_CASES = 1_000_000
#: Relative share of the long run's cases per target (cheap, wide targets get more).
LONG_WEIGHTS = {
    "request_mutated": 30,
    "request_fresh": 6,
    "request_random": 12,
    "frame_stream": 6,
    "produce_batches": 14,
    "wal_frames": 10,
    "segments": 8,
    "meta_records": 6,
    "checkpoints": 4,
    "snapshots": 4,
}
#: Cases per work item handed to a worker process.
CHUNK_CASES = 10_000
#: Worker processes of the long run (the machine is shared).
LONG_WORKERS = 2


def _by_name(name: str) -> Target:
    return next(t for t in TARGETS if t.name == name)


def _check(results: list[TargetResult], kind: str, seed: int, seconds: float) -> None:
    write_report(kind, seed, results, seconds)
    failures = describe_failures(results)
    assert not failures, f"fuzz failures (seed {seed}):\n{failures}"


def test_fuzz_sample() -> None:
    seed = int(os.environ.get(SEED_ENV) or DEFAULT_SAMPLE_SEED)
    print(f"fuzz sample seed {seed}")
    t0 = time.perf_counter()
    results = [run_target(t, seed, 0, SAMPLE_CASES) for t in TARGETS]
    _check(results, "sample", seed, time.perf_counter() - t0)


def _work(name: str, seed: int, first: int, count: int) -> TargetResult:
    return run_target(_by_name(name), seed, first, count)


@pytest.mark.long
@pytest.mark.timeout(3600)
def test_fuzz_long() -> None:
    seed = run_seed()
    print(f"fuzz long-run seed {seed} (replay: {SEED_ENV}={seed})")
    total_weight = sum(LONG_WEIGHTS.values())
    items = []
    for name, weight in LONG_WEIGHTS.items():
        count = -(-LONG_CASES * weight // total_weight)
        items += [(name, seed, first, min(CHUNK_CASES, count - first)) for first in range(0, count, CHUNK_CASES)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(LONG_WORKERS) as pool:
        parts = list(pool.map(_work, *zip(*items, strict=True)))
    results = merge_results(parts)
    assert sum(r.cases for r in results) >= LONG_CASES
    _check(results, "long", seed, time.perf_counter() - t0)


#: What `test_fuzz_replay` replays when no case is given: the snapshot the fuzzer found raising
#: struct.error out of replay (docs/RELIABILITY.md, "Found and fixed"), now a CorruptionError.
REPLAY_DEFAULT = ("snapshots:3885", 20261124)


def test_fuzz_replay() -> None:
    """One case, with its input and full traceback: the replay of a printed failure
    ({CASE_ENV}=<target>:<index>, {SEED_ENV}); without them, a fixed regression case."""
    name, index = (os.environ.get(CASE_ENV) or REPLAY_DEFAULT[0]).rsplit(":", 1)
    target = _by_name(name)
    seed = int(os.environ.get(SEED_ENV) or (REPLAY_DEFAULT[1] if not os.environ.get(CASE_ENV) else DEFAULT_SAMPLE_SEED))
    data = target.make(case_rng(seed, name, int(index)))
    print(f"input ({len(data)} bytes): {data[:400]!r}")
    with hang_alarm():
        exc, _peak = run_case(target, seed, int(index), measure=True)
    if exc is not None:
        raise exc


def _spin(_data: bytes) -> None:
    while True:
        pass


def _leak(data: bytes) -> None:
    _held = bytearray(64 * 1024 * 1024)  # far beyond 16 x the input + 1 MiB
    raise ValueError("after allocating")


def test_the_fuzzer_sees_crashes_hangs_and_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each detector fires: a disallowed exception, a case that never ends, a decoder that
    allocates far more than its input (the case index is a multiple of ALLOC_SAMPLE_EVERY)."""
    import fuzzkit

    make = lambda rng: rng.randbytes(8)  # noqa: E731
    crash = Target("crash", make, lambda d: d[100], (ValueError,))
    hang = Target("hang", make, _spin, (ValueError,))
    leak = Target("leak", make, _leak, (ValueError,))
    ok = Target("ok", make, lambda d: None, (ValueError,))
    results = [run_target(t, 1, 0, 1) for t in (crash, leak, ok)]
    monkeypatch.setattr(fuzzkit, "CASE_TIME_LIMIT_S", 0.05)
    results.insert(1, run_target(hang, 1, 0, 1))
    errors = [r.failures[0]["error"] if r.failures else None for r in results]
    assert errors[0] is not None and errors[0].startswith("IndexError")
    assert errors[1] is not None and errors[1].startswith("CaseHang")
    assert errors[2] is not None and errors[2].startswith("MemoryError")
    assert errors[3] is None
    assert "LOGLAKE_FUZZ_SEED=1 LOGLAKE_FUZZ_CASE=crash:0" in results[0].failures[0]["replay"]
