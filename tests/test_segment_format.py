"""Segment object format: round trips, lookups, and corruption detection."""

from __future__ import annotations

import hashlib
import itertools
import pickle
import random
import struct
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loglake.errors import CorruptionError, CorruptRecordError
from loglake.fs.os_fs import OsFileSystem
from loglake.records.batch import peek_header
from loglake.segment import (
    HEADER_SIZE,
    INDEX_ENTRY_SIZE,
    TAIL_READ_BYTES,
    TRAILER_SIZE,
    ZERO_HASH,
    SegmentIndex,
    SegmentTrailer,
    SegmentWriter,
    describe_segment,
    parse_tail,
    read_tail,
    verify_chain,
    verify_segment,
    verify_segment_in_store,
)
from loglake.segment.format import KAFKA_HEADER, TRAILER, TRAILER_CRC_OFFSET
from loglake.store import LocalStore, MemoryStore, ObjectNotFoundError, ObjectStore

# ---- helpers ----------------------------------------------------------------------------------


def make_batch(base_offset: int, count: int, ts: int = 1_000, payload: int = 20, seed: int = 0) -> bytes:
    """A structurally valid Kafka v2 batch (record bodies are random bytes; only the header and
    CRC matter to the segment format)."""
    body = random.Random(seed).randbytes(payload)
    batch_length = KAFKA_HEADER.size - 12 + len(body)
    header = KAFKA_HEADER.pack(
        base_offset, batch_length, 0, 2, 0, 0, count - 1, ts, ts + count - 1, -1, -1, -1, count
    )
    buf = bytearray(header + body)
    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


def make_batches(
    base: int, n: int, seed: int = 0, ts_start: int = 1_000, shuffle_ts: bool = False
) -> list[bytes]:
    rnd = random.Random(seed)
    out = []
    off = base
    for i in range(n):
        count = rnd.randint(1, 5)
        ts = ts_start + (rnd.randint(-50, 50) if shuffle_ts else i * 10)
        out.append(make_batch(off, count, ts=ts, payload=rnd.randint(0, 200), seed=seed * 1_000_003 + i))
        off += count
    return out


def build_segment(
    base: int, batches: list[bytes], prev_hash: bytes = ZERO_HASH, created_ms: int = 1_700_000_000_000
) -> tuple[bytes, SegmentTrailer, SegmentIndex]:
    w = SegmentWriter(base, prev_hash, created_ms)
    for b in batches:
        w.add_batch(b)
    parts, trailer, index = w.finish()
    data = b"".join(parts)
    assert len(data) == trailer.size
    return data, trailer, index


def resign(data: bytes, recompute_chain: bool = False) -> bytes:
    """What an attacker who knows the format does after editing batch bytes: recompute every
    batch CRC, the data CRC, the trailer CRC (and optionally the chain hash)."""
    buf = bytearray(data)
    size = len(buf)
    t = list(TRAILER.unpack_from(buf, size - TRAILER_SIZE))
    index_position, prev_hash = t[5], t[8]
    pos = HEADER_SIZE
    while pos < index_position:
        length = struct.unpack_from(">i", buf, pos + 8)[0] + 12
        struct.pack_into(">I", buf, pos + 17, crc32c.crc32c(bytes(buf[pos + 21 : pos + length])))
        pos += length
    t[7] = crc32c.crc32c(bytes(buf[:index_position]))
    if recompute_chain:
        t[9] = hashlib.sha256(prev_hash + bytes(buf[HEADER_SIZE:index_position])).digest()
    buf[size - TRAILER_SIZE :] = TRAILER.pack(*t)
    t[10] = crc32c.crc32c(bytes(buf[index_position : size - TRAILER_SIZE + TRAILER_CRC_OFFSET]))
    buf[size - TRAILER_SIZE :] = TRAILER.pack(*t)
    return bytes(buf)


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    s: ObjectStore = LocalStore(str(tmp_path), OsFileSystem()) if request.param == "local" else MemoryStore()
    yield s
    s.close()


SMALL_KEY = "loglake-c/t-id/0/00000000000000000005.seg"


@pytest.fixture(scope="module")
def small_segment() -> bytes:
    data, _, _ = build_segment(
        5, [make_batch(5, 2, payload=3), make_batch(7, 1, payload=0), make_batch(8, 3, payload=5)]
    )
    return data


# ---- round trip -------------------------------------------------------------------------------


def test_sizes() -> None:
    assert HEADER_SIZE == 32
    assert INDEX_ENTRY_SIZE == 40
    assert TRAILER_SIZE == 132


def test_round_trip_through_store(store: ObjectStore) -> None:
    batches = make_batches(1000, 400, seed=1)
    w = SegmentWriter(1000, ZERO_HASH, 42)
    for b in batches:
        w.add_batch(memoryview(b))
    expected_size = w.size
    parts, trailer, index = w.finish()
    assert trailer.size == expected_size
    assert any(isinstance(p, memoryview) for p in parts)  # batches are not copied
    key = "loglake-c/t-id/0/00000000000000001000.seg"
    store.put(key, parts)
    assert store.head(key) == trailer.size

    t2, i2 = read_tail(store, key)
    assert t2 == trailer
    assert i2.raw == index.raw
    assert read_tail(store, key, size=trailer.size)[0] == trailer
    assert trailer.base_offset == 1000
    assert trailer.created_ms == 42
    assert trailer.entry_count == len(index) == 400
    counts = [struct.unpack_from(">i", b, 57)[0] for b in batches]
    assert trailer.record_count == sum(counts)
    assert trailer.last_offset == 1000 + sum(counts) - 1
    assert trailer.prev_hash == ZERO_HASH
    assert trailer.chain_hash == hashlib.sha256(ZERO_HASH + b"".join(batches)).digest()

    data = store.get(key)
    assert data[HEADER_SIZE : trailer.index_position] == b"".join(batches)
    assert verify_segment(data, key) == trailer
    for chunk in (4096, 61, 1000, 1 << 20):
        seen: list[int] = []
        assert (
            verify_segment_in_store(store, key, chunk_bytes=max(chunk, HEADER_SIZE), progress=seen.append)
            == trailer
        )
        assert seen[-1] == trailer.size
        assert seen == sorted(seen)

    pos = HEADER_SIZE
    off = 1000
    for i, b in enumerate(batches):
        e = index.entry(i)
        assert (e.base_offset, e.position, e.length) == (off, pos, len(b))
        assert data[e.position : e.end] == b
        pos += len(b)
        off += counts[i]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_kafka_python_batches_round_trip() -> None:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    batches = []
    base = 0
    for n in (1, 3, 10):
        builder = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=0,
            is_transactional=False,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            batch_size=1 << 20,
        )
        for i in range(n):
            builder.append(i, timestamp=5_000 + base + i, key=b"k", value=b"v" * i, headers=[])
        buf = builder.build()
        struct.pack_into(">q", buf, 0, base)  # base offset is outside the CRC
        batches.append(bytes(buf))
        base += n
    data, trailer, index = build_segment(0, batches)
    assert verify_segment(data, "k") == trailer
    assert trailer.last_offset == 13
    assert trailer.record_count == 14
    assert trailer.max_timestamp == 5_000 + 4 + 9
    assert index.find_offset(13) == 2


# ---- index lookups ----------------------------------------------------------------------------


