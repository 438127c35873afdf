"""Kafka control records: the COMMIT / ABORT markers a transaction leaves in each partition.

A control batch has the transactional and control attribute bits and holds one record whose key
is ``version i16, type i16`` (type 0 ABORT, 1 COMMIT) and whose value is ``version i16,
coordinator epoch i32``. Control batches are never compressed.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable

from loglake.records.batch import ATTR_CONTROL, ATTR_TRANSACTIONAL, Buffer, decode_batch, peek_header

__all__ = ["ABORT_MARKER", "COMMIT_MARKER", "MARKER_KEY", "AbortedTxns", "marker_of"]

ABORT_MARKER, COMMIT_MARKER = 0, 1
MARKER_KEY = struct.Struct(">hh")


def marker_of(buf: Buffer, pos: int = 0) -> tuple[int, int] | None:
    """(producer id, marker type) of the control batch at ``buf[pos]``; None for any other batch
    or a control record whose key is not a marker's (type -1 then would be a guess)."""
    h = peek_header(buf, pos)
    if h.attributes & (ATTR_CONTROL | ATTR_TRANSACTIONAL) != ATTR_CONTROL | ATTR_TRANSACTIONAL:
        return None
    _h, records = decode_batch(buf, pos, check_crc=False)
    if not records or records[0].key is None or len(records[0].key) < MARKER_KEY.size:
        return None
    _version, kind = MARKER_KEY.unpack_from(records[0].key)
    return h.producer_id, kind


class AbortedTxns:
    """Which transactional batches a read_committed reader drops, from the aborted transactions
    (producer id, first offset, ABORT marker offset) around what it reads.

    A producer has at most one transaction open per partition, so its batch at offset o belongs
    to the transaction its next marker after o ends: aborted exactly when some entry has
    first <= o < marker. Duplicate entries (the same marker from two sources) are harmless.
    """

    def __init__(self, entries: Iterable[tuple[int, int, int]]) -> None:
        by_pid: dict[int, list[tuple[int, int]]] = {}
        for pid, first, marker in entries:
            by_pid.setdefault(int(pid), []).append((int(marker), int(first)))
        self._markers: dict[int, list[int]] = {}
        self._firsts: dict[int, list[int]] = {}
        for pid, items in by_pid.items():
            items.sort()
            self._markers[pid] = [m for m, _f in items]
            self._firsts[pid] = [f for _m, f in items]

    def __bool__(self) -> bool:
        return bool(self._markers)

    def covers(self, producer_id: int, offset: int) -> bool:
        """Whether the transactional batch of `producer_id` at `offset` was aborted."""
        markers = self._markers.get(producer_id)
        if not markers:
            return False
        i = bisect.bisect_right(markers, offset)
        return i < len(markers) and self._firsts[producer_id][i] <= offset
