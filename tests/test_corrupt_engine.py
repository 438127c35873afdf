"""Corruption found while running, in-process: the read check, the scrubber, read-only verify.

A real engine on a real data directory; damage is garbage bytes written into a sealed batch.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import loglake
from loglake.engine.types import FileRange
from loglake.engine.verify import verify_source
from loglake.engine.verify_live import LiveSource
from loglake.errors import CorruptBatchError
from loglake.kafka_errors import ErrorCode
from loglake.records.decode import iter_records
from loglake.segment.format import HEADER_SIZE, read_tail

TOPIC = "t"
SEALS = 3
BATCHES = 5  # per segment
RECORDS = 10  # per batch


@pytest.fixture
def log(tmp_path: Path) -> Iterator[loglake.Log]:
    opened = loglake.open(str(tmp_path / "data"), wal_shards=1)
    opened.create_topic(TOPIC, partitions=2)
    for _ in range(SEALS):
        for _b in range(BATCHES):
            for p in (0, 1):
                opened.produce_batch(TOPIC, [(b"k%d" % i, b"v" * 100) for i in range(RECORDS)], partition=p)
        opened.flush()  # one segment per partition per round
    yield opened
    opened.close()


def damage(log: loglake.Log, segment: int, batch: int) -> tuple[str, int]:
    """Garbage inside batch `batch` of partition 0's segment `segment`: (its path, first offset)."""
    engine = log.engine
    seg = engine.segments(TOPIC, 0)[segment]
    _t, index = read_tail(engine.log.stores.hot, seg.key)
    entry = index.entry(batch)
    path = engine.log.stores.hot.local_path(seg.key)
    assert path is not None
    with open(path, "r+b") as f:
        f.seek(entry.position + 70)
        f.write(b"\xee" * 16)
    return path, entry.base_offset


def offsets(chunks: list[object]) -> list[int]:
    data = b"".join(bytes(c) for c in chunks if not isinstance(c, FileRange))  # type: ignore[call-overload]
    out: list[int] = []
    pos = 0
    while pos < len(data):
        size = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
        out.extend(r.offset for r in iter_records(data, pos))
        pos += size
    return out


def test_a_read_stops_before_a_bad_batch_and_one_starting_there_fails(
    log: loglake.Log, caplog: pytest.LogCaptureFixture
) -> None:
    engine = log.engine
    per_segment = BATCHES * RECORDS
    path, bad = damage(log, 1, 2)
    assert bad == per_segment + 2 * RECORDS
    # From the segment's start: the good batches before the bad one.
    assert offsets(engine.read(TOPIC, 0, per_segment, 1 << 20).chunks) == list(range(per_segment, bad))
    fr = engine.read(TOPIC, 0, per_segment, 1 << 20, file_ranges=True).chunks
    assert len(fr) == 1 and isinstance(fr[0], FileRange) and fr[0].path == path
    with caplog.at_level(logging.ERROR, logger="loglake.engine.corrupt"):
        for _ in range(3):
            with pytest.raises(CorruptBatchError) as info:
                engine.read(TOPIC, 0, bad + 3, 1 << 20)
    exc = info.value
    assert (exc.topic, exc.partition, exc.batch_offset, exc.path) == (TOPIC, 0, bad, path)
    assert exc.kafka_code == ErrorCode.CORRUPT_MESSAGE and "CRC-32C" in exc.reason
    lines = [r.getMessage() for r in caplog.records if "corrupt data" in r.getMessage()]
    assert len(lines) == 1 and f"{TOPIC}-0 at offset {bad}" in lines[0] and path in lines[0]
    # Past the bad batch, the other partition, the other segments: all served.
    assert offsets(engine.read(TOPIC, 0, bad + RECORDS, 1 << 20).chunks)[0] == bad + RECORDS
    assert offsets(engine.read(TOPIC, 1, per_segment, 1 << 20).chunks) == list(range(per_segment, 2 * per_segment))
    assert offsets(engine.read(TOPIC, 0, 0, 1 << 20).chunks) == list(range(per_segment))
    c = engine.corruption
    assert c.partitions() == [(TOPIC, 0)] and c.found_total["read"] == 1 and c.reads_refused == 3
    assert c.readyz_lines() == [f"corrupt: {TOPIC}-0 offset {bad} segment {engine.segments(TOPIC, 0)[1].key}"]


def test_the_scrubber_finds_a_bad_segment_and_a_pass_over_good_data_finds_nothing(log: loglake.Log) -> None:
    scrubber = log.engine.scrubber
    assert scrubber is not None
    assert scrubber.run_pass() == 0
    assert scrubber.stats.segments_verified == 2 * SEALS and scrubber.stats.bytes_scrubbed > 0
    _path, bad = damage(log, 2, 4)
    assert scrubber.run_pass() == 1
    assert scrubber.stats.corruptions_found == 1 and scrubber.stats.repairs == 0  # no cold copy
    (mark,) = log.engine.corruption.marks()
    assert (mark.topic, mark.partition, mark.offset, mark.source) == (TOPIC, 0, bad, "scrub")
    with pytest.raises(CorruptBatchError):
        log.engine.read(TOPIC, 0, bad, 1 << 20)
    # Retention removes the bad segment: its mark goes with it.
    log.engine.delete_records(TOPIC, 0, -1)
    assert log.engine.corruption.marks() == [] and log.engine.corruption.readyz_lines() == []


