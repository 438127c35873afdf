"""The cluster-partition records (loglake.meta.cluster) applied to MetaState directly: what every
store decides alike when a record's turn comes — stale epochs, gaps, swept objects, merges that
do not match — and that a checkpoint carries all of it."""

from __future__ import annotations

from typing import Any

import pytest

from loglake.meta.checkpoint import capture, decode_checkpoint, encode_checkpoint
from loglake.meta.cluster import RANGES_PER_PARTITION_MAX
from loglake.meta.state import MetaState

T = "ab" * 16


def rng(epoch: int, base: int, last: int, p: int = 0) -> list[Any]:
    return [T, p, epoch, base, last, 32, 100 * (last - base + 1), last - base + 1, 5, 7, 1]


def led(epoch: int = 1) -> MetaState:
    s = MetaState("c")
    s.apply("plog_leader", {"id": T, "p": 0, "epoch": epoch, "leader": 1})
    return s


def test_a_commit_must_carry_the_current_epoch_and_continue_the_end() -> None:
    s = led()
    s.apply("plog_commit", {"key": "k1", "ranges": [rng(1, 0, 4)]})
    with pytest.raises(ValueError, match="does not continue"):
        s.apply("plog_commit", {"key": "k2", "ranges": [rng(1, 6, 7)]})  # a gap
    with pytest.raises(ValueError, match="does not continue"):
        s.apply("plog_commit", {"key": "k2", "ranges": [rng(1, 3, 7)]})  # an overlap
    s.apply("plog_leader", {"id": T, "p": 0, "epoch": 2, "leader": 2})
    with pytest.raises(ValueError, match="epoch"):
        s.apply("plog_commit", {"key": "k2", "ranges": [rng(1, 5, 7)]})  # the old leader, fenced
    with pytest.raises(ValueError, match="not above"):
        s.apply("plog_leader", {"id": T, "p": 0, "epoch": 2, "leader": 1})  # a lost bump race
    plog = s.plogs.part(bytes.fromhex(T), 0)
    assert (plog.epoch, plog.leader, plog.end, len(plog.ranges)) == (2, 2, 5, 1)


def test_a_commit_is_all_or_nothing() -> None:
    s = led()
    s.apply("plog_leader", {"id": T, "p": 1, "epoch": 1, "leader": 1})
    with pytest.raises(ValueError):
        s.apply("plog_commit", {"key": "k1", "ranges": [rng(1, 0, 4), rng(1, 3, 4, p=1)]})
    assert s.plogs.part(bytes.fromhex(T), 0).end == 0 and not s.plogs.objects


def test_merge_frees_objects_and_sweep_condemns_orphans() -> None:
    s = led()
    s.apply("plog_leader", {"id": T, "p": 1, "epoch": 1, "leader": 1})
    s.apply("plog_commit", {"key": "k1", "ranges": [rng(1, 0, 4), rng(1, 0, 1, p=1)]})
    s.apply("plog_commit", {"key": "k2", "ranges": [rng(1, 5, 9)]})
    seg = ["s0", 0, 9, 900, 800, 3, "00" * 32, 10, 5]
    with pytest.raises(ValueError, match="first 1 ranges"):
        s.apply("plog_merged", {"id": T, "p": 0, "epoch": 1, "ms": 10, "n": 1, "seg": seg})
    with pytest.raises(ValueError, match="epoch"):
        s.apply("plog_merged", {"id": T, "p": 0, "epoch": 0, "ms": 10, "n": 2, "seg": seg})
    s.apply("plog_merged", {"id": T, "p": 0, "epoch": 1, "ms": 10, "n": 2, "seg": seg})
    assert s.plogs.free == {"k2": 10}  # k1 still holds partition 1's range
    with pytest.raises(ValueError, match="still reference"):
        s.apply("plog_swept", {"keys": ["k2", "k1"]})
    s.apply("plog_swept", {"keys": ["k2", "orphan"]})
    assert s.plogs.free == {} and list(s.plogs.condemned) == ["orphan"]
    with pytest.raises(ValueError, match="swept"):  # a commit landing after its object was swept
        s.apply("plog_commit", {"key": "orphan", "ranges": [rng(1, 2, 3, p=1)]})
    image = capture(s)
    again = capture(decode_checkpoint(b"".join(encode_checkpoint(image)), path="ck"))
    assert again.doc["plogs"] == image.doc["plogs"]
    restored = decode_checkpoint(b"".join(encode_checkpoint(image)), path="ck")
    assert restored.plogs.objects == s.plogs.objects


def test_unmerged_ranges_are_bounded_per_partition() -> None:
    s = led()
    plog = s.plogs.part(bytes.fromhex(T), 0)
    for i in range(RANGES_PER_PARTITION_MAX):
        s.apply("plog_commit", {"key": f"k{i}", "ranges": [rng(1, i, i)]})
    with pytest.raises(ValueError, match="merge first"):
        s.apply("plog_commit", {"key": "one-more", "ranges": [rng(1, plog.end, plog.end)]})


