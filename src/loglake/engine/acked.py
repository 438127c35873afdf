"""Acknowledged ends in the engine: recorded while running, checked at recovery (meta/acked.py).

* **Recording.** Each maintenance tick, at most once per `acked_end_interval_ms`, one ``acked``
  metadata record lists the ``durability=fsync`` partitions whose high watermark passed their
  recorded acknowledged end (their high watermark moves only after the WAL group's
  fdatasync). One record at a time: the next waits until the previous one is durable.
  Other classes promise less (``disk`` acknowledges before the fsync, ``memory`` before the
  write) and are covered by their sealed end only.
* **Checking.** After the WAL replay, a partition whose recovered log end is below its
  acknowledged end lost acknowledged records. A torn write cannot explain that (a torn group
  was never acknowledged), so the engine refuses to open (`AcknowledgedDataLossError`, naming
  every partition and offset range) unless `EngineConfig.accept_data_loss` is set.
* **Accepting.** The lost range is filled with one empty batch (no records, offsets up to the
  acknowledged end - 1: what Kafka's cleaner leaves where it removed every record of a batch),
  so the next offset stays at the acknowledged end and offsets consumers may have read are
  never handed out again for different records; readers move over the gap as over any empty
  batch. The partition's leader epoch moves (consumers past the gap see a truncation).

Losses within the last interval before a crash stay indistinguishable from a torn tail.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import crc32c

from loglake.engine.append import Appender
from loglake.engine.catalog import Catalog
from loglake.engine.epochs import record_bump
from loglake.engine.types import RecoveryReport
from loglake.errors import AcknowledgedDataLossError
from loglake.meta.acked import ACKED_PARTS_MAX
from loglake.meta.log import LocalMetaStore
from loglake.meta.records import Acked, AckedRow
from loglake.records.batch import CRC_COVERED_START, CRC_OFFSET, HEADER, LENGTH_FIELD_END
from loglake.wal.shard import Durability

__all__ = ["AckedRecorder", "Loss", "check_losses", "empty_batch", "fill_losses", "find_losses"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Loss:
    topic: str
    partition: int
    recovered_end: int  # the first lost offset
    acked_end: int  # every offset below this was acknowledged

    @property
    def records(self) -> int:
        return self.acked_end - self.recovered_end

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition} offsets {self.recovered_end}..{self.acked_end - 1} ({self.records} records)"


class AckedRecorder:
    def __init__(self, catalog: Catalog, meta: LocalMetaStore, interval_ms: int, clock: Callable[[], float]) -> None:
        self.catalog = catalog
        self.meta = meta
        self.interval_s = interval_ms / 1000.0
        self._clock = clock
        self._last = float("-inf")
        self._pending: Future[int] | None = None

    def tick(self) -> int:
        """Record the partitions whose acknowledged end moved, when due. Returns how many."""
        now = self._clock()
        if now - self._last < self.interval_s or (self._pending is not None and not self._pending.done()):
            return 0
        self._last = now
        parts: list[AckedRow] = []
        for topic, p in self.catalog.partitions():
            if topic.config.durability != Durability.FSYNC or p.deleted:
                continue
            end = p.high_watermark
            if end > p.meta.acked_end:
                parts.append((p.topic_id.hex(), p.index, end))
        for i in range(0, len(parts), ACKED_PARTS_MAX):
            self._pending = self.meta.append(Acked(parts[i : i + ACKED_PARTS_MAX]))
        return len(parts)


def find_losses(catalog: Catalog) -> list[Loss]:
    """Partitions whose recovered log end is below their acknowledged end."""
    return [
        Loss(p.topic, p.index, p.next_offset, p.meta.acked_end)
        for _topic, p in catalog.partitions()
        if p.next_offset < p.meta.acked_end
    ]


def check_losses(losses: list[Loss], accept: bool, data_dir: str) -> None:
    """Refuse to go on over acknowledged data lost, unless accepted (then: one ERROR line each)."""
    if not losses:
        return
    if not accept:
        raise AcknowledgedDataLossError(data_dir, [str(x) for x in losses])
    for x in losses:
        log.error(
            "ACCEPTED LOSS of acknowledged data (--accept-data-loss): %s; the offsets stay reserved "
            "(an empty batch fills them) and the leader epoch moves",
            x,
        )


def empty_batch(count: int, epoch: int, timestamp: int) -> bytearray:
    """A valid Kafka v2 batch with no records covering `count` offsets (base offset 0: the append
    path assigns it)."""
    if not 0 < count <= 1 << 31:
        raise ValueError(f"an empty batch covers 1..2^31 offsets, not {count}")
    buf = bytearray(HEADER.size)
    HEADER.pack_into(buf, 0, 0, HEADER.size - LENGTH_FIELD_END, epoch, 2, 0, 0, count - 1, timestamp, timestamp, -1, -1, -1, 0)
    struct.pack_into(">I", buf, CRC_OFFSET, crc32c.crc32c(bytes(buf[CRC_COVERED_START:])))
    return buf


def fill_losses(catalog: Catalog, appender: Appender, clock: Callable[[], float], report: RecoveryReport) -> None:
    """After an accepted loss (the WAL writers running): an empty batch up to each partition's
    acknowledged end, durably, then a new leader epoch from there."""
    for loss in find_losses(catalog):
        p = catalog.partition(loss.topic, loss.partition)
        gap = empty_batch(loss.records, p.meta.leader_epoch, int(clock() * 1000))
        appender.append_gap(p, gap).result()
        with p.lock:
            record_bump(catalog, p, f"accepted loss of acknowledged offsets {loss.recovered_end}..{loss.acked_end - 1}").result()
        report.leader_epochs_bumped.append(f"{p.topic}-{p.index}")
