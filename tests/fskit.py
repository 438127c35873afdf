"""A filesystem of a test's own: a tmpfs mounted for the test's length (a full disk, a read-only
one, a WAL device of its own). Mounting needs privileges; without them the test is skipped and
says so."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted_tmpfs(target: Path, options: str, what: str = "a filesystem of its own") -> Iterator[Path]:
    """Mount a tmpfs with `options` (e.g. "size=80m", "ro,size=1m") on the existing directory
    `target`; unmounted on exit."""
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"{what} needs mount privileges here: {mounted.stderr.decode().strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=True)
