"""Shared test helpers for driving an Engine on a (faulty) filesystem."""

from __future__ import annotations

from loglake.engine import Engine, EngineConfig
from loglake.records.batch import peek_header
from loglake.records.decode import iter_records

DATA_DIR = "/data"


def small_config(**overrides: object) -> EngineConfig:
    values: dict[str, object] = {
        "wal_shards": 2,
        "wal_file_bytes": 64 * 1024,
        "wal_group_bytes_max": 64 * 1024,
        "wal_queue_bytes_max": 1024 * 1024,
        "memory_budget_bytes": 16 * 1024 * 1024,
    }
    values.update(overrides)
    return EngineConfig(**values)  # type: ignore[arg-type]


def abandon(engine: Engine) -> None:
    """Stop an engine's threads without the clean-shutdown work (as a crash would)."""
    engine._closed = True
    parts = engine.log._parts
    if parts is not None:
        parts.maintenance.close()
        parts.sealer.close()
    shards = list(engine.shards)
    if engine.meta._shard is not None:
        shards.append(engine.meta._shard)
    for shard in shards:
        with shard._cond:
            shard._stopping = True
            shard._cond.notify_all()
        if shard._thread is not None:
            shard._thread.join(timeout=5)


def read_all(engine: Engine, topic: str) -> dict[int, list[tuple[int, bytes | None, bytes | None]]]:
    """Every visible record of every partition: {partition: [(offset, key, value), ...]}."""
    out: dict[int, list[tuple[int, bytes | None, bytes | None]]] = {}
    info = engine.topic(topic)
    for p in range(info.partitions):
        pinfo = engine.partition_info(topic, p)
        offset = pinfo.log_start_offset
        records: list[tuple[int, bytes | None, bytes | None]] = []
        while offset < pinfo.high_watermark:
            result = engine.read(topic, p, offset, 1 << 20)
            if not result.chunks:
                break  # compaction left nothing between `offset` and the high watermark
            data = b"".join(bytes(c) for c in result.chunks)  # type: ignore[arg-type]
            pos = 0
            advanced = False
            while pos < len(data):
                size = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
                for rec in iter_records(data, pos):
                    if rec.offset >= offset:
                        records.append((rec.offset, rec.key, rec.value))
                        offset = rec.offset + 1
                        advanced = True
                # a compacted batch may end past its last kept record: go on after the batch,
                # as Kafka's consumers do
                batch_end = peek_header(data, pos).last_offset + 1
                if batch_end > offset:
                    offset = batch_end
                    advanced = True
                pos += size
            assert advanced, f"read at {offset} made no progress"
        out[p] = records
    return out
