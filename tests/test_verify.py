"""verify_data_dir and `loglake verify`: healthy data, flipped bytes, forged CRCs and chains."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pytest
from typer.testing import CliRunner

import loglake
from loglake.cli.main import app
from loglake.engine.verify import VerifyReport, verify_data_dir
from loglake.segment.format import HEADER_SIZE, TRAILER, TRAILER_CRC_OFFSET, TRAILER_SIZE, read_tail
from loglake.store.base import parse_segment_key

TOPIC = "events"
PARTITIONS = 2
SEALS = 4  # segments per partition


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The CLI's --log-level configures the root logger; undo that after each test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A data directory with SEALS sealed segments in each of PARTITIONS partitions."""
    d = tmp_path / "data"
    with loglake.open(str(d), wal_shards=1) as log:
        log.create_topic(TOPIC, partitions=PARTITIONS)
        for round_ in range(SEALS):
            for p in range(PARTITIONS):
                records = [(f"k{i}".encode(), f"round {round_} value {i} ".encode() * 3) for i in range(50)]
                log.produce_batch(TOPIC, records, partition=p)
            log.flush()  # seals what is buffered: one segment per partition per round
    return d


def segment_keys(data_dir: Path, partition: int) -> list[str]:
    root = data_dir / "segments"
    keys = sorted(str(p.relative_to(root)).replace(os.sep, "/") for p in root.rglob("*.seg"))
    return [k for k in keys if parse_segment_key(k).partition == partition]


def segment_path(data_dir: Path, key: str) -> Path:
    return data_dir / "segments" / key


def run_verify(data_dir: Path) -> VerifyReport:
    seen: list[tuple[int, int]] = []
    with loglake.open(str(data_dir), wal_shards=1) as log:
        report = verify_data_dir(log.engine, lambda done, total: seen.append((done, total)))
    if seen:
        assert all(done <= total for done, total in seen)
        assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    return report


def resign(data: bytes, *, recompute_chain: bool) -> bytes:
    """Forge a segment after editing its batch bytes: fix every batch CRC, the data CRC and the
    trailer CRC, and optionally the segment's own chain hash (prev_hash is left alone)."""
    buf = bytearray(data)
    fields = list(TRAILER.unpack_from(buf, len(buf) - TRAILER_SIZE))
    index_position, prev_hash = fields[5], fields[8]
    pos = HEADER_SIZE
    while pos < index_position:
        size = struct.unpack_from(">i", buf, pos + 8)[0] + 12
        struct.pack_into(">I", buf, pos + 17, crc32c.crc32c(bytes(buf[pos + 21 : pos + size])))
        pos += size
    fields[7] = crc32c.crc32c(bytes(buf[:index_position]))  # data CRC: header + data
    if recompute_chain:
        fields[9] = hashlib.sha256(prev_hash + bytes(buf[HEADER_SIZE:index_position])).digest()
    trailer_at = len(buf) - TRAILER_SIZE
    buf[trailer_at:] = TRAILER.pack(*fields)
    fields[10] = crc32c.crc32c(bytes(buf[index_position : trailer_at + TRAILER_CRC_OFFSET]))
    buf[trailer_at:] = TRAILER.pack(*fields)
    return bytes(buf)


def tamper(path: Path) -> tuple[bytes, int]:
    """Flip one byte inside the first batch's records; returns the new bytes and the batch start."""
    data = bytearray(path.read_bytes())
    target = HEADER_SIZE + 80  # past the 61-byte batch header: inside record bytes
    data[target] ^= 0x01
    return bytes(data), HEADER_SIZE


# ---- healthy ---------------------------------------------------------------------------------------


def test_healthy_data_dir_verifies(data_dir: Path) -> None:
    report = run_verify(data_dir)
    assert report.ok and report.first_error is None and report.errors == []
    assert report.partitions == PARTITIONS
    assert report.segments_checked == PARTITIONS * SEALS
    on_disk = sum(p.stat().st_size for p in (data_dir / "segments").rglob("*.seg"))
    assert report.bytes_checked == on_disk
    assert report.unreferenced == []
    payload = report.to_json()
    assert payload["ok"] is True and payload["first_error"] is None


def test_progress_reaches_total(data_dir: Path) -> None:
    seen: list[tuple[int, int]] = []
    with loglake.open(str(data_dir), wal_shards=1) as log:
        verify_data_dir(log.engine, lambda done, total: seen.append((done, total)))
    total = sum(p.stat().st_size for p in (data_dir / "segments").rglob("*.seg"))
    assert seen[0] == (0, total)
    assert seen[-1] == (total, total)


def test_empty_data_dir_verifies(tmp_path: Path) -> None:
    with loglake.open(str(tmp_path / "d"), wal_shards=1) as log:
        log.create_topic("empty", partitions=3)
        report = verify_data_dir(log.engine)
    assert report.ok and report.segments_checked == 0 and report.partitions == 3


# ---- a flipped byte --------------------------------------------------------------------------------


