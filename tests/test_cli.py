"""The `loglake` command line, through typer's CliRunner and as a real subprocess."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

import loglake
from loglake.cli.data import format_json, format_value, parse_start
from loglake.cli.main import app, hoist_global_options
from loglake.log import ConsumerRecord

LOGLAKE_BIN = Path(sys.executable).parent / "loglake"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The CLI's --log-level configures the root logger; undo that after each test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def run(args: Sequence[str], data_dir: Path | None = None, input: bytes | str | None = None, **kw: Any) -> Result:
    argv = list(args)
    if data_dir is not None:
        argv += ["--data-dir", str(data_dir)]
    return CliRunner().invoke(app, argv, input=input, **kw)


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.exit_code, result.output, result.exception)
    return result


@pytest.fixture
def d(tmp_path: Path) -> Path:
    return tmp_path / "data"


# ---- global options -------------------------------------------------------------------------------


def test_version() -> None:
    result = ok(run(["--version"]))
    assert result.stdout.strip() == f"loglake {loglake.__version__}"


def test_a_command_imports_only_its_own_module() -> None:
    """`loglake` starts without the engine or the broker's handler tables (SUBCOMMANDS loads a
    command's module when it runs): each CLI process of a script or test paid 0.9 s of CPU for
    them before. Every listed command still loads, under its own name."""
    from loglake.cli.main import SUBCOMMANDS, load_subcommand

    probe = (
        "import sys, loglake.cli.main, loglake.cli.groups, loglake.cli.topics, loglake.cli.configs; "
        "print(sorted(m for m in sys.modules if m.startswith(('loglake.engine', 'loglake.broker.handlers', "
        "'loglake.broker.server', 'loglake.cluster'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    for name in SUBCOMMANDS:
        assert load_subcommand(name).name == name
    assert list(SUBCOMMANDS) == re.findall(r"^  (\w+)  ", ok(run(["--help"])).stdout, re.M)


def test_help_and_usage_errors(d: Path) -> None:
    assert "topics" in ok(run(["--help"])).stdout
    assert run(["no-such-command"]).exit_code == 2
    assert run(["topics", "create"], d).exit_code == 2  # missing NAME
    assert run(["topics", "create", "t", "--config", "novalue"], d).exit_code == 2
    assert run(["consume", "t", "--from", "yesterday-ish"], d).exit_code == 2
    assert run(["--log-level", "LOUD", "topics", "list"], d).exit_code == 2


def test_log_level_debug_logs_to_stderr(d: Path) -> None:
    result = ok(run(["--log-level", "debug", "topics", "create", "t"], d))
    assert "created topic t" in result.stderr  # the engine's INFO line
    quiet = ok(run(["topics", "list"], d))
    assert "INFO" not in quiet.stderr


@pytest.mark.parametrize("spelling", [["--log-level", "INFO"], ["--log-level=INFO"]])
def test_global_options_after_the_subcommand(d: Path, spelling: list[str]) -> None:
    """`loglake topics create t --log-level INFO` works like `loglake --log-level INFO topics ...`
    (the console script moves the group's options in front)."""
    result = subprocess.run([str(LOGLAKE_BIN), "topics", "create", "t", *spelling, "--data-dir", str(d)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "created topic t" in result.stderr
    assert hoist_global_options(["serve", "--log-format", "json", "--", "--log-level"]) == ["--log-format", "json", "serve", "--", "--log-level"]


# ---- topics ------------------------------------------------------------------------------------------


def test_topics_lifecycle(d: Path) -> None:
    ok(run(["topics", "create", "orders", "--partitions", "3", "--config", "retention.ms=1000"], d))
    ok(run(["topics", "create", "audit"], d))
    assert ok(run(["topics", "list"], d)).stdout.split() == ["audit", "orders"]

    text = ok(run(["topics", "describe", "orders"], d)).stdout
    assert "retention.ms" in text and "1000" in text and "*" in text
    described = json.loads(ok(run(["topics", "describe", "orders", "--json"], d)).stdout)
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    assert described["overrides"] == {"retention.ms": "1000"}
    assert described["config"]["retention.ms"] == "1000"
    assert described["config"]["segment.bytes"] == "67108864"

    ok(run(["topics", "delete", "audit"], d))
    assert ok(run(["topics", "list"], d)).stdout.split() == ["orders"]


def test_topics_create_takes_kafkas_flush_configs(d: Path) -> None:
    """flush.ms / flush.messages are accepted and stored (durability governs syncing)."""
    ok(run(["topics", "create", "fl", "--config", "flush.ms=1000", "--config", "flush.messages=10"], d))
    described = json.loads(ok(run(["topics", "describe", "fl", "--json"], d)).stdout)
    assert described["overrides"] == {"flush.ms": "1000", "flush.messages": "10"}
    assert described["config"]["durability"] == "fsync"
    assert run(["topics", "create", "fl0", "--config", "flush.messages=0"], d).exit_code == 1


def test_topics_alter_and_add_partitions_on_a_data_dir(d: Path) -> None:
    ok(run(["topics", "create", "orders", "--partitions", "2", "--config", "retention.ms=1000"], d))
    ok(run(["topics", "alter", "orders", "--config", "retention.bytes=4096", "--delete-config", "retention.ms"], d))
    described = json.loads(ok(run(["topics", "describe", "orders", "--json"], d)).stdout)
    assert described["overrides"] == {"retention.bytes": "4096"}
    assert "2 -> 3 partitions" in ok(run(["topics", "add-partitions", "orders", "--partitions", "3"], d)).stdout
    described = json.loads(ok(run(["topics", "describe", "orders", "--json"], d)).stdout)
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    result = run(["topics", "add-partitions", "orders", "--partitions", "2"], d)
    assert result.exit_code == 1 and "must be larger" in result.stderr
    assert run(["topics", "alter", "orders"], d).exit_code == 2  # nothing to change


def test_operating_errors_are_one_red_line_and_exit_1(d: Path) -> None:
    ok(run(["topics", "create", "t"], d))
    cases = [
        (["topics", "create", "t"], "already exists"),
        (["topics", "create", "u", "--config", "bogus=1"], "unknown topic config"),
        (["topics", "create", "u", "--config", "retention.ms=soon"], "not an integer"),
        (["topics", "create", "bad/name"], "characters outside"),
        (["topics", "describe", "nope"], "unknown topic"),
        (["topics", "delete", "nope"], "unknown topic"),
        (["consume", "nope"], "unknown topic"),
        (["consume", "t", "--partition", "7"], "no partition 7"),
    ]
    for args, message in cases:
        result = run(args, d)
        assert result.exit_code == 1, args
        assert message in result.stderr, (args, result.stderr)
        assert result.stderr.startswith("error: ")
        assert len(result.stderr.strip().splitlines()) == 1
        assert "Traceback" not in result.output


def test_read_commands_need_an_existing_data_dir(d: Path) -> None:
    for args in (["topics", "list"], ["consume", "t"], ["verify"]):
        result = run(args, d)
        assert result.exit_code == 1 and "does not exist" in result.stderr
    assert not d.exists()


def test_locked_data_dir(d: Path) -> None:
    with loglake.open(str(d), wal_shards=1):
        result = run(["topics", "list"], d)
    assert result.exit_code == 1
    assert "in use by another loglake process" in result.stderr


def test_data_dir_from_environment(d: Path) -> None:
    ok(CliRunner().invoke(app, ["topics", "create", "envtopic"], env={"LOGLAKE_DATA_DIR": str(d)}))
    assert ok(run(["topics", "list"], d)).stdout.split() == ["envtopic"]


# ---- produce / consume -----------------------------------------------------------------------------


def test_produce_stdin_and_consume(d: Path) -> None:
    ok(run(["topics", "create", "t", "--partitions", "2"], d))
    result = ok(run(["produce", "t", "--key-separator", ":", "--header", "src=test"], d, input="a:1\nb:2\nc:3\r\nd:\n"))
    assert "produced 4 records" in result.stderr

    values = ok(run(["consume", "t"], d)).stdout.splitlines()
    assert sorted(values) == ["", "1", "2", "3"]
    lines = ok(run(["consume", "t", "--format", "json"], d)).stdout.splitlines()
    recs = [json.loads(line) for line in lines]
    assert {r["key"]: r["value"] for r in recs} == {"a": "1", "b": "2", "c": "3", "d": ""}
    assert all(r["headers"] == [["src", "test"]] and r["topic"] == "t" for r in recs)
    assert all(set(r) == {"topic", "partition", "offset", "timestamp", "key", "value", "headers"} for r in recs)
    with_keys = ok(run(["consume", "t", "--key-separator", "="], d)).stdout.splitlines()
    assert sorted(with_keys) == ["a=1", "b=2", "c=3", "d="]


def test_produce_to_missing_topic_creates_it(d: Path) -> None:
    result = ok(run(["produce", "fresh"], d, input="x\ny\n"))
    assert "created topic fresh" in result.stderr
    assert ok(run(["consume", "fresh"], d)).stdout == "x\ny\n"


def test_produce_file_in_batches(d: Path, tmp_path: Path) -> None:
    src = tmp_path / "lines.txt"
    src.write_text("".join(f"k{i % 7}|value {i}\n" for i in range(2_500)))
    ok(run(["topics", "create", "t", "--partitions", "3"], d))
    result = ok(run(["produce", "t", "--file", str(src), "--key-separator", "|", "--batch-size", "300"], d))
    assert "produced 2500 records" in result.stderr
    with loglake.open(str(d), wal_shards=1) as log:
        recs = list(log.consume("t"))
    assert len(recs) == 2_500
    by_key: dict[bytes, list[int]] = {}
    for r in recs:
        assert r.key is not None and r.value is not None
        by_key.setdefault(r.key, []).append(int(r.value.split()[1]))
    for key, seqs in by_key.items():
        assert seqs == sorted(seqs), key  # one key, one partition, file order kept
    assert len({r.partition for r in recs}) == 3


def test_produce_respects_max_message_bytes(d: Path) -> None:
    ok(run(["topics", "create", "t", "--config", "max.message.bytes=20000"], d))
    lines = "".join(f"{i:05d}" + "x" * 95 + "\n" for i in range(2_000))  # 200 KB in 100-byte lines
    ok(run(["produce", "t"], d, input=lines))
    out = ok(run(["consume", "t"], d)).stdout.splitlines()
    assert [int(v[:5]) for v in out] == list(range(2_000))


def test_produce_to_one_partition_and_consume_partitions(d: Path) -> None:
    ok(run(["topics", "create", "t", "--partitions", "3"], d))
    ok(run(["produce", "t", "--partition", "2"], d, input="p2-a\np2-b\n"))
    ok(run(["produce", "t", "--partition", "0"], d, input="p0\n"))
    assert ok(run(["consume", "t", "--partition", "2"], d)).stdout == "p2-a\np2-b\n"
    both = ok(run(["consume", "t", "-p", "0", "-p", "1"], d)).stdout
    assert both == "p0\n"


def test_produce_line_without_separator_fails(d: Path) -> None:
    result = run(["produce", "t", "--key-separator", ":"], d, input="a:1\nnosep\nc:3\n")
    assert result.exit_code == 1
    assert "line 2 has no key separator" in result.stderr


def test_consume_start_positions(d: Path) -> None:
    ok(run(["produce", "t"], d, input="".join(f"v{i}\n" for i in range(10))))
    assert ok(run(["consume", "t", "--from", "7"], d)).stdout == "v7\nv8\nv9\n"
    assert ok(run(["consume", "t", "--from", "latest"], d)).stdout == ""
    assert ok(run(["consume", "t", "--from", "earliest", "-n", "2"], d)).stdout == "v0\nv1\n"
    assert ok(run(["consume", "t", "--max-records", "0"], d)).stdout == ""
    assert ok(run(["consume", "t", "--from", "2000-01-01T00:00:00Z"], d)).stdout.count("\n") == 10
    assert ok(run(["consume", "t", "--from", "2999-01-01T00:00:00+00:00"], d)).stdout == ""
    # --follow stops at --max-records even though it would wait for more
    assert ok(run(["consume", "t", "--follow", "-n", "3"], d)).stdout == "v0\nv1\nv2\n"


def test_consume_binary_and_null_fields(d: Path) -> None:
    with loglake.open(str(d), wal_shards=1) as log:
        log.create_topic("b")
        log.produce("b", b"\xff\xfeok", key=None, headers=[("h", None), ("bin", b"\x80")])
        log.produce("b", None, key=b"k")
    rec = json.loads(ok(run(["consume", "b", "--format", "json", "-n", "1"], d)).stdout)
    assert rec["key"] is None
    assert rec["value"] == "\\xff\\xfeok"
    assert rec["headers"] == [["h", None], ["bin", "\\x80"]]
    raw = ok(run(["consume", "b", "-k", "\t"], d)).stdout_bytes
    assert raw == b"null\t\xff\xfeok\nk\tnull\n"  # value format writes the bytes as they are


def test_format_helpers() -> None:
    rec = ConsumerRecord("t", 1, 5, 1_700_000_000_000, 0, b"k", "é".encode(), [("a", b"1")])
    assert json.loads(format_json(rec)) == {
        "topic": "t",
        "partition": 1,
        "offset": 5,
        "timestamp": 1_700_000_000_000,
        "key": "k",
        "value": "é",
        "headers": [["a", "1"]],
    }
    assert format_value(rec, None) == "é\n".encode()
    assert format_value(rec, b"::") == "k::é\n".encode()
    assert parse_start(" earliest") == "earliest"
    assert parse_start("42") == 42
    when = parse_start("2024-05-01T12:00:00Z")
    assert isinstance(when, datetime) and when.year == 2024 and when.tzinfo is not None


# ---- inspect ----------------------------------------------------------------------------------------


def _one_segment(d: Path) -> Path:
    ok(run(["produce", "t", "-k", ","], d, input="".join(f"k{i},v{i}\n" for i in range(100))))
    segs = sorted((d / "segments").rglob("*.seg"))
    assert segs
    return segs[0]


def test_inspect_segment(d: Path) -> None:
    seg = _one_segment(d)
    text = ok(run(["inspect", str(seg)])).stdout
    for word in ("header", "chain hash", "prev hash", "batches", "0..99", "verified", "ok", "none"):
        assert word in text, word
    info = json.loads(ok(run(["inspect", str(seg), "--json"])).stdout)
    assert info["verified"] is True
    assert info["trailer"]["record_count"] == 100
    assert len(info["trailer"]["chain_hash"]) == 64
    assert info["segment_key"]["topic"] == "t" and info["segment_key"]["partition"] == 0
    assert info["batches"][0]["crc_ok"] is True and info["batches"][0]["codec"] == "none"
    brief = json.loads(ok(run(["inspect", str(seg), "--json", "--no-batches"])).stdout)
    assert brief["batches"] == [] and brief["batches_omitted"] == info["index"]["entries"]


def test_inspect_works_while_the_data_dir_is_locked(d: Path) -> None:
    seg = _one_segment(d)
    with loglake.open(str(d), wal_shards=1):
        ok(run(["inspect", str(seg), "--no-batches"]))


def test_inspect_corrupt_files(d: Path, tmp_path: Path) -> None:
    seg = _one_segment(d)
    data = bytearray(seg.read_bytes())
    data[100] ^= 0x40
    bad = tmp_path / "bad.seg"
    bad.write_bytes(bytes(data))
    result = run(["inspect", str(bad)])
    assert result.exit_code == 1
    assert "corrupt at byte" in result.stderr and "Traceback" not in result.output
    assert "BAD" in result.stdout  # the batch list marks the bad batch

    garbage = tmp_path / "garbage.seg"
    garbage.write_bytes(b"not a segment at all" * 20)
    result = run(["inspect", str(garbage)])
    assert result.exit_code == 1 and "not a readable segment" in result.stderr

    truncated = tmp_path / "trunc.seg"
    truncated.write_bytes(seg.read_bytes()[:-10])
    assert run(["inspect", str(truncated)]).exit_code == 1

    missing = run(["inspect", str(tmp_path / "nope.seg")])
    assert missing.exit_code == 1 and "no such file" in missing.stderr


# ---- verify / demo -----------------------------------------------------------------------------------


def test_verify_ok(d: Path) -> None:
    _one_segment(d)
    result = ok(run(["verify"], d))
    assert "verify ok: 1 segment," in result.stdout  # not "1 segments"
    payload = json.loads(ok(run(["verify", "--json"], d)).stdout)
    assert payload["ok"] is True and payload["segments_checked"] == 1 and payload["partitions"] == 1


def test_demo_is_rerunnable(d: Path) -> None:
    first = ok(run(["demo"], d))
    assert "created topic demo" in first.stdout and "demo done" in first.stdout
    second = ok(run(["demo", "--records", "500"], d))
    assert "produced 503 records" in second.stdout
    assert "recovered 1 topics" in second.stdout
    with loglake.open(str(d), wal_shards=1) as log:
        assert sum(p.high_watermark for p in log.describe_topic("demo").partitions) == 10_003 + 503
    ok(run(["verify"], d))


# ---- the real executable -----------------------------------------------------------------------------


def _bin(*args: str, data_dir: Path, **kw: Any) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [str(LOGLAKE_BIN), *args, "--data-dir", str(data_dir)], capture_output=True, timeout=60, **kw
    )


def test_subprocess_produce_consume_verify(d: Path) -> None:
    assert LOGLAKE_BIN.exists(), LOGLAKE_BIN
    version = subprocess.run([str(LOGLAKE_BIN), "--version"], capture_output=True, timeout=60)
    assert version.returncode == 0 and version.stdout.decode().strip() == f"loglake {loglake.__version__}"
    lines = b"".join(b"key%d\tvalue %d\n" % (i % 5, i) for i in range(1_000))
    produced = _bin("produce", "p", "--key-separator", "\t", input=lines, data_dir=d)
    assert produced.returncode == 0, produced.stderr
    assert b"produced 1000 records" in produced.stderr
    consumed = _bin("consume", "p", "--format", "json", data_dir=d)
    assert consumed.returncode == 0, consumed.stderr
    assert len(consumed.stdout.splitlines()) == 1_000
    assert _bin("verify", data_dir=d).returncode == 0
    missing = _bin("consume", "nope", data_dir=d)
    assert missing.returncode == 1
    assert missing.stderr.decode().startswith("error: unknown topic") and b"Traceback" not in missing.stderr


#: How soon after Ctrl-C a following consume must have given the prompt back.
CTRL_C_EXIT_S = 2.0


def _ctrl_c(proc: subprocess.Popen[bytes], drain: bool = True) -> tuple[float, bytes]:
    """SIGINT `proc`; how long it took to exit, and its stderr."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        if drain:
            _out, err = proc.communicate(timeout=30)
        else:
            proc.wait(timeout=30)
            err = proc.stderr.read() if proc.stderr is not None else b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return time.monotonic() - sent, err


@pytest.mark.parametrize("moment", ["after-open", "waiting", "printing"])
def test_subprocess_follow_stops_cleanly_on_ctrl_c(d: Path, moment: str) -> None:
    """Ctrl-C at any moment of a follow gives the prompt back within 2 s, exit 0, no traceback,
    and the data directory closed (its lock free): right after the directory was opened, while
    waiting for new records, and while printing a long backlog (stdout not read: the write blocks)."""
    lines = b"one\ntwo\n" if moment != "printing" else b"".join(b"line %d\n" % i for i in range(50_000))
    assert _bin("produce", "f", input=lines, data_dir=d).returncode == 0
    proc = subprocess.Popen(
        [str(LOGLAKE_BIN), "--log-level", "INFO", "consume", "f", "--follow", "--data-dir", str(d)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    if moment == "after-open":
        assert b"recovered" in proc.stderr.readline()  # the engine's open has just finished
    elif moment == "waiting":
        assert proc.stdout.readline() == b"one\n"
        assert proc.stdout.readline() == b"two\n"
        time.sleep(0.3)  # now waiting for more
    else:
        assert proc.stdout.readline() == b"line 0\n"
    assert proc.poll() is None
    took, err = _ctrl_c(proc, drain=moment != "printing")
    assert proc.returncode == 0, err
    assert b"Traceback" not in err
    assert took < CTRL_C_EXIT_S, f"exited {took:.2f}s after Ctrl-C"
    # the data dir was closed cleanly: the lock is free again
    assert _bin("topics", "list", data_dir=d).stdout.split() == [b"f"]


#: Runs the CLI with Ctrl-C arriving right after the main thread's `nth` acquisition of a ranked
#: lock of `rank` (loglake.locks, checked locks as in every test): the moment that used to leave
#: the lock held for good (a KeyboardInterrupt raised between a lock's acquisition and the `with`
#: block that releases it) and hang the close of the data directory. It writes the time of the
#: signal (time.monotonic, one clock for all processes) to the file in argv[1].
_CTRL_C_IN_LOCK = """
import os, signal, sys, threading, time
from loglake import locks
from loglake.cli.main import main

assert locks.CHECKING, "needs LOGLAKE_LOCK_ORDER=check (tests/conftest.py)"
rank, nth, mark = locks.Rank[os.environ["CTRL_C_RANK"]], int(os.environ["CTRL_C_NTH"]), sys.argv.pop(1)
seen = 0
acquire = locks.CheckedLock.acquire

def acquire_then_ctrl_c(self, blocking=True, timeout=-1):
    global seen
    got = acquire(self, blocking, timeout)
    if got and self.rank == rank and threading.current_thread() is threading.main_thread():
        seen += 1
        if seen == nth:
            with open(mark, "w") as fh:
                fh.write(repr(time.monotonic()))
            os.kill(os.getpid(), signal.SIGINT)
    return got

locks.CheckedLock.acquire = acquire_then_ctrl_c
sys.argv[0] = "loglake"
main()
"""


def _ctrl_c_in_lock(
    tmp_path: Path, rank: str, nth: int, args: list[str], stdin: bytes | None = None
) -> tuple[bytes, bytes]:
    """Run `loglake ARGS` with Ctrl-C right after the main thread's `nth` acquisition of a lock of
    `rank` (_CTRL_C_IN_LOCK); assert it ended within CTRL_C_EXIT_S, exit 0, no traceback. Its
    stdout and stderr."""
    script, mark = tmp_path / "ctrl_c_in_lock.py", tmp_path / "sent"
    script.write_text(_CTRL_C_IN_LOCK)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(mark), *args],
        stdin=subprocess.PIPE if stdin is not None else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "CTRL_C_RANK": rank, "CTRL_C_NTH": str(nth)},
    )
    try:
        out, err = proc.communicate(stdin, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    exited = time.monotonic()
    assert proc.returncode == 0, err
    assert b"Traceback" not in err
    assert mark.exists(), f"the signal was never sent: no {rank} lock taken {nth} times"
    took = exited - float(mark.read_text())
    assert took < CTRL_C_EXIT_S, f"exited {took:.2f}s after Ctrl-C"
    return out, err


@pytest.mark.parametrize(
    ("rank", "nth"),
    # the open's first partition lock; a poll's read while following; a poll's wait_for
    [("PARTITION", 1), ("PARTITION", 9), ("HIGH_WATERMARK", 3)],
)
def test_ctrl_c_inside_a_lock_acquisition_does_not_hang_the_follow(d: Path, tmp_path: Path, rank: str, nth: int) -> None:
    assert _bin("produce", "f", input=b"one\ntwo\n", data_dir=d).returncode == 0
    out, _err = _ctrl_c_in_lock(tmp_path, rank, nth, ["consume", "f", "--follow", "--data-dir", str(d)])
    assert out in (b"", b"one\ntwo\n")
    assert _bin("topics", "list", data_dir=d).stdout.split() == [b"f"]


def test_ctrl_c_while_produce_waits_for_input_produces_what_was_read(d: Path) -> None:
    """Ctrl-C while `produce` waits for more of stdin: the lines read so far are produced, the
    prompt is back within 2 s, exit 0, and the data directory is closed."""
    proc = subprocess.Popen(
        [str(LOGLAKE_BIN), "produce", "w", "--data-dir", str(d)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write(b"one\ntwo\nthree\n")
    proc.stdin.flush()
    assert b"created topic w" in proc.stderr.readline()  # opened; now reading stdin
    time.sleep(0.3)
    took, err = _ctrl_c(proc, drain=False)
    proc.stdin.close()
    assert proc.returncode == 0, err
    assert b"Traceback" not in err and b"produced 3 records" in err, err
    assert took < CTRL_C_EXIT_S, f"exited {took:.2f}s after Ctrl-C"
    assert _bin("consume", "w", data_dir=d).stdout == b"one\ntwo\nthree\n"


@pytest.mark.parametrize("nth", [1, 3])
def test_ctrl_c_inside_a_lock_acquisition_does_not_hang_a_produce(d: Path, tmp_path: Path, nth: int) -> None:
    """Ctrl-C right after `produce` took a partition lock (appending a batch): the command ends at
    the next line, and what it says it produced is what the topic holds."""
    lines = b"".join(b"line %d\n" % i for i in range(30_000))
    _out, err = _ctrl_c_in_lock(
        tmp_path, "PARTITION", nth, ["produce", "p", "--batch-size", "1000", "--data-dir", str(d)], stdin=lines
    )
    count = re.search(rb"produced ([0-9,]+) records?", err)
    assert count is not None, err
    held = _bin("consume", "p", data_dir=d).stdout.splitlines()
    assert held == [b"line %d" % i for i in range(len(held))]
    assert len(held) == int(count.group(1).replace(b",", b""))


def test_subprocess_broken_pipe_is_quiet(d: Path) -> None:
    lines = b"".join(b"line %d\n" % i for i in range(50_000))
    assert _bin("produce", "bp", input=lines, data_dir=d).returncode == 0
    cmd = f"'{LOGLAKE_BIN}' consume bp --data-dir '{d}' | head -n 1"
    result = subprocess.run(["sh", "-c", cmd], capture_output=True, timeout=60, env={**os.environ})
    assert result.stdout == b"line 0\n"
    assert b"Traceback" not in result.stderr and b"BrokenPipe" not in result.stderr


# ---- a newcomer's habits (issue 34) ---------------------------------------------------------------


def test_counts_are_plural_only_when_they_are_many(d: Path) -> None:
    one = ok(run(["produce", "one"], d, input="x\n"))
    assert "produced 1 record (" in one.stderr
    assert "created topic t (1 partition)" in ok(run(["topics", "create", "t"], d)).stdout
    assert "(2 partitions)" in ok(run(["topics", "create", "t2", "--partitions", "2"], d)).stdout


def test_cli_output_spells_counts_with_the_one_helper() -> None:
    """Every "N things" the CLI prints goes through cli.common.plural: no "{n} records" or
    "partition(s)" of its own, which printed "1 records"."""

    cli_dir = Path(loglake.__file__).parent / "cli"
    pattern = re.compile(r"\}\s+(records|segments|partitions|errors|members)\b(?!\s+\{)|\w\(s\)")  # "partitions {n}" is a label
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(cli_dir.glob("*.py"))
        if path.name not in ("serve.py", "startup.py", "pipeline.py")  # not yet converted: other owners
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line) and "records/s" not in line
    ]
    assert found == []


def test_topics_create_takes_kafkas_replication_factor(d: Path) -> None:
    ok(run(["topics", "create", "r1", "--replication-factor", "1"], d))
    result = run(["topics", "create", "r3", "--replication-factor", "3"], d)
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "error: create topic r3: Unable to replicate the partition 3 time(s): The target replication factor of 3 "
        "cannot be reached because only 1 broker(s) are registered."
    ]
    assert "r3" not in ok(run(["topics", "list"], d)).stdout.split()


@pytest.mark.parametrize("command", [["consume"], ["topics", "create"], ["groups", "reset-offsets"], ["serve"]])
def test_help_keeps_env_var_names_whole_and_flags_without_a_metavar(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    assert not re.search(r"\w…", result.stdout) and "<bool>" not in result.stdout  # nothing cut short
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    if command != ["groups", "reset-offsets"]:
        assert "LOGLAKE_DATA_DIR" in result.stdout
    if command in (["consume"], ["topics", "create"]):
        assert "LOGLAKE_BOOTSTRAP_SERVER" in result.stdout


def test_data_dir_on_proc_is_not_a_full_disk(tmp_path: Path) -> None:
    result = run(["topics", "create", "t"], Path("/proc/self/loglake-data"))
    assert result.exit_code == 1
    [line] = result.stderr.strip().splitlines()
    assert "not a writable data directory" in line and "proc filesystem" in line and "full" not in line


def test_demo_has_its_own_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOGLAKE_DATA_DIR", raising=False)
    helptext = ok(CliRunner().invoke(app, ["demo", "--help"])).stdout
    assert "make run" not in helptext or "not `make run`" in " ".join(helptext.split())
    ok(CliRunner().invoke(app, ["demo", "--records", "10"]))
    assert (tmp_path / "loglake-demo").is_dir() and not (tmp_path / "loglake-data").exists()


def test_embedded_consume_until_a_time(tmp_path: Path) -> None:
    with loglake.open(str(tmp_path / "data")) as log:
        log.create_topic("t", partitions=1)
        for i in range(10):
            log.produce("t", b"v%d" % i, timestamp=1_000 * (i + 1))
        assert log.offset_for_timestamp("t", 0, 4_000) == 3
        assert log.offset_for_timestamp("t", 0, 99_000) is None
        got = [r.offset for r in log.consume("t", start=datetime.fromtimestamp(3), until=datetime.fromtimestamp(7))]
        assert got == [2, 3, 4, 5]
        assert [r.offset for r in log.consume("t", until=2_500)] == [0, 1]
        assert len(list(log.consume("t", until=99_000))) == 10
        with pytest.raises(loglake.LoglakeError):
            next(log.consume("t", follow=True, until=5_000))
