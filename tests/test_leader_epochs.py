"""Leader epochs in the engine and the metadata: stamping, the history, when recovery bumps it,
checkpoints (old ones open at epoch 0), and Kafka's OffsetForLeaderEpoch lookup rule."""

from __future__ import annotations

from pathlib import Path

from loglake.engine import Engine, EngineConfig
from loglake.engine.epochs import end_offset_for
from loglake.fs.faulty import FaultyFileSystem
from loglake.meta.checkpoint import capture, decode_checkpoint, encode_checkpoint
from loglake.meta.segments import SegmentTable
from loglake.meta.state import LEADER_EPOCHS_MAX, MetaState, PartitionMeta
from loglake.records import build_batch, peek_header

from enginekit import DATA_DIR, abandon, small_config


def append(engine: Engine, topic: str, values: list[bytes]) -> int:
    return engine.append_batch(topic, 0, build_batch([(1, None, v, []) for v in values])).result(timeout=10).base_offset


def epochs_of(engine: Engine, topic: str) -> list[int]:
    """partition_leader_epoch of every batch of partition 0, in offset order."""
    out = []
    offset = 0
    while offset < engine.partition_info(topic, 0).high_watermark:
        data = b"".join(bytes(c) for c in engine.read(topic, 0, offset, 1 << 20).chunks)  # type: ignore[arg-type]
        pos = 0
        while pos < len(data):
            h = peek_header(data, pos)
            out.append(int.from_bytes(data[pos + 12 : pos + 16], "big", signed=True))
            offset = h.base_offset + h.last_offset_delta + 1
            pos += h.size
    return out


def pm_with(history: list[list[int]]) -> PartitionMeta:
    pm = PartitionMeta(b"\0" * 16, 0, SegmentTable("k/"))
    for epoch, start in history:
        pm.note_leader_epoch(epoch, start)
    return pm


def test_lookup_follows_kafkas_rule() -> None:
    fresh = PartitionMeta(b"\0" * 16, 0, SegmentTable("k/"))
    assert end_offset_for(fresh, 10, 0) == (0, 10)
    assert end_offset_for(fresh, 10, 1) == (-1, -1)  # newer than the current epoch
    pm = pm_with([[1, 50], [3, 80]])  # implicit [0, 0] first
    assert pm.epoch_history() == [[0, 0], [1, 50], [3, 80]]
    assert end_offset_for(pm, 99, 3) == (3, 99)
    assert end_offset_for(pm, 99, 2) == (1, 80)  # the largest epoch <= 2 and the next one's start
    assert end_offset_for(pm, 99, 0) == (0, 50)
    assert end_offset_for(pm, 99, -1) == (-1, -1)
    # A bump that truncates drops the epochs whose start is past the new start.
    pm.note_leader_epoch(4, 60)
    assert pm.epoch_history() == [[0, 0], [1, 50], [4, 60]]
    assert end_offset_for(pm, 60, 3) == (1, 60)
    # An epoch older than every kept entry: itself, ended where the oldest kept one starts.
    cut = pm_with([[5, 0]])
    assert end_offset_for(cut, 7, 2) == (2, 0)


def test_history_is_bounded() -> None:
    pm = pm_with([[e, e * 10] for e in range(1, LEADER_EPOCHS_MAX + 20)])
    assert len(pm.leader_epochs) == LEADER_EPOCHS_MAX
    assert pm.leader_epochs[-1] == [LEADER_EPOCHS_MAX + 19, (LEADER_EPOCHS_MAX + 19) * 10]


def test_batches_carry_the_epoch_and_bumps_survive_reopen_and_checkpoints(tmp_path: Path) -> None:
    with Engine(str(tmp_path), EngineConfig()) as engine:
        engine.create_topic("t", 1)
        append(engine, "t", [b"a", b"b"])
        assert engine.partition_info("t", 0).leader_epoch == 0
        assert engine.bump_leader_epoch("t", 0, "test: an operator accepted a loss") == 1
        append(engine, "t", [b"c"])
        assert epochs_of(engine, "t") == [0, 1]
        assert engine.epoch_end_offset("t", 0, 0) == (0, 2)
        assert engine.epoch_end_offset("t", 0, 1) == (1, 3)
    with Engine(str(tmp_path), EngineConfig()) as engine:  # replayed from the metadata log
        assert engine.recovery_report is not None and engine.recovery_report.clean_shutdown
        assert engine.recovery_report.leader_epochs_bumped == []
        assert engine.partition_info("t", 0).leader_epoch == 1
        assert epochs_of(engine, "t") == [0, 1]  # sealed segments keep the stamps
        engine.checkpoint_metadata()
    with Engine(str(tmp_path), EngineConfig()) as engine:  # from the checkpoint
        assert engine.epoch_end_offset("t", 0, 0) == (0, 2)
        assert engine.partition_info("t", 0).leader_epoch == 1


def test_checkpoint_without_history_opens_at_epoch_zero() -> None:
    state = MetaState("c")
    state.apply("topic_created", {"name": "t", "id": "00" * 16, "partitions": 1, "config": {}, "created_ms": 0})
    image = capture(state)
    for part in image.doc["partitions"]:
        del part["leader_epochs"]  # as written before leader epochs existed
    back = decode_checkpoint(b"".join(encode_checkpoint(image)), path="ck")
    pm = back.partition(b"\0" * 16, 0)
    assert pm.leader_epoch == 0 and pm.epoch_history() == [[0, 0]]
    state.apply("leader_epoch", {"id": "00" * 16, "p": 0, "epoch": 1, "start": 0, "reason": "t"})
    again = decode_checkpoint(b"".join(encode_checkpoint(capture(state))), path="ck")
    assert again.partition(b"\0" * 16, 0).epoch_history() == [[1, 0]]


def test_unclean_stop_bumps_only_topics_that_show_data_before_fsync() -> None:
    fs = FaultyFileSystem(seed=7)
    engine = Engine(DATA_DIR, small_config(), fs=fs, start_background=False)
    engine.open()
    for cls in ("fsync", "disk", "ephemeral"):
        engine.create_topic(cls, 1, {"durability": cls})
        append(engine, cls, [cls.encode(), b"x"])
    for shard in engine.shards:
        shard.sync()
    abandon(engine)
    after = Engine(DATA_DIR, small_config(), fs=fs.crash(), start_background=False)
    after.open()
    try:
        report = after.recovery_report
        assert report is not None and not report.clean_shutdown
        assert sorted(report.leader_epochs_bumped) == ["disk-0", "ephemeral-0"]
        assert after.partition_info("fsync", 0).leader_epoch == 0
        # ephemeral lost both records: a consumer at 2 in epoch 0 learns that epoch 0 ended at 0
        assert after.partition_info("ephemeral", 0).leader_epoch == 1
        assert after.epoch_end_offset("ephemeral", 0, 0) == (0, 0)
        # disk kept them (synced): epoch 0 ends at the log end, no consumer position is past it
        assert after.epoch_end_offset("disk", 0, 0) == (0, 2)
    finally:
        abandon(after)
