"""Checkpoints of the release before compaction (checkpoint version 1, 113-byte segment entries)
still open, and the data they name can be compacted.

`fixtures/checkpoint-v1-datadir.tar.gz` was written by release 5b958a9 after a clean shutdown:
topic `kv` (compact, 200 records over 10 keys, 4 sealed segments of 50) and topic `plain`
(2 partitions, 15 records each), with a checkpoint taken after the seals.
"""

from __future__ import annotations

import struct
import tarfile
from pathlib import Path

from loglake.engine.engine import open_engine
from loglake.engine.verify import verify_data_dir

from enginekit import read_all

FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint-v1-datadir.tar.gz"


def unpack(tmp_path: Path) -> Path:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "data"


def checkpoint_versions(data: Path) -> list[int]:
    return [struct.unpack_from("<H", p.read_bytes(), 4)[0] for p in sorted((data / "meta").glob("checkpoint-*.bin"))]


def test_a_version_1_checkpoint_opens_verifies_and_compacts(tmp_path: Path) -> None:
    data = unpack(tmp_path)
    assert checkpoint_versions(data)[-1] == 1
    engine = open_engine(str(data), cleaner_threads=0)
    try:
        assert [s.generation for s in engine.segments("kv", 0)] == [0, 0, 0, 0]
        assert all(s.link_hash == s.chain_hash for s in engine.segments("kv", 0))
        before = read_all(engine, "kv")[0]
        assert [v for _o, _k, v in before] == [b"v%d" % i for i in range(200)]
        assert {p: [v for _o, _k, v in recs] for p, recs in read_all(engine, "plain").items()} == {
            p: [b"p%d" % i for i in range(p, 30, 2)] for p in range(2)
        }
        assert verify_data_dir(engine).ok
        assert engine.compact("kv") == 1
        after = read_all(engine, "kv")[0]
        assert after == before[-10:]  # the newest value of each of the 10 keys, offsets kept
        assert verify_data_dir(engine).ok
        engine.checkpoint_metadata()
    finally:
        engine.close()
    assert checkpoint_versions(data)[-1] == 2
    engine = open_engine(str(data), cleaner_threads=0)
    try:
        assert read_all(engine, "kv")[0] == after
        assert [s.generation for s in engine.segments("kv", 0)] == [1]
        assert verify_data_dir(engine).ok
    finally:
        engine.close()