def test_a_raised_log_start_drops_what_lies_wholly_below_and_a_stale_epoch_is_refused() -> None:
    s = led()
    s.apply("plog_leader", {"id": T, "p": 1, "epoch": 1, "leader": 1})
    s.apply("plog_commit", {"key": "k1", "ranges": [rng(1, 0, 4), rng(1, 0, 1, p=1)]})
    s.apply("plog_commit", {"key": "k2", "ranges": [rng(1, 5, 9)]})
    s.apply("plog_merged", {"id": T, "p": 0, "epoch": 1, "ms": 10, "n": 1, "seg": ["s0", 0, 4, 900, 800, 3, "00" * 32, 5, 5]})
    s.apply("plog_commit", {"key": "k3", "ranges": [rng(1, 10, 14)]})
    plog = s.plogs.part(bytes.fromhex(T), 0)
    assert plog.log_start == 0
    with pytest.raises(ValueError, match="outside"):  # past the committed end
        s.apply("plog_start", {"id": T, "p": 0, "epoch": 1, "ms": 20, "start": 16})
    s.apply("plog_leader", {"id": T, "p": 0, "epoch": 2, "leader": 2})
    with pytest.raises(ValueError, match="epoch"):  # a deposed leader's raise: nothing moves
        s.apply("plog_start", {"id": T, "p": 0, "epoch": 1, "ms": 20, "start": 7})
    assert (plog.log_start, len(plog.segments), len(plog.ranges)) == (0, 1, 2)
    s.apply("plog_start", {"id": T, "p": 0, "epoch": 2, "ms": 20, "start": 7})
    # the segment 0..4 is wholly below: dropped for the sweep; the range 5..9 holds 7: kept
    assert (plog.start, plog.log_start, [x.key for x in plog.segments], [r.key for r in plog.ranges]) == (
        7, 7, [], ["k2", "k3"]
    )
    assert s.plogs.dropped == {"s0": 20} and s.plogs.free == {}  # k1: partition 1 still holds it
    with pytest.raises(ValueError, match="outside"):  # below the start: never lowered
        s.apply("plog_start", {"id": T, "p": 0, "epoch": 2, "ms": 30, "start": 6})
    s.apply("plog_start", {"id": T, "p": 0, "epoch": 2, "ms": 30, "start": 15})  # the end: all goes
    assert (plog.log_start, plog.segments, plog.ranges) == (15, [], [])
    assert s.plogs.free == {"k2": 30, "k3": 30}
    image = capture(s)
    restored = decode_checkpoint(b"".join(encode_checkpoint(image)), path="ck")
    assert restored.plogs.part(bytes.fromhex(T), 0).log_start == 15
    assert restored.plogs.part(bytes.fromhex(T), 1).start == 0
    assert capture(restored).doc["plogs"] == image.doc["plogs"]
    s.apply("plog_swept", {"keys": ["s0", "k2", "k3"]})  # nothing of them is referenced any more
    assert s.plogs.dropped == {} and s.plogs.free == {}


def test_a_checkpoint_without_log_starts_still_loads() -> None:
    """Checkpoints before `plog_start` carry seven fields per partition (no start)."""
    s = led()
    s.apply("plog_commit", {"key": "k1", "ranges": [rng(1, 0, 4)]})
    image = capture(s)
    assert [len(part) for part in image.doc["plogs"]["parts"]] == [7]  # unchanged bytes when no start
    restored = decode_checkpoint(b"".join(encode_checkpoint(image)), path="ck")
    pl = restored.plogs.part(bytes.fromhex(T), 0)
    assert (pl.start, pl.log_start, pl.end) == (0, 0, 5)


def topic_led(rf: int = 1) -> MetaState:
    s = MetaState("c")
    body: dict[str, Any] = {"name": "t", "id": T, "partitions": 1, "config": {}, "created_ms": 1}
    if rf != 1:
        body["rf"] = rf
    s.apply("topic_created", body)
    return s


