"""Idempotent producers in cluster mode: sequence checks at the leader, state rebuilt from the log.

The leader checks and records each idempotent batch exactly as the single-node appender does
(loglake.meta.producers.ProducerStates). That state is not written anywhere else: a new leader
rebuilds it when it acquires the partition, from the batch headers of the partition's committed
tail — Kafka's own approach (its producer state is rebuilt from the log after a leader change).
Reading the tail costs one ranged GET per flush range (or one of the last merged segment), and
the committed tail is exact: every batch a producer was acknowledged for is in it, and nothing
else (a commit that failed is not in the log). So a producer that retries a batch the old leader
committed (its answer lost with the old leader) gets the original offsets, and its next
sequence is accepted; no OutOfOrderSequence.

Only the newest PRODUCER_BATCHES_REMEMBERED batches per producer matter (Kafka's clients keep at
most five requests in flight), so the rebuild reads back at most REBUILD_BYTES_MAX bytes: a
producer idle for longer than that tail simply starts over as unknown, which the sequence check
accepts (as Kafka does once a producer's state expired).
"""

from __future__ import annotations

from typing import Any

from loglake.meta.cluster import Plog, PlogRange
from loglake.meta.producers import ProducerStates
from loglake.records.batch import BATCH_HEADER_SIZE, peek_header

__all__ = ["REBUILD_BYTES_MAX", "rebuild_producers"]

#: Bytes of committed tail read to rebuild a partition's producer state at acquire.
REBUILD_BYTES_MAX = 16 * 1024 * 1024
#: Bytes asked for per read while rebuilding.
REBUILD_READ_BYTES = 4 * 1024 * 1024


def tail_start(plog: Plog, bytes_max: int = REBUILD_BYTES_MAX) -> int:
    """The first offset of the newest sources (ranges, then segments) that add up to `bytes_max`."""
    sources: list[Any] = [*plog.segments, *plog.ranges]
    total = 0
    start = plog.end
    for src in reversed(sources):
        total += src.length if isinstance(src, PlogRange) else src.index_pos
        start = src.base
        if total >= bytes_max:
            break
    return start


def rebuild_producers(read: Any, plog: Plog) -> ProducerStates:
    """Producer state from the committed batches of the partition's tail; `read(offset, max_bytes)`
    returns committed batches from `offset` (b"" at the end)."""
    states = ProducerStates()
    offset = tail_start(plog)
    while offset < plog.end:
        data = read(offset, REBUILD_READ_BYTES)
        if not data:
            break
        view = memoryview(data)
        pos = 0
        while pos + BATCH_HEADER_SIZE <= len(view):
            h = peek_header(view[pos:])
            if h.producer_id >= 0 and h.base_sequence >= 0 and not h.is_control:
                states.record(h.producer_id, h.producer_epoch, h.base_sequence, h.record_count, h.base_offset)
            offset = h.last_offset + 1
            pos += h.size
        if pos == 0:
            break
    return states
