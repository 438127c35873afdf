"""The metadata log: records, checkpoints, recovery, corruption, migration, and the lock order.

Crash-point sweep over a metadata-heavy workload, with the oracle extended for metadata:
  * a committed offset acknowledged (its future resolved) is never lost or moved backwards;
  * recover(recover(x)) == recover(x);
  * checkpoint + log == the state the same records build from nothing.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from loglake.broker.groups.meta_store import MetaGroupLog
from loglake.engine import Engine
from loglake.errors import CorruptionError
from loglake.fs.faulty import FaultyFileSystem, SimulatedCrash
from loglake.meta.checkpoint import capture, decode_checkpoint, encode_checkpoint
from loglake.meta.log import LocalMetaStore, checkpoint_name
from loglake.meta.records import Cluster, MetaRecord, RecordKind, encode_record
from loglake.meta.segments import SegmentRef, SegmentTable
from loglake.meta.snapshot import SnapshotStore
from loglake.meta.state import MetaState
from loglake.wal.frame import FrameError, decode_frame, encode_frame

from enginekit import DATA_DIR, abandon, read_all, small_config

META_DIR = f"{DATA_DIR}/meta"


def image(state: MetaState) -> Any:
    """A comparable form of a state (the checkpoint's content)."""
    img = capture(state)
    return img.seq, img.doc, b"".join(img.tables)


def replay(records: list[tuple[int, str, dict[str, Any]]], upto: int, state: MetaState) -> MetaState:
    state.seq = 0
    state.replaying = True
    for seq, kind, body in records:
        if seq > upto:
            break
        state.apply(kind, body)
        state.seq = seq
    state.replaying = False
    return state


# ---- records and tables -----------------------------------------------------------------------


def test_segment_table_packs_and_finds() -> None:
    table = SegmentTable("loglake-c/t-00/0/")
    for base in (0, 10, 30):
        table.append(SegmentRef(base, base + 9, table.key_for(base), 100 + base, 5, 10, bytes(32), bytes([base]) * 32, 7))
    assert [s.base_offset for s in table] == [0, 10, 30]
    assert table.find(15) == 1 and table.find(25) == 2 and table.find(40) is None  # 25: a compaction gap
    assert table.total_bytes() == 100 + 110 + 130
    assert table.set_tier(10, "cold") and table[1].tier == "cold"
    assert table.indexes_in_tier("hot") == [0, 2] and table.count_in_tier("cold") == 1
    assert [s.base_offset for s in table.drop_below(20)] == [0, 10]
    assert table.total_bytes() == 130 and table[0].key == "loglake-c/t-00/0/00000000000000000030.seg"
    with pytest.raises(ValueError):
        table.append(SegmentRef(35, 36, "", 1, 1, 1, bytes(32), bytes(32), 1))


def test_unknown_record_kind_is_refused() -> None:
    with pytest.raises(ValueError):
        encode_record("no_such_kind", {})
    with pytest.raises(ValueError):
        MetaState().apply("no_such_kind", {})


# ---- engine-level behaviour -------------------------------------------------------------------


def test_a_commit_costs_one_small_record(tmp_path: Any) -> None:
    fs = FaultyFileSystem(seed=3)
    engine = Engine(DATA_DIR, small_config(), fs=fs, start_background=False)
    engine.open()
    try:
        engine.create_topic("t", 4)
        for p in range(4):
            engine.append_records("t", p, [(1, None, b"x", [])]).result()
        engine.flush()
        before = fs.mutating_calls
        MetaGroupLog(engine.meta).commit_group_offsets("g", [("t", 0, 1, -1, "", 5)]).result()
        # One record: a vectored write and an fdatasync of the metadata log, nothing else.
        assert fs.mutating_calls - before <= 2
        assert MetaGroupLog(engine.meta).group_metadata()["g"]["offsets"][("t", 0)] == [1, -1, "", 5]
    finally:
        engine.close()


def test_restart_replays_records_after_the_checkpoint(tmp_path: Any) -> None:
    fs = FaultyFileSystem(seed=4)
    engine = Engine(DATA_DIR, small_config(meta_checkpoint_records=5), fs=fs, start_background=False)
    engine.open()
    engine.create_topic("t", 2, {"segment.records": "2"})
    for i in range(12):
        engine.append_records("t", i % 2, [(1, None, f"v{i}".encode(), [])]).result()
        engine.flush()
        MetaGroupLog(engine.meta).commit_group_offsets("g", [("t", i % 2, i, -1, "", i)]).result()
        engine.meta.maybe_checkpoint()
    before = image(engine.meta.state)
    abandon(engine)
    engine = Engine(DATA_DIR, small_config(meta_checkpoint_records=5), fs=fs.crash(), start_background=False)
    report = engine.open()
    try:
        assert report.snapshot_seq is not None and report.meta_records_replayed > 0
        assert image(engine.meta.state) == before
        assert len(engine.meta.checkpoints) == 2  # the newest and one to fall back to
        assert {p: [v for _o, _k, v in recs] for p, recs in read_all(engine, "t").items()} == {
            p: [f"v{i}".encode() for i in range(p, 12, 2)] for p in range(2)
        }
    finally:
        engine.close()


def _engine_with_history(fs: FaultyFileSystem) -> tuple[Engine, list[tuple[int, str, dict[str, Any]]]]:
    engine = Engine(DATA_DIR, small_config(meta_checkpoint_records=4), fs=fs, start_background=False)
    records: list[tuple[int, str, dict[str, Any]]] = []
    engine.open()
    engine.create_topic("t", 1, {"segment.records": "1"})
    for i in range(6):
        engine.append_records("t", 0, [(1, None, f"v{i}".encode(), [])]).result()
        engine.flush()
        MetaGroupLog(engine.meta).commit_group_offsets("g", [("t", 0, i, -1, "", i)]).result()
        engine.meta.maybe_checkpoint()
    return engine, records


def test_every_bit_flip_of_a_checkpoint_is_detected() -> None:
    state = MetaState("c1")
    state.apply("topic_created", {"name": "t", "id": "ab" * 16, "partitions": 1, "config": {}, "created_ms": 1})
    state.apply(
        "segment_published",
        {"id": "ab" * 16, "p": 0, "seg": [0, 4, 100, 5, 5, "00" * 32, "11" * 32, 1, "hot"], "producers": []},
    )
    state.apply("offset_commit", {"g": "g", "rows": [["t", 0, 5, -1, "", 1]]})
    data = b"".join(encode_checkpoint(capture(state)))
    decode_checkpoint(data, path="ck")
    for bit in range(len(data) * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(CorruptionError):
            decode_checkpoint(bytes(flipped), path="ck")


def test_every_bit_flip_of_a_metadata_record_frame_is_detected() -> None:
    raw = encode_record("offset_commit", {"g": "group", "rows": [["topic", 3, 12345, 7, "meta", 99]]})
    frame = b"".join(bytes(part) for part in encode_frame(41, 40, bytes(16), 0, 41, 42, raw))
    decoded = decode_frame(memoryview(frame), 0)
    assert decoded is not None and bytes(decoded.payload) == raw
    for bit in range(len(frame) * 8):
        flipped = bytearray(frame)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(FrameError):
            if decode_frame(memoryview(bytes(flipped)), 0) is None:
                raise FrameError(0, "reads as a clean end")  # a zeroed length: also refused by recovery's scan


def test_every_bit_flip_of_a_log_record_is_detected_by_recovery() -> None:
    fs = FaultyFileSystem(seed=5)
    engine = Engine(DATA_DIR, small_config(), fs=fs, start_background=False)
    engine.open()
    engine.create_topic("t", 1)
    MetaGroupLog(engine.meta).commit_group_offsets("g", [("t", 0, 9, -1, "meta", 1)]).result()
    MetaGroupLog(engine.meta).commit_group_offsets("g", [("t", 0, 10, -1, "meta", 2)]).result()  # a later group commit
    engine.close()
    log_dir = f"{META_DIR}/log/shard-00"
    name = sorted(fs.listdir(log_dir))[-1]
    original = fs.read_file(f"{log_dir}/{name}")
    # Flip bits of the second-to-last record (the first offset commit): durable data followed by
    # a later group commit, so damage there is corruption, never a torn tail.
    tree = fs.durable_tree()
    start = len(original) // 2
    for bit in range(start * 8, len(original) * 8 - 200 * 8, 97):
        crashed = fs.crash()
        flipped = bytearray(original)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with crashed.open(f"{log_dir}/{name}", write=True) as f:
            f.pwrite(0, bytes(flipped))
        engine = Engine(DATA_DIR, small_config(), fs=crashed, start_background=False)
        try:
            engine.open()
        except CorruptionError:
            continue
        # A flip the log could not see would have to leave the state unchanged.
        try:
            assert MetaGroupLog(engine.meta).group_metadata()["g"]["offsets"][("t", 0)][0] == 10, f"bit {bit} changed the state silently"
        finally:
            engine.close()
    assert tree  # the durable tree was there to flip


def test_damaged_newest_checkpoint_falls_back_and_loses_nothing() -> None:
    fs = FaultyFileSystem(seed=6)
    engine, _ = _engine_with_history(fs)
    before = image(engine.meta.state)
    newest = engine.meta.checkpoints[-1]
    engine.close()
    crashed = fs.crash()
    path = f"{META_DIR}/{checkpoint_name(newest)}"
    data = bytearray(crashed.read_file(path))
    data[40] ^= 0xFF
    with crashed.open(path, write=True) as f:
        f.pwrite(0, bytes(data))
    engine = Engine(DATA_DIR, small_config(meta_checkpoint_records=4), fs=crashed, start_background=False)
    report = engine.open()
    try:
        assert report.meta_checkpoints_damaged == [path]
        assert report.snapshot_seq is not None and report.snapshot_seq < newest
        assert image(engine.meta.state)[1:] == before[1:]
    finally:
        engine.close()


def test_a_version_1_snapshot_is_migrated(tmp_path: Any) -> None:
    fs = FaultyFileSystem(seed=7)
    payload = {
        "version": 1,
        "cluster_id": "oldcluster",
        "topics": {"t": {"id": "cd" * 16, "partitions": 1, "config": {"retention.ms": "-1"}, "created_ms": 5}},
        "partitions": {f"{'cd' * 16}/0": {"log_start": 0, "sealed_end": 0, "chain": "00" * 32, "segments": [], "producers": {}}},
        "extra": {"next_producer_id": 1234, "groups": {"version": 1, "groups": {"g": [["t", 0, 0, -1, "m", 9]]}}},
    }
    SnapshotStore(fs, META_DIR).write(payload)
    engine = Engine(DATA_DIR, small_config(), fs=fs, start_background=False)
    report = engine.open()
    try:
        assert report.meta_migrated_from is not None
        assert engine.cluster_id == "oldcluster"
        assert engine.topic("t").config.retention_ms == -1
        assert engine.allocate_producer_id() == 1234
        assert MetaGroupLog(engine.meta).group_metadata()["g"]["offsets"][("t", 0)] == [0, -1, "m", 9]
        assert not any(n.startswith("snapshot-") for n in fs.listdir(META_DIR))
    finally:
        engine.close()


def test_torn_tail_of_the_metadata_log_is_truncated_and_reported() -> None:
    fs = FaultyFileSystem(seed=8)
    store = LocalMetaStore(fs, META_DIR)
    store.open()
    store.append(Cluster("c")).result()
    store.close()
    log_dir = f"{META_DIR}/log/shard-00"
    path = f"{log_dir}/{sorted(fs.listdir(log_dir))[-1]}"
    with fs.open(path, write=True) as f:
        f.pwrite(f.size(), b"\x40\x00\x00\x00garbage-of-a-torn-write")
    store = LocalMetaStore(fs, META_DIR)
    state = store.open()
    try:
        assert state.cluster_id == "c" and store.report.log_bytes_truncated > 0
    finally:
        store.close()


# ---- the lock order (issue: CreateTopics overlapping a background metadata write) -------------


def test_create_topic_holding_the_catalog_lock_cannot_wedge_metadata_writers() -> None:
    """Thread A is pinned inside create_topic with the catalog lock held while thread B runs every
    metadata writer the maintenance thread and the broker use (checkpoint, retention, DeleteRecords,
    an offset commit, a seal). With the old two-lock design B waited for A's lock and A for B's."""
    fs = FaultyFileSystem(seed=10)
    engine = Engine(DATA_DIR, small_config(), fs=fs, start_background=False)
    engine.open()
    engine.create_topic("old", 1, {"retention.ms": "1"})
    engine.append_records("old", 0, [(1, None, b"x", [])]).result()
    a_inside = threading.Event()
    b_done = threading.Event()
    original = engine.meta.append

    def pinned_append(record: MetaRecord) -> Any:
        fut = original(record)
        if record.kind is RecordKind.TOPIC_CREATED:
            a_inside.set()
            b_done.wait(20)  # hold the catalog lock until B is through
        return fut

    engine.meta.append = pinned_append  # type: ignore[method-assign]
    errors: list[BaseException] = []

    def a() -> None:
        try:
            engine.create_topic("new", 2)
        except BaseException as exc:
            errors.append(exc)

    def b() -> None:
        try:
            assert a_inside.wait(20)
            engine.meta.checkpoint()
            engine.flush()
            engine.apply_retention()
            engine.delete_records("old", 0, -1)
            MetaGroupLog(engine.meta).commit_group_offsets("g", [("old", 0, 1, -1, "", 1)]).result()
            engine.allocate_producer_id  # noqa: B018 - takes the catalog lock: not called while A holds it
        except BaseException as exc:
            errors.append(exc)
        finally:
            b_done.set()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert not any(t.is_alive() for t in threads), "a metadata writer is stuck behind the catalog lock"
        assert not errors, errors
        assert engine.has_topic("new") and engine.partition_info("old", 0).log_start_offset == 1
    finally:
        engine.meta.append = original  # type: ignore[method-assign]
        engine.close()


# ---- crash-point sweep ------------------------------------------------------------------------


class Run:
    def __init__(self) -> None:
        self.acked_commits: dict[int, int] = {}  # partition -> highest acknowledged committed offset
        self.acked_seq = -1
        self.records: list[tuple[int, str, dict[str, Any]]] = []


def meta_workload(fs: FaultyFileSystem, run: Run) -> None:
    engine = Engine(DATA_DIR, small_config(meta_checkpoint_records=6), fs=fs, start_background=False)
    try:
        engine.open()
        engine.meta.watch(lambda seq, kind, body, _raw: run.records.append((seq, kind, body)))
        engine.create_topic("t", 2, {"segment.records": "2", "retention.ms": "-1"})
        for i in range(10):
            p = i % 2
            engine.append_records("t", p, [(1_000 + i, None, f"v{i}".encode(), [])]).result()
            if i % 3 == 2:
                engine.flush()
            seq = MetaGroupLog(engine.meta).commit_group_offsets("g", [("t", p, i, -1, "", i)]).result()
            run.acked_commits[p] = i
            run.acked_seq = max(run.acked_seq, seq)
            if i == 5:
                engine.delete_records("t", 0, 2)
            engine.meta.maybe_checkpoint()
        engine.close()
    except (SimulatedCrash, Exception):
        abandon(engine)


def count_meta_calls() -> int:
    fs = FaultyFileSystem(seed=1)
    run = Run()
    meta_workload(fs, run)
    assert len(run.acked_commits) == 2
    return fs.mutating_calls


META_CALLS = count_meta_calls()


def check_meta(k: int, torn: bool) -> None:
    fs = FaultyFileSystem(seed=k, crash_after=k)
    run = Run()
    meta_workload(fs, run)
    after = fs.crash(torn=torn)
    engine = Engine(DATA_DIR, small_config(meta_checkpoint_records=6), fs=after, start_background=False)
    try:
        engine.open()
    except CorruptionError as exc:  # pragma: no cover - a failure of the test subject
        raise AssertionError(f"k={k} torn={torn}: recovery refused: {exc}") from exc
    try:
        state = engine.meta.state
        recovered_seq = state.seq
        offsets = MetaGroupLog(engine.meta).group_metadata().get("g", {"offsets": {}})["offsets"]
        for p, acked in run.acked_commits.items():
            got = offsets.get(("t", p))
            assert got is not None and got[0] >= acked, f"k={k} torn={torn}: commit of partition {p} lost or moved back"
        assert recovered_seq >= run.acked_seq, f"k={k}: recovered up to record {recovered_seq}, {run.acked_seq} was acked"
        # checkpoint + log == the records applied to the data directory's first state (its
        # cluster record, seq 0, written before the workload watched)
        if run.records:
            assert run.records[0][0] == 1
            fresh = replay(run.records, recovered_seq, MetaState(state.cluster_id))
            assert image(fresh) == image(state), f"k={k} torn={torn}: checkpoint + log differ from the records"
        first = image(state)
        data = read_all(engine, "t") if engine.has_topic("t") else {}
    finally:
        abandon(engine)
    again = after.crash()
    engine2 = Engine(DATA_DIR, small_config(meta_checkpoint_records=6), fs=again, start_background=False)
    engine2.open()
    try:
        assert image(engine2.meta.state)[1:] == first[1:], f"k={k} torn={torn}: second recovery differs"
        assert (read_all(engine2, "t") if engine2.has_topic("t") else {}) == data
    finally:
        abandon(engine2)


def test_meta_workload_makes_enough_calls() -> None:
    assert META_CALLS > 60


@pytest.mark.parametrize("torn", [False, True], ids=["clean", "torn"])
def test_metadata_crash_at_every_mutating_call(torn: bool) -> None:
    for k in range(1, META_CALLS + 1):
        check_meta(k, torn)


def test_many_crashed_restarts_do_not_pile_up_metadata_log_files() -> None:
    """Every start begins a new preallocated log file and a crash leaves it untrimmed; a broker
    restarted often while changing little must not read ever more files at each open."""
    from loglake.meta.log import META_LOG_FILES_AT_OPEN_MAX

    fs = FaultyFileSystem(seed=12)
    for i in range(3 * META_LOG_FILES_AT_OPEN_MAX):
        engine = Engine(DATA_DIR, small_config(), fs=fs, start_background=False)
        engine.open()
        if i == 0:
            engine.create_topic("t", 1)
        MetaGroupLog(engine.meta).commit_group_offsets("g", [("t", 0, i, -1, "", i)]).result()
        abandon(engine)
        fs = fs.crash()
        files = fs.listdir(f"{META_DIR}/log/shard-00")
        assert len(files) <= META_LOG_FILES_AT_OPEN_MAX + 2, f"restart {i}: {len(files)} metadata log files"
    engine = Engine(DATA_DIR, small_config(), fs=fs, start_background=False)
    engine.open()
    try:
        assert MetaGroupLog(engine.meta).group_metadata()["g"]["offsets"][("t", 0)][0] == 3 * META_LOG_FILES_AT_OPEN_MAX - 1
        assert len(engine.meta.checkpoints) == 2
    finally:
        engine.close()
