"""The WAL replay bound held while writing, not only after the seals catch up.

`wal_replay_bytes_max` bounds what a restart after a crash reads: maintenance seals the
partitions that hold the oldest WAL files, and the files go once their data is in segments. That
is enough while the seals keep up; on a starved machine (CPU taken by others, a slow disk) the
producers outrun them and the files pile up — 2.75 times the bound was seen under a load of 16 on
two cores — so a crash at that moment would replay more than the bound promises.

`WalRollGate` closes that gap: a WAL writer that is about to start a new file first waits while
the files of all shards exceed the bound by more than `WAL_ROLL_SLACK_FILES` files per shard (the
room the seals get to work in without stopping anyone). The wait holds that shard's writes, so
producers are answered late instead of the WAL growing: back-pressure, as a full memory budget
gives. The seals never wait for the WAL writer (they seal durable data only) and truncation runs
on the maintenance thread, so the wait ends as soon as a seal lets a file go. It is bounded all
the same (`WAL_ROLL_WAIT_S_MAX`): a seal that cannot finish (a segment store failing) must not
stop every producer for good; past it the file is started, counted and logged (rate-limited).
The metadata log's shard has no gate: seals write their records through it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from loglake.logsafe import RateLimitedLog

log = logging.getLogger(__name__)

#: Files per data shard the WAL may hold past the replay bound before a writer waits to roll.
WAL_ROLL_SLACK_FILES = 2
#: Longest a writer waits for the seals to let a file go before it rolls anyway.
WAL_ROLL_WAIT_S_MAX = 10.0
#: How often a waiting writer looks again (truncation has no wake-up of its own to give).
WAL_ROLL_POLL_S = 0.005

_limited = RateLimitedLog(log)


class WalRollGate:
    """Holds WAL rolls while the data shards' files exceed `bound` plus the slack."""

    def __init__(
        self,
        held_bytes: Callable[[], int],
        bound: int,
        file_bytes: int,
        shards: int,
        *,
        wait_s_max: float = WAL_ROLL_WAIT_S_MAX,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        #: bytes of WAL files the shards hold now, counted as a restart would read them
        self._held_bytes = held_bytes
        self.limit = bound + WAL_ROLL_SLACK_FILES * shards * file_bytes
        self._file_bytes = file_bytes
        self._wait_s_max = wait_s_max
        self._clock = clock
        self._sleep = sleep
        #: rolls that waited, and seconds spent waiting (/metrics, benchmarks)
        self.waits = 0
        self.waited_s = 0.0
        #: rolls that went ahead after WAL_ROLL_WAIT_S_MAX with the bound still exceeded
        self.overruns = 0

    def _over(self) -> bool:
        return self._held_bytes() + self._file_bytes > self.limit

    def __call__(self, stopping: Callable[[], bool]) -> None:
        if not self._over():
            return
        started = self._clock()
        deadline = started + self._wait_s_max
        self.waits += 1
        while self._over() and not stopping():
            if self._clock() >= deadline:
                self.overruns += 1
                _limited.warning(
                    ("wal_roll_overrun",),
                    "the WAL holds %d bytes, over its replay bound with slack (%d): the seals did not let a "
                    "file go within %.0f s; rolling anyway (a restart now replays more than "
                    "wal_replay_bytes_max)", self._held_bytes(), self.limit, self._wait_s_max,
                )
                break
            self._sleep(WAL_ROLL_POLL_S)
        self.waited_s += self._clock() - started


__all__ = ["WAL_ROLL_POLL_S", "WAL_ROLL_SLACK_FILES", "WAL_ROLL_WAIT_S_MAX", "WalRollGate"]