def test_find_offset_boundaries() -> None:
    batches = make_batches(50, 60, seed=2)
    _, trailer, index = build_segment(50, batches)
    for i in range(len(index)):
        e = index.entry(i)
        assert index.find_offset(e.base_offset) == i
        assert index.find_offset(e.last_offset) == i
        assert index.find_offset((e.base_offset + e.last_offset) // 2) == i
    assert index.find_offset(49) == 0
    assert index.find_offset(0) == 0
    assert index.find_offset(trailer.last_offset + 1) is None
    assert index.base_offset == 50
    assert index.last_offset == trailer.last_offset
    assert index.entry(-1) == index.entry(len(index) - 1)
    clone = pickle.loads(pickle.dumps(index))
    assert clone.raw == index.raw and clone.find_offset(60) == index.find_offset(60)
    with pytest.raises(IndexError):
        index.entry(len(index))


def test_find_timestamp_matches_linear_scan() -> None:
    batches = make_batches(0, 80, seed=3, shuffle_ts=True)
    _, _, index = build_segment(0, batches)
    entries = list(index)
    for ts in range(900, 1_110):
        expected = next((i for i, e in enumerate(entries) if e.max_timestamp >= ts), None)
        assert index.find_timestamp(ts) == expected, ts


def test_byte_range_matches_brute_force() -> None:
    batches = make_batches(0, 40, seed=4)
    _, trailer, index = build_segment(0, batches)
    entries = list(index)
    for first in range(len(entries)):
        boundaries = {0, 1, 10**9}
        acc = 0
        for e in entries[first:]:
            acc += e.length
            boundaries |= {acc - 1, acc, acc + 1}
        for max_bytes in sorted(boundaries):
            n, total = 0, 0
            for e in entries[first:]:
                if total + e.length > max_bytes:
                    break
                total += e.length
                n += 1
            if n == 0:
                n, total = 1, entries[first].length
            assert index.byte_range(first, max_bytes) == (entries[first].position, total, n), (
                first,
                max_bytes,
            )
    assert index.byte_range(0, 10**9) == (HEADER_SIZE, trailer.data_size, len(entries))
    with pytest.raises(IndexError):
        index.byte_range(len(entries), 100)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    counts=st.lists(st.integers(1, 20), min_size=1, max_size=30),
    payloads=st.lists(st.integers(0, 300), min_size=30, max_size=30),
    base=st.integers(0, 2**40),
    max_bytes=st.integers(0, 5_000),
)
def test_round_trip_property(counts: list[int], payloads: list[int], base: int, max_bytes: int) -> None:
    batches = []
    off = base
    for i, c in enumerate(counts):
        batches.append(make_batch(off, c, ts=i, payload=payloads[i], seed=i))
        off += c
    data, trailer, index = build_segment(base, batches)
    parsed = parse_tail(data, len(data), "k")
    assert not isinstance(parsed, int)
    assert parsed[0] == trailer and parsed[1].raw == index.raw
    assert verify_segment(data, "k") == trailer
    start, length, n = index.byte_range(0, max_bytes)
    assert start == HEADER_SIZE
    assert length == sum(len(b) for b in batches[:n])
    assert n == 1 or length <= max_bytes
    assert n == len(batches) or length + len(batches[n]) > max_bytes or n == 1


# ---- writer validation ------------------------------------------------------------------------


def test_writer_rejects_bad_input() -> None:
    w = SegmentWriter(10, ZERO_HASH, 0)
    with pytest.raises(ValueError, match="expected 10"):
        w.add_batch(make_batch(11, 1))
    w.add_batch(make_batch(10, 2))
    with pytest.raises(ValueError, match="dense"):
        w.add_batch(make_batch(13, 1))  # gap
    with pytest.raises(ValueError):
        w.add_batch(make_batch(11, 1))  # overlap
    bad_crc = bytearray(make_batch(12, 1, payload=10))
    bad_crc[-1] ^= 1
    with pytest.raises(CorruptRecordError):
        w.add_batch(bad_crc)
    with pytest.raises(ValueError):
        w.add_batch(make_batch(12, 1) + b"x")  # length field disagrees with the buffer
    with pytest.raises(ValueError):
        w.add_batch(b"short")
    wrong_magic = bytearray(make_batch(12, 1))
    wrong_magic[16] = 1
    with pytest.raises(ValueError):
        w.add_batch(wrong_magic)
    assert w.batch_count == 1 and w.next_offset == 12
    w.finish()
    with pytest.raises(ValueError):
        w.finish()
    with pytest.raises(ValueError):
        w.add_batch(make_batch(12, 1))
    with pytest.raises(ValueError):
        SegmentWriter(0, ZERO_HASH, 0).finish()
    with pytest.raises(ValueError):
        SegmentWriter(0, b"short", 0)
    with pytest.raises(ValueError):
        SegmentWriter(-1, ZERO_HASH, 0)


