"""Shared pieces of the CLI: consoles, the --data-dir option, opening the log, errors."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

import loglake
from loglake.errors import DataDirLockedError

if TYPE_CHECKING:  # the engine is imported when a command opens a data directory, not by `loglake --help`
    from loglake.log import Log

DEFAULT_DATA_DIR = "./loglake-data"
DATA_DIR_ENV = "LOGLAKE_DATA_DIR"

DataDirOption = Annotated[
    str,
    typer.Option(
        "--data-dir",
        "-d",
        envvar=DATA_DIR_ENV,
        help=f"Data directory (env {DATA_DIR_ENV}).",
        show_default=True,
    ),
]


class CliError(Exception):
    """A problem the user can fix (bad input, missing directory): one red line, exit 1, and a
    `hint:` line when there is one."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def report_error(exc: BaseException) -> None:
    """The `error:` line of `exc`, and its `hint:` line when it carries one (CliError,
    MissingExtraError)."""
    error_line(str(exc))
    hint = getattr(exc, "hint", None)
    if isinstance(hint, str) and hint:
        note(f"hint: {hint}")


def stderr_console() -> Console:
    """A console on the current stderr (looked up per call: tests swap sys.stderr)."""
    return Console(file=sys.stderr, highlight=False, soft_wrap=True)


def stdout_console() -> Console:
    console = Console(file=sys.stdout, highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console.width = 200  # piped: do not wrap tables at 80 columns (they take their natural width)
    return console


def error_line(message: str) -> None:
    """Print one red error line on stderr (markup in `message` is not interpreted)."""
    console = stderr_console()
    console.print(f"error: {message}", style="bold red", markup=False)


def note(message: str) -> None:
    stderr_console().print(message, style="dim", markup=False)


def parse_pairs(values: list[str] | None, what: str) -> dict[str, str]:
    """`k=v` strings into a dict; a malformed one is a usage error (exit 2)."""
    out: dict[str, str] = {}
    for raw in values or []:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{what} must look like key=value, got {raw!r}")
        out[key] = value
    return out


def parse_header_pairs(values: list[str] | None) -> list[tuple[str, bytes | None]]:
    out: list[tuple[str, bytes | None]] = []
    for raw in values or []:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--header must look like key=value, got {raw!r}")
        out.append((key, value.encode()))
    return out


@contextmanager
def open_log(data_dir: str, *, must_exist: bool, **options: Any) -> Iterator[Log]:
    """Open (and recover) the data directory; close it (flush, release the lock) afterwards.

    `must_exist`: commands that only read refuse to create an empty data directory by typo.
    """
    if must_exist and not os.path.isdir(data_dir):
        raise CliError(
            f"data directory {data_dir} does not exist (use --data-dir or {DATA_DIR_ENV}, "
            f"or --bootstrap-server HOST:PORT for a running broker)"
        )
    try:
        log = loglake.open(data_dir, **options)
    except OSError as exc:  # cannot be created or written: a typo'd path, no permission, /proc
        raise CliError(not_a_data_dir(data_dir, exc)) from None
    except DataDirLockedError as exc:
        # A running broker holds the directory: point at the way to reach it instead.
        raise CliError(
            f"{exc}; to work with the running broker use --bootstrap-server HOST:PORT "
            "(or set LOGLAKE_BOOTSTRAP_SERVER)"
        ) from None
    try:
        yield log
    finally:
        log.close()


#: Filesystems that hold no files of ours: kernel views, not disks (their free space reads as 0).
PSEUDO_FILESYSTEMS = frozenset(
    {"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "pstore",
     "bpf", "configfs", "fusectl", "mqueue", "hugetlbfs", "autofs", "binfmt_misc"}
)


def filesystem_type(path: str) -> str | None:
    """The type of the filesystem `path` (or its nearest existing parent) is on, from
    /proc/self/mounts; None where that is not readable (not Linux)."""
    target = os.path.realpath(os.path.abspath(path))
    best, kind = "", None
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                inside = target == mount or target.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, fields[2]
    except OSError:
        return None
    return kind


def not_a_data_dir(data_dir: str, exc: OSError) -> str:
    """The one line for a data directory that cannot be created or written."""
    kind = filesystem_type(data_dir)
    if kind in PSEUDO_FILESYSTEMS:
        return (
            f"{data_dir} is not a writable data directory: it is on a {kind} filesystem (a kernel view, not a disk); "
            "use a directory on a disk"
        )
    return f"{data_dir} is not a writable data directory: {exc.strerror or exc}"


def strip_newline(line: bytes) -> bytes:
    """A produced line without its line end (\\n or \\r\\n): the record value `produce` sends."""
    if line.endswith(b"\n"):
        line = line[:-1]
        if line.endswith(b"\r"):
            line = line[:-1]
    return line


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """A count and its noun, "1 record" / "2 records": every count the CLI prints goes through it
    (tests/test_cli.py guards that no other spelling of "N records" is left)."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover
