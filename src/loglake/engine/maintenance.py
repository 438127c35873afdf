"""Background maintenance: one thread, one tick every `maintenance_interval_ms` (or when woken).

Each tick: a free-space reading (on its own interval, loglake.engine.space), age and size seals, emergency seals under memory pressure, retention, relocation
scheduling, a metadata checkpoint when the log passed its bound, WAL truncation, and copying
the metadata's changes to the object stores. Every step is bounded by what changed since the
last tick, not by the history the broker holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from loglake.engine.acked import AckedRecorder
from loglake.engine.catalog import Catalog
from loglake.engine.memory import MemoryPool
from loglake.engine.partition import Partition, SegmentRef
from loglake.engine.seal import Sealer
from loglake.engine.space import SpaceGuard
from loglake.engine.stores import IndexCache, Stores
from loglake.engine.tiering import Relocator
from loglake.errors import StorageError, StorageFullError
from loglake.meta.log import LocalMetaStore
from loglake.meta.publish import MetaPublisher
from loglake.wal.shard import WalFile, WalShard

__all__ = ["Maintenance"]

log = logging.getLogger(__name__)


class Maintenance:
    def __init__(
        self,
        catalog: Catalog,
        meta: LocalMetaStore,
        sealer: Sealer,
        stores: Stores,
        indexes: IndexCache,
        pool: MemoryPool,
        clock: Callable[[], float],
        *,
        interval_ms: int,
        shards: Callable[[], list[WalShard]],
        space: SpaceGuard | None = None,
        wal_max_bytes: int | None = None,
        wal_replay_bytes: int | None = None,
        relocator: Relocator | None = None,
        publisher: MetaPublisher | None = None,
        acked: AckedRecorder | None = None,
    ) -> None:
        self.catalog = catalog
        self.meta = meta
        self.sealer = sealer
        self.stores = stores
        self.indexes = indexes
        self.pool = pool
        self._clock = clock
        self.interval_s = interval_ms / 1000.0
        self._shards = shards
        self.space = space
        self.wal_max_bytes = wal_max_bytes
        #: the bound on all shards' WAL files together (EngineConfig.wal_replay_bound)
        self.wal_replay_bytes = wal_replay_bytes
        #: seals asked for to let WAL files go: past wal_max_bytes or the replay bound, or tight space
        self.wal_bound_seals = 0
        self.relocator = relocator
        self.publisher = publisher
        self.acked = acked
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._failing: str | None = None  # the last tick's error, while ticks fail

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="loglake-maint", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.tick()
            except Exception as exc:
                # Logged once per state change (a full disk fails every tick the same way).
                what = f"{type(exc).__name__}: {exc}"
                if what != self._failing:
                    expected = isinstance(exc, StorageError)  # a full disk: one line, no traceback
                    log.error(
                        "maintenance tick failed: %s; retrying every tick, logged again when it works or fails differently",
                        what, exc_info=None if expected else exc,
                    )
                    self._failing = what
            else:
                if self._failing is not None:
                    log.warning("maintenance tick works again (it failed with %s)", self._failing)
                    self._failing = None

    def tick(self) -> None:
        if self.acked is not None:
            self.acked.tick()
        if self.space is not None:
            self.space.check()  # on its own interval; produce resumes here when space came back
        self._seal_due()
        self.apply_retention()
        if self.relocator is not None:
            self.relocator.schedule()
        self.meta.maybe_checkpoint()
        self.truncate_wal()
        self._seal_wal_holders()
        if self.publisher is not None and (self.publisher.due() or self.publisher.checkpoint_pending()):
            self.publisher.publish()

    # ---- seals ------------------------------------------------------------------------------

    def _seal_due(self) -> None:
        now = time.monotonic()
        pressure = self.pool.used_bytes >= self.pool.pressure_bytes
        candidates: list[tuple[int, Partition]] = []
        for topic, p in self.catalog.partitions():
            if not p.buffer or p.seal_scheduled:
                continue
            config = topic.config
            oldest = p.buffer[0].appended_at if p.buffer else now
            if (now - oldest) * 1000 >= config.segment_ms:
                self.sealer.schedule(p, full=True)
            elif p.buffer_bytes >= config.segment_bytes or (
                config.segment_records and p.buffer_records >= config.segment_records
            ):
                self.sealer.schedule(p)  # a size trigger whose seal found the tail not yet durable
            elif pressure:
                candidates.append((p.buffer_bytes, p))
        if pressure and candidates:
            # Emergency seal: biggest buffers first until half the budget would be free.
            candidates.sort(key=lambda c: -c[0])
            target = self.pool.used_bytes - self.pool.budget_bytes // 2
            for size, p in candidates:
                if target <= 0:
                    break
                self.sealer.schedule(p, full=True)
                target -= size

    def _seal_wal_holders(self) -> None:
        """Seal the partitions whose unsealed data holds closed WAL files that should go
        (truncation, next tick, then lets them go), oldest files first:

        * a shard's files past `wal_max_bytes`: without this an idle partition's few records
          hold every later file for up to its segment.ms;
        * all shards' files past the replay bound, taken from the shards with the most: a
          restart after a crash reads and replays at most that much (docs/RELIABILITY.md);
        * every closed file while free space is tight (loglake.engine.space): the files go
          before produce must be refused for the seals they wait for.

        Files count at `file_bytes` each, the active one too (recovery reads it whole)."""
        shards = [(shard, shard.files(), shard.closed_files()) for shard in self._shards()]
        tight = self.space is not None and self.space.tight
        doomed: list[WalFile] = []
        left: list[tuple[int, list[WalFile], int]] = []  # (bytes of files kept, closed kept, file size)
        for shard, files, closed in shards:
            size = shard.file_bytes
            take = len(closed) if tight else 0
            if self.wal_max_bytes is not None and len(files) >= 2:
                over = len(files) * size - self.wal_max_bytes
                take = max(take, min(len(closed), -(-over // size)))
            doomed += closed[:take]
            left.append(((len(files) - take) * size, closed[take:], size))
        if self.wal_replay_bytes is not None:
            total = sum(kept for kept, _closed, _size in left)
            while total > self.wal_replay_bytes:
                i = max(range(len(left)), key=lambda j: left[j][0] if left[j][1] else -1, default=-1)
                if i < 0 or not left[i][1]:
                    break  # only active files left
                kept, closed, size = left[i]
                doomed.append(closed[0])
                left[i] = (kept - size, closed[1:], size)
                total -= size
        by_id = self.catalog.by_id
        for wal_file in doomed:
            for (topic_id, index), end in list(wal_file.partitions.items()):
                topic = by_id.get(topic_id)
                if topic is None or index >= len(topic.partitions):
                    continue
                p = topic.partitions[index]
                if p.durable_sealed_end < end and p.buffer and not p.seal_scheduled:
                    self.sealer.schedule(p, full=True)
                    self.wal_bound_seals += 1

    # ---- retention --------------------------------------------------------------------------

    def apply_retention(self) -> int:
        """Drop whole sealed segments past retention.ms / retention.bytes; returns how many.

        The log start offset moves durably first; only then do the objects go.
        """
        now_ms = int(self._clock() * 1000)
        pending: list[tuple[Future[int], list[SegmentRef]]] = []
        for topic, p in self.catalog.partitions():
            config = topic.config
            if "delete" not in config.cleanup_policy:
                continue
            with p.lock:
                table = p.segments
                if not table or p.deleted:
                    continue
                total = table.total_bytes() if config.retention_bytes >= 0 else 0
                drop = 0
                for i in range(len(table)):  # stops at the first segment kept: O(dropped)
                    seg = table[i]
                    expired = config.retention_ms >= 0 and seg.max_timestamp < now_ms - config.retention_ms
                    oversize = config.retention_bytes >= 0 and total > config.retention_bytes
                    if not (expired or oversize):
                        break
                    drop += 1
                    total -= seg.size
                if not drop:
                    continue
                gone = table.slice(0, drop)
                pending.append((self.catalog.record_log_start(p, gone[-1].end_offset), gone))
        for fut, gone in pending:
            fut.result()
            for seg in gone:
                self.indexes.forget(seg.key)
                self.stores.delete_segment(seg.key, seg.tier)
        return sum(len(g) for _f, g in pending)

    # ---- WAL truncation ---------------------------------------------------------------------

    def truncate_wal(self) -> int:
        """Delete WAL files whose frames are all in segments named by durable metadata."""
        shards = self._shards()
        if not any(s.has_closed_files() for s in shards):
            return 0  # only active files: nothing can go
        try:
            self.meta.sync()  # a topic deletion applied in memory is durable before its frames go
        except StorageFullError:
            return 0  # the metadata log is stalled on a full disk: truncate once it has healed
        by_id = self.catalog.by_id

        def obsolete(topic_id: bytes, partition: int, end: int) -> bool:
            topic = by_id.get(topic_id)
            if topic is None:
                return topic_id not in self.catalog.state.topics  # deleted, durably
            if partition >= len(topic.partitions):
                return False
            return topic.partitions[partition].durable_sealed_end >= end

        return sum(shard.delete_obsolete(obsolete) for shard in shards)