# ---- corruption detection ---------------------------------------------------------------------


def test_every_bit_flip_is_detected(small_segment: bytes) -> None:
    data = bytearray(small_segment)
    assert verify_segment(bytes(data), SMALL_KEY)
    for byte in range(len(data)):
        for bit in range(8):
            data[byte] ^= 1 << bit
            with pytest.raises(CorruptionError) as info:
                verify_segment(bytes(data), SMALL_KEY)
            assert info.value.path == SMALL_KEY
            assert 0 <= info.value.offset <= len(data)
            data[byte] ^= 1 << bit


def test_every_bit_flip_is_detected_streaming(small_segment: bytes) -> None:
    store = MemoryStore()
    data = bytearray(small_segment)
    for byte in range(len(data)):
        for bit in range(8):
            data[byte] ^= 1 << bit
            store.poke(SMALL_KEY, bytes(data))
            with pytest.raises(CorruptionError):
                verify_segment_in_store(store, SMALL_KEY, chunk_bytes=40)
            data[byte] ^= 1 << bit


def test_every_truncation_is_detected(small_segment: bytes) -> None:
    store = MemoryStore()
    for n in range(len(small_segment)):
        with pytest.raises(CorruptionError):
            verify_segment(small_segment[:n], SMALL_KEY)
        store.poke(SMALL_KEY, small_segment[:n])
        with pytest.raises(CorruptionError):
            read_tail(store, SMALL_KEY)
        with pytest.raises(CorruptionError):
            read_tail(store, SMALL_KEY, size=len(small_segment))  # object shorter than listed


def test_trailing_and_leading_garbage_detected(small_segment: bytes) -> None:
    tail = small_segment[-TRAILER_SIZE:]
    for extra in (b"\x00", b"x" * 7, tail, small_segment[-200:], small_segment):
        with pytest.raises(CorruptionError):
            verify_segment(small_segment + extra, SMALL_KEY)
        with pytest.raises(CorruptionError):
            verify_segment(extra + small_segment, SMALL_KEY)


def test_random_multi_byte_damage_raises_only_corruption_error(small_segment: bytes) -> None:
    rnd = random.Random(7)
    for _ in range(2_000):
        data = bytearray(small_segment)
        for _ in range(rnd.randint(1, 6)):
            data[rnd.randrange(len(data))] = rnd.randrange(256)
        if bytes(data) == small_segment:
            continue
        with pytest.raises(CorruptionError):
            verify_segment(bytes(data), SMALL_KEY)


def test_index_inconsistent_with_data_is_detected() -> None:
    # A writer bug (not bit rot): the index is CRC-valid but disagrees with the batches.
    batches = make_batches(0, 5, seed=9)
    data, trailer, _ = build_segment(0, batches)
    buf = bytearray(data)
    entry2 = trailer.index_position + 2 * INDEX_ENTRY_SIZE
    struct.pack_into("<q", buf, entry2 + 16, 999_999)  # max_timestamp of entry 2
    with pytest.raises(CorruptionError, match="index entry 2 max_timestamp") as info:
        verify_segment(resign(bytes(buf)), "k")
    assert info.value.offset == entry2 + 16


def test_read_tail_errors(small_segment: bytes) -> None:
    store = MemoryStore()
    with pytest.raises(ObjectNotFoundError):
        read_tail(store, SMALL_KEY)
    store.put(SMALL_KEY, [small_segment[:-1] + b"X"])  # trailer magic
    with pytest.raises(CorruptionError, match="magic"):
        read_tail(store, SMALL_KEY)
    flipped = bytearray(small_segment)
    flipped[-TRAILER_SIZE - 3] ^= 0x10  # inside the index
    store.put(SMALL_KEY, [bytes(flipped)])
    with pytest.raises(CorruptionError, match="trailer CRC") as info:
        read_tail(store, SMALL_KEY)
    assert info.value.offset == len(small_segment) - TRAILER_SIZE + TRAILER_CRC_OFFSET
    store.put(SMALL_KEY, [b"not a segment at all" * 20])
    with pytest.raises(CorruptionError):
        read_tail(store, SMALL_KEY)


