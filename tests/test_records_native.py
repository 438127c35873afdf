"""The compiled record backend (loglake.records.native) against the pure-Python reference.

Both backends build and decode through the same public calls (build_batch, new_builder,
decode_batch, iter_records); these tests run each input through both and compare: the bytes built
must be identical, decoding must give the same records, and malformed batches (CRC recomputed so
the record decoder itself is reached) must fail with the same typed error and message.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import loglake.records.batch as batch_module
import loglake.records.native as native
from loglake.errors import ConfigError, CorruptRecordError, InvalidRecordError
from loglake.records import (
    CRC_COVERED_START,
    LENGTH_FIELD_END,
    BatchBuilder,
    Record,
    active_backend,
    build_batch,
    decode_batch,
    new_builder,
    set_log_append_time,
    use_backend,
)
from loglake.records.decode import columns_of, decode_batch_columns, decode_batches_columns
from loglake.records.rebuild import decode_plain, rebuild_batch

SRC = str(Path(__file__).resolve().parents[1] / "src")
CODECS = [0, 1, 2, 3, 4]
pytestmark = pytest.mark.skipif(
    not native.native_available(), reason="aiokafka's compiled records are not installed"
)


@pytest.fixture(autouse=True)
def _restore_backend() -> Iterator[None]:
    before = active_backend()
    yield
    use_backend(before)


def both(fn: Callable[[], Any]) -> tuple[Any, Any]:
    """``fn()`` under the reference, then under the native backend; exceptions become values."""
    out = []
    for name in ("python", "native"):
        use_backend(name)
        try:
            out.append(("ok", fn()))
        except Exception as e:
            out.append(("error", type(e), str(e)))
    return out[0], out[1]


def fix_crc(buf: bytearray) -> bytearray:
    """Recompute the batch's length and CRC after its records section was changed."""
    HEADER_LENGTH = 8
    buf[HEADER_LENGTH:12] = (len(buf) - LENGTH_FIELD_END).to_bytes(4, "big", signed=True)
    buf[17:21] = crc32c.crc32c(bytes(buf[CRC_COVERED_START:])).to_bytes(4, "big")
    return buf


# --------------------------------------------------------------------------- selection


def test_native_module_is_compiled() -> None:
    """The native backend is aiokafka's Cython extension, not its pure-Python fallback."""
    assert native.native_available()
    assert native._crecords is not None
    assert native._crecords.__file__.endswith(".so")
    assert use_backend("auto") == "native"
    assert type(new_builder()) is native.NativeBatchBuilder


def test_use_backend_switches_and_refuses_unknown_names() -> None:
    assert use_backend("python") == "python"
    assert type(new_builder()) is BatchBuilder
    assert use_backend("native") == "native"
    with pytest.raises(ConfigError, match="expected one of auto, native, python"):
        use_backend("rust")


