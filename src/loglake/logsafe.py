"""Rate-limited log lines for warnings that a client (or a stuck condition) can repeat at will.

A `RateLimitedLog` logs the first occurrence of a key at once, then counts the repeats of that
key for `interval_s` and logs one summary when the window is over::

    closing 10.0.0.7:51234: frame of 209715250 bytes over max_frame_bytes ... (234 more in the last 30 s)

The key names the peer and the condition (for example ``("frame_too_large", "10.0.0.7")``: the
peer's address without its port, so reconnects count as the same peer). Summaries of windows that
are over are written by `flush()`, which the broker calls once a second (`flush_all()` flushes
every limiter of the process) and at shutdown (`flush_all(force=True)` writes the pending counts
at once). A repeat that arrives after its window is over also writes the summary first.

Memory is bounded: at most `TRACKED_KEYS_MAX` keys are held per limiter; a new key beyond that
first writes out and drops the oldest one. Thread-safe (the engine's threads may use it too).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Hashable
from typing import Any

#: How long repeats of one key are counted before their summary line.
RATE_LIMIT_INTERVAL_S = 30.0
#: Most distinct keys one limiter tracks at a time (the oldest is written out and dropped beyond).
TRACKED_KEYS_MAX = 1024

_LIMITERS: weakref.WeakSet[RateLimitedLog] = weakref.WeakSet()
_LIMITERS_LOCK = threading.Lock()


class _Window:
    __slots__ = ("last_args", "last_msg", "level", "started", "suppressed")

    def __init__(self, started: float, level: int, msg: str, args: tuple[Any, ...]) -> None:
        self.started = started
        self.level = level
        self.last_msg = msg
        self.last_args = args
        self.suppressed = 0


class RateLimitedLog:
    """Log a keyed message once per `interval_s`; repeats are counted and summarised."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = RATE_LIMIT_INTERVAL_S,
        max_keys: int = TRACKED_KEYS_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.logger = logger
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._clock = clock
        self._windows: dict[Hashable, _Window] = {}  # insertion order: oldest window first
        self._lock = threading.Lock()
        with _LIMITERS_LOCK:
            _LIMITERS.add(self)

    def __len__(self) -> int:
        return len(self._windows)

    def warning(self, key: Hashable, msg: str, *args: Any) -> bool:
        return self.log(logging.WARNING, key, msg, *args)

    def error(self, key: Hashable, msg: str, *args: Any) -> bool:
        return self.log(logging.ERROR, key, msg, *args)

    def info(self, key: Hashable, msg: str, *args: Any) -> bool:
        return self.log(logging.INFO, key, msg, *args)

    def log(self, level: int, key: Hashable, msg: str, *args: Any) -> bool:
        """Log `msg % args` unless `key` was logged less than `interval_s` ago; True if it was written."""
        now = self._clock()
        out: list[tuple[int, str, tuple[Any, ...]]] = []
        with self._lock:
            window = self._windows.get(key)
            if window is not None and now - window.started < self.interval_s:
                window.suppressed += 1
                window.level, window.last_msg, window.last_args = level, msg, args
                return False
            if window is not None:
                del self._windows[key]
                self._summary(window, now, out)
            elif len(self._windows) >= self.max_keys:
                oldest = next(iter(self._windows))
                self._summary(self._windows.pop(oldest), now, out)
            self._windows[key] = _Window(now, level, msg, args)
            out.append((level, msg, args))
        self._emit(out)
        return True

    def flush(self, force: bool = False) -> int:
        """Write the summaries of windows that are over (all of them with `force`); returns how many."""
        now = self._clock()
        out: list[tuple[int, str, tuple[Any, ...]]] = []
        with self._lock:
            over = [k for k, w in self._windows.items() if force or now - w.started >= self.interval_s]
            for key in over:
                self._summary(self._windows.pop(key), now, out)
        self._emit(out)
        return len(out)

    def _summary(self, window: _Window, now: float, out: list[tuple[int, str, tuple[Any, ...]]]) -> None:
        if window.suppressed:
            elapsed = min(now - window.started, self.interval_s)
            seconds = f"{elapsed:.1f}" if elapsed < 10 else f"{elapsed:.0f}"
            out.append(
                (window.level, window.last_msg + " (%d more in the last %s s)", (*window.last_args, window.suppressed, seconds))
            )

    def _emit(self, lines: list[tuple[int, str, tuple[Any, ...]]]) -> None:
        for level, msg, args in lines:
            self.logger.log(level, msg, *args)


def flush_all(force: bool = False) -> int:
    """`flush()` every limiter of the process; returns how many summary lines were written."""
    with _LIMITERS_LOCK:
        limiters = list(_LIMITERS)
    return sum(limiter.flush(force) for limiter in limiters)


__all__ = ["RATE_LIMIT_INTERVAL_S", "TRACKED_KEYS_MAX", "RateLimitedLog", "flush_all"]