def test_parse_tail_asks_for_more(small_segment: bytes) -> None:
    size = len(small_segment)
    assert parse_tail(small_segment[-10:], size, "k") == TRAILER_SIZE
    need = parse_tail(small_segment[-TRAILER_SIZE:], size, "k")
    assert need == TRAILER_SIZE + 3 * INDEX_ENTRY_SIZE
    assert isinstance(need, int)
    parsed = parse_tail(small_segment[-need:], size, "k")
    assert not isinstance(parsed, int) and parsed[0].entry_count == 3


def test_read_tail_request_count() -> None:
    store = MemoryStore()
    small, trailer, _ = build_segment(0, make_batches(0, 20))
    store.put("small", [small])
    store.calls.clear()
    read_tail(store, "small")
    assert store.calls["get_range"] == 1 and store.calls["head"] == 1
    store.calls.clear()
    read_tail(store, "small", size=trailer.size)
    assert store.calls == {"get_range": 1}

    # An index bigger than the tail read needs exactly one more read.
    n = TAIL_READ_BYTES // INDEX_ENTRY_SIZE + 50
    big, big_trailer, big_index = build_segment(0, [make_batch(i, 1, payload=0, seed=i) for i in range(n)])
    store.put("big", [big])
    store.calls.clear()
    t, idx = read_tail(store, "big", size=len(big))
    assert store.calls == {"get_range": 2}
    assert t == big_trailer and idx.raw == big_index.raw
    store.calls.clear()
    read_tail(store, "big")
    assert store.calls["get_range"] == 2


# ---- hash chain -------------------------------------------------------------------------------


def make_chain(n: int = 3) -> tuple[list[bytes], list[SegmentTrailer], list[str]]:
    datas, trailers, keys = [], [], []
    prev = ZERO_HASH
    base = 0
    for i in range(n):
        batches = make_batches(base, 4, seed=100 + i)
        data, trailer, _ = build_segment(base, batches, prev_hash=prev)
        datas.append(data)
        trailers.append(trailer)
        keys.append(f"loglake-c/t-id/0/{base:020d}.seg")
        prev = trailer.chain_hash
        base = trailer.last_offset + 1
    return datas, trailers, keys


def test_chain_verifies() -> None:
    datas, trailers, keys = make_chain()
    verify_chain(trailers, keys)
    prev = ZERO_HASH
    for data, key in zip(datas, keys, strict=True):
        prev = verify_segment(data, key, expected_prev_hash=prev).chain_hash
    with pytest.raises(CorruptionError, match="prev_hash"):
        verify_segment(datas[2], keys[2], expected_prev_hash=trailers[0].chain_hash)
    with pytest.raises(ValueError):
        verify_chain(trailers, keys[:2])


def test_chain_catches_tampering_with_fixed_crcs() -> None:
    datas, trailers, keys = make_chain()
    tampered = bytearray(datas[1])
    tampered[HEADER_SIZE + 70] ^= 0xFF  # inside the first batch's records
    # An attacker who recomputes all CRCs but not the chain hash: the segment itself fails.
    forged = resign(bytes(tampered))
    with pytest.raises(CorruptionError, match="chain hash") as info:
        verify_segment(forged, keys[1])
    assert info.value.path == keys[1]
    # One who also recomputes the chain hash makes a self-consistent segment, but the next
    # segment's prev_hash no longer links to it.
    forged = resign(bytes(tampered), recompute_chain=True)
    forged_trailer = verify_segment(forged, keys[1], expected_prev_hash=trailers[0].chain_hash)
    with pytest.raises(CorruptionError, match="hash chain broken") as info:
        verify_chain([trailers[0], forged_trailer, trailers[2]], keys)
    assert info.value.path == keys[2]
    with pytest.raises(CorruptionError):
        verify_segment(datas[2], keys[2], expected_prev_hash=forged_trailer.chain_hash)


