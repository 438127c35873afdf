"""Engine-side descriptions for the admin APIs (bytes per tier, idempotent producers), the leader
epoch bump of a disaster recovery from the cold store, and reading consumer subscriptions for
OffsetDelete."""

from __future__ import annotations

import struct
from pathlib import Path

import loglake
from loglake.broker.groups.offset_delete import ALL_TOPICS, _topics_of
from loglake.records import build_batch


def test_tier_bytes_follow_relocation_and_producers_are_described(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'bucket'}"
    with loglake.open(str(tmp_path / "a"), cold_store=url) as log:
        engine = log.engine
        engine.create_topic("t", 1, {"segment.bytes": "4096", "hot.retain.segments": "0", "retention.ms": "-1"})
        for seq in range(0, 40, 4):  # an idempotent producer, 4 records a batch
            batch = build_batch([(1_000 + seq + i, None, b"v" * 300, []) for i in range(4)],
                                producer_id=77, producer_epoch=2, base_sequence=seq)
            engine.append_batch("t", 0, batch).result(timeout=10)
        engine.append_batch("t", 0, build_batch([(5, None, b"plain", [])])).result(timeout=10)
        # 4 KiB segments roll while the batches go in, and a rolled segment is sealed and relocated
        # in the background: how much is cold by now is the machine's timing. The open segment
        # holding the last batch is hot until the flush seals it.
        before = engine.tier_bytes("t", 0)
        assert before.hot > 0 and before.offset_lag == 0
        log.flush()
        assert engine.wait_relocations()
        after = engine.tier_bytes("t", 0)
        assert after.cold > before.cold and after.hot == 0  # everything sealed and relocated
        assert after.cold == sum(s.size for s in engine.segments("t", 0))
        [desc] = engine.producers("t", 0)  # read back from a cold segment
        assert (desc.producer_id, desc.producer_epoch, desc.last_sequence, desc.last_timestamp) == (77, 2, 39, 1_039)


def test_restore_from_the_cold_store_starts_a_new_epoch_everywhere(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'bucket'}"
    with loglake.open(str(tmp_path / "a"), cold_store=url) as log:
        log.create_topic("t", 2, {"segment.bytes": "4096", "hot.retain.segments": "0", "retention.ms": "-1"})
        for i in range(30):
            log.produce("t", b"x" * 300, partition=0, timestamp=1_000 + i)
        log.flush()
        assert log.engine.wait_relocations()
        log.flush()
        end = log.engine.partition_info("t", 0).high_watermark
    with loglake.open(str(tmp_path / "b"), cold_store=url) as log:
        report = log.recovery_report
        assert report is not None and report.restored_from == url
        assert sorted(report.leader_epochs_bumped) == ["t-0", "t-1"]
        assert [log.engine.leader_epoch("t", p) for p in range(2)] == [1, 1]
        assert log.engine.epoch_end_offset("t", 0, 0) == (0, end)  # nothing lost: epoch 0 ends at the log end


def subscription(version: int, topics: list[str]) -> bytes:
    """A ConsumerProtocolSubscription as Kafka's clients write it (v0..v3)."""
    out = struct.pack(">hi", version, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    out += struct.pack(">i", -1)  # user data: null
    if version >= 1:
        out += struct.pack(">i", 0)  # owned partitions
    if version >= 2:
        out += struct.pack(">i", 5)  # generation id
    if version >= 3:
        out += struct.pack(">h", -1)  # rack id: null
    return out


def test_subscription_topics_of_every_version() -> None:
    for version in range(4):
        assert _topics_of(subscription(version, ["a", "bb"])) == {"a", "bb"}
    assert _topics_of(b"\x00") is None
    assert _topics_of(struct.pack(">hi", 0, 3) + struct.pack(">h", 9) + b"ab") is None
    assert _topics_of(struct.pack(">hi", 0, -2)) is None
    assert "*" in ALL_TOPICS
