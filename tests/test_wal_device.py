"""The WAL on a filesystem of its own: `<data-dir>/wal` a mount point (a small tmpfs here) under a
data directory on the machine's disk. The free-space reserve is kept on both filesystems (produce
is refused when the WAL's runs low, with that path named, and resumes by itself), every
acknowledged record comes back after a restart, and the start-up space check counts the WAL
files against the WAL's filesystem."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import loglake
from fskit import mounted_tmpfs
from loglake.cli.startup import EXIT_NO_SPACE, check_space
from loglake.errors import StorageFullError

MIB = 1024 * 1024
WAL_FS_BYTES = 16 * MIB
RESERVE = 4 * MIB


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A data directory whose `wal` is a tmpfs of WAL_FS_BYTES."""
    data = tmp_path / "data"
    wal = data / "wal"
    wal.mkdir(parents=True)
    with mounted_tmpfs(wal, f"size={WAL_FS_BYTES // MIB}m", "a WAL filesystem of its own"):
        yield data


def open_log(data: Path) -> loglake.Log:
    return loglake.open(
        str(data),
        wal_shards=1,
        wal_file_bytes=1 * MIB,
        storage_min_free_bytes=RESERVE,
        storage_min_free_percent=0.0,
        storage_space_check_interval_ms=10,
    )


def produced(log: loglake.Log, value: bytes) -> int | None:
    try:
        return log.produce("t", value).offset
    except StorageFullError:
        return None


def test_reserve_is_kept_on_the_wal_filesystem_and_records_survive_a_restart(data_dir: Path) -> None:
    wal = data_dir / "wal"
    assert os.stat(wal).st_dev != os.stat(data_dir).st_dev
    log = open_log(data_dir)
    acked: dict[int, bytes] = {}
    try:
        for i in range(20):
            acked[log.produce("t", b"before-%d" % i).offset] = b"before-%d" % i
        assert any(name.startswith("shard-") for name in os.listdir(wal))  # the WAL lives on the tmpfs
        # Fill the WAL's filesystem to below the reserve; the data directory's has plenty.
        st = os.statvfs(wal)
        filler = wal / "filler"
        filler.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - RESERVE // 2))
        time.sleep(0.05)
        with pytest.raises(StorageFullError) as info:
            for _ in range(100):  # the next reading comes within the check interval
                log.produce("t", b"refused")
                time.sleep(0.01)
        # what the WAL owes (its next file) counts on top of the reserve, named when not ~0
        owed = r"( \+ [\d.]+ MiB owed to seals and new WAL files)?"
        assert re.search(rf"free on {re.escape(str(wal))} < reserve 4\.0 MiB{owed}; produce refused", str(info.value))
        assert log.engine.space.path == str(wal)
        filler.unlink()
        deadline = time.monotonic() + 15
        offset = produced(log, b"after")
        while offset is None and time.monotonic() < deadline:
            time.sleep(0.02)
            offset = produced(log, b"after")
        assert offset is not None, "produce did not resume once the WAL's filesystem had room again"
        acked[offset] = b"after"
        assert sorted(acked) == list(range(21))  # nothing refused took an offset
    finally:
        log.close()
    log = open_log(data_dir)
    try:
        got = {m.offset: m.value for m in log.consume("t", "earliest")}
        assert got == acked
    finally:
        log.close()


def test_startup_counts_the_wal_files_against_the_wal_filesystem(data_dir: Path) -> None:
    (data_dir / "meta").mkdir()  # an existing data directory: a warning, not a refusal...
    assert check_space(str(data_dir), 2, 64 * MIB, 4 * MIB) is None
    (data_dir / "meta").rmdir()  # ...a new one is refused, naming the WAL's filesystem
    failure = check_space(str(data_dir), 2, 64 * MIB, 4 * MIB)
    assert failure is not None and failure.exit_code == EXIT_NO_SPACE
    assert f"free on the filesystem of {data_dir / 'wal'}" in failure.message
    assert "2 WAL file(s) of 64 MiB" in failure.message and "metadata log" not in failure.message
    # WAL files that fit the WAL's filesystem: the data directory's only has to hold the metadata log
    assert check_space(str(data_dir), 2, 4 * MIB, 4 * MIB, 1 * MIB) is None