def test_the_scrubber_finds_a_segment_forged_with_refixed_crcs_by_its_chain_hash(log: loglake.Log) -> None:
    """Every batch CRC, the data CRC and the trailer CRC made right again after the damage: only
    the SHA-256 chain hash can tell (the skip_chain_check canary's scrubber half)."""
    from test_verify import resign  # the forger of the verify tests

    engine = log.engine
    seg = engine.segments(TOPIC, 0)[1]
    path = engine.log.stores.hot.local_path(seg.key)
    assert path is not None
    data = bytearray(Path(path).read_bytes())
    data[HEADER_SIZE + 80] ^= 0x01  # inside the first batch's records
    Path(path).write_bytes(resign(bytes(data), recompute_chain=False))
    scrubber = engine.scrubber
    assert scrubber is not None
    assert scrubber.run_pass() == 1
    (mark,) = engine.corruption.marks()
    assert mark.key == seg.key and mark.source == "scrub" and "chain hash" in mark.detail


def _listing(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_verify_reads_an_open_data_dir_without_its_lock_and_skips_what_goes_away(log: loglake.Log) -> None:
    d = Path(log.engine.data_dir)
    before = _listing(d)
    report = verify_source(LiveSource(str(d)))
    assert report.ok and report.segments_checked == 2 * SEALS, report.errors
    assert _listing(d) == before  # nothing written, renamed or removed
    # The broker deletes two segments after verify read the metadata: they are skipped.
    source = LiveSource(str(d))
    log.engine.delete_records(TOPIC, 0, 2 * BATCHES * RECORDS)
    assert not any(os.path.exists(log.engine.log.stores.hot.local_path(s.key) or "") for s in source.segments(TOPIC, 0)[:2])
    report = verify_source(source)
    assert report.ok and report.segments_checked == 2 * SEALS - 2, report.errors
    damage(log, 0, 1)  # now partition 0's only segment
    report = verify_source(LiveSource(str(d)))
    assert not report.ok and report.bad_segments == [log.engine.segments(TOPIC, 0)[0].key]


def test_relocation_never_uploads_a_damaged_hot_copy(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    with loglake.open(str(tmp_path / "data"), wal_shards=1, cold_store_url=f"file://{bucket}") as opened:
        opened.create_topic(TOPIC, partitions=1, config={"hot.retain.segments": "100"})
        for _ in range(SEALS):
            opened.produce_batch(TOPIC, [(b"k", b"v" * 100) for _i in range(RECORDS)], partition=0)
            opened.flush()
        damage(opened, 1, 0)
        engine = opened.engine
        engine.alter_topic_config(TOPIC, {"hot.retain.segments": "0"})
        deadline = time.monotonic() + 60  # the maintenance thread relocates too; either may move them
        while [s.tier for s in engine.segments(TOPIC, 0)] != ["cold", "hot", "cold"] and time.monotonic() < deadline:
            engine.relocate_due()
        tiers = [s.tier for s in engine.segments(TOPIC, 0)]
        assert tiers == ["cold", "hot", "cold"]  # the damaged one stays hot, its only copy
        bad_key = engine.segments(TOPIC, 0)[1].key
        assert not (bucket / bad_key).exists()


def test_relocation_never_uploads_a_hot_copy_forged_with_refixed_crcs(tmp_path: Path) -> None:
    """The check before the upload includes the chain hash (the skip_chain_check canary's
    relocation half): a copy whose CRCs were all made right again stays hot."""
    from test_verify import resign

    bucket = tmp_path / "bucket"
    with loglake.open(str(tmp_path / "data"), wal_shards=1, cold_store_url=f"file://{bucket}") as opened:
        opened.create_topic(TOPIC, partitions=1, config={"hot.retain.segments": "100"})
        for _ in range(SEALS):
            opened.produce_batch(TOPIC, [(b"k", b"v" * 100) for _i in range(RECORDS)], partition=0)
            opened.flush()
        engine = opened.engine
        seg = engine.segments(TOPIC, 0)[1]
        path = engine.log.stores.hot.local_path(seg.key)
        assert path is not None
        data = bytearray(Path(path).read_bytes())
        data[HEADER_SIZE + 80] ^= 0x01
        Path(path).write_bytes(resign(bytes(data), recompute_chain=False))
        engine.alter_topic_config(TOPIC, {"hot.retain.segments": "0"})
        deadline = time.monotonic() + 60
        while [s.tier for s in engine.segments(TOPIC, 0)][::2] != ["cold", "cold"] and time.monotonic() < deadline:
            engine.relocate_due()  # until the two good ones have moved
        assert [s.tier for s in engine.segments(TOPIC, 0)] == ["cold", "hot", "cold"]
        assert not (bucket / seg.key).exists()


def test_a_segment_object_gone_from_under_the_metadata_is_an_error_not_out_of_range(log: loglake.Log) -> None:
    engine = log.engine
    seg = engine.segments(TOPIC, 0)[1]
    path = engine.log.stores.hot.local_path(seg.key)
    assert path is not None
    os.unlink(path)
    with pytest.raises(CorruptBatchError) as info:
        engine.read(TOPIC, 0, seg.base_offset, 1 << 20)
    assert "missing" in info.value.reason and info.value.kafka_code == ErrorCode.CORRUPT_MESSAGE
    assert engine.corruption.partitions() == [(TOPIC, 0)]
    assert offsets(engine.read(TOPIC, 0, 0, 1 << 20).chunks) == list(range(BATCHES * RECORDS))