def test_chain_catches_offset_gap_and_reorder() -> None:
    _, trailers, keys = make_chain()
    with pytest.raises(CorruptionError):
        verify_chain([trailers[0], trailers[2]], [keys[0], keys[2]])
    with pytest.raises(CorruptionError):
        verify_chain([trailers[1], trailers[0]], [keys[1], keys[0]])


# ---- describe ---------------------------------------------------------------------------------


def test_describe_segment(small_segment: bytes) -> None:
    d = describe_segment(small_segment, SMALL_KEY)
    assert d["header"]["magic"] == "LLSG" and d["header"]["base_offset"] == 5
    assert d["trailer"]["last_offset"] == 10 and d["trailer"]["record_count"] == 6
    assert d["index"]["entries"] == 3
    assert [b["base_offset"] for b in d["batches"]] == [5, 7, 8]
    assert d["batches"][0]["compression"] == "none"
    store = MemoryStore()
    store.put(SMALL_KEY, [small_segment])
    d2 = describe_segment(store, SMALL_KEY, max_batches=1)
    assert d2["trailer"] == d["trailer"] and len(d2["batches"]) == 1 and d2["batches_omitted"] == 2


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 40), cuts=st.lists(st.integers(1, 39), max_size=8))
def test_runs_of_batches_make_the_object_one_batch_at_a_time_makes(seed: int, n: int, cuts: list[int]) -> None:
    """add_batches over contiguous runs (a seal's appends) writes the same bytes, trailer and
    index as add_batch per batch, and returns each batch's header fields."""
    batches = make_batches(500, n, seed=seed, shuffle_ts=True)
    one = SegmentWriter(500, ZERO_HASH, 7)
    for b in batches:
        one.add_batch(b)
    runs = SegmentWriter(500, ZERO_HASH, 7)
    bounds = [0, *sorted({c for c in cuts if c < n}), n]
    headers = []
    for lo, hi in itertools.pairwise(bounds):
        lead = b"\xff" * (lo % 3)  # a run need not start at its buffer's first byte
        data = lead + b"".join(batches[lo:hi])
        positions, at = [], len(lead)
        for b in batches[lo:hi]:
            positions.append(at)
            at += len(b)
        headers += runs.add_batches(memoryview(data), positions)
    assert headers == [peek_header(b) for b in batches]
    assert runs.batch_count == one.batch_count == n
    parts_one, trailer_one, index_one = one.finish()
    parts_runs, trailer_runs, index_runs = runs.finish()
    assert b"".join(parts_runs) == b"".join(parts_one)
    assert trailer_runs == trailer_one and index_runs.raw == index_one.raw


def test_a_run_with_a_bad_batch_adds_nothing() -> None:
    """All or nothing: a damaged batch anywhere in a run leaves the writer as it was."""
    batches = make_batches(0, 5, seed=3)
    w = SegmentWriter(0, ZERO_HASH, 7)
    w.add_batch(batches[0])
    damaged = bytearray(b"".join(batches[1:]))
    damaged[-1] ^= 1  # the last batch's records: its CRC no longer holds
    positions, at = [], 0
    for b in batches[1:]:
        positions.append(at)
        at += len(b)
    with pytest.raises(CorruptRecordError):
        w.add_batches(memoryview(damaged), positions)
    first = KAFKA_HEADER.unpack(batches[0][: KAFKA_HEADER.size])
    assert w.batch_count == 1 and w.next_offset == first[0] + first[6] + 1
    w.add_batches(memoryview(b"".join(batches[1:])), positions)
    parts, trailer, _ = w.finish()
    assert trailer.entry_count == 5 and b"".join(parts[1:-1]) == b"".join(batches)
