"""Key compaction and segment merging against a dict model.

The model knows what was produced, what is sealed, where the cleaned part ends and when each
tombstone was first passed by the cleaner. After every step a full read must give:

* offsets strictly increasing, every record with the key and value produced at its offset;
* every record of the dirty part (at or past the clean end) and, below the clean end, the
  newest record of each key there; nothing else;
* a tombstone below the clean end may be missing only once a pass ran `delete.retention.ms`
  after the cleaner first passed it.

`verify_data_dir` must find no error and no unreferenced object after every step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loglake.engine import Engine
from loglake.engine import compaction as compaction_mod
from loglake.engine.verify import verify_data_dir
from loglake.fs.faulty import FaultyFileSystem
from loglake.records.batch import peek_header
from loglake.records.compression import CODEC_GZIP, CODEC_NONE, CODEC_ZSTD
from loglake.records.decode import iter_records

from enginekit import DATA_DIR, read_all, small_config

TOPIC = "t"
KEYS = [f"key-{i}".encode() for i in range(5)]
RETENTION_MS = 1_000
START_MS = 1_700_000_000_000
#: Patched in for a key map that holds about 4 keys in the 1 MiB floor: many passes.
TINY_MAP_ENTRY_BYTES = 250_000

Record = tuple[int, bytes | None, bytes | None]


@contextmanager
def tiny_key_map() -> Any:
    with mock.patch.object(compaction_mod, "KEY_ENTRY_BYTES", TINY_MAP_ENTRY_BYTES):
        yield


class Harness:
    """An engine on an in-memory filesystem with a clock the test moves."""

    def __init__(self, topic_config: dict[str, str] | None = None, **engine_config: Any) -> None:
        self.fs = FaultyFileSystem()
        self.now_ms = START_MS
        self.engine_config = {
            "cleaner_threads": 0,
            "merge_min_segments": 3,
            "merge_min_age_ms": 0,  # the clock is the test's; merge what is sealed
            "cleaner_dedupe_buffer_bytes": 1 << 20,  # the floor: tiny_key_map() makes it hold 4 keys
            **engine_config,
        }
        self.engine = self._open()
        config = {
            "cleanup.policy": "compact",
            "delete.retention.ms": str(RETENTION_MS),
            "segment.records": "3",
        }
        config.update(topic_config or {})
        self.engine.create_topic(TOPIC, 1, config)

    def clock(self) -> float:
        return self.now_ms / 1000

    def _open(self) -> Engine:
        engine = Engine(
            DATA_DIR, small_config(**self.engine_config), fs=self.fs, clock=self.clock, start_background=False
        )
        engine.open()
        return engine

    def reopen(self) -> None:
        self.engine.close()
        self.engine = self._open()

    def produce(self, records: list[tuple[bytes, bytes | None]], codec: int = CODEC_NONE) -> int:
        rows = [(None, k, v, []) for k, v in records]
        return self.engine.append_records(TOPIC, 0, rows, compression=codec).result().base_offset  # type: ignore[arg-type]

    def clean_end(self) -> int:
        return self.engine.catalog.partition(TOPIC, 0).meta.clean_end

    def merge(self) -> bool:
        for t, p in self.engine.catalog.partitions():
            if t.name == TOPIC:
                return self.engine.cleaner.merge(t, p)
        raise AssertionError("topic missing")

    def records(self) -> list[Record]:
        return read_all(self.engine, TOPIC)[0]

    def check_verified(self) -> None:
        report = verify_data_dir(self.engine)
        assert report.ok, report.errors
        assert not report.errors
        assert not report.unreferenced, report.unreferenced

    def close(self) -> None:
        self.engine.close()


def batches(engine: Engine) -> list[tuple[int, int]]:
    """(record count, codec) of every stored batch, read as a consumer would."""
    out: list[tuple[int, int]] = []
    info = engine.partition_info(TOPIC, 0)
    offset = info.log_start_offset
    while offset < info.high_watermark:
        data = b"".join(bytes(c) for c in engine.read(TOPIC, 0, offset, 1 << 20).chunks)  # type: ignore[arg-type]
        pos = 0
        while pos < len(data):
            h = peek_header(data, pos)
            out.append((h.record_count, h.compression))
            offset = max(offset, h.last_offset + 1)
            pos += int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
    return out


@dataclass
class Model:
    log: list[tuple[int, bytes, bytes | None]] = field(default_factory=list)
    sealed: int = 0
    clean_end: int = 0
    first_pass: dict[int, int] = field(default_factory=dict)  # tombstone offset -> ms
    last_pass_ms: int = -1

    def produce(self, records: list[tuple[bytes, bytes | None]]) -> None:
        for k, v in records:
            self.log.append((len(self.log), k, v))

    def seal(self) -> None:
        self.sealed = len(self.log)

    def compact(self, now_ms: int) -> bool:
        """A pass (as many as the key map needs) at `now_ms`; False when nothing is dirty and no
        tombstone the last pass kept is past delete.retention.ms."""
        newest_clean = {k: o for o, k, _v in self.log[: self.clean_end]}
        kept_tombstones = [
            o for o in newest_clean.values() if self.log[o][2] is None and self.first_pass[o] + RETENTION_MS > self.last_pass_ms
        ]
        due = any(self.first_pass[o] + RETENTION_MS <= now_ms for o in kept_tombstones)
        if self.sealed <= self.clean_end and not due:
            return False
        for o, _k, v in self.log[self.clean_end : self.sealed]:
            if v is None:
                self.first_pass[o] = now_ms
        self.clean_end = self.sealed
        self.last_pass_ms = now_ms
        return True

    def check(self, records: list[Record]) -> None:
        offsets = [o for o, _k, _v in records]
        assert offsets == sorted(set(offsets)), f"offsets not strictly increasing: {offsets}"
        for o, k, v in records:
            assert o < len(self.log) and self.log[o] == (o, k, v), (
                f"record at {o} is not the one produced there"
            )
        newest_clean = {k: o for o, k, _v in self.log[: self.clean_end]}
        must: set[int] = set()
        may: set[int] = set()
        for o, k, v in self.log:
            if o >= self.clean_end:
                must.add(o)
            elif newest_clean[k] == o:
                expired = v is None and self.first_pass[o] + RETENTION_MS <= self.last_pass_ms
                (may if expired else must).add(o)
        got = set(offsets)
        assert must <= got, f"missing records at {sorted(must - got)}"
        assert got <= must | may, f"superseded records kept at {sorted(got - must - may)}"
        latest = {k: (o, v) for o, k, v in self.log}
        for k, (o, v) in latest.items():  # the newest value of every key (expired tombstones aside)
            assert o in got or (v is None and o in may), f"newest record of {k!r} (offset {o}) missing"


# ---- the property -------------------------------------------------------------------------------

record_st = st.tuples(st.integers(0, len(KEYS) - 1), st.integers(0, 3).map(lambda n: n == 0))
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("produce"), st.lists(record_st, min_size=1, max_size=3)),
        st.tuples(st.just("advance"), st.sampled_from([300, 700, 1_500])),
        st.tuples(st.just("seal")),
        st.tuples(st.just("compact")),
        st.tuples(st.just("merge")),
        st.tuples(st.just("reopen")),
    ),
    max_size=40,
)


def run_ops(ops: list[tuple[Any, ...]], codec: int, multipass: bool) -> None:
    h = Harness()
    model = Model()
    try:
        for step, op in enumerate(ops):
            kind = op[0]
            if kind == "produce":
                records = [
                    (KEYS[k], None if dead else f"v{step}-{i}".encode()) for i, (k, dead) in enumerate(op[1])
                ]
                h.produce(records, codec)
                model.produce(records)
            elif kind == "advance":
                h.now_ms += op[1]
            elif kind == "seal":
                h.engine.flush()
                model.seal()
            elif kind == "reopen":
                h.reopen()
                model.seal()
            elif kind == "merge":
                before = len(h.engine.segments(TOPIC, 0))
                after = len(h.engine.segments(TOPIC, 0)) if h.merge() else before - 2
                assert after <= before - 2, f"a merge of at least 3 segments left {after} of {before}"
            else:
                passes = h.engine.cleaner.stats.passes
                h.engine.compact(TOPIC)
                for _ in range(200 if multipass else 0):
                    if h.clean_end() >= model.sealed:
                        break
                    h.engine.compact(TOPIC)
                did = model.compact(h.now_ms)
                done = h.engine.cleaner.stats.passes - passes
                assert (done > 0) == did, f"passes {done}, model expected a pass: {did}"
                assert multipass or done <= 1
            assert h.engine.partition_info(TOPIC, 0).sealed_end == model.sealed
            assert h.clean_end() == model.clean_end
            model.check(h.records())
            h.check_verified()
        for count, stored in batches(h.engine):
            assert count == 0 or stored == codec, (
                f"batch of {count} records has codec {stored}, expected {codec}"
            )
    finally:
        h.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, codec=st.sampled_from([CODEC_NONE, CODEC_GZIP, CODEC_ZSTD]))
def test_compaction_matches_model(ops: list[tuple[Any, ...]], codec: int) -> None:
    run_ops(ops, codec, multipass=False)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_multipass_compaction_matches_model(ops: list[tuple[Any, ...]]) -> None:
    with tiny_key_map():
        run_ops(ops, CODEC_NONE, multipass=True)


# ---- deterministic cases ------------------------------------------------------------------------


def values_of(records: list[Record]) -> dict[bytes | None, tuple[int, bytes | None]]:
    return {k: (o, v) for o, k, v in records}


def test_tombstone_kept_on_first_pass_and_dropped_after_delete_retention() -> None:
    h = Harness()
    try:
        h.produce([(b"a", b"1"), (b"b", b"1")])
        h.produce([(b"a", None)])  # offset 2
        h.engine.flush()
        assert h.engine.compact(TOPIC) == 1
        first = h.now_ms
        assert h.records() == [(1, b"b", b"1"), (2, b"a", None)]  # the tombstone stays, a=1 goes
        h.check_verified()
        for step_ms, kept in ((RETENTION_MS - 200, True), (400, False)):  # first+800, then first+1200
            h.now_ms += step_ms
            h.produce([(b"c", str(h.now_ms).encode())])  # something dirty, so a pass is due
            h.engine.flush()
            assert h.engine.compact(TOPIC) == 1
            assert ((2, b"a", None) in h.records()) is kept, f"at first pass + {h.now_ms - first} ms"
            h.check_verified()
        assert h.engine.cleaner.stats.tombstones_dropped == 1
        h.reopen()
        h.check_verified()
        assert [k for _o, k, _v in h.records()] == [b"b", b"c"]
    finally:
        h.close()


def test_min_compaction_lag_keeps_recent_segments_untouched() -> None:
    h = Harness({"min.compaction.lag.ms": "10000", "segment.records": "100"})
    try:
        h.produce([(b"a", b"old"), (b"a", b"mid"), (b"b", b"old")])
        h.engine.flush()
        h.now_ms += 20_000
        h.produce([(b"a", b"new"), (b"b", b"new"), (b"b", b"newer")])  # offsets 3..5: inside the lag
        h.engine.flush()
        recent = h.engine.segments(TOPIC, 0)[-1]
        assert h.engine.compact(TOPIC) == 1
        segs = h.engine.segments(TOPIC, 0)
        assert segs[-1] == recent, "a segment inside min.compaction.lag.ms was rewritten"
        assert segs[0].generation == 1
        # only the old segment was mapped: its own duplicate goes, the newer ones do not count yet
        assert h.records() == [
            (1, b"a", b"mid"),
            (2, b"b", b"old"),
            (3, b"a", b"new"),
            (4, b"b", b"new"),
            (5, b"b", b"newer"),
        ]
        assert h.clean_end() == 3
        h.check_verified()
        h.now_ms += 20_000  # now the second segment is old enough
        assert h.engine.compact(TOPIC) == 1
        assert h.records() == [(3, b"a", b"new"), (5, b"b", b"newer")]
        h.check_verified()
    finally:
        h.close()


def test_dirty_ratio_below_min_cleanable_does_nothing_unless_forced() -> None:
    h = Harness({"min.cleanable.dirty.ratio": "0.5", "segment.records": "1000"}, merge_min_segments=0)
    try:
        h.produce([(f"key-{i:03d}".encode(), b"x" * 50) for i in range(60)])  # all distinct: all stay
        h.engine.flush()
        assert h.engine.compact(TOPIC, force=False) == 1  # everything is dirty: ratio 1.0
        h.produce([(b"key-000", b"y")])
        h.engine.flush()
        segs = h.engine.segments(TOPIC, 0)
        assert len(segs) == 2 and segs[1].size * 2 < segs[0].size  # dirty ratio well under 0.5
        passes = h.engine.cleaner.stats.passes
        assert h.engine.compact(TOPIC, force=False) == 0
        assert h.engine.cleaner.run_once(force=False) == 0
        assert h.engine.segments(TOPIC, 0) == segs and h.engine.cleaner.stats.passes == passes
        assert h.engine.compact(TOPIC, force=True) == 1
        assert values_of(h.records())[b"key-000"] == (60, b"y") and len(h.records()) == 60
        h.check_verified()
    finally:
        h.close()


def test_merging_many_small_segments_keeps_the_data() -> None:
    h = Harness({"cleanup.policy": "delete", "segment.records": "2"}, merge_min_segments=4)
    try:
        for i in range(40):
            h.produce([(KEYS[i % len(KEYS)], f"v{i}".encode())])
            if i % 8 == 7:
                h.engine.flush()  # seals of 2-record segments, in several rounds
        h.engine.flush()
        before = h.records()
        many = len(h.engine.segments(TOPIC, 0))
        assert many == 20
        assert h.engine.compact(TOPIC) >= 1
        segs = h.engine.segments(TOPIC, 0)
        assert len(segs) < 4, f"{len(segs)} segments left, merge_min_segments is 4"
        assert all(s.generation >= 1 for s in segs)
        assert h.engine.cleaner.stats.merges >= 1 and h.engine.cleaner.stats.passes == 0
        assert h.records() == before
        h.check_verified()
        h.reopen()
        assert h.records() == before and h.engine.segments(TOPIC, 0) == segs
        h.check_verified()
    finally:
        h.close()


def test_merge_respects_segment_bytes() -> None:
    h = Harness({"cleanup.policy": "delete", "segment.records": "1"}, merge_min_segments=2)
    try:
        for i in range(12):
            h.produce([(b"k", f"{i:02d}".encode() * 100)])
        h.engine.flush()
        size = h.engine.segments(TOPIC, 0)[0].size
        h.engine.alter_topic_config(TOPIC, {"cleanup.policy": "delete", "segment.bytes": str(size * 3)})
        before = h.records()
        h.engine.compact(TOPIC)
        segs = h.engine.segments(TOPIC, 0)
        assert 4 <= len(segs) < 12
        # inputs whose sizes add up to at most segment.bytes: 3 one-record segments a merge
        # (the output is larger than its inputs by its provenance, so the size is not compared)
        assert all(s.last_offset - s.base_offset < 3 for s in segs), [
            (s.base_offset, s.last_offset) for s in segs
        ]
        assert h.records() == before
        h.check_verified()
    finally:
        h.close()


def test_compressed_batches_keep_their_codec_when_rebuilt() -> None:
    for codec in (CODEC_GZIP, CODEC_ZSTD):
        h = Harness()
        try:
            for i in range(6):  # batches of 4 over 3 keys: every batch loses some records
                h.produce([(KEYS[(i + j) % 3], f"v{i}-{j}".encode() * 20) for j in range(4)], codec)
            h.engine.flush()
            h.engine.compact(TOPIC)
            assert h.engine.cleaner.stats.records_out < h.engine.cleaner.stats.records_in
            stored = batches(h.engine)
            assert stored and all(c == codec for n, c in stored if n), stored
            assert sorted(v for _k, (_o, v) in values_of(h.records()).items()) == [
                b"v5-1" * 20,
                b"v5-2" * 20,
                b"v5-3" * 20,
            ]
            h.check_verified()
            h.reopen()
            assert batches(h.engine) == stored
        finally:
            h.close()


def test_many_passes_with_a_tiny_key_map_give_the_single_pass_result() -> None:
    results = []
    for tiny in (False, True):
        h = Harness({"segment.records": "7"})
        try:
            for i in range(90):
                h.produce([(f"key-{(i * 7) % 30}".encode(), None if i % 11 == 0 else f"v{i}".encode())])
            h.engine.flush()
            passes = 0
            with tiny_key_map() if tiny else nullcontext():
                while h.clean_end() < 90:
                    assert h.engine.compact(TOPIC) >= 1
                    passes += 1
                    h.check_verified()
            assert (passes > 5) if tiny else (passes == 1), f"tiny map: {tiny}, passes: {passes}"
            results.append(h.records())
        finally:
            h.close()
    assert results[0] == results[1]
    assert len(results[0]) == 30


def test_reader_never_goes_back_or_misses_newest_value_while_compacting() -> None:
    h = Harness({"segment.records": "4"}, merge_min_segments=3)
    try:
        latest: dict[bytes, tuple[int, bytes]] = {}
        produced: dict[int, tuple[bytes, bytes]] = {}
        for i in range(240):
            k, v = f"key-{(i * 13) % 40}".encode(), f"v{i}".encode()
            h.produce([(k, v)])
            latest[k] = (i, v)
            produced[i] = (k, v)
        h.engine.flush()
        errors: list[BaseException] = []
        done = threading.Event()

        def cleaner() -> None:
            try:
                with tiny_key_map():
                    while h.clean_end() < 240:
                        h.engine.compact(TOPIC)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)
            finally:
                done.set()

        thread = threading.Thread(target=cleaner)
        thread.start()
        scans = 0
        while True:
            finished = done.is_set()
            scan_while_compacting(h, produced, latest, max_bytes=300)
            scans += 1
            if finished:
                break
        thread.join()
        assert not errors, errors
        assert h.engine.cleaner.stats.passes > 5
        assert [o for o, _k, _v in h.records()] == sorted(o for o, _v in latest.values())
        h.check_verified()
    finally:
        h.close()


def test_reader_interleaved_with_compaction_steps() -> None:
    h = Harness({"segment.records": "3"}, merge_min_segments=2)
    try:
        latest: dict[bytes, tuple[int, bytes]] = {}
        produced: dict[int, tuple[bytes, bytes]] = {}
        for i in range(60):
            k, v = f"key-{i % 7}".encode(), f"v{i}".encode()
            h.produce([(k, v)])
            latest[k], produced[i] = (i, v), (k, v)
        h.engine.flush()
        with tiny_key_map():
            # one read of at most one batch, then one compaction pass (and merges), and so on
            scan_while_compacting(h, produced, latest, max_bytes=1, between=lambda: h.engine.compact(TOPIC))
        assert h.engine.cleaner.stats.passes > 5 and h.engine.cleaner.stats.merges > 0
        h.check_verified()
    finally:
        h.close()


def scan_while_compacting(
    h: Harness,
    produced: dict[int, tuple[bytes, bytes]],
    latest: dict[bytes, tuple[int, bytes]],
    max_bytes: int,
    between: Callable[[], object] | None = None,
) -> None:
    """One consumer pass from the log start to the high watermark, checking each record."""
    info = h.engine.partition_info(TOPIC, 0)
    offset, seen = info.log_start_offset, {}
    while offset < info.high_watermark:
        data = b"".join(bytes(c) for c in h.engine.read(TOPIC, 0, offset, max_bytes).chunks)  # type: ignore[arg-type]
        assert data, f"empty read at {offset}"
        pos = 0
        while pos < len(data):
            hdr = peek_header(data, pos)
            for rec in iter_records(data, pos):
                if rec.offset >= offset:
                    assert produced[rec.offset] == (rec.key, rec.value), f"record at {rec.offset} changed"
                    seen[rec.key] = rec.offset
                    offset = rec.offset + 1
            assert hdr.last_offset + 1 >= offset, "offsets went backwards"
            offset = hdr.last_offset + 1
            pos += int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
        if between is not None:
            between()
    for k, (o, _v) in latest.items():
        assert seen.get(k) == o, f"the newest record of {k!r} (offset {o}) was not seen"
