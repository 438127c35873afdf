"""Reading a self-describing object from its end: a footer (and the index before it) first.

Sealed segments and flush objects both end in an index and a fixed-size footer that says how
long the index is. `read_tail` fetches a guess of the tail in one ranged read and lets the
format's parser say whether that was enough; when the index is longer than the guess, one more
ranged read fetches exactly what is missing. Two reads at most, whatever the index size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from loglake.errors import CorruptionError
from loglake.store.base import ObjectStore

__all__ = ["read_tail"]

T = TypeVar("T")


def read_tail(
    store: ObjectStore, key: str, want: int, size: int | None, parse: Callable[[bytes, int, str], T | int]
) -> T:
    """Parse the end of object `key`. `parse(tail, size, key)` gives the parsed tail, or the number
    of bytes from the object's end it needs when `tail` is too short. `want` bytes are read first
    (the whole object when smaller); `size` (if known) saves the size lookup. CorruptionError when the object is shorter than `size` or
    changes size between the two reads."""
    if size is None:
        tail, size = store.get_tail(key, want)
    else:
        start = max(0, size - want)
        tail = store.get_range(key, start, size - start)
        if len(tail) != size - start:
            raise CorruptionError(key, start + len(tail), f"object is shorter than the expected {size} bytes")
    parsed = parse(tail, size, key)
    if isinstance(parsed, int):
        more = parsed - len(tail)
        head = store.get_range(key, size - parsed, more)
        if len(head) != more:
            raise CorruptionError(key, size - parsed + len(head), "object changed size while reading its tail")
        parsed = parse(head + tail, size, key)
        if isinstance(parsed, int):  # pragma: no cover - the parsers ask for their full need at once
            raise CorruptionError(key, size - parsed, "tail still too short after a second read")
    return parsed
