"""Ctrl-C and SIGTERM as a request to stop, asked for at safe points, not an exception anywhere.

Python turns SIGINT into a KeyboardInterrupt raised at whatever line the main thread runs. In a
command that reads the local engine on its main thread, that line may sit between a lock's
acquisition and the `with` block that would release it (`Partition.lock` in a read,
`Partition.hw_cond` in `wait_for`): the lock then stays held for good, and closing the data
directory (a maintenance thread blocked on that lock, joined; a seal needing it) hangs the
command forever. So while `stop_signals()` is active, the first SIGINT or SIGTERM only sets a
flag, which the command's loop asks between records and at least every `CONSUME_WAIT_S` while it
waits (`loglake.log.Log.consume(stop=...)`); the loop ends and the data directory closes as on
any normal end. Only where the main thread holds no engine lock and may block for long (`raising`: its own
write to a stdout pipe nobody reads; connecting to a broker) does the signal also raise
KeyboardInterrupt. Opening the data directory is not cut short: a stop asked meanwhile ends the
command right after it.
A second signal exits at once (exit code 128 + the signal), for a user who insists.

Once a command stopped this way has closed what it opened, `main()` ends the process with
`exit_now` instead of the interpreter's teardown of every imported module, which alone takes about
a second on a loaded machine: Ctrl-C gives the prompt back well within 2 s.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["StopRequest", "exit_now", "signalled", "stop_signals"]

#: The signals that end a command cleanly.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: Whether a stop signal arrived during this process's command (the CLI runs one per process).
_signalled = [False]


def signalled() -> bool:
    """Whether a command of this process was stopped by SIGINT or SIGTERM."""
    return _signalled[0]


def exit_now(code: int) -> None:
    """Flush stdout and stderr and end the process with `code`, skipping the interpreter's
    teardown; only once everything the command opened is closed."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone (`| head`), a closed stream
            pass
    os._exit(code)


class StopRequest:
    """Whether Ctrl-C or SIGTERM arrived; call it (a `stop` callable for `Log.consume`)."""

    __slots__ = ("raising", "requested")

    def __init__(self) -> None:
        self.requested = False
        #: True only while the main thread runs code that holds no engine lock (our own output):
        #: there the signal may raise KeyboardInterrupt, to leave a blocked write.
        self.raising = False

    def __call__(self) -> bool:
        return self.requested

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        # A signal handler runs on the main thread between two bytecodes: it takes no lock (the
        # interrupted code may hold it) and writes with os.write only.
        if self.requested:
            os.write(2, b"interrupted again: exiting now\n")
            os._exit(128 + signum)
        self.requested = True
        _signalled[0] = True
        if self.raising:
            raise KeyboardInterrupt


@contextmanager
def stop_signals() -> Iterator[StopRequest]:
    """While active, SIGINT and SIGTERM set the yielded request instead of raising (see the module
    doc); the previous handlers come back afterwards. Off the main thread (tests call commands
    in-process) signals cannot be handled here, and the request is never set by them."""
    request = StopRequest()
    previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}
    try:
        for signum in STOP_SIGNALS:
            previous[signum] = signal.signal(signum, request.on_signal)
    except ValueError:  # not the main thread
        pass
    try:
        yield request
    finally:
        for restored, handler in previous.items():
            signal.signal(restored, handler)