def _import_in_child(env_value: str | None, block_native: bool) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys\n"
        + ("sys.modules['aiokafka.record._crecords'] = None\n" if block_native else "")
        + "import loglake.records as r\n"
        "print(r.active_backend(), r.native_available())\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    env.pop(native.ENV_VAR, None)
    if env_value is not None:
        env[native.ENV_VAR] = env_value
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_fallback_when_the_compiled_module_is_missing() -> None:
    done = _import_in_child(None, block_native=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["python", "False"]


def test_environment_variable_chooses() -> None:
    assert _import_in_child("python", block_native=False).stdout.split() == ["python", "True"]
    assert _import_in_child("native", block_native=False).stdout.split() == ["native", "True"]
    refused = _import_in_child("native", block_native=True)
    assert refused.returncode != 0
    assert "LOGLAKE_RECORDS=native but aiokafka's compiled record module is not importable" in refused.stderr


# --------------------------------------------------------------------------- building

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
TIMESTAMPS = st.one_of(st.just(-1), st.integers(0, 1 << 45), st.integers(-(1 << 20), 1 << 20))
BLOBS = st.one_of(st.none(), st.binary(max_size=300))
HEADERS = st.lists(st.tuples(st.text(max_size=12), st.one_of(st.none(), st.binary(max_size=40))), max_size=4)
RECORDS = st.lists(st.tuples(TIMESTAMPS, BLOBS, BLOBS, HEADERS), min_size=1, max_size=40)
BUILDER_KWARGS = st.fixed_dictionaries(
    {
        "compression": st.sampled_from(CODECS),
        "base_offset": st.integers(0, 1 << 50),
        "producer_id": st.one_of(st.just(-1), st.integers(0, (1 << 63) - 1)),
        "producer_epoch": st.integers(-1, (1 << 15) - 1),
        "base_sequence": st.one_of(st.just(-1), st.integers(0, (1 << 31) - 1)),
        "is_transactional": st.booleans(),
        "is_control": st.booleans(),
        "timestamp_type": st.sampled_from([0, 1]),
        "partition_leader_epoch": st.integers(-1, (1 << 31) - 1),
    }
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=RECORDS, kwargs=BUILDER_KWARGS)
def test_built_bytes_are_identical(records: list[Any], kwargs: dict[str, Any]) -> None:
    ref, nat = both(lambda: build_batch(records, **kwargs))
    assert ref == nat
    assert ref[0] == "ok"
    _h, decoded = decode_batch(ref[1])
    if not kwargs["timestamp_type"]:
        assert [r.timestamp for r in decoded] == [r[0] for r in records]
    assert [(r.key, r.value, r.headers) for r in decoded] == [(k, v, list(h)) for _t, k, v, h in records]


def assert_fills_agree(make: Callable[[], Any], reference: Callable[[Any], None], bulk: Callable[[Any], None]) -> None:
    """A builder's bulk path leaves the same records (count and batch bytes) or raises the same
    error as the reference fill, on either backend; and where both succeed, the backends agree."""

    def run(fill: Callable[[Any], None]) -> Callable[[], tuple[int, bytes | None]]:
        def built() -> tuple[int, bytes | None]:
            builder = make()
            try:
                fill(builder)
            finally:
                count = len(builder)
            return count, builder.build() if count else None

        return built

    expected = both(run(reference))
    assert both(run(bulk)) == expected
    if expected[0][0] == "ok" or expected[1][0] == "ok":
        assert expected[0] == expected[1]


#: append_all's records: timestamps may be None (the call's `now`), out of range, or not ints;
#: keys, values and headers of every kind `append` takes, and some it refuses.
ALL_TIMESTAMPS = st.one_of(st.none(), TIMESTAMPS, st.sampled_from([1.5, (1 << 63) + 9, -(1 << 63) - 9]))
ALL_BLOBS = st.one_of(BLOBS, st.binary(max_size=20).map(bytearray), st.sampled_from(["str"]))
ALL_HEADERS = st.one_of(HEADERS, HEADERS.map(tuple), st.just(()), st.just([(b"bytes key", b"v")]))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(st.tuples(ALL_TIMESTAMPS, ALL_BLOBS, ALL_BLOBS, ALL_HEADERS), min_size=0, max_size=30),
    now=st.integers(0, 1 << 45),
    split=st.integers(0, 30),
)
# Found by this test: a timestamp within an int64 delta of the first one but outside int64 itself
# was encoded by the reference and refused by aiokafka (OverflowError); both refuse it now.
@example(records=[(-9, None, None, ()), (-(1 << 63) - 9, None, None, ())], now=0, split=0)
def test_append_all_is_append_one_at_a_time_on_both_backends(records: list[Any], now: int, split: int) -> None:
    """The bulk path (the embedded API's produce loop) builds the same bytes and raises the same
    error as `append` record by record, on either backend, also when appended in two calls."""

    def one_at_a_time(builder: Any) -> None:
        for ts, k, v, h in records:
            builder.append(now if ts is None else ts, k, v, h)

    def bulk(builder: Any) -> None:
        builder.append_all(records[:split], now)
        builder.append_all(iter(records[split:]), now)

    assert_fills_agree(new_builder, one_at_a_time, bulk)


