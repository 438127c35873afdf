"""What the engine benchmark's sections share (benchmarks/engine.py, engine_recovery.py): the
engine import from a checkout, the topic and pipeline depth, record making, WAL shard counters,
and the retry around a known engine race (reported, not hidden)."""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

try:
    from loglake.engine import Engine, EngineConfig
except ImportError:  # run from a checkout without an installed package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
    from loglake.engine import Engine, EngineConfig

from disk_limits import log

TOPIC = "bench"
PIPELINE_DEPTH = 64


def make_records(n: int, size: int, rng: random.Random) -> list[tuple[int, bytes | None, bytes | None, list[Any]]]:
    now = int(time.time() * 1000)
    blob = rng.randbytes(size * 64)
    out: list[tuple[int, bytes | None, bytes | None, list[Any]]] = []
    for i in range(n):
        start = (i * 37 % 64) * size // 2
        value = (blob[start:] + blob)[:size]
        out.append((now + i // 100, None, value, []))
    return out


def shard_stats(engine: Engine) -> tuple[int, int, int, float, list[int]]:
    groups = frames = fsyncs = 0
    fsync_s = 0.0
    per_shard: list[int] = []
    for s in engine.shards:
        groups += s.groups_written
        frames += s.frames_written
        fsyncs += s.fsyncs
        fsync_s += s.fsync_seconds_total
        per_shard.append(s.frames_written)
    return groups, frames, fsyncs, fsync_s, per_shard


ENGINE_ERRORS: list[str] = []  # engine errors worked around during the run (reported, not hidden)


def checked(what: str, fn: Callable[[], Any], retries: int = 5) -> Any:
    """Call fn; on FileNotFoundError (WAL truncation racing between flush() and the maintenance
    thread, both unlinking the same obsolete WAL file) record it and retry."""
    for attempt in range(retries + 1):
        try:
            return fn()
        except FileNotFoundError as exc:
            ENGINE_ERRORS.append(f"{what}: {exc!r}")
            log(f"  ENGINE ERROR during {what}: {exc!r}" + (" - retrying" if attempt < retries else ""))
            if attempt == retries:
                raise
            time.sleep(0.05)
    return None


def engine_config(overrides: dict[str, Any]) -> EngineConfig:
    config = EngineConfig(**overrides)
    config.validate()
    return config
