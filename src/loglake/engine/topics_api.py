"""The engine's topic calls (a mixin of `Engine`): create, delete, alter, describe, delete records.

Durable on return: each change is one metadata record the call waits for.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, cast

from loglake.engine.compaction import dirty_ratio_locked
from loglake.engine.config import TopicConfig
from loglake.engine.partition import SegmentRef
from loglake.engine.txn import last_stable_offset
from loglake.engine.types import PartitionInfo, TopicInfo
from loglake.errors import OffsetOutOfRangeError, UnknownTopicError

if TYPE_CHECKING:
    from loglake.engine.engine import Engine

__all__ = ["TopicsMixin"]

log = logging.getLogger("loglake.engine.engine")


class TopicsMixin:
    def create_topic(
        self, name: str, partitions: int = 1, config: dict[str, str] | None = None, *, validate_only: bool = False
    ) -> TopicInfo:
        eng = cast("Engine", self)
        eng._check_open()
        return eng.catalog.create_topic(name, partitions, config, validate_only=validate_only)

    def delete_topic(self, name: str) -> None:
        eng = cast("Engine", self)
        eng._check_open()
        topic = eng.catalog.delete_topic(name)
        # The metadata no longer names the topic: its data can go. Segments first, then memory.
        for p in topic.partitions:
            with p.lock:
                freed = p.buffer_bytes
                p.buffer_pop_front(len(p.buffer))
                segments = p.segments.slice(0)
            eng._pool.release(freed)
            p.wake_all()
            for seg in segments:
                eng.stores.delete_segment(seg.key, seg.tier)
        log.info("deleted topic %s", name)

    def create_partitions(self, name: str, total: int, *, validate_only: bool = False) -> None:
        eng = cast("Engine", self)
        eng._check_open()
        eng.catalog.create_partitions(name, total, validate_only=validate_only)

    def alter_topic_config(self, name: str, overrides: dict[str, str], *, validate_only: bool = False) -> TopicConfig:
        """Replace the topic's overrides with `overrides` (callers merge for incremental alters)."""
        eng = cast("Engine", self)
        eng._check_open()
        new = eng.catalog.alter_topic_config(name, overrides, validate_only=validate_only)
        if not validate_only:
            eng._wake()
        return new

    def topics(self) -> list[TopicInfo]:
        eng = cast("Engine", self)
        return [t.info() for t in eng.catalog.all_topics()]

    def topic(self, name: str) -> TopicInfo:
        eng = cast("Engine", self)
        return eng.catalog.topic(name).info()

    def has_topic(self, name: str) -> bool:
        eng = cast("Engine", self)
        return eng.catalog.has_topic(name)

    def partition_info(self, name: str, partition: int) -> PartitionInfo:
        eng = cast("Engine", self)
        p = eng.catalog.partition(name, partition)
        compacted = eng.catalog.topic(name).config.compacted  # only those have a dirty ratio
        with p.lock:
            return PartitionInfo(
                name,
                partition,
                p.log_start_offset,
                p.high_watermark,
                p.next_offset,
                p.sealed_end,
                len(p.segments),
                p.segments.total_bytes(),
                p.buffer_bytes,
                p.meta.clean_end,
                dirty_ratio_locked(p) if compacted else 0.0,
                p.meta.leader_epoch,
                last_stable_offset(p),
            )

    def delete_records(self, name: str, partition: int, offset: int) -> int:
        """Kafka DeleteRecords: raise the log start offset to `offset` (-1 = high watermark).

        Durable before it returns; whole segments below the new start are deleted.
        Returns the new log start offset (the "low watermark").
        """
        eng = cast("Engine", self)
        eng._check_open()
        p = eng.catalog.partition(name, partition)
        with p.lock:
            if p.deleted:
                raise UnknownTopicError(f"topic {name!r} was deleted")
            hw = p.high_watermark
            target = hw if offset == -1 else offset
            if not 0 <= target <= hw:
                raise OffsetOutOfRangeError(
                    f"cannot delete records of {name}-{partition} below {offset}: high watermark is {hw}",
                    log_start_offset=p.log_start_offset,
                    high_watermark=hw,
                )
            if target <= p.log_start_offset:
                return p.log_start_offset
            table = p.segments
            n = 0
            while n < len(table) and table[n].last_offset < target:
                n += 1
            doomed = table.slice(0, n)
            fut = eng.catalog.record_log_start(p, target)
        fut.result()
        for seg in doomed:
            eng._reader_indexes_forget(seg.key)
            eng.stores.delete_segment(seg.key, seg.tier)
        return target

    def _reader_indexes_forget(self, key: str) -> None:
        eng = cast("Engine", self)
        if eng._reader is not None:
            eng._reader.indexes.forget(key)

    def segments(self, name: str, partition: int) -> list[SegmentRef]:
        eng = cast("Engine", self)
        p = eng.catalog.partition(name, partition)
        with p.lock:
            return p.segments.slice(0)

    def allocate_producer_id(self) -> int:
        """A new producer id for InitProducerId, durable before it is handed out."""
        eng = cast("Engine", self)
        eng._check_open()
        return eng.catalog.allocate_producer_id()
