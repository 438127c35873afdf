"""Damaged metadata, against a real `loglake serve`: its own exit code and a hint that restores it.

A broker with a `file://` cold store takes acks=all produces (some sealed into segments, the rest
only in the WAL) and is killed. Then the metadata is damaged as a disk or an operator's accident
would damage it: a byte flipped in the only checkpoint, or in a metadata log record with intact
ones after it. The next start refuses with EXIT_META_DAMAGED, one `error:` line and a `hint:`
line naming the cold store's copy and the commands that restore from it; running the hint's
command and starting again brings back every acknowledged record. Without a cold store the hint
says there is no copy to restore from.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from loglake.cli.startup import EXIT_META_DAMAGED
from loglake.wal.frame import decode_frame
from test_acked_end import _produce, _read_all  # acks=all producer; read to the end offset

from brokerkit import Broker

WAIT_S = 60.0
RECORDS = 2000
#: small segments: part of the log is sealed (segments, and their copy in the bucket), part only in the WAL
TOPIC_CONFIG = {"segment.bytes": "65536", "hot.retain.segments": "2", "retention.ms": "-1"}
ENV = {"LOGLAKE_ENGINE__META_PUBLISH_INTERVAL_MS": "100"}


def _serve(data: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "loglake.cli.main", "serve", "--data-dir", str(data), "--listen", "127.0.0.1:0", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT_S, env={**os.environ, **ENV})


def _flip(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))


def _damage(meta: Path, where: str) -> None:
    if where == "checkpoint":
        checkpoints = sorted(meta.glob("checkpoint-*.bin"))
        assert len(checkpoints) == 1, checkpoints  # the only one: nothing to fall back to
        _flip(checkpoints[0], checkpoints[0].stat().st_size // 2)
    else:  # a byte in the payload of the log's first record; intact records follow it
        log_file = sorted((meta / "log" / "shard-00").glob("wal-*.log"))[0]
        raw = memoryview(log_file.read_bytes())
        first = decode_frame(raw, 0)
        assert first is not None and decode_frame(raw, first.size) is not None
        _flip(log_file, first.size // 2)


def _refusal(result: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    """The error and hint lines of a refused start: exactly one of each, last on stderr."""
    assert result.returncode == EXIT_META_DAMAGED, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert [x for x in lines if x.startswith(("error: ", "hint: "))] == lines[-2:], result.stderr
    error, hint = lines[-2:]
    assert error.startswith("error: ") and hint.startswith("hint: "), result.stderr
    return error, hint


def _fill(data: Path, extra: list[str]) -> tuple[list[bytes], list[int]]:
    """A broker on `data` took RECORDS acks=all records on t-0 and was killed (-9)."""
    b = Broker(data, extra, env=ENV).start()
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic("t", 1, config=TOPIC_CONFIG)])["t"].result(WAIT_S)
    values = [b"v%05d-" % i + os.urandom(100) for i in range(RECORDS)]
    acked = _produce(b.bootstrap, values)
    assert acked == list(range(RECORDS))
    time.sleep(1.0)  # the metadata's copy in the bucket catches up (every 100 ms here)
    b.stop(signal.SIGKILL)
    return values, acked


@pytest.mark.parametrize("where", ["checkpoint", "log"])
def test_damaged_metadata_refuses_with_its_own_code_and_the_hint_restores_it(tmp_path: Path, where: str) -> None:
    data = tmp_path / "data"
    url = f"file://{tmp_path / 'bucket'}"
    values, acked = _fill(data, ["--cold-store", url])
    assert list((data / "segments").rglob("*.seg")) and list((tmp_path / "bucket").rglob("*.seg"))
    _damage(data / "meta", where)

    error, hint = _refusal(_serve(data, "--cold-store", url))
    assert error.startswith("error: the metadata is damaged: ") and str(data / "meta") in error, error
    assert f"the cold store {url} holds a copy" in hint, hint
    # the hint's commands, as written: move the damaged metadata aside, start with the same store
    move = re.search(r"(mv \S+ \S+) && (loglake serve --data-dir \S+ --cold-store \S+)", hint)
    assert move is not None, hint
    subprocess.run(shlex.split(move.group(1)), check=True)
    assert shlex.split(move.group(2))[3:] == [str(data), "--cold-store", url]
    assert (data / "meta.damaged").is_dir() and not (data / "meta").exists()

    b = Broker(data, ["--cold-store", url], env=ENV).start()
    try:
        assert "restoring from" in b.log_text()
        got = _read_all(b.bootstrap, RECORDS)
        assert sorted(got) == acked  # every acknowledged record, sealed or only in the WAL
        assert all(got[o] == values[o] for o in acked)
    finally:
        assert b.stop() == 0


def test_damaged_metadata_without_a_cold_store_points_at_a_backup(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _fill(data, [])
    _damage(data / "meta", "log")
    error, hint = _refusal(_serve(data))
    assert error.startswith("error: the metadata is damaged: "), error
    assert "no cold store (--cold-store) is configured" in hint and "backup" in hint and "mv " not in hint, hint
