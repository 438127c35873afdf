"""The flush buffer and the background merge (cluster mode, durability class `object`): one PUT
per flush whatever the partition count, byte and time triggers, acknowledgement only after the
commit callback, a failed PUT or commit failing exactly its flush, back-pressure at the memory
bound, and merges into sealed segments the segment reader verifies — over the memory, local
and moto S3 stores."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import s3kit
from loglake.cluster.flusher import FLUSH_PUT_ATTEMPTS, FlushAck, Flusher, FlushSettings
from loglake.cluster.flushobj import FlushIndex, ranges_by_partition, read_index, read_range
from loglake.cluster.merge import FlushObjectRefs, MergedSegment, MergeStats, merge_partition
from loglake.engine.txn import control_batch
from loglake.errors import (
    BackPressureTimeoutError,
    CorruptionError,
    CorruptRecordError,
    EngineClosedError,
    FlushFailedError,
    MergeConflictError,
    MetaFencedError,
    StorageError,
)
from loglake.fs.os_fs import OsFileSystem
from loglake.kafka_errors import ErrorCode
from loglake.records.batch import build_batch, set_base_offset
from loglake.records.committed import AbortedTxns
from loglake.records.decode import decode_batch
from loglake.segment import ZERO_HASH, verify_chain, verify_segment_in_store
from loglake.segment.verify import SegmentReader
from loglake.store import LocalStore, MemoryStore, ObjectStore
from loglake.store.base import BytesLike, parse_segment_key
from loglake.store.retry import RetryPolicy
from test_cluster_flushobj import batch, topic_ids, values

moto_endpoint = s3kit.moto_endpoint
s3_client = s3kit.s3_client
bucket = s3kit.bucket
fault_proxy = s3kit.fault_proxy
_proxy_server = s3kit._proxy_server

HOUR_MS = 3_600_000
#: Tests retry PUTs quickly.
FAST = RetryPolicy(max_attempts=FLUSH_PUT_ATTEMPTS, base_delay=0.001, max_delay=0.005)


class Committed:
    """A commit callback that records the indexes it was given (and can be told to fail)."""

    def __init__(self) -> None:
        self.indexes: list[FlushIndex] = []
        self.fail_next: BaseException | None = None

    def __call__(self, index: FlushIndex) -> None:
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        self.indexes.append(index)


def flusher(store: ObjectStore, commit: Committed, **settings: object) -> Flusher:
    kw: dict[str, object] = {"object_flush_ms": HOUR_MS, "put_retry": FAST}
    kw.update(settings)
    return Flusher(store, commit, cluster_id="c1", node_id=1, settings=FlushSettings(**kw))  # type: ignore[arg-type]


@pytest.fixture(params=["memory", "local", "s3"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "memory":
        yield MemoryStore()
    elif request.param == "local":
        yield LocalStore(str(tmp_path / "bucket"), OsFileSystem())
    else:
        s = s3kit.make_store(request.getfixturevalue("moto_endpoint"), request.getfixturevalue("bucket"))
        yield s
        s.close()


def store_puts(store: ObjectStore) -> int:
    if isinstance(store, MemoryStore):
        return store.calls["put"] + store.calls["put_if_absent"]  # the merge creates, the flusher puts
    return int(getattr(store, "requests", {}).get("PutObject", 0))


# ---- one PUT per flush -----------------------------------------------------------------------


@pytest.mark.parametrize("partitions", [1, 100, 1000])
def test_one_put_per_flush_whatever_the_partition_count(partitions: int) -> None:
    store, commit = MemoryStore(), Committed()
    tids = topic_ids(2)
    with flusher(store, commit) as f:
        futures = [f.append(tids[p % 2], p, batch(0, 3, f"p{p}")) for p in range(partitions)]
        futures += [f.append(tids[p % 2], p, batch(3, 2, f"p{p}")) for p in range(partitions)]
        f.flush()
        assert store.calls["put"] == 1 and f.stats.puts == 1 and f.stats.objects == 1
        assert f.stats.max_partitions == partitions
        acks = [fu.result() for fu in futures]
    (index,) = commit.indexes
    assert {a.key for a in acks} == {index.key}
    assert len(index.entries) == partitions
    assert all(e.base_offset == 0 and e.last_offset == 4 and e.batch_count == 2 for e in index.entries)


def test_puts_per_flush_over_moto(moto_endpoint: str, bucket: str) -> None:
    store, commit = s3kit.make_store(moto_endpoint, bucket), Committed()
    tids = topic_ids(1)
    with flusher(store, commit) as f:
        for round_ in range(3):
            futures = [f.append(tids[0], p, batch(round_, 1, f"p{p}")) for p in range(1000)]
            f.flush()
            assert all(fu.result().key == commit.indexes[-1].key for fu in futures)
    assert store.requests["PutObject"] == 3 and len(commit.indexes) == 3
    store.close()


def test_the_time_trigger_flushes_without_being_asked() -> None:
    store, commit = MemoryStore(), Committed()
    with flusher(store, commit, object_flush_ms=20) as f:
        ack = f.append(topic_ids(1)[0], 0, batch(0, 1, "t")).result(timeout=30)
        assert store.calls["put"] == 1 and commit.indexes[0].key == ack.key


def test_the_byte_trigger_flushes_and_caps_each_object() -> None:
    store, commit = MemoryStore(), Committed()
    one = len(batch(100, 10, "b"))  # offsets of three digits: every batch has this size
    tid = topic_ids(1)[0]
    with flusher(store, commit, object_flush_bytes=4 * one) as f:  # the time trigger is an hour away
        futures = [f.append(tid, p % 3, batch(100 + 10 * (p // 3), 10, "b")) for p in range(12)]
        for fu in futures:
            fu.result(timeout=30)
        assert f.stats.objects == 3
    for index in commit.indexes:
        assert index.index_position - 32 <= 4 * one  # an object holds at most the trigger's bytes


def test_futures_resolve_only_after_the_commit() -> None:
    store = MemoryStore()
    entered, release = threading.Event(), threading.Event()
    seen: list[FlushIndex] = []

    def slow_commit(index: FlushIndex) -> None:
        seen.append(index)
        entered.set()
        release.wait(30)

    f = Flusher(
        store, slow_commit, cluster_id="c1", node_id=1, settings=FlushSettings(object_flush_ms=HOUR_MS)
    )
    fut = f.append(topic_ids(1)[0], 0, batch(0, 2, "x"))
    threading.Thread(target=f.flush, daemon=True).start()
    assert entered.wait(30)
    assert store.calls["put"] == 1 and not fut.done()  # in the bucket, not yet committed: not acked
    release.set()
    ack = fut.result(timeout=30)
    assert isinstance(ack, FlushAck) and ack.key == seen[0].key and ack.entry.last_offset == 1
    f.close()


# ---- failures --------------------------------------------------------------------------------


def test_a_failed_put_fails_exactly_that_flush_and_the_next_works() -> None:
    any_store, commit = MemoryStore(), Committed()
    tid = topic_ids(1)[0]
    with flusher(any_store, commit) as f:
        first = [f.append(tid, p, batch(0, 1, "a")) for p in range(5)]
        any_store.fail(
            "put", StorageError("put", "x", "bucket away", retriable=True), times=FLUSH_PUT_ATTEMPTS
        )
        f.flush()
        for fu in first:
            err = fu.exception()
            assert isinstance(err, FlushFailedError) and err.retriable and err.stage == "PUT"
            assert err.kafka_code == ErrorCode.KAFKA_STORAGE_ERROR  # the store's retriable code
        assert f.stats.puts == FLUSH_PUT_ATTEMPTS and commit.indexes == []
        second = [f.append(tid, p, batch(0, 1, "b")) for p in range(5)]
        f.flush()
        assert {fu.result().key for fu in second} == {commit.indexes[0].key}
        assert f.stats.failed_flushes == 1 and f.stats.objects == 1


def test_a_put_that_fails_then_succeeds_within_the_retries_acks() -> None:
    any_store, commit = MemoryStore(), Committed()
    with flusher(any_store, commit) as f:
        any_store.fail("put", StorageError("put", "x", "blip", retriable=True), times=FLUSH_PUT_ATTEMPTS - 1)
        fut = f.append(topic_ids(1)[0], 0, batch(0, 1, "a"))
        f.flush()
        assert fut.result().key == commit.indexes[0].key and f.stats.puts == FLUSH_PUT_ATTEMPTS


def test_a_bucket_outage_through_the_fault_proxy(fault_proxy: s3kit.FaultProxy, bucket: str) -> None:
    store, commit = s3kit.make_store(fault_proxy.endpoint, bucket), Committed()
    tid = topic_ids(1)[0]
    with flusher(store, commit) as f:
        fault_proxy.bucket_gone(bucket)
        lost = [f.append(tid, p, batch(0, 2, "a")) for p in range(50)]
        f.flush()
        assert all(isinstance(fu.exception(), FlushFailedError) for fu in lost)
        fault_proxy.bucket_back(bucket)
        kept = [f.append(tid, p, batch(0, 2, "b")) for p in range(50)]
        f.flush()
        keys = {fu.result().key for fu in kept}
    assert keys == {commit.indexes[0].key} and len(commit.indexes) == 1
    index = read_index(store, commit.indexes[0].key)
    assert values(store.get_range(index.key, index.entries[0].position, index.entries[0].length)) == [
        b"b@0",
        b"b@1",
    ]
    store.close()


def test_a_failed_commit_fails_that_flush_with_the_commits_code() -> None:
    store, commit = MemoryStore(), Committed()
    tid = topic_ids(1)[0]
    with flusher(store, commit) as f:
        commit.fail_next = MetaFencedError("epoch 4 of partition 0 is no longer current")
        fenced = f.append(tid, 0, batch(0, 1, "a"))
        f.flush()
        err = fenced.exception()
        assert isinstance(err, FlushFailedError) and err.stage == "commit"
        assert err.kafka_code == ErrorCode.NOT_LEADER_OR_FOLLOWER and err.retriable
        assert f.append(tid, 1, batch(0, 1, "b")) is not None
        f.flush()
    assert len(commit.indexes) == 1 and f.stats.failed_flushes == 1
    assert store.calls["put"] == 2  # the first object stays: its commit may have landed unseen


def test_bad_input_is_refused_at_append_and_after_close() -> None:
    store, commit = MemoryStore(), Committed()
    f = flusher(store, commit)
    damaged = bytearray(batch(0, 1, "x"))
    damaged[-1] ^= 1
    with pytest.raises(CorruptRecordError):
        f.append(topic_ids(1)[0], 0, bytes(damaged))
    fut = f.append(topic_ids(1)[0], 0, batch(0, 1, "x"))
    f.close()  # flushes what is buffered
    assert fut.result().key == commit.indexes[0].key
    with pytest.raises(EngineClosedError):
        f.append(topic_ids(1)[0], 0, batch(1, 1, "x"))


# ---- back-pressure ---------------------------------------------------------------------------


class BlockingStore(MemoryStore):
    """A store whose PUTs wait until released: a slow bucket."""

    def __init__(self) -> None:
        super().__init__("blocking")
        self.release = threading.Event()
        self.entered = threading.Event()

    def put(self, key: str, parts: list[BytesLike]) -> None:  # type: ignore[override]
        self.entered.set()
        self.release.wait(60)
        super().put(key, parts)


def test_back_pressure_at_the_memory_bound() -> None:
    store, commit = BlockingStore(), Committed()
    one = len(batch(100, 5, "x"))  # offsets of three digits: every batch has this size
    tid = topic_ids(1)[0]
    f = flusher(store, commit, object_flush_bytes=2 * one, buffer_bytes_max=4 * one, append_wait_s=0.3)
    first = [f.append(tid, 0, batch(100 + 5 * i, 5, "x")) for i in range(2)]  # a flush, stuck in its PUT
    assert store.entered.wait(30)
    more = [f.append(tid, 0, batch(100 + 5 * i, 5, "x")) for i in range(2, 4)]  # the bound is now full
    assert f.buffered_bytes == 4 * one
    with pytest.raises(BackPressureTimeoutError):
        f.append(tid, 0, batch(120, 5, "x"))
    # an append that waits long enough gets in once the PUT is done
    result: list[Future[FlushAck]] = []
    waiter = threading.Thread(target=lambda: result.append(f.append(tid, 1, batch(100, 5, "y"))), daemon=True)
    f.settings = FlushSettings(
        object_flush_bytes=2 * one, object_flush_ms=HOUR_MS, buffer_bytes_max=4 * one, append_wait_s=60
    )
    waiter.start()
    store.release.set()
    waiter.join(60)
    assert result, "the waiting append never got room"
    f.flush()
    for fu in [*first, *more, *result]:
        fu.result(timeout=30)
    f.close()
    assert f.buffered_bytes == 0


# ---- merge -----------------------------------------------------------------------------------


def _flushed(store: ObjectStore, rounds: int, partitions: int) -> tuple[Flusher, Committed, list[str]]:
    commit = Committed()
    tids = topic_ids(1)
    f = flusher(store, commit)
    for r in range(rounds):
        futures = [f.append(tids[0], p, batch(3 * r, 3, f"p{p}")) for p in range(partitions)]
        f.flush()
        for fu in futures:
            fu.result()
    f.close()
    return f, commit, tids


def test_merge_writes_verified_segments_holding_exactly_the_records(any_store: ObjectStore) -> None:
    f, commit, _tids = _flushed(any_store, rounds=4, partitions=5)
    puts_before = store_puts(any_store)
    indexes = [read_index(any_store, ix.key) for ix in commit.indexes]
    stats = MergeStats()
    switched: list[MergedSegment] = []
    refs = FlushObjectRefs(grace_s=0)
    for ix in indexes:
        refs.add(ix)
    for (tid, p), ranges in sorted(ranges_by_partition(indexes).items()):
        longest = max(e.length for _k, e in ranges)
        segs = merge_partition(
            any_store,
            ranges,
            cluster_id="c1",
            topic="orders",
            prev_hash=ZERO_HASH,
            commit=switched.append,
            segment_bytes=2 * longest,  # two ranges per segment: a chain of two segments
            stats=stats,
        )
        assert len(segs) == 2
        trailers = [verify_segment_in_store(any_store, s.key) for s in segs]
        verify_chain(trailers, [s.key for s in segs])
        assert trailers[0].base_offset == 0 and trailers[-1].last_offset == 11
        got: list[bytes] = []
        for s in segs:
            assert parse_segment_key(s.key)[:4] == ("orders", tid, p, s.trailer.base_offset)
            reader = SegmentReader(any_store, s.key)
            for chunk in reader.chunks():
                got.extend(values(bytes(chunk)))
            reader.finish(None)
        assert got == [f"p{p}@{i}".encode() for i in range(12)]
        for key, e in ranges:
            released = refs.release(key, e.topic_id, e.partition)
            assert released == (p == 4)  # an object goes once its last partition is merged
    assert stats.merge_puts == 10 and stats.range_gets == 20 and len(switched) == 10
    if not isinstance(any_store, LocalStore):  # the stores that count their requests
        assert store_puts(any_store) - puts_before == 10  # the merge PUTs, apart from the flusher's
    assert f.stats.puts == 4
    assert sorted(refs.sweep(any_store)) == sorted(ix.key for ix in indexes)
    assert all(any_store.head(ix.key) is None for ix in indexes)


def test_merge_refuses_a_corrupt_range_before_writing() -> None:
    store = MemoryStore()
    _f, commit, _tids = _flushed(store, rounds=2, partitions=2)
    index = read_index(store, commit.indexes[1].key)
    raw = bytearray(store.raw(index.key))
    raw[index.entries[0].position + 70] ^= 4
    store.poke(index.key, bytes(raw))
    ranges = ranges_by_partition([read_index(store, ix.key) for ix in commit.indexes])
    store.calls.clear()
    with pytest.raises(CorruptionError) as info:
        merge_partition(
            store, ranges[(index.entries[0].topic_id, 0)], cluster_id="c1", topic="t", prev_hash=ZERO_HASH
        )
    assert info.value.path == index.key and store.calls["put"] == 0


def test_merge_needs_consecutive_ranges_of_one_partition() -> None:
    store = MemoryStore()
    _f, commit, _tids = _flushed(store, rounds=3, partitions=2)
    ranges = ranges_by_partition([read_index(store, ix.key) for ix in commit.indexes])
    (a, b) = sorted(ranges)
    with pytest.raises(ValueError):
        merge_partition(store, [ranges[a][0], ranges[a][2]], cluster_id="c1", topic="t", prev_hash=ZERO_HASH)
    with pytest.raises(ValueError):
        merge_partition(store, [ranges[a][0], ranges[b][1]], cluster_id="c1", topic="t", prev_hash=ZERO_HASH)


def test_merged_segment_continues_an_existing_chain() -> None:
    store = MemoryStore()
    _f, commit, _tids = _flushed(store, rounds=2, partitions=1)
    ranges = ranges_by_partition([read_index(store, ix.key) for ix in commit.indexes])
    (only,) = ranges.values()
    first = merge_partition(store, only[:1], cluster_id="c1", topic="t", prev_hash=ZERO_HASH)
    second = merge_partition(
        store, only[1:], cluster_id="c1", topic="t", prev_hash=first[-1].trailer.link_hash
    )
    verify_chain([first[0].trailer, second[0].trailer], [first[0].key, second[0].key])
    _h, records = decode_batch(bytes(next(SegmentReader(store, second[0].key).chunks())))
    assert records[0].value == b"p0@3"


def test_refs_keep_an_object_while_any_range_is_referenced() -> None:
    now = [0.0]
    refs = FlushObjectRefs(grace_s=10, clock=lambda: now[0])
    store = MemoryStore()
    _flushed(store, rounds=1, partitions=3)
    index = read_index(store, store.list("")[0])
    refs.add(index)
    assert not refs.release(index.key, index.entries[0].topic_id, 0)
    assert refs.referenced(index.key) and refs.deletable() == []
    assert not refs.release(index.key, index.entries[1].topic_id, 1)
    assert refs.release(index.key, index.entries[2].topic_id, 2)
    assert refs.deletable() == []  # inside the grace period for readers that looked it up before
    now[0] = 11
    assert refs.sweep(store) == [index.key] and store.head(index.key) is None


def test_merge_of_transactional_batches_carries_the_transaction_index() -> None:
    """An aborted transaction flushed through shared objects ends in a version-3 segment whose
    transaction index read_committed readers use, as a sealed single-node segment would."""
    store, commit = MemoryStore(), Committed()
    tid = topic_ids(1)[0]
    txn = build_batch(
        ((1_000 + i, None, b"t%d" % i, ()) for i in range(3)),
        base_offset=0,
        producer_id=7,
        producer_epoch=0,
        base_sequence=0,
        is_transactional=True,
    )
    marker = control_batch(7, 0, False, 0, 2_000)
    set_base_offset(marker, 0, 3)
    with flusher(store, commit) as f:
        f.append(tid, 0, txn)
        f.flush()
        f.append(tid, 0, bytes(marker))
        f.append(tid, 0, batch(4, 2, "after"))
        f.flush()
    ranges = ranges_by_partition([read_index(store, ix.key) for ix in commit.indexes])[(tid, 0)]
    (seg,) = merge_partition(store, ranges, cluster_id="c1", topic="t", prev_hash=ZERO_HASH)
    trailer = verify_segment_in_store(store, seg.key)
    assert trailer.txn_index and trailer.aborted_txns == ((7, 0, 3),)
    assert (trailer.base_offset, trailer.last_offset, trailer.record_count) == (0, 5, 6)
    # a transaction that began before the segment begins, for the segment, at its base
    (again,) = merge_partition(store, ranges[1:], cluster_id="c1", topic="t2", prev_hash=ZERO_HASH)
    assert again.trailer.aborted_txns == ((7, 3, 3),)


def test_a_merged_abort_covers_only_its_own_transaction() -> None:
    """Producer 7 commits offsets 0-1 (marker 2), then aborts 3-4 (marker 5), in one segment:
    the segment's entry starts at 3, so a read_committed reader keeps the committed pair."""
    store, commit = MemoryStore(), Committed()
    tid = topic_ids(1)[0]

    def txn(base: int, tag: str) -> bytes:
        return build_batch(((1_000 + i, None, b"%s%d" % (tag.encode(), i), ()) for i in range(2)),
                           base_offset=base, producer_id=7, producer_epoch=0, base_sequence=base,
                           is_transactional=True)  # fmt: skip

    with flusher(store, commit) as f:
        for base, data, commit_it in ((0, txn(0, "c"), True), (3, txn(3, "a"), False)):
            f.append(tid, 0, data)
            marker = control_batch(7, 0, commit_it, 0, 2_000)
            set_base_offset(marker, 0, base + 2)
            f.append(tid, 0, bytes(marker))
        f.flush()
    ranges = ranges_by_partition([read_index(store, ix.key) for ix in commit.indexes])[(tid, 0)]
    (seg,) = merge_partition(store, ranges, cluster_id="c1", topic="t", prev_hash=ZERO_HASH)
    assert verify_segment_in_store(store, seg.key).aborted_txns == ((7, 3, 5),)
    aborted = AbortedTxns(seg.trailer.aborted_txns)
    assert [o for o in range(5) if aborted.covers(7, o)] == [3, 4]
    # a segment merged before this fix said (7, 0, 5); the metadata's entry (7, 3, 5) beside it wins
    assert [o for o in range(5) if AbortedTxns([(7, 0, 5), (7, 3, 5)]).covers(7, o)] == [3, 4]