def test_each_leadership_enters_the_epoch_history_at_the_committed_end() -> None:
    """A `plog_leader` starts its epoch at the committed end as it applies (every commit is
    guarded by its epoch, so the new leader's first range starts there); an epoch that wrote
    nothing is replaced by the next, as in Kafka's epoch cache. A checkpoint carries the history."""
    from loglake.engine.epochs import end_offset_in, epoch_at

    s = topic_led()
    s.apply("plog_leader", {"id": T, "p": 0, "epoch": 1, "leader": 1})
    s.apply("plog_commit", {"key": "k1", "ranges": [rng(1, 0, 9)]})
    s.apply("plog_leader", {"id": T, "p": 0, "epoch": 2, "leader": 2})
    s.apply("plog_leader", {"id": T, "p": 0, "epoch": 3, "leader": 3})  # epoch 2 wrote nothing
    s.apply("plog_commit", {"key": "k2", "ranges": [rng(3, 10, 14)]})
    s.apply("plog_leader", {"id": T, "p": 0, "epoch": 4, "leader": 1})
    pm = s.partition(bytes.fromhex(T), 0)
    assert pm.leader_epochs == [[1, 0], [3, 10], [4, 15]] and pm.leader_epoch == 4
    back = decode_checkpoint(b"".join(bytes(x) for x in encode_checkpoint(capture(s))), path="ckpt")
    assert back.partition(bytes.fromhex(T), 0).leader_epochs == pm.leader_epochs
    history, end = pm.epoch_history(), 15
    assert end_offset_in(history, end, 1) == (1, 10)  # epoch 1 ends where epoch 3 began
    assert end_offset_in(history, end, 2) == (1, 10)  # no offsets of its own: the largest epoch below
    assert end_offset_in(history, end, 3) == (3, 15)
    assert end_offset_in(history, end, 4) == (4, 15)  # the current epoch: the committed end
    assert end_offset_in(history, end, 5) == (-1, -1)
    assert end_offset_in(history, end, 0) == (0, 0)  # older than the history: its first start
    assert [epoch_at(history, o) for o in (0, 9, 10, 14, 15)] == [1, 1, 3, 3, 4]


def test_a_topic_remembers_its_replication_factor() -> None:
    """`rf` is written only when not 1 (a single node's records keep their bytes); the state and a
    checkpoint keep it."""
    from loglake.meta.records import TopicCreated

    assert "rf" not in TopicCreated("t", T, 1, {}, 1).body()
    assert TopicCreated("t", T, 1, {}, 1, replication_factor=3).body()["rf"] == 3
    s = topic_led(rf=3)
    assert s.topics[bytes.fromhex(T)].replication_factor == 3
    back = decode_checkpoint(b"".join(bytes(x) for x in encode_checkpoint(capture(s))), path="ckpt")
    assert back.topics[bytes.fromhex(T)].replication_factor == 3
    assert topic_led().topics[bytes.fromhex(T)].replication_factor == 1
    with pytest.raises(ValueError, match="replication factor"):
        topic_led(rf=0)


def test_a_compaction_switch_must_replace_segments_in_place_with_the_same_offsets_and_chain() -> None:
    s = led()
    s.apply("plog_commit", {"key": "k1", "ranges": [rng(1, 0, 4)]})
    s.apply("plog_commit", {"key": "k2", "ranges": [rng(1, 5, 9)]})
    for n, (key, base, last, link) in enumerate((("s0", 0, 4, "01"), ("s5", 5, 9, "02"))):
        seg = [key, base, last, 900, 800, 3, link * 32, 5, 5]
        s.apply("plog_merged", {"id": T, "p": 0, "epoch": 1, "ms": 10 + n, "n": 1, "seg": seg})
    plog = s.plogs.part(bytes.fromhex(T), 0)
    good = [["s0-g1001", 0, 9, 500, 400, 4, "02" * 32, 2, 5, 1001]]

    def compacted(old: list[str], segs: list[list[Any]], epoch: int = 1) -> None:
        body = {"id": T, "p": 0, "epoch": epoch, "ms": 20, "old": old, "segs": segs, "clean": [10, 20, -1]}
        s.apply("plog_compacted", body)

    for old, segs, match in (
        (["s5"], good, "cover"),  # other offsets than the replaced ones
        (["s5", "s0"], good, "not in place"),  # not the partition's order
        (["s0", "s5"], [[*good[0][:6], "03" * 32, *good[0][7:]]], "chain"),  # another link hash
        (["s0", "s5"], [[*good[0][:9], 0]], "generation"),  # a rewritten segment has one
        (["s0", "s5"], [["s0", 0, 9, 500, 400, 4, "02" * 32, 2, 5, 1]], "already"),  # a key in use
    ):
        with pytest.raises(ValueError, match=match):
            compacted(old, segs)
    s.apply("plog_leader", {"id": T, "p": 0, "epoch": 2, "leader": 2})
    with pytest.raises(ValueError, match="epoch"):  # a deposed leader's switch: nothing moves
        compacted(["s0", "s5"], good)
    assert [x.key for x in plog.segments] == ["s0", "s5"] and s.plogs.dropped == {}
    compacted(["s0", "s5"], [[*good[0][:9], 2001]], epoch=2)
    assert [(x.key, x.gen) for x in plog.segments] == [("s0-g1001", 2001)]
    assert s.plogs.dropped == {"s0": 20, "s5": 20}
    image = capture(s)
    restored = decode_checkpoint(b"".join(encode_checkpoint(image)), path="ck")
    assert restored.plogs.part(bytes.fromhex(T), 0).segments == plog.segments
    assert capture(restored).doc["plogs"] == image.doc["plogs"]
