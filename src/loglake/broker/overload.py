"""Overload: the bound on request bytes read and not yet answered, Produce throttling, and the RSS budget.

Three things keep a broker's memory bounded when clients send more than it can take
(docs/RELIABILITY.md, "Overload"):

* the engine's memory pool (`memory_budget_bytes`) bounds unsealed data; an append that finds it
  full waits (up to `memory_wait_ms`, then REQUEST_TIMED_OUT, retriable);
* `RequestBytes` bounds request frames read from sockets and not yet answered, across all
  connections (`queued_max_request_bytes`, Kafka's queued.max.request.bytes): while it is spent,
  connections stop being read (TCP back-pressure; one already waiting for data holds the chunk it
  got undecoded) — except one in the middle of a frame, which reserves the frame's declared size
  and finishes it so that its bytes can be handled and released (without that, connections
  holding partial frames could wait for each other forever);
* `max_connections` bounds connections, each holding at most `CONNECTION_BYTES` of buffers
  outside the two budgets above.

Produce responses carry `throttle_time_ms` (`produce_throttle_ms`) while the pool is under
pressure, an append had to wait for memory, or the request bytes are spent; clients report it
(librdkafka's throttle callback and stats, kafka-python's metrics) and back off (KIP-219).

`rss_budget` adds these up into the figure the overload test holds the process to.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Protocol

from loglake.engine.config import EngineConfig

#: Bytes read from a socket per call (the connection's read loop).
READ_CHUNK_BYTES = 256 * 1024
#: What one connection holds outside the request-bytes bound: asyncio's StreamReader buffer
#: (the transport pauses above twice its limit, READ_CHUNK_BYTES, and one socket read may land on
#: top), the chunk being decoded, and the connection's objects (tasks, queue, transport).
CONNECTION_BYTES = 4 * READ_CHUNK_BYTES + 64 * 1024
#: The process without data: interpreter, loglake and its libraries loaded, thread stacks touched,
#: metadata state of a small broker (measured: about 90 MiB idle on CPython 3.11; doubled).
BASE_RSS_BYTES = 192 * 1024 * 1024
#: Kafka's queued.max.request.bytes default is -1 (no bound); loglake bounds it.
QUEUED_MAX_REQUEST_BYTES_DEFAULT = 128 * 1024 * 1024
#: The longest throttle_time_ms a Produce response asks for. librdkafka sends nothing to the broker
#: for that long (KIP-219); an emergency seal empties a full pool in well under this, so a longer
#: pause would leave the broker idle (a 1 s cap cost a third of the overload run's throughput).
THROTTLE_MS_MAX = 500
#: The throttle a Produce response asks for as soon as memory is under pressure.
THROTTLE_MS_MIN = 50


class RequestBytes:
    """Bytes of requests read and not yet answered, across all connections (one event loop)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        #: Times a connection waited before reading because the bound was spent.
        self.pauses = 0
        #: Connections waiting now.
        self.paused = 0
        self._room: asyncio.Event | None = None

    @property
    def full(self) -> bool:
        return self.used >= self.limit

    def add(self, n: int) -> None:
        self.used += n
        if n < 0 and self.used < self.limit and self._room is not None:
            self._room.set()
            self._room = None

    async def wait_for_room(self) -> None:
        """Return once fewer than `limit` bytes are held (at once if they are)."""
        if self.used < self.limit:
            return
        self.pauses += 1
        self.paused += 1
        try:
            while self.used >= self.limit:
                if self._room is None:
                    self._room = asyncio.Event()
                await self._room.wait()
        finally:
            self.paused -= 1


class PoolLevels(Protocol):
    """What the throttle reads of the engine's memory pool (`loglake.engine.memory.MemoryPool`)."""

    @property
    def used_bytes(self) -> int: ...
    @property
    def pressure_bytes(self) -> int: ...
    @property
    def budget_bytes(self) -> int: ...


def produce_throttle_ms(pool: PoolLevels, waited_s: float, request_bytes: RequestBytes | None) -> int:
    """throttle_time_ms for a Produce response: 0 unless memory is short.

    Under pool pressure it grows from THROTTLE_MS_MIN (at `memory_pressure_ratio` of the budget)
    to THROTTLE_MS_MAX (budget spent); at least the time this request waited for memory, and at
    least THROTTLE_MS_MIN while the request-bytes bound is spent.
    """
    ms = waited_s * 1000.0
    used, pressure, budget = pool.used_bytes, pool.pressure_bytes, pool.budget_bytes
    if used >= pressure:
        span = max(budget - pressure, 1)
        ms = max(ms, THROTTLE_MS_MIN + (THROTTLE_MS_MAX - THROTTLE_MS_MIN) * min((used - pressure) / span, 1.0))
    if request_bytes is not None and request_bytes.full:
        ms = max(ms, THROTTLE_MS_MIN)
    return min(int(ms + 0.999), THROTTLE_MS_MAX)


@dataclass(frozen=True)
class RssBudget:
    """The resident memory a broker with these settings stays within, by part (bytes)."""

    base: int
    memory_pool: int
    queued_requests: int
    largest_frame: int
    wal_groups: int
    cold_range_cache: int
    cleaner_dedupe: int
    connections: int

    @property
    def total(self) -> int:
        return (
            self.base + self.memory_pool + self.queued_requests + self.largest_frame + self.wal_groups
            + self.cold_range_cache + self.cleaner_dedupe + self.connections
        )

    def describe(self) -> str:
        mib = 1024 * 1024
        parts = ", ".join(f"{k} {v / mib:.0f} MiB" for k, v in self.__dict__.items())
        return f"{self.total / mib:.0f} MiB ({parts})"


class BudgetedConfig(Protocol):
    """What `rss_budget` reads of a broker's settings (`loglake.broker.config.BrokerConfig`, which
    imports this module for its defaults)."""

    @property
    def queued_max_request_bytes(self) -> int: ...
    @property
    def max_frame_bytes(self) -> int: ...
    @property
    def max_connections(self) -> int: ...
    def engine_config(self) -> EngineConfig: ...


def rss_budget(config: BudgetedConfig) -> RssBudget:
    """The RSS budget: base + memory pool + queued request bytes (+ the one frame that may cross
    it) + WAL group buffers + cold range cache + compaction key map + max_connections x CONNECTION_BYTES."""
    engine = config.engine_config()
    return RssBudget(
        base=BASE_RSS_BYTES,
        memory_pool=engine.memory_budget_bytes,
        queued_requests=config.queued_max_request_bytes,
        largest_frame=config.max_frame_bytes,
        wal_groups=engine.wal_shards * engine.wal_group_bytes_max,
        cold_range_cache=engine.cold_range_cache_bytes if engine.cold_store_url else 0,
        cleaner_dedupe=engine.cleaner_dedupe_buffer_bytes,
        connections=config.max_connections * CONNECTION_BYTES,
    )


def rss_bytes() -> int:
    """This process's resident set size (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
