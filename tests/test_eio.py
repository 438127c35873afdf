"""EIO in the engine, injected by the fault-injecting filesystem (issue 10): on a WAL write or
fdatasync, the metadata log's write or fsync, a checkpoint, a segment's write or fsync (seal), and
a hot segment's pread. Each is a typed error with one log line that says what and where; other
partitions and segments keep working; after a crash every acknowledged record is there at dense
offsets (acked ⊆ recovered ⊆ written)."""

from __future__ import annotations

import errno
import logging
import time
from types import SimpleNamespace

import pytest

from loglake.broker.metrics import Metrics
from loglake.broker.server import BrokerServer
from loglake.engine import Engine
from loglake.errors import EngineFailedError, SegmentReadError, StorageError, StorageFullError
from loglake.fs.faulty import FaultyFileSystem
from loglake.kafka_errors import ErrorCode

from enginekit import DATA_DIR, abandon, read_all, small_config

WAL = "/data/wal/"
META_LOG = "/data/meta/log/"
SEGMENTS = "/data/segments/"

Records = dict[int, list[tuple[int, bytes | None, bytes | None]]]


def wait_until(cond: object, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def append(engine: Engine, partition: int, value: bytes, topic: str = "t") -> int:
    return engine.append_records(topic, partition, [(None, None, value, [])]).result(timeout=30).base_offset


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def health(engine: Engine) -> tuple[str, list[str]]:
    """What /metrics and /readyz would show for this engine."""
    server = SimpleNamespace(engine=engine)
    return Metrics().render(engine), BrokerServer._readyz_notes(server)  # type: ignore[arg-type]


def check_oracle(recovered: Records, acked: dict[int, list[bytes]], written: dict[int, list[bytes]]) -> None:
    """acked ⊆ recovered ⊆ written, in order, at dense offsets from 0."""
    for p, records in recovered.items():
        assert [o for o, _k, _v in records] == list(range(len(records))), f"offsets of partition {p} not dense"
        values = [v for _o, _k, v in records]
        assert values[: len(acked.get(p, []))] == acked.get(p, []), f"acknowledged records of partition {p} lost"
        assert set(values) <= set(written.get(p, [])), f"partition {p} recovered something never written"


def reopen(fs: FaultyFileSystem) -> Engine:
    after = Engine(DATA_DIR, small_config(wal_shards=1), fs=fs.crash(), start_background=False)
    after.open()
    return after


@pytest.mark.parametrize("op", ["write", "sync"])
def test_wal_eio_fails_the_engine_once_and_reads_go_on(op: str, caplog: pytest.LogCaptureFixture) -> None:
    """EIO on the WAL's pwritev or fdatasync: that group's producers get a StorageError (never an
    ack), the engine refuses writes for good with KAFKA_STORAGE_ERROR (a failed fsync is never
    retried), says so in one ERROR line naming the WAL directory and errno, keeps serving reads of
    every partition, and a restart recovers every acknowledged record."""
    caplog.set_level(logging.WARNING)
    fs = FaultyFileSystem(seed=11)
    engine = Engine(DATA_DIR, small_config(wal_shards=1), fs=fs, start_background=False)
    engine.open()
    engine.create_topic("t", 2)
    acked = {0: [b"a0", b"a1"], 1: [b"b0"]}
    for p, values in acked.items():
        for v in values:
            append(engine, p, v)
    written = {p: [*vs] for p, vs in acked.items()}
    fs.fail_path(WAL, op, times=1)
    written[0].append(b"failed")
    with pytest.raises(StorageError) as info:
        engine.append_records("t", 0, [(None, None, b"failed", [])]).result(timeout=10)
    assert not isinstance(info.value, StorageFullError)
    assert info.value.kafka_code == ErrorCode.KAFKA_STORAGE_ERROR
    assert engine.failure is not None
    for p in (0, 1):
        with pytest.raises(EngineFailedError) as refused:
            engine.append_records("t", p, [(None, None, b"refused", [])])
        assert refused.value.kafka_code == ErrorCode.KAFKA_STORAGE_ERROR
    # reads of everything acknowledged go on, in both partitions
    assert {p: [v for _o, _k, v in rs] for p, rs in read_all(engine, "t").items()} == acked
    lines = errors(caplog)
    assert len(lines) == 1, lines
    assert "/data/wal/shard-00" in lines[0] and "Errno 5" in lines[0]
    metrics, notes = health(engine)
    assert "loglake_engine_failed 1.0" in metrics
    assert len(notes) == 1 and notes[0].startswith("engine failed: ") and "/data/wal/shard-00" in notes[0]
    abandon(engine)
    after = reopen(fs)
    try:
        check_oracle(read_all(after, "t"), acked, written)
        assert append(after, 1, b"after-restart") == 1
    finally:
        abandon(after)


@pytest.mark.parametrize("op", ["write", "sync"])
def test_metadata_log_eio_fails_the_engine_once(op: str, caplog: pytest.LogCaptureFixture) -> None:
    """EIO on the metadata log: the change is refused with a StorageError, the engine refuses
    writes from then on (one ERROR line with the path and errno), reads go on, and a restart has
    every acknowledged record and every metadata change that was acknowledged."""
    caplog.set_level(logging.WARNING)
    fs = FaultyFileSystem(seed=12)
    engine = Engine(DATA_DIR, small_config(wal_shards=1), fs=fs, start_background=False)
    engine.open()
    engine.create_topic("t", 1)
    acked = {0: [b"a0", b"a1"]}
    for v in acked[0]:
        append(engine, 0, v)
    fs.fail_path(META_LOG, op, times=1)
    with pytest.raises(StorageError) as info:
        engine.create_topic("u", 1)
    assert info.value.kafka_code == ErrorCode.KAFKA_STORAGE_ERROR
    assert engine.failure is not None
    with pytest.raises(EngineFailedError):
        engine.append_records("t", 0, [(None, None, b"refused", [])])
    assert [v for _o, _k, v in read_all(engine, "t")[0]] == acked[0]
    lines = errors(caplog)
    assert len(lines) == 1, lines
    assert "/data/meta/log" in lines[0] and "Errno 5" in lines[0]
    abandon(engine)
    after = reopen(fs)
    try:
        check_oracle(read_all(after, "t"), acked, acked)
    finally:
        abandon(after)


@pytest.mark.parametrize("op", ["write", "sync"])
def test_checkpoint_eio_is_retried_and_loses_nothing(op: str, caplog: pytest.LogCaptureFixture) -> None:
    """A checkpoint is a compaction of the metadata log, which still holds everything: EIO writing
    it fails that checkpoint only (the engine keeps accepting writes; the maintenance tick goes on),
    one ERROR line says so, it is retried after a backoff, the half-written file is never read as
    a checkpoint, and one line says when it works again."""
    caplog.set_level(logging.WARNING)
    fs = FaultyFileSystem(seed=13)
    engine = Engine(DATA_DIR, small_config(wal_shards=1, meta_checkpoint_records=1), fs=fs, start_background=False)
    engine.open()
    engine.create_topic("t", 1)
    acked = {0: [b"a0"]}
    append(engine, 0, b"a0")
    engine.meta.maybe_checkpoint()
    before = list(engine.meta.checkpoints)
    fs.fail_path("/data/meta/checkpoint", op)
    engine.create_topic("u", 1)  # due again
    for _ in range(5):  # what each maintenance tick does: not raised, tried after the backoff
        assert engine.meta.maybe_checkpoint() is None
        time.sleep(0.05)
    assert 1 <= engine.meta.checkpoint_failures <= 3
    assert engine.failure is None and list(engine.meta.checkpoints) == before
    lines = errors(caplog)
    assert len(lines) == 1 and "metadata checkpoint in /data/meta failed" in lines[0] and "Errno 5" in lines[0], lines
    engine.create_topic("v", 1)  # metadata changes go on in the log
    acked[0].append(b"a1")
    append(engine, 0, b"a1")
    fs.clear_path_faults()
    wait_until(engine.meta.checkpoint_due, timeout=3)
    assert engine.meta.maybe_checkpoint() is not None and engine.meta.checkpoint_failures == 0
    assert any("metadata checkpoint in /data/meta works again" in r.getMessage() for r in caplog.records)
    abandon(engine)
    after = reopen(fs)
    try:
        assert after.topic("u").partitions == 1 and after.topic("v").partitions == 1
        check_oracle(read_all(after, "t"), acked, acked)
    finally:
        abandon(after)


@pytest.mark.parametrize("op", ["write", "sync"])
def test_segment_eio_on_seal_backs_off_and_heals(op: str, caplog: pytest.LogCaptureFixture) -> None:
    """EIO writing or fsyncing a segment (the seal's PUT to the hot store): the data stays in
    memory and in the WAL, produce and reads go on, the seal is retried with backoff (one ERROR
    line, not one per tick) and succeeds once the disk does; nothing is lost after a crash."""
    caplog.set_level(logging.DEBUG, logger="loglake.engine.seal")
    caplog.set_level(logging.WARNING)
    fs = FaultyFileSystem(seed=14)
    engine = Engine(DATA_DIR, small_config(wal_shards=1, maintenance_interval_ms=10), fs=fs)
    engine.open()
    try:
        engine.create_topic("t", 2, {"segment.ms": "1"})
        assert append(engine, 0, b"sealed") == 0
        wait_until(lambda: engine.partition_info("t", 0).sealed_end == 1)
        fs.fail_path(SEGMENTS, op)
        acked = {0: [b"sealed", b"while-failing"], 1: [b"p1"]}
        assert append(engine, 0, b"while-failing") == 1
        assert append(engine, 1, b"p1") == 0
        time.sleep(1.0)
        assert engine.partition_info("t", 0).sealed_end == 1 and engine.failure is None
        assert {p: [v for _o, _k, v in rs] for p, rs in read_all(engine, "t").items()} == acked
        seal_errors = [m for m in errors(caplog) if m.startswith("sealing t-")]
        assert 1 <= len(seal_errors) <= 2, seal_errors  # one per partition, not one per try
        assert all("Errno 5" in m for m in seal_errors)
        fs.clear_path_faults()
        wait_until(lambda: engine.partition_info("t", 0).sealed_end == 2 and engine.partition_info("t", 1).sealed_end == 1, timeout=40)
        assert [v for _o, _k, v in read_all(engine, "t")[0]] == acked[0]
    finally:
        abandon(engine)
    after = reopen(fs)
    try:
        check_oracle(read_all(after, "t"), acked, acked)
    finally:
        abandon(after)


def test_read_eio_on_one_segment_affects_only_its_readers(caplog: pytest.LogCaptureFixture) -> None:
    """pread EIO on one hot segment: reads of that segment get SegmentReadError (CORRUPT_MESSAGE on
    the wire, so consumers hear it), logged once per segment (not per read) with the file; the
    partition's other segments and other partitions are served; nothing is marked corrupt; once
    the segment reads again its readers resume."""
    caplog.set_level(logging.WARNING)
    fs = FaultyFileSystem(seed=15)
    engine = Engine(DATA_DIR, small_config(wal_shards=1), fs=fs, start_background=False)
    engine.open()
    try:
        engine.create_topic("t", 2)
        append(engine, 0, b"s0")
        engine.flush()
        append(engine, 0, b"s1")
        append(engine, 1, b"p1")
        engine.flush()
        first, second = engine.segments("t", 0)[:2]
        read_all(engine, "t")  # indexes cached, batches verified: the failure is the data read itself
        fs.fail_path(first.key, "read")
        for _ in range(20):
            with pytest.raises(SegmentReadError) as info:
                engine.read("t", 0, 0, 1 << 20)
        error = info.value
        assert error.kafka_code == ErrorCode.CORRUPT_MESSAGE and error.retriable
        assert first.key in error.path and "Errno 5" in str(error)
        assert engine.read("t", 0, second.base_offset, 1 << 20).chunks  # the next segment
        assert engine.read("t", 1, 0, 1 << 20).chunks  # another partition
        lines = [m for m in errors(caplog) if m.startswith("reading t-0")]
        assert len(lines) == 1, lines
        assert first.key in lines[0] and "Errno 5" in lines[0] and "CORRUPT_MESSAGE" in lines[0]
        assert engine.read_errors.total == 20
        assert len(engine.read_errors.readyz_lines()) == 1 and not engine.corruption.marks()
        assert engine.failure is None
        metrics, notes = health(engine)
        assert "loglake_engine_failed 0.0" in metrics and "loglake_segment_read_errors_total 20.0" in metrics
        assert "loglake_segments_failing_reads 1.0" in metrics
        assert notes == [f"read errors: t-0 segment /data/segments/{first.key}: [Errno 5] Input/output error (injected)"]
        assert append(engine, 0, b"writes-go-on") == 2
        fs.clear_path_faults()
        assert [v for _o, _k, v in read_all(engine, "t")[0]] == [b"s0", b"s1", b"writes-go-on"]
        assert engine.read_errors.readyz_lines() == []
    finally:
        abandon(engine)


def test_eio_on_an_uncached_index_is_a_read_error_too() -> None:
    """The first read of a segment loads its index (footer) first: EIO there is the same typed
    error for that segment's readers."""
    fs = FaultyFileSystem(seed=16)
    engine = Engine(DATA_DIR, small_config(wal_shards=1), fs=fs, start_background=False)
    engine.open()
    engine.create_topic("t", 1)
    append(engine, 0, b"s0")
    engine.flush()
    abandon(engine)
    fs = fs.crash()
    fs.fail_path(".seg", "read")
    after = Engine(DATA_DIR, small_config(wal_shards=1), fs=fs, start_background=False)
    after.open()
    try:
        with pytest.raises(SegmentReadError):
            after.read("t", 0, 0, 1 << 20)
        fs.clear_path_faults()
        assert [v for _o, _k, v in read_all(after, "t")[0]] == [b"s0"]
    finally:
        abandon(after)


def test_enospc_is_still_a_stall_not_a_failure() -> None:
    """The path faults default to EIO; with ENOSPC the WAL stalls and heals as before."""
    fs = FaultyFileSystem(seed=17)
    engine = Engine(DATA_DIR, small_config(wal_shards=1), fs=fs, start_background=False)
    engine.open()
    try:
        engine.create_topic("t", 1)
        append(engine, 0, b"a0")
        fs.fail_path(WAL, "sync", lambda: OSError(errno.ENOSPC, "No space left on device (injected)"), times=1)
        with pytest.raises(StorageFullError):
            engine.append_records("t", 0, [(None, None, b"x", [])]).result(timeout=10)
        wait_until(lambda: not engine.shards[0].stalled)
        assert engine.failure is None and append(engine, 0, b"a2") == 2
    finally:
        abandon(engine)


def test_the_scrubber_logs_unreadable_segments_once_and_marks_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """The scrubber meeting EIO on every segment (a failing disk, a cold store down): unreadable
    is not corrupt (nothing marked, nothing "repaired"), and one line for all of them, not one
    per segment per pass."""
    caplog.set_level(logging.WARNING)
    fs = FaultyFileSystem(seed=18)
    engine = Engine(DATA_DIR, small_config(wal_shards=1), fs=fs, start_background=False)
    engine.open()
    try:
        engine.create_topic("t", 2)
        for i in range(3):
            for p in (0, 1):
                append(engine, p, b"v%d" % i)
            engine.flush()
        assert len(engine.segments("t", 0)) == 3
        fs.fail_path(".seg", "read")
        scrubber = engine.scrubber
        assert scrubber is not None
        for _ in range(3):
            assert scrubber.run_pass() == 0
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("scrub could not read")]
        assert len(lines) == 1, lines
        assert not engine.corruption.marks() and scrubber.stats.repairs == 0
        fs.clear_path_faults()
        assert scrubber.run_pass() == 0 and scrubber.stats.segments_verified == 6
    finally:
        abandon(engine)


