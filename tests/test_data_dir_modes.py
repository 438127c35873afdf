"""The data directory is the broker's user's only (`loglake.fs.modes`), whatever the umask.

A real broker under umask 022 writes everything it writes (WAL, segments, metadata log,
checkpoints, the lock, the users inbox, the cold store's copies of segments and metadata) with no
group or other permission bits. A data directory an earlier release left readable (0644 files,
0755 directories) is narrowed at open with one log line and opens as before. The modes are
spelled in one module only.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

import loglake
from loglake.fs.modes import DIR_MODE, FILE_MODE, SHARED_BITS, narrow_tree

from brokerkit import Broker

SRC = Path(loglake.__file__).parent
OWNER = SRC / "fs" / "modes.py"
#: An octal literal: how a file mode is spelled.
MODE_LITERAL = re.compile(r"\b0o[0-7]{3,4}\b")
#: Mode literals outside the owner today, each with what removes it. The list only shrinks: the
#: test fails on an entry that no longer occurs exactly so.
KNOWN: dict[tuple[str, str], str] = {}
TOPIC_CONFIG = {"segment.bytes": "16384", "hot.retain.segments": "1", "retention.ms": "-1"}


def _open_to_others(root: Path) -> list[str]:
    """Every path under `root` (itself included) that the group or others may use."""
    found = []
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode & SHARED_BITS and not path.is_symlink():
            found.append(f"{path.relative_to(root.parent)} {mode:03o}")
    return found


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_modes_are_spelled_in_one_place() -> None:
    found: dict[tuple[str, str], int] = {}
    for path in sorted(SRC.rglob("*.py")):
        if path == OWNER:
            continue
        for literal in MODE_LITERAL.findall(path.read_text()):
            key = (str(path.relative_to(SRC)), literal)
            found[key] = found.get(key, 0) + 1
    unknown = sorted(k for k in found if k not in KNOWN)
    assert not unknown, f"file modes belong in loglake/fs/modes.py (FILE_MODE, DIR_MODE): {unknown}"
    gone = sorted(k for k in KNOWN if k not in found)
    assert not gone, f"no longer there, drop from KNOWN: {gone}"
    assert (FILE_MODE, DIR_MODE) == (0o600, 0o700)  # docs/SECURITY.md says so


def test_everything_a_broker_writes_is_its_users_only(tmp_path: Path, umask_022: None) -> None:
    data, bucket = tmp_path / "data", tmp_path / "bucket"
    env = {"LOGLAKE_ENGINE__META_CHECKPOINT_RECORDS": "20", "LOGLAKE_ENGINE__META_PUBLISH_INTERVAL_MS": "100"}
    b = Broker(data, ["--cold-store", f"file://{bucket}"], env=env).start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("t", 2, config=TOPIC_CONFIG)])["t"].result(30)
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 2})
        for i in range(3000):
            p.produce("t", value=os.urandom(200), partition=i % 2)
            if i % 300 == 299:
                assert p.flush(30) == 0  # separate appends: several sealed segments
        deadline = time.monotonic() + 30  # relocation to the cold store, and a checkpoint or more
        while time.monotonic() < deadline and not (
            list(bucket.rglob("*.seg")) and len(list((data / "meta").glob("checkpoint-*"))) > 1
        ):
            time.sleep(0.1)
    finally:
        assert b.stop() == 0  # a clean stop: seals the rest, leaves the clean-shutdown mark
    kinds = {
        "WAL": list((data / "wal").rglob("wal-*.log")),
        "hot segments": list((data / "segments").rglob("*.seg")),
        "metadata log": list((data / "meta" / "log").rglob("wal-*.log")),
        "checkpoints": list((data / "meta").glob("checkpoint-*.bin")),
        "lock": [data / ".loglake.lock"],
        "users inbox": [data / "users-inbox"],
        "cold segments": list(bucket.rglob("*.seg")),
        "cold metadata": list(bucket.rglob("meta/*.bin")),
    }
    assert all(paths and all(p.exists() for p in paths) for paths in kinds.values()), kinds
    assert len(kinds["checkpoints"]) > 1, kinds["checkpoints"]  # one written while serving, not only at open
    assert _open_to_others(data) == []
    assert _open_to_others(bucket) == []
    assert "readable by other users" not in b.log_text()  # nothing to narrow: it was made so


def _fill(data: Path) -> None:
    with loglake.open(str(data)) as log:
        log.create_topic("t", 1, {"segment.bytes": "4096", "retention.ms": "-1"})
        for i in range(30):  # sealed segments and, after the last seal, records only in the WAL
            log.produce("t", b"v%d" % i + b"x" * 300, partition=0)


def _read(data: Path) -> list[bytes | None]:
    with loglake.open(str(data)) as log:
        return [r.value for r in log.consume("t")]


def test_a_data_directory_an_earlier_release_left_readable_is_narrowed_and_opens(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    _fill(data)
    for path in [data, *data.rglob("*")]:  # what the previous release left under umask 022
        path.chmod(0o755 if path.is_dir() else 0o644)
    with caplog.at_level(logging.WARNING, logger="loglake.engine.engine"):
        assert _read(data) == [b"v%d" % i + b"x" * 300 for i in range(30)]
    said = [r.getMessage() for r in caplog.records if "readable by other users" in r.getMessage()]
    assert len(said) == 1 and str(data) in said[0] and re.search(r"mode (644|755)\)", said[0]), said
    assert _open_to_others(data) == []
    assert stat.S_IMODE(data.stat().st_mode) == DIR_MODE
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="loglake.engine.engine"):
        _read(data)
    assert not [r for r in caplog.records if "readable by other users" in r.getMessage()]  # once


def test_a_shared_sticky_directory_is_left_alone(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "someone-elses").write_bytes(b"x")
    (shared / "someone-elses").chmod(0o644)
    shared.chmod(0o1777)  # as /tmp
    got = narrow_tree(str(shared))
    assert got.shared_root and got.changed == []
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert stat.S_IMODE((shared / "someone-elses").stat().st_mode) == 0o644


def test_a_wal_directory_linked_to_another_place_is_narrowed_too(tmp_path: Path) -> None:
    data, elsewhere = tmp_path / "data", tmp_path / "wal-device"
    (elsewhere / "shard-00").mkdir(parents=True)
    (elsewhere / "shard-00" / "wal-0.log").write_bytes(b"x")
    data.mkdir()
    (data / "wal").symlink_to(elsewhere)
    for path in [elsewhere, elsewhere / "shard-00", elsewhere / "shard-00" / "wal-0.log"]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    data.chmod(DIR_MODE)  # the data directory is private: what it links to is not shielded by it
    got = narrow_tree(str(data))
    assert {p for p, _mode in got.changed} == {
        str(data / "wal"), str(data / "wal" / "shard-00"), str(data / "wal" / "shard-00" / "wal-0.log")
    }
    assert _open_to_others(data) == [] and _open_to_others(elsewhere) == []


def test_a_private_data_directory_shields_what_it_holds_and_is_not_walked(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "segments").mkdir(parents=True)
    (data / "segments").chmod(0o755)
    (data / "segments" / "x.seg").write_bytes(b"x")
    (data / "segments" / "x.seg").chmod(0o644)  # nobody else can reach it through a 0700 directory
    data.chmod(DIR_MODE)
    assert narrow_tree(str(data)).changed == []
    data.chmod(0o750)
    walked = [str(data / "segments"), str(data / "segments" / "x.seg"), str(data)]  # the root last
    assert [p for p, _mode in narrow_tree(str(data)).changed] == walked


def test_a_killed_broker_under_umask_0_leaves_nothing_readable(tmp_path: Path) -> None:
    """The modes are the creation modes, not what the umask leaves: 0 takes nothing away."""
    old = os.umask(0)
    try:
        b = Broker(tmp_path / "data", ["--default-partitions", "1"]).start()
    finally:
        os.umask(old)
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    for i in range(100):
        p.produce("t", value=b"%d" % i)
    assert p.flush(30) == 0
    b.stop(signal.SIGKILL)
    assert _open_to_others(tmp_path / "data") == []
