"""A small seeded fuzzing engine: targets, per-case replay, hang and allocation bounds, a JSON report.

A target is a pair of functions: ``make(rng) -> bytes`` builds one case (a mutated valid input or
random bytes) from a `random.Random` seeded by ``(seed, target name, case index)``, and
``run(data)`` feeds it to the decoder under test, which may raise only the target's ``allowed``
(documented, typed) errors. Every case can therefore be replayed alone:

    LOGLAKE_FUZZ_SEED=<seed> LOGLAKE_FUZZ_CASE=<target>:<index> pytest tests/test_fuzz.py -k replay

Properties checked per case:
- no crash: any exception other than ``allowed`` is a failure (with its seed and index);
- no hang: a case running longer than `CASE_TIME_LIMIT_S` is interrupted and reported (a failure
  detector for infinite loops, not a performance assertion);
- no unbounded allocation: every `ALLOC_SAMPLE_EVERY`-th case runs under tracemalloc and its peak
  must stay within ``ALLOC_FACTOR * len(input) + ALLOC_SLACK_BYTES + target.alloc_extra``.
"""

from __future__ import annotations

import os
import random
import signal
import time
import traceback
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from longreport import update_report

SEED_ENV = "LOGLAKE_FUZZ_SEED"
CASE_ENV = "LOGLAKE_FUZZ_CASE"
REPORT_ENV = "LOGLAKE_FUZZ_REPORT"
#: The seed of `make test`'s sample when LOGLAKE_FUZZ_SEED is not set (fixed: reproducible CI).
DEFAULT_SAMPLE_SEED = 20261124

#: A case still running after this long is reported as a hang.
CASE_TIME_LIMIT_S = 5.0
#: One case in this many runs under tracemalloc.
ALLOC_SAMPLE_EVERY = 50
#: A decoder may allocate this many times its input, plus the slack, plus its own named limit.
ALLOC_FACTOR = 16
ALLOC_SLACK_BYTES = 1 << 20
#: Failures kept per target in a report (the count is exact).
FAILURES_KEPT = 20


class CaseHang(BaseException):
    """Raised by the alarm in a case that exceeds CASE_TIME_LIMIT_S (BaseException: no decoder
    may swallow it)."""


@dataclass(frozen=True)
class Target:
    name: str
    make: Callable[[random.Random], bytes]
    run: Callable[[bytes], Any]
    allowed: tuple[type[BaseException], ...]
    #: Bytes a decoder may allocate beyond the input-proportional bound (its named limit).
    alloc_extra: int = 0


@dataclass
class TargetResult:
    target: str
    seed: int
    first_case: int
    cases: int = 0
    failure_count: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    alloc_checked: int = 0
    max_alloc_bytes: int = 0
    seconds: float = 0.0

    def merge(self, other: TargetResult) -> None:
        self.cases += other.cases
        self.failure_count += other.failure_count
        self.failures.extend(other.failures[: max(0, FAILURES_KEPT - len(self.failures))])
        self.alloc_checked += other.alloc_checked
        self.max_alloc_bytes = max(self.max_alloc_bytes, other.max_alloc_bytes)
        self.seconds += other.seconds


def case_rng(seed: int, target: str, index: int) -> random.Random:
    return random.Random(f"{seed}/{target}/{index}")


def run_seed() -> int:
    """The run's seed: LOGLAKE_FUZZ_SEED, else a fresh one for long runs (printed by the caller)."""
    raw = os.environ.get(SEED_ENV)
    return int(raw) if raw else random.SystemRandom().randrange(1 << 32)


def replay_line(target: str, seed: int, index: int) -> str:
    return f"{SEED_ENV}={seed} {CASE_ENV}={target}:{index} pytest tests/test_fuzz.py -k replay"


def _on_alarm(_signum: int, _frame: Any) -> None:
    raise CaseHang(f"case ran over {CASE_TIME_LIMIT_S} s")


