"""The cyclic garbage collector of the broker process: tuned once the broker has started, and
measured for /metrics.

A full collection walks every object the collector tracks while holding the GIL, so it stops
the event loop and every request with it. A broker holds many long-lived objects (modules,
recovered engine state, configs); `freeze_startup_objects` moves all of those out of the
collector's reach, and `GcStats` counts every collection's pause by generation, so a tail
latency that lines up with collections shows on /metrics (docs/PERFORMANCE.md, issue 12).

Only `loglake serve` does either: its process is the broker's own. The embedded `loglake.Log`
leaves its host program's collector alone.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

GENERATIONS = (0, 1, 2)


def freeze_startup_objects() -> int:
    """Collect once, then freeze every object still alive; returns how many were frozen.

    Measured at 400k records/s of 100 B on a quiet machine: max produce latency 49-65 ms
    without, 25-38 ms with. Reference counting still frees frozen objects; only cycles among
    them are never collected (they were alive at start, so they are the broker's own state).
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcStats:
    """Collections and their pauses by generation, from `gc.callbacks` (collections run in
    whichever thread allocates, so updates take a lock; a scrape reads under it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: float | None = None
        self.collections = [0, 0, 0]
        self.pause_seconds = [0.0, 0.0, 0.0]
        self.pause_max_seconds = [0.0, 0.0, 0.0]
        self.frozen = 0

    def install(self) -> GcStats:
        gc.callbacks.append(self._callback)
        return self

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        started, self._started = self._started, None
        if started is None:
            return
        pause = time.perf_counter() - started
        g = info.get("generation", 2)
        if g not in GENERATIONS:
            return
        with self._lock:
            self.collections[g] += 1
            self.pause_seconds[g] += pause
            if pause > self.pause_max_seconds[g]:
                self.pause_max_seconds[g] = pause

    def families(self) -> Iterator[Metric]:
        with self._lock:
            counts, total, top = (
                list(self.collections),
                list(self.pause_seconds),
                list(self.pause_max_seconds),
            )
        c = CounterMetricFamily(
            "loglake_gc_collections", "Cyclic garbage collections, by generation.", labels=["generation"]
        )
        s = CounterMetricFamily(
            "loglake_gc_pause_seconds",
            "Seconds the process stood still in garbage collections, by generation.",
            labels=["generation"],
        )
        m = GaugeMetricFamily(
            "loglake_gc_pause_max_seconds",
            "The longest garbage collection pause so far, by generation.",
            labels=["generation"],
        )
        for g in GENERATIONS:
            c.add_metric([str(g)], counts[g])
            s.add_metric([str(g)], total[g])
            m.add_metric([str(g)], top[g])
        yield c
        yield s
        yield m
        yield GaugeMetricFamily(
            "loglake_gc_frozen_objects",
            "Objects frozen out of the collector's reach once the broker started.",
            value=gc.get_freeze_count(),
        )
