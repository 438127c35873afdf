"""Ctrl-C at any point of `loglake serve`'s start-up (issue 34, item 9): exit 0 (README.md: SIGINT
or SIGTERM stops the broker with exit code 0), at most one line of its own on stderr, never a
traceback. It used to print 22-41 lines of KeyboardInterrupt traceback and exit -2 when the
signal came during the CLI's imports (most of a second).

Each case runs a real `loglake serve` subprocess and sends SIGINT when its start-up reaches a
given point, told by its own output: the import-time lines of `-X importtime` (which modules have
been imported) and its INFO log lines, so the points are the same on a busy machine.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import pytest

from loglake.cli.early import EXIT_STOPPED, program_args, subcommand

#: A log record of the broker (`--log-level INFO`), as main.log_formatter writes it.
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO) loglake")

#: Where the signal is sent: the first stdout or stderr line this matches (an import-time line
#: ends with the module's name, indented by its depth).
POINTS = {
    # the CLI package's guard is in place; the CLI's own imports (typer, rich, the engine) begin
    "imports begin": r"^import time:.*\|\s+loglake\.cli$",
    "imports halfway": r"^import time:.*\|\s+loglake\.engine$",
    # run_server, before the event loop takes the signals over
    "before the event loop": r"INFO loglake\.broker: event loop: asyncio",
    # BrokerServer.start: the engine is open, the listeners not yet
    "engine opened": r"INFO loglake\.engine\.engine: recovered",
    "listening": r"^loglake listening on",
}


def interrupted_at(marker: str, tmp_path: Path) -> tuple[int, list[str], list[str]]:
    """Start `loglake serve`, send SIGINT once `marker` shows; its exit code, stdout and stderr
    lines (without the import-time lines and its INFO log records)."""
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "loglake.cli.main", "serve", "--data-dir", str(tmp_path / "d"),
         "--listen", "127.0.0.1:0", "--log-level", "INFO"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    seen = threading.Event()
    lines: dict[str, list[str]] = {"out": [], "err": []}

    def read(stream: IO[str], into: list[str]) -> None:
        for line in stream:
            into.append(line)
            if re.search(marker, line.rstrip("\n")):
                seen.set()

    readers = [
        threading.Thread(target=read, args=(proc.stdout, lines["out"]), daemon=True),
        threading.Thread(target=read, args=(proc.stderr, lines["err"]), daemon=True),
    ]
    for t in readers:
        t.start()
    try:
        assert seen.wait(120), (marker, lines)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for t in readers:
        t.join(10)
    err = [x.rstrip("\n") for x in lines["err"] if not x.startswith("import time:") and not LOG_RECORD.match(x)]
    return code, [x.rstrip("\n") for x in lines["out"]], err


@pytest.mark.parametrize("point", list(POINTS))
def test_ctrl_c_during_start_up_exits_cleanly(point: str, tmp_path: Path) -> None:
    code, out, err = interrupted_at(POINTS[point], tmp_path)
    assert code == EXIT_STOPPED == 0, (point, code, err)
    assert not any("Traceback" in x or "KeyboardInterrupt" in x or "Aborted" in x for x in err), err
    assert len(err) <= 1, err
    assert all(x.startswith("loglake listening on") for x in out), out


def test_the_guard_is_for_the_serve_program_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "loglake.cli.main", "--log-level", "INFO", "serve", "-d", "x"])
    args = program_args()
    assert args is not None and subcommand(args) == "serve"
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "loglake.cli.main", "consume", "serve"])
    args = program_args()
    assert args is not None and subcommand(args) == "consume"
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "pytest", "tests"])
    monkeypatch.setattr(sys, "argv", ["pytest", "tests"])
    assert program_args() is None  # a process that imports loglake.cli keeps its own Ctrl-C
    import loglake.cli  # noqa: F401 - imported in this (pytest) process too

    handler = signal.getsignal(signal.SIGINT)
    assert "install_stop_guard" not in getattr(handler, "__qualname__", ""), handler