@contextmanager
def hang_alarm() -> Iterator[None]:
    """SIGALRM raises CaseHang while inside; pytest-timeout's own alarm (same signal) is put back
    after, with the time it had left."""
    old_handler = signal.signal(signal.SIGALRM, _on_alarm)
    old_left, _interval = signal.getitimer(signal.ITIMER_REAL)
    t0 = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_left > 0:
            signal.setitimer(signal.ITIMER_REAL, max(old_left - (time.monotonic() - t0), 0.001))


def run_case(target: Target, seed: int, index: int, *, measure: bool = False) -> tuple[BaseException | None, int]:
    """Run one case (inside `hang_alarm`); returns (the disallowed exception or None, peak bytes
    allocated if measured)."""
    data = target.make(case_rng(seed, target.name, index))
    peak = 0
    signal.setitimer(signal.ITIMER_REAL, CASE_TIME_LIMIT_S)
    try:
        if measure:
            tracemalloc.start()
            tracemalloc.reset_peak()
            try:
                target.run(data)
            finally:
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
        else:
            target.run(data)
    except target.allowed:
        pass
    except (Exception, CaseHang, RecursionError, MemoryError) as exc:  # the failure being looked for
        return exc, peak
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    limit = ALLOC_FACTOR * len(data) + ALLOC_SLACK_BYTES + target.alloc_extra
    if peak > limit:
        return MemoryError(f"decoder peak {peak} bytes over the bound {limit} for a {len(data)}-byte input"), peak
    return None, peak


def run_target(target: Target, seed: int, first: int, count: int) -> TargetResult:
    result = TargetResult(target.name, seed, first)
    t0 = time.perf_counter()
    with hang_alarm():
        _run_cases(target, seed, first, count, result)
    result.seconds = time.perf_counter() - t0
    return result


def _run_cases(target: Target, seed: int, first: int, count: int, result: TargetResult) -> None:
    for index in range(first, first + count):
        measure = index % ALLOC_SAMPLE_EVERY == 0
        exc, peak = run_case(target, seed, index, measure=measure)
        result.cases += 1
        if measure:
            result.alloc_checked += 1
            result.max_alloc_bytes = max(result.max_alloc_bytes, peak)
        if exc is not None:
            result.failure_count += 1
            if len(result.failures) < FAILURES_KEPT:
                tb = "".join(traceback.format_exception(exc)[-3:])
                result.failures.append(
                    {"index": index, "error": f"{type(exc).__name__}: {exc}"[:500], "traceback": tb[-1500:],
                     "replay": replay_line(target.name, seed, index)}
                )


def describe_failures(results: list[TargetResult]) -> str:
    lines = []
    for r in results:
        for f in r.failures:
            lines.append(f"[{r.target}] seed {r.seed} case {f['index']}: {f['error']}\n  replay: {f['replay']}\n{f['traceback']}")
    return "\n".join(lines)


def write_report(kind: str, seed: int, results: list[TargetResult], seconds: float, extra: dict[str, Any] | None = None) -> None:
    """Merge this run's figures into the JSON file named by LOGLAKE_FUZZ_REPORT (if set)."""
    update_report(REPORT_ENV, lambda doc: _merge(doc, kind, seed, results, seconds, extra))


def _merge(doc: dict[str, Any], kind: str, seed: int, results: list[TargetResult], seconds: float, extra: dict[str, Any] | None) -> None:
    doc[kind] = {
        "seed": seed,
        "seconds": round(seconds, 1),
        "cases": sum(r.cases for r in results),
        "failures": sum(r.failure_count for r in results),
        "targets": {
            r.target: {
                "cases": r.cases,
                "failures": r.failure_count,
                "alloc_checked": r.alloc_checked,
                "max_alloc_bytes": r.max_alloc_bytes,
                "seconds": round(r.seconds, 1),
                "failed_cases": r.failures,
            }
            for r in results
        },
        **(extra or {}),
    }
    doc["cases_total"] = sum(v["cases"] for k, v in doc.items() if isinstance(v, dict) and "cases" in v)


def merge_results(parts: list[TargetResult]) -> list[TargetResult]:
    merged: dict[str, TargetResult] = {}
    for p in parts:
        if p.target in merged:
            merged[p.target].merge(p)
        else:
            merged[p.target] = p
    return list(merged.values())
