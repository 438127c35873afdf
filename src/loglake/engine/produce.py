"""What a produced batch must pass before any partition log takes it (both modes, written once).

* `checked_batches`: Kafka v2 batches as a producer sent them — each header, size
  (`max.message.bytes`) and CRC-32C checked without decoding records; a compacted topic's
  batches must have a key on every record (loglake.engine.compacted); with `compression.type`
  set on the topic, batches in another codec are rewritten in that one, as Kafka's broker does.
* `built_from_records` / `built_from_pairs`: one batch built from the embedded API's tuples.

The partition log then assigns offsets (loglake.engine.partition_log).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from loglake.engine.compacted import check_batches, check_keys
from loglake.engine.config import TopicConfig
from loglake.engine.types import AppendBuffer
from loglake.errors import CorruptRecordError, RecordTooLargeError
from loglake.records.batch import BatchBuilder, BatchHeader, new_builder, peek_header, split_batches
from loglake.records.compression import codec_from_name
from loglake.records.decode import iter_records

__all__ = ["PairTuple", "RecordTuple", "built_from_pairs", "built_from_records", "checked_batches", "codec_of"]

RecordTuple = tuple[int | None, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]
#: produce_batch's records: (key, value) or (key, value, headers), stamped with the append's time.
PairTuple = tuple[bytes | None, bytes | None] | tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]

Checked = tuple[AppendBuffer, list[tuple[int, BatchHeader]]]
T = TypeVar("T", RecordTuple, PairTuple)


def codec_of(config: TopicConfig) -> int:
    """The codec a topic's `compression.type` asks for ("producer": whatever the batch has)."""
    return 0 if config.compression_type == "uncompressed" else codec_from_name(config.compression_type)


def checked_batches(topic: str, partition: int, config: TopicConfig, data: bytes | bytearray | memoryview) -> Checked:
    """The batches of a produce, checked; a bytearray or writable memoryview argument is taken
    over (patched later, not copied)."""
    batches = split_batches(data, max_batch_bytes=config.max_message_bytes)
    if not batches:
        raise CorruptRecordError(f"append to {topic}-{partition}: no record batch in {len(data)} bytes")
    if config.compacted:
        check_batches(topic, partition, data, batches)
    buf: AppendBuffer = data if isinstance(data, bytearray) or (isinstance(data, memoryview) and not data.readonly) else bytearray(data)
    if config.compression_type != "producer":
        codec = codec_of(config)
        if any(h.compression != codec for _, h in batches):
            return _recompress(buf, batches, codec)
    return buf, batches


def _recompress(buf: AppendBuffer, batches: list[tuple[int, BatchHeader]], codec: int) -> Checked:
    """compression.type set on the topic: rewrite batches in that codec, as Kafka's broker does."""
    out: list[bytes] = []
    for pos, h in batches:
        if h.is_control:
            out.append(bytes(buf[pos : pos + h.size]))
            continue
        builder = new_builder(
            compression=codec,
            producer_id=h.producer_id,
            producer_epoch=h.producer_epoch,
            base_sequence=h.base_sequence,
            is_transactional=h.is_transactional,
            timestamp_type=h.timestamp_type,
        )
        for rec in iter_records(buf, pos):
            builder.append(rec.timestamp, rec.key, rec.value, rec.headers)
        out.append(builder.build())
    new = bytearray(b"".join(out))
    return new, split_batches(new)


def built_from_records(
    topic: str, partition: int, config: TopicConfig, records: Iterable[RecordTuple], compression: int | None, now_ms: int
) -> Checked:
    """One batch of append_records' (timestamp or None, key, value, headers) tuples."""
    return _built(
        topic, partition, config, records, compression, lambda r: r[1], lambda b, rs: b.append_all(rs, now_ms), "append_records"
    )


def built_from_pairs(
    topic: str, partition: int, config: TopicConfig, records: Iterable[PairTuple], compression: int | None, now_ms: int
) -> Checked:
    """One batch of append_pairs' (key, value[, headers]) tuples, all stamped `now_ms`."""
    return _built(
        topic, partition, config, records, compression, lambda r: r[0], lambda b, rs: b.append_pairs(rs, now_ms), "append_pairs"
    )


def _built(
    topic: str,
    partition: int,
    config: TopicConfig,
    records: Iterable[T],
    compression: int | None,
    key_of: Callable[[T], bytes | None],
    fill: Callable[[BatchBuilder, Iterable[T]], None],
    what: str,
) -> Checked:
    """A compacted topic's records must each have a key (`key_of`); then one batch is filled
    and finished."""
    if config.compacted:
        records = list(records)
        check_keys(topic, partition, (key_of(rec) for rec in records))
    builder = new_builder(compression=_compression(config, compression))
    fill(builder, records)
    return _finish(topic, config, builder, what)


def _compression(config: TopicConfig, compression: int | None) -> int:
    if compression is not None:
        return compression
    return 0 if config.compression_type == "producer" else codec_of(config)


def _finish(topic: str, config: TopicConfig, builder: BatchBuilder, what: str) -> Checked:
    """Built here, so its header is read back and its CRC not checked again."""
    if len(builder) == 0:
        raise CorruptRecordError(f"{what}: no records")
    data = bytearray(builder.build())
    if len(data) > config.max_message_bytes:
        raise RecordTooLargeError(
            f"batch of {len(data)} bytes exceeds max.message.bytes={config.max_message_bytes} of {topic}"
        )
    return data, [(0, peek_header(data))]
