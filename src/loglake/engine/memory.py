"""The global memory budget for unsealed partition data (DESIGN.md §5).

Every append reserves its bytes before it is accepted and releases them once the data is
sealed into a segment. At `pressure_ratio` of the budget the pool asks for an emergency seal;
when the budget is spent, appends wait (back-pressure) — they are never dropped, and the
process never grows past the budget by more than one batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from loglake.errors import BackPressureTimeoutError
from loglake.locks import Rank, ranked_condition


class MemoryPool:
    def __init__(self, budget_bytes: int, pressure_ratio: float, on_pressure: Callable[[], None]) -> None:
        self.budget_bytes = budget_bytes
        self.pressure_bytes = int(budget_bytes * pressure_ratio)
        self._on_pressure = on_pressure
        self._cond = ranked_condition(Rank.MEMORY, "MemoryPool._cond")
        self._used = 0
        self.waits = 0  # appends that had to wait: a sign the budget or sealing is too small

    @property
    def used_bytes(self) -> int:
        return self._used

    def reserve(self, size: int, timeout_s: float) -> None:
        """Take `size` bytes, waiting up to `timeout_s` for room."""
        pressure = False
        with self._cond:
            if self._used + size > self.budget_bytes and self._used > 0:
                self.waits += 1
                deadline = time.monotonic() + timeout_s
                self._on_pressure()
                while self._used + size > self.budget_bytes and self._used > 0:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise BackPressureTimeoutError(
                            f"memory budget of {self.budget_bytes} bytes for unsealed data is full "
                            f"({self._used} used) and did not drain within {timeout_s:.1f}s"
                        )
                    self._cond.wait(remaining)
            self._used += size
            pressure = self._used >= self.pressure_bytes
        if pressure:
            self._on_pressure()

    def force_reserve(self, size: int) -> None:
        """Account bytes that already exist (WAL replay at start-up) without waiting."""
        with self._cond:
            self._used += size

    def release(self, size: int) -> None:
        with self._cond:
            self._used -= size
            if self._used < 0:
                raise AssertionError("memory pool released more than it reserved")
            self._cond.notify_all()
