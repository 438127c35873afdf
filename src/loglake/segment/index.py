"""The index of a segment: one 40-byte entry per batch, and its parsed, zero-copy form.

Entry (little-endian, `INDEX_ENTRY`): base_offset i64, position u64, max_timestamp i64,
length u32, last_offset_delta i32, record_count i32, reserved u32 (docs/FORMAT.md).
"""

from __future__ import annotations

import bisect
import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from typing import NamedTuple

__all__ = ["INDEX_ENTRY", "INDEX_ENTRY_SIZE", "IndexEntry", "SegmentIndex"]

#: base_offset, position, max_timestamp, length, last_offset_delta, record_count, reserved
INDEX_ENTRY = struct.Struct("<qQqIiiI")
INDEX_ENTRY_SIZE = INDEX_ENTRY.size  # 40
_INDEX_FIELDS = 5  # the entry as five int64 columns (for zero-copy column views)


class IndexEntry(NamedTuple):
    base_offset: int
    position: int  # absolute byte position of the batch in the object
    length: int  # batch size in bytes (batch_length + 12)
    last_offset_delta: int
    max_timestamp: int
    record_count: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def end(self) -> int:
        return self.position + self.length


class SegmentIndex:
    """The parsed index of one segment, kept as its raw bytes.

    Column lookups (base offsets, positions) are zero-copy strided views of those bytes, so an
    index costs about 40 bytes per batch; a timestamp lookup builds a running-max column on
    first use.
    """

    __slots__ = ("_base_offsets", "_cols", "_data_end", "_last_offset", "_n", "_positions", "_raw", "_ts_max")

    def __init__(self, raw: bytes, data_end: int) -> None:
        if len(raw) % INDEX_ENTRY_SIZE:
            raise ValueError(f"index length {len(raw)} is not a multiple of {INDEX_ENTRY_SIZE}")
        self._raw = bytes(raw)
        self._n = len(raw) // INDEX_ENTRY_SIZE
        self._data_end = data_end
        if sys.byteorder == "little":
            cols = memoryview(self._raw).cast("q")
        else:  # pragma: no cover - big-endian hosts
            arr = array("q")
            arr.frombytes(self._raw)
            arr.byteswap()
            cols = memoryview(arr)
        self._cols = cols
        self._base_offsets = cols[0::_INDEX_FIELDS]
        self._positions = cols[1::_INDEX_FIELDS]
        self._ts_max: array[int] | None = None
        self._last_offset = self.entry(self._n - 1).last_offset if self._n else -1

    def __reduce__(self) -> tuple[type[SegmentIndex], tuple[bytes, int]]:
        return (SegmentIndex, (self._raw, self._data_end))

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        if not self._n:
            return "SegmentIndex(empty)"
        return f"SegmentIndex({self._n} batches, offsets {self.base_offset}..{self.last_offset})"

    def __iter__(self) -> Iterator[IndexEntry]:
        for i in range(self._n):
            yield self.entry(i)

    @property
    def raw(self) -> bytes:
        return self._raw

    @property
    def base_offsets(self) -> Sequence[int]:
        """Each batch's first offset (a zero-copy column view)."""
        return self._base_offsets

    @property
    def positions(self) -> Sequence[int]:
        """Each batch's byte position (a zero-copy column view); batch i ends where i+1 starts."""
        return self._positions

    @property
    def data_end(self) -> int:
        """Byte position just past the last batch (= the index position)."""
        return self._data_end

    @property
    def base_offset(self) -> int:
        return int(self._base_offsets[0]) if self._n else -1

    @property
    def last_offset(self) -> int:
        return self._last_offset

    def entry(self, i: int) -> IndexEntry:
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"index entry {i} out of range (0..{self._n - 1})")
        base_offset, position, max_ts, length, lod, count, _reserved = INDEX_ENTRY.unpack_from(
            self._raw, i * INDEX_ENTRY_SIZE
        )
        return IndexEntry(base_offset, position, length, lod, max_ts, count)

    def find_offset(self, offset: int) -> int | None:
        """Index of the batch holding `offset`; 0 when `offset` is before the segment; None
        when it is past the segment's last offset."""
        if not self._n or offset > self._last_offset:
            return None
        i = max(0, bisect.bisect_right(self._base_offsets, offset) - 1)
        if self.entry(i).last_offset < offset:  # in a gap after batch i (a compacted segment)
            i += 1
        return i if i < self._n else None

    def find_timestamp(self, timestamp: int) -> int | None:
        """Index of the first batch whose max_timestamp >= `timestamp`, None if there is none."""
        ts_max = self._ts_max
        if ts_max is None:
            ts_max = array("q")
            running = -(2**63)
            for i in range(self._n):
                running = max(running, self._cols[i * _INDEX_FIELDS + 2])
                ts_max.append(running)
            self._ts_max = ts_max
        i = bisect.bisect_left(ts_max, timestamp)
        return i if i < self._n else None

    def byte_range(self, first: int, max_bytes: int) -> tuple[int, int, int]:
        """(start position, length, batch count) of consecutive whole batches from entry
        `first` totalling at most `max_bytes`, but always at least one batch."""
        n = self._n
        if not 0 <= first < n:
            raise IndexError(f"index entry {first} out of range (0..{n - 1})")
        positions = self._positions
        start = int(positions[first])
        limit = start + max(max_bytes, 0)
        # Entries first..k-1 start at or before `limit`; entry j ends where j+1 starts.
        k = bisect.bisect_right(positions, limit, first + 1, n)
        last = n - 1 if k == n and self._data_end <= limit else k - 2
        last = max(last, first)
        end = int(positions[last + 1]) if last + 1 < n else self._data_end
        return start, end - start, last - first + 1
