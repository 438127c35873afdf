"""Overload: the bound on request bytes read and not yet answered, Produce throttling, and the RSS budget.

Three things keep a broker's memory bounded when clients send more than it can take
(docs/RELIABILITY.md, "Overload"):

* the engine's memory pool (`memory_budget_bytes`) bounds unsealed data; an append that finds it
  full waits (up to `memory_wait_ms`, then REQUEST_TIMED_OUT, retriable);
* `RequestBytes` bounds request bytes read from sockets and not yet answered, across all
  connections (`queued_max_request_bytes`, Kafka's queued.max.request.bytes), granted as bytes
  arrive — never for the size a prefix merely claims. Every connection may hold
  `CONNECTION_FLOOR_BYTES` outside it (so the small requests every client lives on are read
  whatever the bound holds), and at most a `CONNECTION_SHARE_DIVISOR`-th of it beyond that. A
  connection whose frame needs more waits for the one overdraft lease: its holder finishes that
  frame past the bound, by at most `max_frame_bytes` in all (the one frame the RSS budget lets
  cross it), so frames in progress never wait for each other forever. When the bound is spent,
  only connections that hold it (or want more than their floor) stop being read. A frame must
  arrive within `frame_receive_timeout_ms` of its first byte, or its connection is closed;
* `max_connections` bounds connections, each holding at most `CONNECTION_BYTES` of buffers
  outside the two budgets above.

Produce responses carry `throttle_time_ms` (`produce_throttle_ms`) while the pool is under
pressure, an append had to wait for memory, or the request bytes are spent; clients report it
(librdkafka's throttle callback and stats, kafka-python's metrics) and back off (KIP-219).

`rss_budget` adds these up into the figure the overload test holds the process to.
"""

from __future__ import annotations

import asyncio
import collections
import os
from dataclasses import dataclass
from typing import Protocol

from loglake.engine.config import EngineConfig

