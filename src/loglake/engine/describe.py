"""Read-only descriptions of partitions for admin APIs: where their bytes live (DescribeLogDirs)
and their idempotent producers (DescribeProducers)."""

from __future__ import annotations

from dataclasses import dataclass

from loglake.engine.catalog import Catalog
from loglake.engine.read import Reader
from loglake.errors import LoglakeError
from loglake.meta.lifecycle import Tier
from loglake.records.batch import peek_header

__all__ = ["PRODUCER_TIMESTAMP_READS_MAX", "ProducerDescription", "TierBytes", "producers", "tier_bytes"]

#: Most batches one DescribeProducers call reads for last timestamps; producers past it report -1.
PRODUCER_TIMESTAMP_READS_MAX = 1000


@dataclass(frozen=True, slots=True)
class TierBytes:
    #: on the data directory's disk: hot sealed segments and the unsealed data (WAL and memory)
    hot: int
    #: in the cold store
    cold: int
    #: log end minus high watermark (Kafka's OffsetLag of the current log)
    offset_lag: int


@dataclass(frozen=True, slots=True)
class ProducerDescription:
    producer_id: int
    producer_epoch: int
    last_sequence: int
    #: max timestamp of the producer's newest batch (-1: not read or no longer held)
    last_timestamp: int


def tier_bytes(catalog: Catalog, name: str, partition: int) -> TierBytes:
    p = catalog.partition(name, partition)
    with p.lock:
        table = p.segments
        cold = sum(table[i].size for i in table.indexes_in_tier(Tier.COLD))
        hot = table.total_bytes() - cold + p.buffer_bytes
        lag = max(0, p.next_offset - p.high_watermark)
    return TierBytes(hot, cold, lag)


def producers(catalog: Catalog, reader: Reader, name: str, partition: int) -> list[ProducerDescription]:
    """The partition's idempotent producers; each last timestamp is read from its newest batch
    (blocking: call off the event loop)."""
    p = catalog.partition(name, partition)
    with p.lock:
        states = p.producers.describe()
    out = []
    for i, (pid, epoch, last_seq, base) in enumerate(states):
        ts = _batch_max_timestamp(reader, name, partition, base) if base >= 0 and i < PRODUCER_TIMESTAMP_READS_MAX else -1
        out.append(ProducerDescription(pid, epoch, last_seq, ts))
    return out


def _batch_max_timestamp(reader: Reader, name: str, partition: int, offset: int) -> int:
    try:
        result = reader.read(name, partition, offset, 1, min_one=True)
    except LoglakeError:
        return -1  # retention or compaction removed it
    data = b"".join(bytes(c) for c in result.chunks if not hasattr(c, "path"))
    if not data:
        return -1
    return peek_header(data, 0).max_timestamp
