"""A data directory written by the previous release (metadata format 1) opens, and verifies.

`fixtures/v1-datadir.tar.gz` was written by release c450c6a (whole-snapshot metadata) and left
without a clean shutdown: two topics, sealed segments, three `audit` records only in the WAL, a
consumer group's offsets in the snapshot's "groups" key, one producer id handed out.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import loglake
from loglake.broker.groups.meta_store import MetaGroupLog
from loglake.engine.verify import verify_data_dir

FIXTURE = Path(__file__).parent / "fixtures" / "v1-datadir.tar.gz"
LOGLAKE_BIN = Path(sys.executable).parent / "loglake"


def unpack(tmp_path: Path) -> Path:
    target = tmp_path / "data"
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(target, filter="data")
    return target


def test_a_release_1_data_dir_opens_with_everything_it_held(tmp_path: Path) -> None:
    data = unpack(tmp_path)
    assert list((data / "meta").glob("snapshot-*.bin"))
    with loglake.open(str(data)) as log:
        report = log.recovery_report
        assert report is not None and report.meta_migrated_from is not None
        orders = {p: [r.value for r in log.consume("orders", partitions=[p])] for p in range(2)}
        assert orders == {p: [f"order-{i}".encode() for i in range(p, 50, 2)] for p in range(2)}
        audit = [r.value for r in log.consume("audit")]
        assert audit == [f"audit-{i}".encode() for i in range(5)] + [f"unsealed-{i}".encode() for i in range(3)]
        assert log.engine.topic("orders").config.segment_records == 10
        groups = MetaGroupLog(log.engine.meta).group_metadata()
        assert groups["billing"]["offsets"] == {
            ("orders", 0): [12, -1, "m", 1_700_000_000_500],
            ("orders", 1): [7, 3, "", 1_700_000_000_600],
        }
        assert log.engine.allocate_producer_id() == 1001  # 1000 was handed out by the old release
        assert not verify_data_dir(log.engine).errors
    assert not list((data / "meta").glob("snapshot-*.bin"))  # migrated: the checkpoint replaces them
    assert not list((data / "segments").glob("loglake-*/meta.json"))  # the stores' copy is incremental now
    assert list((data / "segments").glob("loglake-*/meta/checkpoint-*.bin"))
    # A second open starts from the checkpoint and the log; nothing changes.
    with loglake.open(str(data)) as log:
        assert log.recovery_report is not None and log.recovery_report.meta_migrated_from is None
        assert [r.value for r in log.consume("audit")][-1] == b"unsealed-2"
        assert MetaGroupLog(log.engine.meta).group_metadata()["billing"]["offsets"][("orders", 1)][0] == 7


def test_loglake_verify_passes_on_a_release_1_data_dir(tmp_path: Path) -> None:
    data = unpack(tmp_path)
    result = subprocess.run([str(LOGLAKE_BIN), "verify", "--data-dir", str(data)], capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    assert b"verify ok" in result.stdout
