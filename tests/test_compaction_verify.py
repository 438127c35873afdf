"""What `verify` says about rewritten segments: damage anywhere in one is found; a cleaner that
broke compaction's rules (a key twice below the clean end) is found; an empty rewritten
segment (everything in its range cleaned away) reads and verifies."""

from __future__ import annotations

from pathlib import Path

import pytest

import loglake.engine.compaction as compaction
from loglake.engine import Engine, EngineConfig
from loglake.engine.verify import verify_data_dir
from loglake.records.batch import peek_header

from enginekit import read_all


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def engine_at(path: Path, clock: Clock | None = None, **options: object) -> Engine:
    config = EngineConfig(cleaner_threads=0, merge_min_segments=0, wal_shards=1, **options)  # type: ignore[arg-type]
    engine = Engine(str(path), config, clock=clock or Clock())
    engine.open()
    return engine


def fill(engine: Engine, topic: str = "kv", keys: int = 5, rounds: int = 20, tombstones: bool = False) -> None:
    engine.create_topic(topic, 1, {"cleanup.policy": "compact", "segment.records": "25", "delete.retention.ms": "1000"})
    for r in range(rounds):
        for k in range(keys):
            value = None if tombstones and r == rounds - 1 else b"v%d-%d" % (k, r)
            engine.append_records(topic, 0, [(None, b"k%d" % k, value, [])]).result()
    engine.flush()


def rewritten_path(engine: Engine, data: Path) -> Path:
    seg = engine.segments("kv", 0)[0]
    assert seg.rewritten
    return data / "segments" / seg.key


@pytest.mark.parametrize("where", ["data", "provenance", "link_hash"])
def test_damage_in_a_rewritten_segment_is_found(tmp_path: Path, where: str) -> None:
    engine = engine_at(tmp_path)
    try:
        fill(engine)
        assert engine.compact("kv") == 1
        assert verify_data_dir(engine).ok
        path = rewritten_path(engine, tmp_path)
        raw = bytearray(path.read_bytes())
        trailer_at = len(raw) - 172
        at = {"data": 32 + 70, "provenance": trailer_at - 5, "link_hash": trailer_at + 130}[where]
        raw[at] ^= 0x01
        path.write_bytes(bytes(raw))
        engine.log.reader.indexes.forget(engine.segments("kv", 0)[0].key)
        report = verify_data_dir(engine)
        assert not report.ok
        assert report.errors[0].key == engine.segments("kv", 0)[0].key
    finally:
        engine.close()


def test_a_cleaner_that_keeps_superseded_records_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = engine_at(tmp_path, cleaner_process=False)  # the broken filter is patched into this process
    try:
        fill(engine)
        real = compaction.record_filter

        def keep_all(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
            real(*args, **kwargs)
            return lambda batch: batch  # a broken cleaner: drops nothing, still records its clean end

        monkeypatch.setattr("loglake.engine.cleaner_job.record_filter", keep_all)
        assert engine.compact("kv") == 1
        report = verify_data_dir(engine)
        assert not report.ok
        assert "appears at offsets" in report.errors[0].detail and "below the clean end" in report.errors[0].detail
    finally:
        engine.close()


def test_a_segment_cleaned_empty_reads_and_verifies(tmp_path: Path) -> None:
    clock = Clock()
    engine = engine_at(tmp_path, clock)
    try:
        fill(engine, tombstones=True)  # the last round deletes every key
        engine.create_topic("other", 1)
        assert engine.compact("kv") == 1  # first pass: tombstones kept
        assert [v for _o, _k, v in read_all(engine, "kv")[0]] == [None] * 5
        clock.now += 2  # past delete.retention.ms (1 s) since the cleaner passed them
        assert engine.compact("kv") == 1
        segments = engine.segments("kv", 0)
        assert len(segments) == 1 and segments[0].record_count == 0
        assert segments[0].base_offset == 0 and segments[0].last_offset == 99  # it still covers the range
        assert read_all(engine, "kv")[0] == []
        # the log's last batch stays as an empty batch, so a consumer at 0 steps to 100
        (chunk,) = engine.read("kv", 0, 0, 1 << 20).chunks
        header = peek_header(bytes(chunk))  # type: ignore[arg-type]
        assert (header.record_count, header.last_offset) == (0, 99)
        engine.append_records("kv", 0, [(None, b"k9", b"after", [])]).result()
        assert read_all(engine, "kv")[0] == [(100, b"k9", b"after")]
        assert verify_data_dir(engine).ok
    finally:
        engine.close()
    engine = engine_at(tmp_path, clock)
    try:
        assert read_all(engine, "kv")[0] == [(100, b"k9", b"after")]
        assert verify_data_dir(engine).ok
    finally:
        engine.close()
