"""What an engine's parts report beyond the engine's own state: /metrics families and the reasons
/readyz answers "not ready".

The engine does not know Prometheus, and the broker never imports cluster mode (tests/test_layers.py):
so a part that has something to say (cluster mode's leadership and health: loglake.cluster.health)
implements `Telemetry` with the plain values here, and the broker renders them
(loglake.broker.metrics). A single node's parts have nothing to add (`NO_TELEMETRY`).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = ["NO_TELEMETRY", "Family", "HistogramFamily", "LatencyHistogram", "Telemetry"]


@dataclass(frozen=True)
class Family:
    """One gauge or counter family: `samples` are (label values, value), in `labels` order."""

    name: str
    doc: str
    kind: Literal["gauge", "counter"]
    samples: tuple[tuple[tuple[str, ...], float], ...]
    labels: tuple[str, ...] = ()

    @staticmethod
    def gauge(name: str, doc: str, value: float) -> Family:
        return Family(name, doc, "gauge", (((), float(value)),))

    @staticmethod
    def counter(name: str, doc: str, value: float) -> Family:
        return Family(name, doc, "counter", (((), float(value)),))


@dataclass(frozen=True)
class HistogramFamily:
    """One histogram without labels: cumulative counts per upper bound (the last is +Inf)."""

    name: str
    doc: str
    buckets: tuple[tuple[float, int], ...]
    total: float


class LatencyHistogram:
    """Thread-safe counts of observed durations (seconds) under fixed upper bounds."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(sorted(bounds))
        self._counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        i = bisect.bisect_left(self.bounds, seconds)
        with self._lock:
            self._counts[i] += 1
            self._sum += seconds

    @property
    def count(self) -> int:
        with self._lock:
            return sum(self._counts)

    def family(self, name: str, doc: str) -> HistogramFamily:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
            running += n
            cumulative.append((bound, running))
        return HistogramFamily(name, doc, tuple(cumulative), total)


class Telemetry(Protocol):
    def families(self) -> list[Family | HistogramFamily]:
        """The families to add to /metrics now (read at scrape time)."""
        ...

    def not_ready(self) -> list[str]:
        """Why the broker should not get traffic now, one line each, with what to do (/readyz
        answers 503 with them); empty when nothing is wrong."""
        ...


class _NoTelemetry:
    def families(self) -> list[Family | HistogramFamily]:
        return []

    def not_ready(self) -> list[str]:
        return []


#: A part with nothing to add (a single node).
NO_TELEMETRY: Telemetry = _NoTelemetry()