#: append_pairs' records: (key, value) and (key, value, headers) tuples of every kind `append`
#: takes, and some it refuses: a 1-tuple, a list instead of a tuple, headers aiokafka refuses.
PAIRS = st.one_of(
    st.tuples(ALL_BLOBS, ALL_BLOBS),
    st.tuples(ALL_BLOBS, ALL_BLOBS, ALL_HEADERS),
    st.tuples(ALL_BLOBS),
    st.lists(ALL_BLOBS, min_size=2, max_size=2),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    first=st.none() | st.tuples(TIMESTAMPS, BLOBS, BLOBS),
    records=st.lists(PAIRS, min_size=0, max_size=30),
    now=st.one_of(st.integers(0, 1 << 45), st.sampled_from([-1, (1 << 63) + 9, 1.5])),
    split=st.integers(0, 30),
)
def test_append_pairs_is_append_one_at_a_time_on_both_backends(
    first: tuple[int, bytes, bytes] | None, records: list[Any], now: Any, split: int
) -> None:
    """produce_batch's path (records as the caller gives them, all stamped `now`) builds the same
    bytes and raises the same error as `append` record by record, on either backend, in two
    calls, and after a record with a timestamp of its own."""

    def start() -> Any:
        builder = new_builder()
        if first is not None:
            builder.append(first[0], first[1], first[2])
        return builder

    def one_at_a_time(builder: Any) -> None:
        for rec in records:
            builder.append(now, rec[0], rec[1], rec[2] if len(rec) > 2 else ())

    def bulk(builder: Any) -> None:
        builder.append_pairs(records[:split], now)
        builder.append_pairs(iter(records[split:]), now)

    assert_fills_agree(start, one_at_a_time, bulk)


def test_append_pairs_past_the_record_limit_raises_what_append_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    limit = 5  # the real one is 2**31 - 1 records
    monkeypatch.setattr(batch_module, "MAX_RECORDS_PER_BATCH", limit)
    monkeypatch.setattr(native, "MAX_RECORDS_PER_BATCH", limit)
    for backend in ("python", "native"):
        use_backend(backend)
        builder = new_builder()
        with pytest.raises(InvalidRecordError, match=f"at most {limit} records"):
            builder.append_pairs([(b"k", b"v")] * (limit + 1), 1_700_000_000_000)
        assert len(builder) == limit


def test_builder_accepts_what_the_reference_accepts() -> None:
    """Any buffer as key, value or header value, and headers as any sequence of pairs."""
    kinds = [
        (1000, bytearray(b"k"), memoryview(b"v"), [("a", bytearray(b"x"))]),
        (1001, b"k", None, (("a", None), ["b", b"y"])),
        (1002, None, b"", ()),
    ]

    def build() -> bytes:
        builder = new_builder(base_offset=7)
        for ts, k, v, h in kinds:
            builder.append(ts, k, v, h)
        assert len(builder) == 3
        assert builder.estimated_size() > 61
        return builder.build()

    ref, nat = both(build)
    assert ref == nat and ref[0] == "ok"


@pytest.mark.parametrize(
    "record",
    [
        (1.5, b"k", b"v", []),  # timestamp not an int
        (1, "str key", b"v", []),
        (1, b"k", b"v", [(b"bytes header key", b"v")]),
    ],
)
def test_builder_refuses_what_the_reference_refuses(record: tuple[Any, ...]) -> None:
    ref, nat = both(lambda: build_batch([record]))
    assert ref[0] == nat[0] == "error"
    assert ref[1] is nat[1] is TypeError


def test_timestamp_delta_beyond_int64_is_refused_by_both() -> None:
    recs = [(-(1 << 62) - 5, None, b"a", []), ((1 << 62) + 5, None, b"b", [])]
    ref, nat = both(lambda: build_batch(recs))
    assert ref == nat
    assert ref[0] == "error" and ref[1].__name__ == "InvalidRecordError"