#: Bytes read from a socket per call while frames fit in it: a connection's receive block (loglake.broker.receive).
READ_CHUNK_BYTES = 256 * 1024
#: Request bytes each connection may hold outside `queued_max_request_bytes`: ApiVersions,
#: Metadata, heartbeats, commits and small produces are read however full the bound is.
CONNECTION_FLOOR_BYTES = 64 * 1024
#: One connection holds at most 1/this of `queued_max_request_bytes` beyond its floor (a larger
#: frame finishes under the overdraft lease), so a few stalled or non-reading clients cannot spend it.
CONNECTION_SHARE_DIVISOR = 4
#: Bytes of a response handed to the transport at a time: the writer waits for each piece to
#: drain, so a client that does not read holds at most this (and the transport's high-water
#: mark) of copies, whatever the response's size.
SEND_CHUNK_BYTES = 256 * 1024
#: The largest frame a connection allocates whole once its size prefix is known (loglake.broker.receive;
#: a larger one's pages are taken as its bytes arrive): Kafka clients' 1,000,000-byte batches fit.
PREALLOCATED_FRAME_BYTES = 1024 * 1024
#: What one connection holds outside the request-bytes bound: its receive block (READ_CHUNK_BYTES),
#: a frame buffer allocated before its bytes arrive (PREALLOCATED_FRAME_BYTES), its request floor,
#: the piece of a response being sent (and the transport's write buffer up to its 64 KiB
#: high-water mark), and the connection's objects.
CONNECTION_BYTES = READ_CHUNK_BYTES + PREALLOCATED_FRAME_BYTES + CONNECTION_FLOOR_BYTES + SEND_CHUNK_BYTES + 64 * 1024 + 64 * 1024
#: What one request in flight costs beside its bytes: its handler task and coroutines, the decoded
#: request and, once made, a small response (measured: 3.3 KB per ApiVersions, 4.1 KB per Metadata
#: request held unanswered, RSS from /proc). Charged into the request bytes with each request, so
#: Produce requests, which no count bounds, are bounded by those bytes.
REQUEST_OVERHEAD_BYTES = 4 * 1024
#: Produce requests one connection may have in flight. `max_inflight_per_connection` bounds the
#: others (their answers may be far larger than their requests); a Produce answer is no larger
#: than its request, so Produce requests are bounded by their bytes (with REQUEST_OVERHEAD_BYTES
#: each) and by this. While they wait for durability (a cluster's object flush: half a second)
#: a producer that sends a request per millisecond to one partition needs hundreds in flight.
PRODUCE_INFLIGHT_PER_CONNECTION = 4096
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
    """Bytes of requests read and not yet answered, across all connections (one event loop; the
    module doc has the rules). Each connection holds a `ConnectionBytes` of it."""

    def __init__(self, limit: int, overdraft: int) -> None:
        self.limit = limit
        #: How far past `limit` the lease holder may read (max_frame_bytes: one frame).
        self.overdraft = overdraft
        self.used = 0  # bytes held beyond the connections' floors
        #: Times a connection waited before reading because the bound (or its share) was spent.
        self.pauses = 0
        #: Connections waiting now.
        self.paused = 0
        #: Frames finished under the overdraft lease.
        self.leases = 0
        self._lease: ConnectionBytes | None = None
        self._lease_queue: collections.deque[ConnectionBytes] = collections.deque()  # bounded by max_connections
        self._changed: asyncio.Event | None = None

    @property
    def full(self) -> bool:
        return self.used >= self.limit

    @property
    def share(self) -> int:
        """The most one connection holds beyond its floor without the lease."""
        return max(self.limit // CONNECTION_SHARE_DIVISOR, READ_CHUNK_BYTES)

    def connection(self) -> ConnectionBytes:
        return ConnectionBytes(self)

    def _change(self, delta: int) -> None:
        self.used += delta
        if delta < 0:
            self._wake()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _take_lease(self, c: ConnectionBytes) -> bool:
        if self._lease is c:
            return True
        if c not in self._lease_queue:
            self._lease_queue.append(c)
        if self._lease is None and self._lease_queue[0] is c:
            self._lease = self._lease_queue.popleft()
            return True
        return False

    def _drop_lease(self, c: ConnectionBytes) -> None:
        if self._lease is c:
            self._lease = None
            self.leases += 1
            self._wake()
        elif c in self._lease_queue:
            self._lease_queue.remove(c)

    async def _wait(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._changed.wait()


class ConnectionBytes:
    """One connection's request bytes read and not yet answered: its floor, then the shared bound."""

    def __init__(self, gate: RequestBytes) -> None:
        self.gate = gate
        self.held = 0

    @property
    def pooled(self) -> int:
        """Bytes of the shared bound this connection holds."""
        return max(0, self.held - CONNECTION_FLOOR_BYTES)

    @property
    def leased(self) -> bool:
        return self.gate._lease is self

    def allowance(self, frame_left: int) -> int:
        """Bytes this connection may read now; `frame_left`: what its frame in progress still
        misses (0 between frames)."""
        g = self.gate
        room = max(0, CONNECTION_FLOOR_BYTES - self.held)
        if g.used < g.limit:
            room += max(0, min(g.limit - g.used, g.share - self.pooled))
        if frame_left and g._lease is self:
            room = max(room, min(frame_left, g.limit + g.overdraft - g.used))
        return room

    async def room(self, frame_left: int) -> int:
        """Wait until this connection may read; how many bytes. In the middle of a frame it
        queues for the overdraft lease when the bound (or its share) has no room for it."""
        g = self.gate
        allowed = self.allowance(frame_left)
        if allowed > 0:
            return allowed
        g.pauses += 1
        g.paused += 1
        try:
            while True:
                if frame_left and g._take_lease(self):
                    allowed = self.allowance(frame_left)
                    if allowed > 0:
                        return allowed
                await g._wait()
                allowed = self.allowance(frame_left)
                if allowed > 0:
                    return allowed
        finally:
            g.paused -= 1
            if not self.leased:  # read without it: out of the line (a stalled reader must not head it)
                g._drop_lease(self)

    def add(self, n: int) -> None:
        """`n` bytes read (negative: released once answered)."""
        before = self.pooled
        self.held += n
        if self.held < 0:
            raise AssertionError("a connection released more request bytes than it read")
        self.gate._change(self.pooled - before)

    def frame_done(self) -> None:
        """The frame in progress is complete: the lease (if held) goes to the next in line."""
        self.gate._drop_lease(self)

    def close(self) -> None:
        """The connection is gone: everything it held is released."""
        self.gate._drop_lease(self)
        self.add(-self.held)


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


def rss_budget(config: BudgetedConfig, memory_pool_bytes: int | None = None) -> RssBudget:
    """The RSS budget: base + memory pool + queued request bytes (+ the one frame that may cross
    it) + WAL group buffers + cold range cache + compaction key map + max_connections x CONNECTION_BYTES.
    `memory_pool_bytes`: the serving engine's pool budget (cluster mode's is the flush buffer), else
    `memory_budget_bytes`."""
    engine = config.engine_config()
    return RssBudget(
        base=BASE_RSS_BYTES,
        memory_pool=engine.memory_budget_bytes if memory_pool_bytes is None else memory_pool_bytes,
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