def test_flipped_byte_is_reported_with_segment_and_offset(data_dir: Path) -> None:
    key = segment_keys(data_dir, 1)[1]
    path = segment_path(data_dir, key)
    data, batch_at = tamper(path)
    path.write_bytes(data)

    report = run_verify(data_dir)
    assert not report.ok
    first = report.first_error
    assert first is not None
    assert first.key == key
    assert first.offset == batch_at + 17  # the CRC field of the batch holding the flipped byte
    assert "CRC" in first.detail
    assert report.bad_segments == [key]
    assert report.segments_checked == PARTITIONS * SEALS  # the walk went on past the bad one

    result = CliRunner().invoke(app, ["verify", "--data-dir", str(data_dir)])
    assert result.exit_code == 1
    assert key in result.stderr
    assert f"byte {batch_at + 17}" in result.stderr
    assert "Traceback" not in result.output

    result = CliRunner().invoke(app, ["verify", "--json", "--data-dir", str(data_dir)])
    assert result.exit_code == 1
    payload = json.loads(result.stdout)
    assert payload["ok"] is False
    assert payload["first_error"]["key"] == key
    assert payload["first_error"]["offset"] == batch_at + 17


def test_flipped_trailer_byte_is_reported(data_dir: Path) -> None:
    key = segment_keys(data_dir, 0)[-1]
    path = segment_path(data_dir, key)
    data = bytearray(path.read_bytes())
    data[len(data) - TRAILER_SIZE + 20] ^= 0x80  # max_timestamp field: covered by trailer_crc
    path.write_bytes(bytes(data))
    report = run_verify(data_dir)
    assert report.first_error is not None and report.first_error.key == key
    assert "trailer CRC" in report.first_error.detail


# ---- forged CRCs: the hash chain catches it ------------------------------------------------------


def test_refixed_crcs_are_caught_by_the_chain_hash(data_dir: Path) -> None:
    key = segment_keys(data_dir, 0)[1]
    path = segment_path(data_dir, key)
    data, _ = tamper(path)
    path.write_bytes(resign(data, recompute_chain=False))

    report = run_verify(data_dir)
    assert report.first_error is not None
    assert report.first_error.key == key
    assert "chain hash" in report.first_error.detail
    assert report.bad_segments == [key]


def test_recomputed_chain_hash_breaks_the_link_to_the_next_segment(data_dir: Path) -> None:
    keys = segment_keys(data_dir, 0)
    key, next_key = keys[1], keys[2]
    path = segment_path(data_dir, key)
    data, _ = tamper(path)
    forged = resign(data, recompute_chain=True)
    path.write_bytes(forged)

    report = run_verify(data_dir)
    assert not report.ok
    # The forged segment is self-consistent, but the metadata recorded another chain hash ...
    assert report.first_error is not None and report.first_error.key == key
    assert "chain_hash" in report.first_error.detail
    # ... and the next segment's prev_hash no longer links to it.
    assert any(e.key == next_key and "hash chain broken" in e.detail for e in report.errors)

    result = CliRunner().invoke(app, ["verify", "--data-dir", str(data_dir)])
    assert result.exit_code == 1
    assert key in result.stderr and next_key in result.stderr


def test_forged_last_segment_is_caught_by_the_metadata(data_dir: Path) -> None:
    key = segment_keys(data_dir, 1)[-1]
    path = segment_path(data_dir, key)
    data, _ = tamper(path)
    path.write_bytes(resign(data, recompute_chain=True))
    report = run_verify(data_dir)
    assert report.bad_segments == [key]
    assert report.first_error is not None and "chain_hash" in report.first_error.detail


def test_chain_of_a_forged_segment_with_a_rewritten_successor(data_dir: Path) -> None:
    """Forge segment 1 and re-link segment 2 to it (fixing 2's prev_hash and CRCs too): the
    segment after that (3) and the metadata still disagree."""
    keys = segment_keys(data_dir, 0)
    p1, p2 = segment_path(data_dir, keys[1]), segment_path(data_dir, keys[2])
    data, _ = tamper(p1)
    forged1 = resign(data, recompute_chain=True)
    p1.write_bytes(forged1)
    t1 = TRAILER.unpack_from(forged1, len(forged1) - TRAILER_SIZE)
    buf = bytearray(p2.read_bytes())
    fields = list(TRAILER.unpack_from(buf, len(buf) - TRAILER_SIZE))
    fields[8] = t1[9]  # prev_hash := the forged chain hash
    buf[len(buf) - TRAILER_SIZE :] = TRAILER.pack(*fields)
    p2.write_bytes(resign(bytes(buf), recompute_chain=True))

    report = run_verify(data_dir)
    assert {keys[1], keys[2], keys[3]} <= set(report.bad_segments)


def test_missing_segment_fails_open_naming_it(data_dir: Path) -> None:
    key = segment_keys(data_dir, 1)[0]
    segment_path(data_dir, key).unlink()
    result = CliRunner().invoke(app, ["verify", "--data-dir", str(data_dir)])
    assert result.exit_code == 1
    assert key in result.stderr and "missing" in result.stderr


def test_read_tail_still_works_after_data_flip(data_dir: Path) -> None:
    """The verifier follows the chain past a segment with bad data (its tail is intact)."""
    keys = segment_keys(data_dir, 0)
    path = segment_path(data_dir, keys[0])
    data, _ = tamper(path)
    path.write_bytes(data)
    report = run_verify(data_dir)
    assert report.bad_segments == [keys[0]]  # no spurious chain errors on the segments after it
    with loglake.open(str(data_dir), wal_shards=1) as log:
        trailer, _ = read_tail(log.engine.log.stores.hot, keys[0])
    assert trailer.base_offset == 0