def test_empty_batch_is_refused_by_both() -> None:
    ref, nat = both(lambda: new_builder().build())
    assert ref == nat and ref[0] == "error"


# --------------------------------------------------------------------------- decoding


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=RECORDS, kwargs=BUILDER_KWARGS, stamp=st.one_of(st.none(), st.integers(0, 1 << 45)))
def test_decoding_gives_the_same_records(
    records: list[Any], kwargs: dict[str, Any], stamp: int | None
) -> None:
    use_backend("python")
    buf = bytearray(build_batch(records, **kwargs))
    if stamp is not None:
        set_log_append_time(buf, 0, stamp)
    ref, nat = both(lambda: decode_batch(buf))
    assert ref == nat
    assert ref[0] == "ok"


def _valid_plain_batch(records: list[Any]) -> bytearray:
    use_backend("python")
    return bytearray(build_batch(records))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=RECORDS,
    edits=st.lists(
        st.tuples(st.integers(0, 1 << 16), st.integers(0, 255), st.sampled_from(["set", "ins", "del"])),
        min_size=1,
        max_size=4,
    ),
)
def test_malformed_records_fail_the_same_way(records: list[Any], edits: list[tuple[int, int, str]]) -> None:
    """Damage inside the records section with a fresh CRC, so only the record decoders judge it."""
    buf = _valid_plain_batch(records)
    for at, byte, how in edits:
        pos = 61 + at % max(1, len(buf) - 61)
        if how == "set" and pos < len(buf):
            buf[pos] = byte
        elif how == "ins":
            buf[pos:pos] = bytes([byte])
        elif len(buf) > 62:
            del buf[min(pos, len(buf) - 1)]
    fix_crc(buf)
    ref, nat = both(lambda: decode_batch(buf))
    assert ref == nat
    if ref[0] == "error":
        assert ref[1] is CorruptRecordError


@pytest.mark.parametrize("attributes", [0x01, 0x7F, 0x80, 0xFF])
def test_record_attributes_byte_is_ignored_by_both(attributes: int) -> None:
    """A record's attributes byte is unused; Kafka reads one byte and ignores it. aiokafka reads it
    as a varint (so 0x80 shifts the record's later fields); the native backend must notice and
    give what the reference gives. Found by test_malformed_records_fail_the_same_way."""
    records = [(-1, None, None, []), (5, b"\x00", b"k" * 10, [("h", b"v")]), (7, None, b"", [])]
    buf = _valid_plain_batch(records)
    pos = 61
    for _ in records:  # every record's attributes byte, after its one-byte length varint
        length = buf[pos] >> 1
        buf[pos + 1] = attributes
        pos += 1 + length
    fix_crc(buf)
    ref, nat = both(lambda: decode_batch(buf))
    assert ref == nat
    assert ref[0] == "ok"
    assert [(r.key, r.value) for r in ref[1][1]] == [(k, v) for _t, k, v, _h in records]


def test_a_shifted_read_that_adds_up_is_not_trusted() -> None:
    """The case hypothesis found: the last record's attributes byte set to 0x80, and aiokafka's
    shifted read of that record still consumed exactly its length (giving offset 1, timestamp 4
    and an empty key instead of offset 5, timestamp -1 and key 00)."""
    records = [
        (-1, None, None, []),
        (-1, None, None, [("", None), ("00\x80", b"\x00" * 8)]),
        (8191, None, b"\x00" * 17, []),
        (134217727, None, b"\x00\x00", []),
        (134217727, None, b"\x00" * 25, [("0\U00010000", b"\x00" * 7)]),
        (-1, b"\x00", None, []),
    ]
    buf = _valid_plain_batch(records)
    # the last record: length 7, attributes 0, ts delta 0, offset delta 5, key 00, null value, no headers
    assert buf[-8:] == bytes.fromhex("0e00000a02000100")
    buf[-7] = 0x80
    fix_crc(buf)
    ref, nat = both(lambda: decode_batch(buf))
    assert ref == nat
    assert ref[0] == "ok"
    assert ref[1][1][-1] == Record(5, -1, b"\x00", None, [])


@pytest.mark.parametrize("count_change", [-1, 1, 1000, (1 << 31) - 1])
def test_wrong_record_count_fails_the_same_way(count_change: int) -> None:
    buf = _valid_plain_batch([(5, b"k", b"v", [("h", b"x")]), (6, None, b"w", [])])
    count = int.from_bytes(buf[57:61], "big") + count_change
    buf[57:61] = min(count, (1 << 31) - 1).to_bytes(4, "big")
    fix_crc(buf)
    ref, nat = both(lambda: decode_batch(buf))
    assert ref == nat
    assert ref[0] == "error" and ref[1] is CorruptRecordError


@pytest.mark.parametrize("codec", CODECS)
def test_compressed_batches_decode_the_same(codec: int) -> None:
    recs = [
        (1_700_000_000_000 + i, b"k%d" % i, b"v" * (i % 50), [("i", str(i).encode())]) for i in range(500)
    ]
    use_backend("python")
    buf = build_batch(recs, compression=codec)
    ref, nat = both(lambda: decode_batch(buf))
    assert ref == nat and ref[0] == "ok"
    assert len(ref[1][1]) == 500


# --------------------------------------------------------------------------- columns (consume's decode)


def _columns_and_records(buf: bytes | bytearray) -> Any:
    """decode_batch_columns next to the columns of decode_batch, both from the active backend."""
    h, cols = decode_batch_columns(buf)
    h2, recs = decode_batch(buf)
    return h, tuple(map(list, cols)), h2, tuple(map(list, columns_of(recs)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=RECORDS, kwargs=BUILDER_KWARGS, stamp=st.one_of(st.none(), st.integers(0, 1 << 45)))
def test_columns_are_the_records_on_both_backends(
    records: list[Any], kwargs: dict[str, Any], stamp: int | None
) -> None:
    """The columnar decode (Log.consume's) gives the records decode_batch gives, field by field,
    and the same on both backends."""
    use_backend("python")
    buf = bytearray(build_batch(records, **kwargs))
    if stamp is not None:
        set_log_append_time(buf, 0, stamp)
    ref, nat = both(lambda: _columns_and_records(buf))
    assert ref == nat
    assert ref[0] == "ok"
    _h, cols, _h2, from_records = ref[1]
    assert cols == from_records
    assert len(cols[0]) == len(records)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=RECORDS,
    edits=st.lists(
        st.tuples(st.integers(0, 1 << 16), st.integers(0, 255), st.sampled_from(["set", "ins", "del"])),
        min_size=1,
        max_size=4,
    ),
)
def test_malformed_records_fail_the_same_way_as_columns(
    records: list[Any], edits: list[tuple[int, int, str]]
) -> None:
    """Damage inside the records section (fresh CRC): the columnar decode reads what decode_batch
    reads, or fails with the same typed error and message, on both backends."""
    buf = _valid_plain_batch(records)
    for at, byte, how in edits:
        pos = 61 + at % max(1, len(buf) - 61)
        if how == "set" and pos < len(buf):
            buf[pos] = byte
        elif how == "ins":
            buf[pos:pos] = bytes([byte])
        elif len(buf) > 62:
            del buf[min(pos, len(buf) - 1)]
    fix_crc(buf)
    results = []
    for name in ("python", "native"):
        use_backend(name)
        for fn in (decode_batch_columns, decode_batch):
            try:
                h, out = fn(buf)
                results.append(
                    ("ok", h, tuple(map(list, out if fn is decode_batch_columns else columns_of(out))))
                )
            except Exception as e:
                results.append(("error", type(e), str(e)))
    assert all(r == results[0] for r in results), results
    if results[0][0] == "error":
        assert results[0][1] is CorruptRecordError


