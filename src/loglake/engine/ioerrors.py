"""I/O errors reading stored segments: one log line per segment and minute, counters for /metrics
and the segments failing now for /readyz.

A hot segment whose pread fails (EIO: a bad sector, a failing disk) or a cold segment the cold
store still cannot serve after its own retries (an S3 5xx storm) fails the reads of that segment
only, with `SegmentReadError` (CORRUPT_MESSAGE on the wire; loglake.errors says why not
KAFKA_STORAGE_ERROR). Other segments and partitions keep serving, nothing is marked corrupt (the
data is not known to be bad) and the next read of the segment tries again: a transient error
heals by itself, a lasting one keeps being an error for that segment's readers, on /readyz and
in the log once a minute.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from loglake.errors import SegmentReadError, StorageError
from loglake.logsafe import RateLimitedLog

__all__ = ["READ_ERROR_LOG_INTERVAL_S", "ReadErrors"]

log = logging.getLogger(__name__)

#: One line per failing segment per this many seconds (the rest are counted in the summary).
READ_ERROR_LOG_INTERVAL_S = 60.0
#: A segment is listed on /readyz while its last failed read is younger than this.
READ_ERROR_RECENT_S = 60.0
_TRACKED_MAX = 1000


@dataclass
class _Failing:
    topic: str
    partition: int
    key: str
    where: str
    error: str
    at: float


class ReadErrors:
    """Segments whose reads failed with an I/O error, for the log, /metrics and /readyz."""

    def __init__(self, clock: object = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._log = RateLimitedLog(log, READ_ERROR_LOG_INTERVAL_S)
        self._failing: OrderedDict[str, _Failing] = OrderedDict()
        self.total = 0

    def failed(self, topic: str, partition: int, offset: int, key: str, where: str, tier: str, exc: StorageError) -> SegmentReadError:
        """Count, log (rate-limited per segment) and return the error for the reader."""
        # An OSError says it best ("[Errno 5] ..."); a store's error says what it tried.
        cause: BaseException | str = exc.cause if isinstance(exc.cause, OSError) else str(exc)
        now = self._clock()  # type: ignore[operator]
        with self._lock:
            self.total += 1
            self._failing[key] = _Failing(topic, partition, key, where, str(cause), now)
            self._failing.move_to_end(key)
            while len(self._failing) > _TRACKED_MAX:
                self._failing.popitem(last=False)
        self._log.error(
            ("read", key),
            "reading %s-%d at offset %d failed: %s segment %s: %s (readers of this segment get CORRUPT_MESSAGE until it reads again)",
            topic, partition, offset, tier, where, cause,
        )
        return SegmentReadError(topic, partition, offset, where, cause)

    def succeeded(self, key: str) -> None:
        """The segment read fine again: it is no longer listed."""
        if not self._failing:  # the common case: nothing failing, no lock
            return
        with self._lock:
            self._failing.pop(key, None)

    def failing(self) -> list[tuple[str, int, str, str]]:
        """(topic, partition, where, error) of the segments that failed recently."""
        cutoff = self._clock() - READ_ERROR_RECENT_S  # type: ignore[operator]
        with self._lock:
            return [(f.topic, f.partition, f.where, f.error) for f in self._failing.values() if f.at >= cutoff]

    def readyz_lines(self) -> list[str]:
        return [f"read errors: {t}-{p} segment {where}: {err}" for t, p, where, err in self.failing()]
