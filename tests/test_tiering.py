"""Hot/cold tiering: relocation, cold reads (GET counts, caches), crash points, faults, recovery."""

from __future__ import annotations

import dataclasses
import errno
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

import loglake
from loglake.broker.groups.meta_store import MetaGroupLog
from loglake.engine import Engine
from loglake.engine.verify import verify_data_dir
from loglake.errors import StorageError
from loglake.fs import OsFileSystem
from loglake.fs.faulty import FaultyFileSystem, SimulatedCrash
from loglake.store.base import BytesLike
from loglake.store.local import LocalStore
from loglake.store.memory import MemoryStore

from enginekit import DATA_DIR, abandon, read_all, small_config

TOPIC_CONFIG = {"segment.bytes": "4096", "hot.retain.segments": "1"}


def fill(engine: Engine, topic: str, count: int, size: int = 300) -> list[bytes]:
    values = [f"{i:06d}".encode() * (size // 6) for i in range(count)]
    for v in values:
        engine.append_records(topic, 0, [(int(time.time() * 1000), None, v, [])]).result()
    engine.flush()
    return values


def values_of(engine: Engine, topic: str) -> list[bytes | None]:
    return [v for _o, _k, v in read_all(engine, topic)[0]]


def test_relocation_moves_all_but_the_newest_segments(tmp_path: Path) -> None:
    cold = MemoryStore()
    engine = Engine(str(tmp_path / "d"), small_config(), cold_store=cold, start_background=False)
    engine.open()
    try:
        engine.create_topic("t", 1, TOPIC_CONFIG)
        values = fill(engine, "t", 60)
        segments = engine.segments("t", 0)
        assert len(segments) > 3
        assert engine.relocate_due() == len(segments) - 1
        tiers = [s.tier for s in engine.segments("t", 0)]
        assert tiers == ["cold"] * (len(segments) - 1) + ["hot"]
        for seg in engine.segments("t", 0)[:-1]:
            assert engine.log.stores.hot.head(seg.key) is None  # the hot copy is gone
            assert cold.head(seg.key) == seg.size
        assert values_of(engine, "t") == values
        assert not verify_data_dir(engine).errors
    finally:
        abandon(engine)


def test_a_cold_fetch_costs_at_most_two_gets_and_one_once_the_footer_is_cached(tmp_path: Path) -> None:
    cold = MemoryStore()
    engine = Engine(
        str(tmp_path / "d"), small_config(cold_read_ahead_segments=0), cold_store=cold, start_background=False
    )
    engine.open()
    try:
        engine.create_topic("t", 1, TOPIC_CONFIG)
        fill(engine, "t", 60)
        engine.relocate_due()
        engine.close()
    finally:
        abandon(engine)
    # A fresh engine: no footer cached yet.
    engine = Engine(
        str(tmp_path / "d"), small_config(cold_read_ahead_segments=0), cold_store=cold, start_background=False
    )
    engine.open()
    try:
        first_cold = engine.segments("t", 0)[0]
        assert first_cold.tier == "cold"
        cold.calls.clear()
        engine.read("t", 0, first_cold.base_offset, 1000)
        gets = cold.calls["get_range"] + cold.calls["get_tail"] + cold.calls["get"]
        assert gets <= 2, cold.calls
        cold.calls.clear()
        engine.read("t", 0, first_cold.base_offset + 2, 1000)
        gets = cold.calls["get_range"] + cold.calls["get_tail"] + cold.calls["get"]
        assert gets <= 1, cold.calls
    finally:
        abandon(engine)


def test_read_ahead_serves_sequential_readers_from_cache(tmp_path: Path) -> None:
    cold = MemoryStore()
    engine = Engine(str(tmp_path / "d"), small_config(), cold_store=cold, start_background=False)
    engine.open()
    try:
        engine.create_topic("t", 1, {"segment.bytes": "65536", "hot.retain.segments": "0"})
        fill(engine, "t", 200)
        engine.relocate_due()
        assert engine.cold_reader is not None
        for offset in range(0, 30, 5):  # small sequential fetches (each returns ~6 batches)
            engine.read("t", 0, offset, 2000)
            time.sleep(0.05)  # let the read-ahead land
        assert engine.cold_reader.ranges.hits > 0
    finally:
        abandon(engine)


def test_upload_failures_keep_the_segment_hot_and_retry_later(tmp_path: Path) -> None:
    cold = MemoryStore()
    engine = Engine(str(tmp_path / "d"), small_config(), cold_store=cold, start_background=False)
    engine.open()
    try:
        engine.create_topic("t", 1, TOPIC_CONFIG)
        values = fill(engine, "t", 40)
        cold.fail("put", StorageError("put", "x", "503 Slow Down", retriable=True), times=1000)
        assert engine.relocate_due() == 0
        assert all(s.tier == "hot" for s in engine.segments("t", 0))
        # Producers are not affected by a failing bucket.
        more = fill(engine, "t", 10)
        cold._faults.clear()  # the bucket is back
        assert engine.relocate_due() > 0
        assert values_of(engine, "t") == values + more
    finally:
        abandon(engine)


class ShortUploads(MemoryStore):
    """A bucket that keeps all but the last byte of every upload (and says nothing)."""

    def put(self, key: str, parts: Sequence[BytesLike]) -> None:
        data = b"".join(bytes(p) for p in parts)
        super().put(key, [data[:-1]])


def test_a_cold_copy_that_fails_verification_keeps_the_segment_hot_and_readable(tmp_path: Path) -> None:
    """Step 2 (verify the cold copy) fails: no switch, and the hot copy, still the only good one,
    stays (the delete_hot_before_cold_verified canary deletes it first)."""
    cold = ShortUploads()
    engine = Engine(str(tmp_path / "d"), small_config(), cold_store=cold, start_background=False)
    engine.open()
    try:
        engine.create_topic("t", 1, TOPIC_CONFIG)
        values = fill(engine, "t", 40)
        assert engine.relocate_due() == 0
        segments = engine.segments("t", 0)
        assert len(segments) > 1 and all(s.tier == "hot" for s in segments)
        assert all(engine.log.stores.hot.head(s.key) == s.size for s in segments)
        assert values_of(engine, "t") == values
    finally:
        abandon(engine)


# ---- crash points over relocation ---------------------------------------------------------------


def relocation_workload(fs: FaultyFileSystem) -> tuple[set[tuple[int, bytes]], set[bytes]]:
    acked: set[tuple[int, bytes]] = set()
    written: set[bytes] = set()
    cold = LocalStore("/cold", fs)
    engine = Engine(DATA_DIR, small_config(), fs=fs, cold_store=cold, start_background=False)
    try:
        fs.makedirs("/cold")
        engine.open()
        engine.create_topic("t", 1, {"segment.bytes": "2048", "hot.retain.segments": "1"})
        for i in range(12):
            value = f"v{i:03d}-".encode() * 60
            written.add(value)
            r = engine.append_records("t", 0, [(i, None, value, [])]).result()
            acked.add((r.base_offset, value))
            if i % 3 == 2:
                engine.flush()
                engine.relocate_due()
        engine.close()
    except (SimulatedCrash, Exception):
        abandon(engine)
    return acked, written


def _relocation_calls() -> int:
    fs = FaultyFileSystem(seed=1)
    acked, _ = relocation_workload(fs)
    assert len(acked) == 12
    return fs.mutating_calls


RELOCATION_CALLS = _relocation_calls()


@pytest.mark.parametrize("torn", [False, True], ids=["clean", "torn"])
def test_crash_at_every_step_of_relocation_loses_no_segment(torn: bool) -> None:
    for k in range(1, RELOCATION_CALLS + 1):
        fs = FaultyFileSystem(seed=k, crash_after=k)
        acked, written = relocation_workload(fs)
        after = fs.crash(torn=torn)
        engine = Engine(DATA_DIR, small_config(), fs=after, cold_store=LocalStore("/cold", after), start_background=False)
        engine.open()
        try:
            state = read_all(engine, "t") if engine.has_topic("t") else {0: []}
            recovered = {(o, v) for o, _k, v in state[0]}
            assert acked <= recovered, f"k={k}: acknowledged records lost"
            assert [o for o, _v in sorted(recovered)] == list(range(len(recovered)))
            assert all(v in written for _o, v in recovered)
            # Exactly one authoritative copy: the tier the metadata names holds every segment.
            for seg in engine.segments("t", 0) if engine.has_topic("t") else []:
                assert engine.log.stores.store_for(seg).head(seg.key) == seg.size, f"k={k}: {seg.key} missing from its tier"
                if seg.tier == "cold":
                    assert engine.log.stores.hot.head(seg.key) is None, f"k={k}: leftover hot copy of {seg.key}"
        finally:
            abandon(engine)


# ---- disaster recovery ---------------------------------------------------------------------------


def test_empty_data_dir_is_rebuilt_from_the_cold_store(tmp_path: Path) -> None:
    cold_dir = tmp_path / "bucket"
    url = f"file://{cold_dir}"
    with loglake.open(str(tmp_path / "a"), cold_store=url) as log:
        log.create_topic("t", 2, {"segment.bytes": "4096", "hot.retain.segments": "0", "retention.ms": "-1"})
        produced = {p: [f"p{p}-{i}".encode() * 20 for i in range(50)] for p in range(2)}
        for p, vals in produced.items():
            for v in vals:
                log.produce("t", v, partition=p, timestamp=1_000)
        MetaGroupLog(log.engine.meta).commit_group_offsets("g", [("t", 0, 7, -1, "m", 1_000)]).result()
        MetaGroupLog(log.engine.meta).save_group_state("g", {"generation": 3}).result()
        log.flush()
        assert log.engine.wait_relocations()
        log.flush()  # publishes the metadata's changes with every segment cold
    # The disk is lost: a new, empty data directory pointed at the same bucket.
    with loglake.open(str(tmp_path / "b"), cold_store=url) as log:
        report = log.recovery_report
        assert report is not None and report.restored_from == url and not report.segments_lost
        got = {p: [r.value for r in log.consume("t", partitions=[p])] for p in range(2)}
        assert got == produced
        assert MetaGroupLog(log.engine.meta).group_metadata() == {"g": {"offsets": {("t", 0): [7, -1, "m", 1_000]}, "state": {"generation": 3}}}
        assert not verify_data_dir(log.engine).errors


def test_disaster_recovery_reports_segments_that_never_reached_the_bucket(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'bucket'}"
    with loglake.open(str(tmp_path / "a"), cold_store=url) as log:
        log.create_topic("t", 1, {"segment.bytes": "4096", "hot.retain.segments": "2", "retention.ms": "-1"})
        for i in range(80):
            log.produce("t", f"{i}".encode() * 100, timestamp=1_000)
        log.flush()
        assert log.engine.wait_relocations()
        log.flush()
        hot = [s.key for s in log.engine.segments("t", 0) if s.tier == "hot"]
        last_cold = [s for s in log.engine.segments("t", 0) if s.tier == "cold"][-1]
    with loglake.open(str(tmp_path / "b"), cold_store=url) as log:
        report = log.recovery_report
        assert report is not None and sorted(report.segments_lost) == sorted(hot)
        assert log.engine.partition_info("t", 0).high_watermark == last_cold.end_offset
        assert [r.offset for r in log.consume("t")] == list(range(last_cold.end_offset))


def test_verify_walks_the_cold_store_too(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'bucket'}"
    with loglake.open(str(tmp_path / "a"), cold_store=url) as log:
        log.create_topic("t", 1, {"segment.bytes": "4096", "hot.retain.segments": "0", "retention.ms": "-1"})
        for _ in range(40):
            log.produce("t", b"x" * 200, timestamp=1_000)
        log.flush()
        assert log.engine.wait_relocations()
        victim = log.engine.segments("t", 0)[1]
    path = LocalStore(str(tmp_path / "bucket"), OsFileSystem()).local_path(victim.key)
    assert path is not None
    with open(path, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    with loglake.open(str(tmp_path / "a"), cold_store=url) as log:
        report = verify_data_dir(log.engine)
        assert report.errors and report.errors[0].key == victim.key


def test_full_disk_while_relocating_is_retried(tmp_path: Path) -> None:
    fs = FaultyFileSystem(seed=3)
    fs.makedirs("/cold")
    engine = Engine(DATA_DIR, small_config(), fs=fs, cold_store=LocalStore("/cold", fs), start_background=False)
    engine.open()
    try:
        engine.create_topic("t", 1, TOPIC_CONFIG)
        for i in range(30):
            engine.append_records("t", 0, [(i, None, b"z" * 300, [])]).result()
        engine.flush()
        fs.fail_after(1, lambda: OSError(errno.ENOSPC, "No space left on device"))
        engine.relocate_due()  # the first upload fails; the rest go through
        assert engine.relocate_due() >= 0
        assert [s.tier for s in engine.segments("t", 0)][-1] == "hot"
        assert all(s.tier == "cold" for s in engine.segments("t", 0)[:-1])
        assert len(read_all(engine, "t")[0]) == 30
    finally:
        abandon(engine)


def test_a_second_relocation_of_a_segment_already_switched_keeps_the_cold_copy(tmp_path: Path) -> None:
    """Two relocations of one segment (the pool's, and close()'s relocate_due) overlapping: the
    one that finds the segment already cold must not delete the cold object (it is the only copy)."""
    cold = MemoryStore()
    engine = Engine(str(tmp_path / "d"), small_config(), cold_store=cold, start_background=False)
    engine.open()
    try:
        engine.create_topic("t", 1, TOPIC_CONFIG)
        values = fill(engine, "t", 60)
        seg = engine.segments("t", 0)[0]
        stale = dataclasses.replace(seg)  # the second relocation's view: still hot
        hot_bytes = engine.log.stores.hot.get(seg.key)
        p = engine.catalog.partition("t", 0)
        relocator = engine.log.parts.relocator
        assert relocator is not None
        relocator.relocate(p, seg)  # the first one switches it to cold and deletes the hot copy
        assert engine.segments("t", 0)[0].tier == "cold"
        engine.log.stores.hot.put(seg.key, [hot_bytes])  # the second one read the hot copy before that
        relocator.relocate(p, stale)
        assert cold.head(seg.key) == seg.size  # the authoritative copy is still there
        assert values_of(engine, "t") == values
    finally:
        abandon(engine)