def test_a_shifted_read_is_not_trusted_as_columns() -> None:
    """The attributes-byte case of test_a_shifted_read_that_adds_up_is_not_trusted, through the
    columnar decode: the native columns fall back to the reference as the records do."""
    records = [(-1, None, None, []), (-1, b"\x00", None, [])]
    buf = _valid_plain_batch(records)
    assert buf[-8:] == bytes.fromhex("0e00000202000100")
    buf[-7] = 0x80
    fix_crc(buf)
    ref, nat = both(lambda: tuple(map(list, decode_batch_columns(buf)[1])))
    assert ref == nat
    assert ref == ("ok", ([0, 1], [-1, -1], [None, b"\x00"], [None, None], [[], []]))


@pytest.mark.parametrize("codec", [0, 4])
def test_compacted_batch_columns_keep_their_offset_gaps(codec: int) -> None:
    """A compacted batch (records left out, offsets with gaps) is decoded by the reference on the
    native backend too; its columns carry the kept records' own offsets."""
    use_backend("python")
    recs = [(1_000 + i, b"k%d" % i, b"v%d" % i, []) for i in range(10)]
    buf = build_batch(recs, compression=codec, base_offset=100)
    h, decoded = decode_plain(memoryview(buf))
    compacted = rebuild_batch(h, [r for r in decoded if (r.offset - 100) % 3 == 0])
    two = compacted + buf  # two batches back to back, as a read returns them
    ref, nat = both(lambda: [(h.base_offset, tuple(map(list, c))) for h, c in decode_batches_columns(two)])
    assert ref == nat and ref[0] == "ok"
    (base, cols), (_base2, cols2) = ref[1]
    assert base == 100 and cols[0] == [100, 103, 106, 109]
    assert cols[2] == [b"k0", b"k3", b"k6", b"k9"]
    assert cols2[0] == list(range(100, 110))


# --------------------------------------------------------------------------- the embedded API


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_embedded_produce_and_consume_agree_across_backends(tmp_path: Path, codec: str) -> None:
    """produce_batch and consume (whole batches, a start inside a batch, one partition) give the
    same records under both backends, and a log written under one reads the same under the other."""
    import loglake

    records = [
        (
            None if i % 4 == 0 else b"k%d" % (i % 7),
            b"v" * (i % 130),
            [("i", str(i).encode())] if i % 3 else [],
        )
        for i in range(600)
    ]

    def fields(rec: Any) -> tuple[Any, ...]:
        return tuple(rec[:3]) + tuple(rec[4:])  # not the timestamp: each log was written at its own time

    seen: dict[str, Any] = {}
    for name in ("python", "native"):
        use_backend(name)
        with loglake.open(str(tmp_path / name)) as log:
            log.create_topic("t", 2)
            for start in range(0, len(records), 200):
                log.produce_batch("t", records[start : start + 200], compression=codec)
            seen[name] = [
                [fields(r) for r in log.consume("t", "earliest")],
                [fields(r) for r in log.consume("t", {0: 37, 1: 150}, partitions=[0, 1])],
                [fields(r) for r in log.consume("t", "earliest", partitions=[1])],
            ]
    assert seen["python"] == seen["native"]
    everything, from_middle, one = seen["native"]
    assert sorted(repr(r[4:]) for r in everything) == sorted(repr((k, v, list(h))) for k, v, h in records)
    assert all(r[1] == 1 for r in one) and len(one) == sum(1 for r in everything if r[1] == 1)
    assert min(r[2] for r in from_middle if r[1] == 0) == 37
    assert min(r[2] for r in from_middle if r[1] == 1) == 150
    # what one backend wrote, the other reads the same
    use_backend("python")
    with loglake.open(str(tmp_path / "native")) as log:
        assert [fields(r) for r in log.consume("t", "earliest")] == everything