def test_a_retried_merge_keeps_its_segment_and_a_different_one_is_a_conflict() -> None:
    store = MemoryStore()
    _f, commit, _tids = _flushed(store, rounds=3, partitions=1)
    (ranges,) = ranges_by_partition([read_index(store, ix.key) for ix in commit.indexes]).values()
    stats = MergeStats()
    (first,) = merge_partition(store, ranges, cluster_id="c1", topic="t", prev_hash=ZERO_HASH, stats=stats)
    (again,) = merge_partition(store, ranges, cluster_id="c1", topic="t", prev_hash=ZERO_HASH, stats=stats)
    assert stats.merge_puts == 1 and again.trailer == first.trailer  # the retry wrote nothing
    with pytest.raises(MergeConflictError, match="another hash chain"):
        merge_partition(store, ranges[:2], cluster_id="c1", topic="t", prev_hash=ZERO_HASH)
    verify_segment_in_store(store, first.key)  # still the first merge's segment


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, 30), st.integers(1, 5)), min_size=1, max_size=120),
    st.integers(200, 5_000),
)
def test_every_append_lands_once_in_the_objects_its_future_names(
    appends: list[tuple[int, int]], flush_bytes: int
) -> None:
    """Whatever the mix of partitions and the byte trigger: each future names an object whose
    range for its partition covers its batch, and the committed ranges hold every appended
    record exactly once, in offset order."""
    store, commit = MemoryStore(), Committed()
    tid = topic_ids(1)[0]
    nxt: dict[int, int] = {}
    futures: list[tuple[int, int, int, Future[FlushAck]]] = []
    with flusher(store, commit, object_flush_bytes=flush_bytes) as f:
        for p, count in appends:
            base = nxt.get(p, 0)
            futures.append((p, base, base + count - 1, f.append(tid, p, batch(base, count, f"p{p}"))))
            nxt[p] = base + count
    for p, first, last, fut in futures:
        ack = fut.result()
        assert ack.entry.partition == p and ack.entry.base_offset <= first and last <= ack.entry.last_offset
    got: dict[int, list[bytes]] = {}
    for index in commit.indexes:
        for e in read_index(store, index.key).entries:
            got.setdefault(e.partition, []).extend(values(read_range(store, index.key, e)))
    assert got == {p: [f"p{p}@{i}".encode() for i in range(n)] for p, n in nxt.items()}
    assert f.stats.puts == len(commit.indexes) == store.calls["put"]
