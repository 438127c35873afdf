"""Engine behaviour: offsets, reads, sealing, memory budget, configs, retention, failures."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import loglake
from loglake.engine import Engine, EngineConfig
from loglake.engine.memory import MemoryPool
from loglake.errors import (
    BackPressureTimeoutError,
    ConfigError,
    CorruptionError,
    CorruptRecordError,
    DataDirLockedError,
    EngineClosedError,
    InvalidPartitionsError,
    InvalidTopicError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
    TopicExistsError,
    UnknownTopicError,
)
from loglake.fs.faulty import FaultyFileSystem
from loglake.records import CODEC_ZSTD, build_batch, iter_records, peek_header

from enginekit import DATA_DIR, abandon, read_all, small_config


def open_engine(path: Path, **kw: object) -> Engine:
    engine = Engine(str(path), EngineConfig(**kw))  # type: ignore[arg-type]
    engine.open()
    return engine


def append(engine: Engine, topic: str, partition: int, values: list[bytes], ts: int | None = None) -> int:
    recs = [(ts, None, v, []) for v in values]
    return engine.append_records(topic, partition, recs).result().base_offset


def test_offsets_are_dense_and_reads_return_whole_batches(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        engine.create_topic("t", 1)
        assert append(engine, "t", 0, [b"a", b"b", b"c"]) == 0
        assert append(engine, "t", 0, [b"d"]) == 3
        batch = build_batch([(5, None, b"e", []), (6, None, b"f", [])], base_offset=999)
        assert engine.append_batch("t", 0, batch).result().base_offset == 4
        # Reading offset 1 returns the whole first batch (it holds offset 1), Kafka style.
        result = engine.read("t", 0, 1, 1 << 20)
        data = b"".join(bytes(c) for c in result.chunks)  # type: ignore[arg-type]
        first = peek_header(data)
        assert (first.base_offset, first.last_offset) == (0, 2)
        assert result.high_watermark == 6
        assert [r.offset for r in iter_records(data, first.size + peek_header(data, first.size).size)] == [4, 5]
        assert engine.read("t", 0, 6, 1 << 20).chunks == []  # at the high watermark: nothing yet
        with pytest.raises(OffsetOutOfRangeError):
            engine.read("t", 0, 7, 1 << 20)


def test_max_bytes_is_respected_but_one_batch_always_comes_back(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        engine.create_topic("t", 1)
        for i in range(10):
            append(engine, "t", 0, [bytes([i]) * 1000])
        assert len(engine.read("t", 0, 0, 10).chunks) == 1
        assert len(engine.read("t", 0, 0, 3500).chunks) == 3
        engine.flush()  # now from a segment
        assert engine.partition_info("t", 0).sealed_end == 10
        one = engine.read("t", 0, 0, 10)
        assert one.size > 1000 and len(one.chunks) == 1
        assert engine.read("t", 0, 0, 3500).size < 3500


def test_offset_for_timestamp_and_max_timestamp(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        # Timestamps of 1970: without retention.ms=-1 the maintenance thread's first tick (1 s
        # after open, later under load) drops the sealed segment as expired mid-test.
        engine.create_topic("t", 1, {"retention.ms": "-1"})
        for i in range(5):
            append(engine, "t", 0, [b"x"], ts=1000 + i * 100)
        engine.flush()
        for i in range(5, 8):
            append(engine, "t", 0, [b"y"], ts=1000 + i * 100)
        assert engine.offset_for_timestamp("t", 0, 0) == (0, 1000)
        assert engine.offset_for_timestamp("t", 0, 1150) == (2, 1200)
        assert engine.offset_for_timestamp("t", 0, 1600) == (6, 1600)  # in the unsealed buffer
        assert engine.offset_for_timestamp("t", 0, 5000) is None
        assert engine.max_timestamp("t", 0) == (7, 1700)


def test_tail_wait_resolves_when_data_becomes_visible(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        engine.create_topic("t", 1)
        waiter = engine.wait_for_data("t", 0, 0)
        assert not waiter.done()
        append(engine, "t", 0, [b"x"])
        waiter.result(timeout=5)
        assert engine.wait_for_data("t", 0, 0).done()


def test_seal_on_segment_bytes_records_and_age(tmp_path: Path) -> None:
    with open_engine(tmp_path, maintenance_interval_ms=20) as engine:
        engine.create_topic("bytes", 1, {"segment.bytes": "16384"})
        engine.create_topic("records", 1, {"segment.records": "10"})
        engine.create_topic("age", 1, {"segment.ms": "50"})
        for _ in range(20):
            append(engine, "bytes", 0, [b"b" * 1000])
            append(engine, "records", 0, [b"r"])
        append(engine, "age", 0, [b"a"])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if (
                engine.partition_info("bytes", 0).segments >= 1
                and engine.partition_info("records", 0).segments >= 2
                and engine.partition_info("age", 0).segments == 1
            ):
                break
            time.sleep(0.02)
        assert engine.partition_info("bytes", 0).segments >= 1
        assert all(s.size <= 16384 + 2000 for s in engine.segments("bytes", 0))
        assert [s.record_count for s in engine.segments("records", 0)][:2] == [10, 10]
        assert engine.partition_info("age", 0).sealed_end == 1


def test_clean_shutdown_seals_everything_and_reopen_sees_it(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        engine.create_topic("t", 2, {"durability": "ephemeral"})
        append(engine, "t", 0, [b"e1", b"e2"])
        append(engine, "t", 1, [b"e3"])
    with open_engine(tmp_path) as engine:
        assert engine.partition_info("t", 0).sealed_end == 2
        assert read_all(engine, "t") == {0: [(0, None, b"e1"), (1, None, b"e2")], 1: [(0, None, b"e3")]}
        assert engine.recovery_report is not None
        assert engine.recovery_report.wal_frames_replayed == 0


def test_durability_classes_after_a_crash() -> None:
    fs = FaultyFileSystem(seed=5)
    engine = Engine(DATA_DIR, small_config(), fs=fs, start_background=False)
    engine.open()
    for cls in ("fsync", "disk", "memory", "ephemeral"):
        engine.create_topic(cls, 1, {"durability": cls})
        append(engine, cls, 0, [cls.encode()])
    for shard in engine.shards:
        shard.sync()  # the interval fsync of `disk`/`memory` has happened
    abandon(engine)
    after = Engine(DATA_DIR, small_config(), fs=fs.crash(), start_background=False)
    after.open()
    try:
        assert read_all(after, "fsync") == {0: [(0, None, b"fsync")]}
        assert read_all(after, "disk") == {0: [(0, None, b"disk")]}
        assert read_all(after, "memory") == {0: [(0, None, b"memory")]}
        assert read_all(after, "ephemeral") == {0: []}  # never in the WAL: gone, by definition
    finally:
        abandon(after)


def test_memory_budget_bounds_unsealed_data_and_backpressure_waits(tmp_path: Path) -> None:
    budget = 8 * 1024 * 1024
    with open_engine(tmp_path, memory_budget_bytes=budget, maintenance_interval_ms=20) as engine:
        engine.create_topic("t", 4, {"segment.bytes": str(64 * 1024 * 1024), "max.message.bytes": "1000000"})
        now = int(time.time() * 1000)  # (timestamp 0 would be 56 years past retention.ms)
        batch = build_batch([(now, None, b"m" * 1000, [])] * 200)  # ~200 KB
        peak = 0
        futures = []
        for i in range(150):  # 30 MB through an 8 MiB budget
            futures.append(engine.append_batch("t", i % 4, batch))
            peak = max(peak, engine.memory_pool.used_bytes)
        for f in futures:
            f.result(timeout=30)
        assert peak <= budget + len(batch)
        assert sum(engine.partition_info("t", p).high_watermark for p in range(4)) == 150 * 200
        assert sum(engine.partition_info("t", p).segments for p in range(4)) > 0  # emergency seals ran


def test_memory_pool_times_out_with_a_retriable_error() -> None:
    pool = MemoryPool(1000, 0.75, lambda: None)
    pool.reserve(900, 1.0)
    with pytest.raises(BackPressureTimeoutError) as info:
        pool.reserve(200, 0.05)
    assert info.value.retriable
    pool.release(900)
    pool.reserve(200, 0.05)


def test_topic_config_and_name_validation(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        with pytest.raises(ConfigError, match="unknown topic config"):
            engine.create_topic("a", 1, {"retention.msec": "1"})
        with pytest.raises(ConfigError, match="not an integer"):
            engine.create_topic("a", 1, {"retention.ms": "soon"})
        with pytest.raises(ConfigError, match="must be one of"):
            engine.create_topic("a", 1, {"durability": "paper"})
        with pytest.raises(InvalidTopicError):
            engine.create_topic("bad/name", 1)
        with pytest.raises(InvalidTopicError):
            engine.create_topic("x" * 250, 1)
        with pytest.raises(InvalidPartitionsError):
            engine.create_topic("a", 0)
        engine.create_topic("a", 1)
        with pytest.raises(TopicExistsError):
            engine.create_topic("a", 1)
        with pytest.raises(UnknownTopicError):
            engine.append_records("nope", 0, [(None, None, b"x", [])])
        with pytest.raises(UnknownTopicError):
            engine.append_records("a", 5, [(None, None, b"x", [])])
    with pytest.raises(ConfigError, match="unknown engine option"):
        EngineConfig.from_kwargs(wal_shard=3)


def test_bad_batches_are_rejected_with_kafka_errors(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        engine.create_topic("t", 1, {"max.message.bytes": "2000"})
        batch = bytearray(build_batch([(0, None, b"v", [])]))
        batch[-1] ^= 1
        with pytest.raises(CorruptRecordError):
            engine.append_batch("t", 0, bytes(batch))
        with pytest.raises(RecordTooLargeError):
            engine.append_batch("t", 0, build_batch([(0, None, b"v" * 5000, [])]))
        with pytest.raises(CorruptRecordError):
            engine.append_batch("t", 0, b"")
        assert engine.partition_info("t", 0).next_offset == 0


def test_log_append_time_and_topic_compression(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        engine.create_topic("lat", 1, {"message.timestamp.type": "LogAppendTime"})
        engine.create_topic("z", 1, {"compression.type": "zstd"})
        before = int(time.time() * 1000)
        result = engine.append_batch("lat", 0, build_batch([(5, b"k", b"v", [])])).result()
        assert result.log_append_time >= before
        data = b"".join(bytes(c) for c in engine.read("lat", 0, 0, 1 << 20).chunks)  # type: ignore[arg-type]
        assert [r.timestamp for r in iter_records(data)] == [result.log_append_time]
        engine.append_batch("z", 0, build_batch([(5, b"k", b"v" * 100, [("h", b"1")])])).result()
        data = b"".join(bytes(c) for c in engine.read("z", 0, 0, 1 << 20).chunks)  # type: ignore[arg-type]
        assert peek_header(data).compression == CODEC_ZSTD
        [rec] = list(iter_records(data))
        assert (rec.timestamp, rec.key, rec.value, rec.headers) == (5, b"k", b"v" * 100, [("h", b"1")])


def test_deleted_topic_is_gone_and_a_recreated_one_starts_empty(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        engine.create_topic("t", 1)
        append(engine, "t", 0, [b"old"])
        engine.flush()
        old_keys = [s.key for s in engine.segments("t", 0)]
        append(engine, "t", 0, [b"unsealed"])
        engine.delete_topic("t")
        assert engine.log.stores.hot.head(old_keys[0]) is None
        engine.create_topic("t", 1)
        append(engine, "t", 0, [b"new"])
    with open_engine(tmp_path) as engine:
        assert read_all(engine, "t") == {0: [(0, None, b"new")]}


def test_retention_drops_old_segments_and_moves_log_start(tmp_path: Path) -> None:
    with open_engine(tmp_path, maintenance_interval_ms=20) as engine:
        engine.create_topic("t", 1, {"retention.ms": "1000"})
        now = int(time.time() * 1000)
        append(engine, "t", 0, [b"ancient"] * 3, ts=now - 3_600_000)
        engine.flush()
        append(engine, "t", 0, [b"fresh"], ts=now)
        engine.flush()
        deadline = time.monotonic() + 10
        while engine.partition_info("t", 0).log_start_offset == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        info = engine.partition_info("t", 0)
        assert info.log_start_offset == 3 and info.segments == 1
        with pytest.raises(OffsetOutOfRangeError):
            engine.read("t", 0, 0, 100)
    with loglake.open(str(tmp_path)) as log:
        assert [r.value for r in log.consume("t")] == [b"fresh"]


def test_second_open_of_a_data_dir_fails_fast(tmp_path: Path) -> None:
    with open_engine(tmp_path), pytest.raises(DataDirLockedError, match="in use by another loglake process"):
        open_engine(tmp_path)


def test_shard_count_may_change_between_restarts(tmp_path: Path) -> None:
    fs = FaultyFileSystem(seed=9)
    engine = Engine(DATA_DIR, small_config(wal_shards=4), fs=fs, start_background=False)
    engine.open()
    engine.create_topic("t", 4)
    for p in range(4):
        append(engine, "t", p, [f"p{p}".encode()])
    abandon(engine)
    fs2 = fs.crash()
    engine = Engine(DATA_DIR, small_config(wal_shards=1), fs=fs2, start_background=False)
    engine.open()
    try:
        assert {p: [v for _, _, v in recs] for p, recs in read_all(engine, "t").items()} == {
            p: [f"p{p}".encode()] for p in range(4)
        }
        engine.flush()  # everything sealed: the old shards' files can all go
        assert fs2.listdir(f"{DATA_DIR}/wal/shard-03") == []
    finally:
        abandon(engine)


def test_full_disk_during_seal_is_retried_and_loses_nothing() -> None:
    fs = FaultyFileSystem(seed=11)
    engine = Engine(DATA_DIR, small_config(), fs=fs, start_background=False)
    engine.open()
    try:
        engine.create_topic("t", 1)
        append(engine, "t", 0, [b"before"])  # rolls the WAL file now, while space remains
        fs.set_full(True)
        append(engine, "t", 0, [b"while-full"])  # fits in the preallocated WAL file
        with pytest.raises(StorageError):
            engine.flush()  # the segment cannot be written
        assert engine.partition_info("t", 0).sealed_end == 0
        fs.set_full(False)
        engine.flush()
        assert engine.partition_info("t", 0).sealed_end == 2
        assert read_all(engine, "t") == {0: [(0, None, b"before"), (1, None, b"while-full")]}
    finally:
        abandon(engine)


def test_segment_missing_from_the_store_stops_startup(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        engine.create_topic("t", 1)
        append(engine, "t", 0, [b"x"])
        engine.flush()
        key = engine.segments("t", 0)[0].key
        path = engine.log.stores.hot.local_path(key)
    assert path is not None
    os.unlink(path)
    with pytest.raises(CorruptionError, match="missing"):
        open_engine(tmp_path)


def _idempotent_batch(pid: int, epoch: int, seq: int, values: list[bytes]) -> bytes:
    return build_batch(
        [(0, None, v, []) for v in values], producer_id=pid, producer_epoch=epoch, base_sequence=seq
    )


def test_idempotent_producer_duplicates_and_gaps(tmp_path: Path) -> None:
    from loglake.errors import InvalidProducerEpochError, OutOfOrderSequenceError

    with open_engine(tmp_path) as engine:
        engine.create_topic("t", 1)
        pid = engine.allocate_producer_id()
        assert engine.allocate_producer_id() == pid + 1
        first = engine.append_batch("t", 0, _idempotent_batch(pid, 0, 0, [b"a", b"b"])).result()
        retry = engine.append_batch("t", 0, _idempotent_batch(pid, 0, 0, [b"a", b"b"])).result()
        assert (retry.base_offset, retry.last_offset) == (first.base_offset, first.last_offset) == (0, 1)
        assert engine.partition_info("t", 0).next_offset == 2  # the retry appended nothing
        with pytest.raises(OutOfOrderSequenceError):
            engine.append_batch("t", 0, _idempotent_batch(pid, 0, 5, [b"c"]))
        assert engine.append_batch("t", 0, _idempotent_batch(pid, 0, 2, [b"c"])).result().base_offset == 2
        assert engine.append_batch("t", 0, _idempotent_batch(pid, 1, 0, [b"d"])).result().base_offset == 3
        with pytest.raises(InvalidProducerEpochError):
            engine.append_batch("t", 0, _idempotent_batch(pid, 0, 3, [b"e"]))
    # Producer state survives a restart (from the snapshot and from WAL replay).
    with open_engine(tmp_path) as engine:
        again = engine.append_batch("t", 0, _idempotent_batch(pid, 1, 0, [b"d"])).result()
        assert again.base_offset == 3 and engine.partition_info("t", 0).next_offset == 4
        assert engine.allocate_producer_id() == pid + 2


def test_delete_records_moves_log_start_durably(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        engine.create_topic("t", 1)
        append(engine, "t", 0, [b"a", b"b", b"c"])
        engine.flush()
        append(engine, "t", 0, [b"d", b"e"])
        assert engine.delete_records("t", 0, 3) == 3
        assert engine.partition_info("t", 0).segments == 0  # [0, 3) was one whole segment
        with pytest.raises(OffsetOutOfRangeError):
            engine.read("t", 0, 2, 100)
        with pytest.raises(OffsetOutOfRangeError):
            engine.delete_records("t", 0, 99)
        assert engine.delete_records("t", 0, 1) == 3  # never moves backwards
    with open_engine(tmp_path) as engine:
        assert engine.partition_info("t", 0).log_start_offset == 3
        assert [v for _o, _k, v in read_all(engine, "t")[0]] == [b"d", b"e"]
        assert engine.delete_records("t", 0, -1) == 5


def test_an_engine_that_is_not_open_refuses_with_engine_closed(tmp_path: Path) -> None:
    """Before `open` and after `close` every data call raises EngineClosedError (a typed,
    retriable error the broker answers), never an AssertionError or a lookup error."""
    engine = Engine(str(tmp_path / "d"))
    calls = [
        lambda: engine.append_batch("t", 0, build_batch([(1, None, b"x", [])])),
        lambda: engine.read("t", 0, 0, 1024),
        lambda: engine.read_async("t", 0, 0, 1024),
        lambda: engine.partition_info("t", 0),
        lambda: engine.producers("t", 0),
        lambda: engine.create_topic("t", 1),
        lambda: engine.delete_records("t", 0, 0),
        lambda: engine.flush(),
        lambda: engine.allocate_producer_id(),
    ]
    for call in calls:
        with pytest.raises(EngineClosedError):
            call()
    engine.open()
    engine.create_topic("t", 1)
    engine.close()
    for call in calls:
        with pytest.raises(EngineClosedError):
            call()
