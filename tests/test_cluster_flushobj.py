"""Flush objects (cluster mode, durability class `object`): the format's round trip with many
partitions, one ranged read for the index and one per partition, and corrupt objects refused
with a CorruptionError naming the key — over the memory, local and moto S3 stores."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import s3kit
from loglake.cluster.flushobj import (
    FLUSH_TAIL_READ_BYTES,
    FOOTER_SIZE,
    HEADER_SIZE,
    INDEX_ENTRY_SIZE,
    FlushIndex,
    build_flush_object,
    flush_object_key,
    flush_prefix,
    iter_batches,
    new_session,
    read_index,
    read_range,
    verify_flush_object,
)
from loglake.errors import CorruptionError, CorruptRecordError, InvalidRecordError
from loglake.fs.os_fs import OsFileSystem
from loglake.records.batch import build_batch
from loglake.records.decode import decode_batch
from loglake.store import LocalStore, MemoryStore, ObjectStore
from loglake.store.base import InvalidObjectKeyError, parse_segment_key

moto_endpoint = s3kit.moto_endpoint
s3_client = s3kit.s3_client
bucket = s3kit.bucket


# ---- helpers (test_cluster_flusher.py uses them too) ------------------------------------------


def topic_ids(n: int, seed: int = 0) -> list[str]:
    rnd = random.Random(seed)
    return [uuid.UUID(int=rnd.getrandbits(128)).hex for _ in range(n)]


def batch(base: int, count: int, tag: str, ts: int = 1_700_000_000_000) -> bytes:
    """A real Kafka v2 batch of `count` records whose values name `tag` and the offset."""
    return build_batch(
        ((ts + i, f"k{i}".encode(), f"{tag}@{base + i}".encode(), ()) for i in range(count)), base_offset=base
    )


def values(data: bytes) -> list[bytes]:
    out: list[bytes] = []
    for view in iter_batches(data):
        _h, records = decode_batch(bytes(view))
        out.extend(r.value or b"" for r in records)
    return out


def workload(
    partitions: int, batches_per: int, seed: int = 0
) -> tuple[list[tuple[str, int, bytes]], dict[tuple[str, int], list[bytes]]]:
    """Interleaved batches of `partitions` partitions over 3 topics, and the values per partition."""
    rnd = random.Random(seed)
    tids = topic_ids(3, seed)
    next_offset: dict[tuple[str, int], int] = {}
    expect: dict[tuple[str, int], list[bytes]] = {}
    out: list[tuple[str, int, bytes]] = []
    keys = [(tids[i % 3], i // 3) for i in range(partitions)]
    for _ in range(batches_per):
        rnd.shuffle(keys)
        for k in keys:
            base = next_offset.get(k, rnd.randint(0, 1000))
            count = rnd.randint(1, 4)
            tag = f"{k[0][:6]}-{k[1]}"
            out.append((k[0], k[1], batch(base, count, tag)))
            expect.setdefault(k, []).extend(f"{tag}@{base + i}".encode() for i in range(count))
            next_offset[k] = base + count
    return out, expect


@pytest.fixture(params=["memory", "local", "s3"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "memory":
        yield MemoryStore()
    elif request.param == "local":
        yield LocalStore(str(tmp_path / "bucket"), OsFileSystem())
    else:
        endpoint = request.getfixturevalue("moto_endpoint")
        s = s3kit.make_store(endpoint, request.getfixturevalue("bucket"), "p")
        yield s
        s.close()


KEY = flush_object_key("c1", 3, new_session(), 7)


# ---- round trip ------------------------------------------------------------------------------


def test_round_trip_many_partitions_in_a_store(any_store: ObjectStore) -> None:
    batches, expect = workload(300, 3)
    data, built = build_flush_object(batches, node_id=3, seq=7, created_ms=1)
    any_store.put(KEY, [data])
    index = read_index(any_store, KEY)
    assert index.entries == built.entries and index.key == KEY and index.size == len(data)
    assert len(index.entries) == 300
    for e in index.entries:
        got = values(read_range(any_store, KEY, e))
        assert got == expect[(e.topic_id, e.partition)]
        assert e.last_offset - e.base_offset + 1 == e.record_count == len(got)
    assert verify_flush_object(data, KEY).entries == built.entries


def test_index_is_one_ranged_get_and_a_partition_is_one_more(moto_endpoint: str, bucket: str) -> None:
    store = s3kit.make_store(moto_endpoint, bucket)
    batches, expect = workload(1000, 1)
    data, built = build_flush_object(batches)
    assert len(built.entries) * INDEX_ENTRY_SIZE + FOOTER_SIZE < FLUSH_TAIL_READ_BYTES
    store.put(KEY, [data])
    before = store.requests["GetObject"]
    index = read_index(store, KEY)
    assert store.requests["GetObject"] - before == 1
    e = index.entries[500]
    assert values(read_range(store, KEY, e)) == expect[(e.topic_id, e.partition)]
    assert store.requests["GetObject"] - before == 2
    store.close()


def test_index_bigger_than_the_tail_read_costs_one_more_read_or_none_when_its_length_is_known() -> None:
    store = MemoryStore()
    batches, _ = workload(3500, 1)
    data, built = build_flush_object(batches)
    assert len(built.entries) * INDEX_ENTRY_SIZE > FLUSH_TAIL_READ_BYTES
    store.put(KEY, [data])
    store.calls.clear()
    assert read_index(store, KEY).entries == built.entries
    assert store.calls["get_range"] == 2  # MemoryStore's tail is head + range, plus the rest of the index
    store.calls.clear()
    idx = read_index(store, KEY, size=len(data), index_length=len(built.entries) * INDEX_ENTRY_SIZE)
    assert idx.entries == built.entries and store.calls["get_range"] == 1 and store.calls["head"] == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 40), st.integers(1, 6), st.integers(0, 2**40)),
        min_size=1,
        max_size=80,
    ),
    st.randoms(use_true_random=False),
)
def test_round_trip_property(spec: list[tuple[int, int, int, int]], rnd: random.Random) -> None:
    tids = topic_ids(6, 1)
    nxt: dict[tuple[str, int], int] = {}
    expect: dict[tuple[str, int], list[bytes]] = {}
    batches = []
    for t, p, count, start in spec:
        k = (tids[t], p)
        base = nxt.setdefault(k, start)
        batches.append((k[0], p, batch(base, count, f"{t}-{p}")))
        expect.setdefault(k, []).extend(f"{t}-{p}@{base + i}".encode() for i in range(count))
        nxt[k] = base + count
    data, built = build_flush_object(batches, node_id=rnd.randint(0, 99), seq=rnd.randint(0, 10**9))
    index = verify_flush_object(data, KEY)
    assert index.entries == built.entries
    assert sorted(expect) == [(e.topic_id, e.partition) for e in index.entries]
    store = MemoryStore()
    store.put(KEY, [data])
    for e in read_index(store, KEY).entries:
        assert values(read_range(store, KEY, e)) == expect[(e.topic_id, e.partition)]
        assert index.find(e.topic_id, e.partition) == e


# ---- keys ------------------------------------------------------------------------------------


def test_keys_of_two_writers_never_collide_and_are_no_segment_keys() -> None:
    a, b = new_session(), new_session()
    assert flush_object_key("c", 1, a, 5) != flush_object_key("c", 1, b, 5)
    assert flush_object_key("c", 1, a, 5) != flush_object_key("c", 2, a, 5)
    key = flush_object_key("c", 1, a, 5, "pre/fix")
    assert key.startswith(flush_prefix("c", "pre/fix")) and key.startswith("pre/fix/loglake-c/flush/1/")
    with pytest.raises(InvalidObjectKeyError):
        parse_segment_key(key)  # tools that walk segments skip flush objects
    with pytest.raises(InvalidObjectKeyError):
        flush_object_key("c", 1, "not-a-session", 5)
    with pytest.raises(InvalidObjectKeyError):
        flush_object_key("c", -1, a, 5)


def test_bad_input_is_a_typed_error() -> None:
    tid = topic_ids(1)[0]
    with pytest.raises(InvalidRecordError):
        build_flush_object([("nothex", 0, batch(0, 1, "x"))])
    with pytest.raises(InvalidRecordError):
        build_flush_object([(tid, -1, batch(0, 1, "x"))])
    damaged = bytearray(batch(0, 2, "x"))
    damaged[-1] ^= 1
    with pytest.raises(CorruptRecordError):
        build_flush_object([(tid, 0, bytes(damaged))])
    with pytest.raises(ValueError, match="dense"):
        build_flush_object([(tid, 0, batch(0, 2, "x")), (tid, 0, batch(5, 1, "x"))])


# ---- corruption ------------------------------------------------------------------------------


def _flush_object() -> tuple[bytes, FlushIndex]:
    batches, _ = workload(12, 2, seed=5)
    return build_flush_object(batches, node_id=2, seq=9, created_ms=123)


def _region(data: bytes, index: FlushIndex, name: str) -> range:
    size = len(data)
    return {
        "header": range(0, HEADER_SIZE),
        "data": range(HEADER_SIZE, index.index_position),
        "index": range(index.index_position, size - FOOTER_SIZE),
        "footer": range(size - FOOTER_SIZE, size),
    }[name]


@pytest.mark.parametrize("region", ["header", "data", "index", "footer"])
def test_every_sampled_bit_flip_is_refused(region: str) -> None:
    data, index = _flush_object()
    rnd = random.Random(region)
    where = _region(data, index, region)
    positions = list(where) if len(where) <= 200 else rnd.sample(list(where), 200)
    for pos in positions:
        bad = bytearray(data)
        bad[pos] ^= 1 << rnd.randrange(8)
        with pytest.raises(CorruptionError) as info:
            verify_flush_object(bytes(bad), KEY)
        assert KEY in str(info.value)


@pytest.mark.parametrize("region", ["data", "index", "footer"])
def test_a_reader_through_the_store_never_returns_flipped_bytes(any_store: ObjectStore, region: str) -> None:
    data, index = _flush_object()
    rnd = random.Random(7)
    where = _region(data, index, region)
    for pos in rnd.sample(list(where), 5):
        bad = bytearray(data)
        bad[pos] ^= 0x10
        any_store.put(KEY, [bytes(bad)])
        with pytest.raises(CorruptionError) as info:
            idx = read_index(any_store, KEY)
            for e in idx.entries:  # a flip in the data shows when its range is read
                read_range(any_store, KEY, e)
        assert info.value.path == KEY


def test_truncated_or_extended_objects_are_refused(any_store: ObjectStore) -> None:
    data, index = _flush_object()
    for cut in sorted({1, 2, FOOTER_SIZE - 1, FOOTER_SIZE, FOOTER_SIZE + 7, len(data) // 2, len(data) - 1}):
        with pytest.raises(CorruptionError, match=r"flush object|footer|index"):
            verify_flush_object(data[:-cut], KEY)
        any_store.put(KEY, [data[:-cut]])
        with pytest.raises(CorruptionError):
            read_index(any_store, KEY)
    with pytest.raises(CorruptionError):
        verify_flush_object(data + b"\0", KEY)
    # a reader that knows the size from the metadata notices a shorter object
    any_store.put(KEY, [data[:-10]])
    with pytest.raises(CorruptionError, match="shorter"):
        read_index(any_store, KEY, size=len(data))
    # and a range read past a truncated end is refused, not returned short
    any_store.put(KEY, [data[: index.entries[-1].end - 3]])
    with pytest.raises(CorruptionError):
        read_range(any_store, KEY, index.entries[-1])


def test_random_bytes_are_not_a_flush_object() -> None:
    for junk in (b"", b"x" * 10, random.Random(1).randbytes(5000)):
        with pytest.raises(CorruptionError):
            verify_flush_object(junk, KEY)


def test_the_index_must_tile_the_data() -> None:
    """An index written wrong (not merely damaged: its SHA-256 and the footer CRC match) is
    refused too, since the checksums only say the index is the one written."""
    import hashlib
    import struct

    import crc32c

    from loglake.cluster import flushobj as fo

    data, index = _flush_object()
    raw = bytearray(data)
    at = index.index_position + INDEX_ENTRY_SIZE  # second entry: shift its position by one
    pos_field = at + 16 + 4 + 4 + 8 + 8
    struct.pack_into("<Q", raw, pos_field, struct.unpack_from("<Q", raw, pos_field)[0] + 1)
    idx_bytes = bytes(raw[index.index_position : len(raw) - FOOTER_SIZE])
    foot = len(raw) - FOOTER_SIZE
    raw[foot + 16 : foot + 48] = hashlib.sha256(idx_bytes).digest()
    struct.pack_into("<I", raw, foot + fo.FOOTER_CRC_OFFSET, crc32c.crc32c(bytes(raw[foot : foot + 48])))
    with pytest.raises(CorruptionError, match="does not continue the data section"):
        verify_flush_object(bytes(raw), KEY)