def test_eio_during_sendfile_makes_the_next_fetch_of_that_segment_an_error() -> None:
    """Batches verified once are served by sendfile without the engine reading them again: an EIO
    there only cuts the broker's response (the connection goes). The broker tells the reader,
    which forgets the verification, so the next fetch reads the file, fails, and answers
    CORRUPT_MESSAGE instead of the client reconnecting in a silent loop."""
    fs = FaultyFileSystem(seed=19)
    engine = Engine(DATA_DIR, small_config(wal_shards=1), fs=fs, start_background=False)
    engine.open()
    try:
        engine.create_topic("t", 1)
        append(engine, 0, b"s0")
        engine.flush()
        seg = engine.segments("t", 0)[0]
        first = engine.read("t", 0, 0, 1 << 20, file_ranges=True).chunks  # verified now
        path = first[0].path  # type: ignore[union-attr]
        fs.fail_path(seg.key, "read")
        again = engine.read("t", 0, 0, 1 << 20, file_ranges=True).chunks
        assert again and again[0].path == path  # type: ignore[union-attr]  # not read: sendfile would meet the EIO
        assert engine.report_file_range_failure(path, OSError(errno.EIO, "Input/output error (sendfile)"))
        assert not engine.report_file_range_failure("/elsewhere", OSError(errno.EIO, "x"))
        with pytest.raises(SegmentReadError):
            engine.read("t", 0, 0, 1 << 20, file_ranges=True)
        assert engine.read_errors.total >= 2
        fs.clear_path_faults()
        assert engine.read("t", 0, 0, 1 << 20, file_ranges=True).chunks
    finally:
        abandon(engine)
