"""Acknowledged means acknowledged: damage to the WAL is told from a torn write.

A real broker takes acks=all produces (durability fsync), records its acknowledged ends in the
metadata, and is killed. The newest WAL file is then damaged as an operator's accident would
damage it: cut short, its last tenth zeroed in place, or one bit of its last frame flipped. The
next start refuses (exit 10, naming the partition and the lost offsets, pointing at
--accept-data-loss) instead of calling it a torn write and handing the offsets out again; its log
does not call the damage an unacknowledged write either. With --accept-data-loss it starts: the
lost offsets stay reserved (an empty batch), consumers move past them, new records get offsets
above everything ever acknowledged, and the leader epoch moves.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from loglake.engine.acked import empty_batch
from loglake.errors import CorruptionError
from loglake.fs.os_fs import OsFileSystem
from loglake.records.decode import decode_batch
from loglake.wal.frame import decode_frame, encode_frame
from loglake.wal.recovery import recover_wal

from brokerkit import Broker

WAIT_S = 60.0
ENV = {"LOGLAKE_ENGINE__ACKED_END_INTERVAL_MS": "20", "LOGLAKE_ENGINE__WAL_SHARDS": "1"}
RECORDS = 3000


def _produce(bootstrap: str, values: list[bytes]) -> list[int]:
    """acks=all; the offsets acknowledged, in order."""
    acked: list[int] = []

    def report(err: object, msg: object) -> None:
        assert err is None, err
        acked.append(msg.offset())  # type: ignore[attr-defined]

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True, "batch.num.messages": 50})
    for v in values:
        p.produce("t", value=v, partition=0, on_delivery=report)
        p.poll(0)
    assert p.flush(WAIT_S) == 0
    return acked


def _read_all(bootstrap: str, end: int) -> dict[int, bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g{time.monotonic_ns()}", "enable.auto.commit": False})
    c.assign([TopicPartition("t", 0, 0)])
    got: dict[int, bytes] = {}
    deadline = time.monotonic() + WAIT_S
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                if got and max(got) >= end - 1:
                    break
                continue
            got[m.offset()] = m.value()
            if m.offset() >= end - 1:
                break
    finally:
        c.close()
    return got


def _newest_wal(data: Path) -> Path:
    files = sorted((data / "wal" / "shard-00").glob("wal-*.log"))
    assert files
    return files[-1]


def _damage(path: Path, how: str) -> None:
    raw = path.read_bytes()
    end = len(raw.rstrip(b"\0"))
    assert end > 100_000
    if how == "cut":  # the file cut short inside a frame, as a bad copy or a truncate(1) leaves it
        os.truncate(path, end // 2 + 7)
    elif how == "flipped":  # one bit of the last frame's records: in the file alone, a torn write
        buf = memoryview(raw)
        pos, last = 0, None
        while (frame := decode_frame(buf, pos)) is not None:
            pos, last = pos + frame.size, frame
        assert last is not None
        with open(path, "r+b") as f:
            f.seek(last.position + last.size // 2)
            f.write(bytes([raw[last.position + last.size // 2] ^ 0x01]))
    else:  # the last tenth of the written bytes zeroed in place
        with open(path, "r+b") as f:
            f.seek(end - end // 10)
            f.write(bytes(end // 10))


def _serve(data: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "loglake.cli.main", "serve", "--data-dir", str(data), "--listen", "127.0.0.1:0", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT_S, env={**os.environ, **ENV})


@pytest.mark.parametrize("how", ["cut", "zeroed", "flipped"])
def test_damaged_wal_refuses_to_start_and_an_accepted_loss_keeps_offsets(tmp_path: Path, how: str) -> None:
    data = tmp_path / "data"
    b = Broker(data, ["--default-partitions", "1"], env=ENV).start()
    values = [b"v%05d-" % i + b"x" * 200 for i in range(RECORDS)]
    acked = _produce(b.bootstrap, values)
    assert acked == list(range(RECORDS))
    time.sleep(0.5)  # several acked-end records since the last acknowledgement
    b.stop(signal.SIGKILL)
    _damage(_newest_wal(data), how)

    refused = _serve(data, "--log-level", "INFO")
    assert refused.returncode == 10, refused.stderr
    assert "--accept-data-loss" in refused.stderr
    # nothing calls the damage an unacknowledged write, at any level, before the check that refutes it
    assert "unacknowledged" not in refused.stderr, refused.stderr
    if how != "cut":  # a torn tail would explain the damage, the acknowledged end does not
        assert f"..{RECORDS - 1} (" in refused.stderr and "t-0 offsets" in refused.stderr, refused.stderr
    else:
        assert "cut short" in refused.stderr, refused.stderr

    b = Broker(data, ["--accept-data-loss"], env=ENV).start()
    try:
        log = b.log_text()
        assert "ACCEPTED LOSS" in log or "ACCEPTED (--accept-data-loss)" in log, log[-3000:]
        more = _produce(b.bootstrap, [b"after-%d" % i for i in range(10)])
        assert min(more) >= RECORDS  # no offset acknowledged before is handed out again
        got = _read_all(b.bootstrap, max(more) + 1)
        survived = sorted(o for o in got if o < RECORDS)
        assert survived == list(range(len(survived))) and 0 < len(survived) < RECORDS
        assert all(got[o] == values[o] for o in survived)  # nothing changed under its offset
        assert [got[o] for o in more] == [b"after-%d" % i for i in range(10)]
    finally:
        assert b.stop() == 0
    # the next start is quiet: the loss was dealt with once
    b = Broker(data, env=ENV)
    before = len(b.log_text())
    b.start()
    try:
        assert "ACCEPTED" not in b.log_text()[before:]
        assert set(_read_all(b.bootstrap, RECORDS + 10)) >= set(more)
    finally:
        assert b.stop() == 0


def test_a_torn_tail_is_still_just_truncated(tmp_path: Path) -> None:
    """A kill in the middle of a group commit (never acknowledged) opens without complaint."""
    data = tmp_path / "data"
    b = Broker(data, ["--default-partitions", "1"], env=ENV).start()
    acked = _produce(b.bootstrap, [b"v%d" % i for i in range(500)])
    time.sleep(0.3)
    b.stop(signal.SIGKILL)
    wal = _newest_wal(data)
    raw = wal.read_bytes()
    end = len(raw.rstrip(b"\0"))
    frame = b"".join(bytes(x) for x in encode_frame(10**6, 10**6, bytes(16), 0, 0, 1, b"p" * 300))
    with open(wal, "r+b") as f:  # half of a frame of a later, never-acknowledged group
        f.seek(end)
        f.write(frame[: len(frame) // 2])
    b = Broker(data, env=ENV).start()
    try:
        assert "torn tail" in b.log_text()
        assert sorted(_read_all(b.bootstrap, len(acked))) == acked
    finally:
        assert b.stop() == 0


def test_recover_wal_tells_a_cut_from_a_torn_write(tmp_path: Path) -> None:
    fs = OsFileSystem()
    shard = tmp_path / "wal" / "shard-00"
    shard.mkdir(parents=True)
    frames = b"".join(
        b"".join(bytes(x) for x in encode_frame(i, i, bytes(16), 0, i, i + 1, b"r" * 100)) for i in range(3)
    )
    path = shard / f"wal-{0:020d}.log"
    path.write_bytes(frames[: len(frames) - 50])  # the last frame runs past the end of the file
    with pytest.raises(CorruptionError, match="cut short"):
        recover_wal(fs, str(tmp_path / "wal"))
    got = recover_wal(fs, str(tmp_path / "wal"), accept_data_loss=True)
    assert [f.base_offset for f in got.frames] == [0, 1]
    path.write_bytes(frames[: len(frames) - 50] + bytes(1000))  # preallocated zeros after it: torn
    assert [f.base_offset for f in recover_wal(fs, str(tmp_path / "wal")).frames] == [0, 1]


def test_empty_batch_covers_the_gap() -> None:
    batch = empty_batch(1234, 3, 1_700_000_000_000)
    header, records = decode_batch(batch)
    assert records == [] and header.record_count == 0 and header.last_offset_delta == 1233
    assert header.partition_leader_epoch == 3
    with pytest.raises(ValueError):
        empty_batch(0, 0, 0)
