"""What the `loglake` command does before its heavy imports: Ctrl-C during `loglake serve`'s
start-up.

Importing the CLI takes most of a second. A SIGINT in that time used to raise KeyboardInterrupt
wherever the import was: a 20-40 line traceback and exit -2 (issue 34). `loglake serve` is
documented to exit 0 on SIGINT or SIGTERM, so until its event loop takes the signals over
(`run_server`: then the broker stops as it always does, finishing its start-up first) a signal
ends the process at once with one line and exit code 0: nothing has been opened yet that would
need closing.

`guard_start_up()` runs from loglake/cli/__init__.py, first thing in the process that is the
`loglake` program (the console script or `python -m loglake.cli.main`), and only when the command
is `serve`: other commands keep Python's KeyboardInterrupt (consume --follow stops on it), and a
process that merely imports loglake.cli (a test, an application) keeps its own handlers.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

#: Options of the `loglake` group itself, accepted anywhere on the line (`loglake serve --log-level
#: INFO` as well as `loglake --log-level INFO serve`), with whether they take a value.
GLOBAL_OPTIONS = {"--log-level": True, "--log-format": True}

#: The exit code of `loglake serve` on SIGINT or SIGTERM (README.md, "The broker").
EXIT_STOPPED = 0

#: The module `python -m` runs for the `loglake` command.
MAIN_MODULE = "loglake.cli.main"


def program_args() -> list[str] | None:
    """The arguments of the `loglake` command when this process is it, else None."""
    orig = list(getattr(sys, "orig_argv", []))
    if "-m" in orig[1:]:
        at = orig.index("-m", 1)
        return orig[at + 2 :] if orig[at + 1 : at + 2] == [MAIN_MODULE] else None
    if sys.argv and os.path.basename(sys.argv[0]) == "loglake":
        return sys.argv[1:]
    return None


def subcommand(args: list[str]) -> str | None:
    """The subcommand of `loglake ARGS`: the first word that is neither a group option nor its value."""
    i = 0
    while i < len(args):
        arg = args[i]
        name = arg.split("=", 1)[0]
        if name in GLOBAL_OPTIONS:
            i += 1 if "=" in arg or not GLOBAL_OPTIONS[name] else 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return arg
    return None


def install_stop_guard(message: str | None) -> None:
    """From now on SIGINT and SIGTERM end the process at once with EXIT_STOPPED, after `message`
    (one line on stderr) when there is one. Main thread only."""

    def stop(signum: int, frame: FrameType | None) -> None:
        if message:
            try:
                os.write(2, f"{message}\n".encode())
            except OSError:
                pass
        os._exit(EXIT_STOPPED)  # nothing to close: neither the data directory nor a port is open yet

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


def guard_start_up() -> None:
    """When this process is `loglake serve`: a signal before the broker takes them over stops it
    cleanly (install_stop_guard)."""
    args = program_args()
    if args is not None and subcommand(args) == "serve":
        install_stop_guard("loglake serve: stopped during start-up, before it served anything")


__all__ = ["EXIT_STOPPED", "GLOBAL_OPTIONS", "guard_start_up", "install_stop_guard", "program_args", "subcommand"]
