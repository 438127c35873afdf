"""Which records a read_committed reader returns: Kafka's consumer-side rule, in one place.

A read at isolation read_committed (the broker's Fetch with isolation_level 1, or
`Engine.read_committed`) stops at the last stable offset and names the aborted transactions
overlapping what it returned, as (producer id, first offset). The reader then drops:

* every control batch (transaction markers), at any isolation level: consumers never return them;
* the batches of an aborted transaction: a *transactional* batch whose producer id is *active*.
  A producer id becomes active once the read passes the first offset of one of its aborted
  transactions (first offset <= the batch's last offset), and stops being active at that
  producer's ABORT marker (a control batch whose record key is version i16 + type i16, type 0).

This is the algorithm of Kafka's Java consumer (`CompletedFetch`: abortedProducerIds and the
aborted transactions in a queue ordered by first offset). `CommittedFilter` works on batch
headers alone (plus a control batch's record key), so any reader of loglake's batches -- the
embedded API, a Spark source, a pipeline -- applies the same rule. One filter per read: the
aborted list a read returns includes every transaction whose ABORT marker lies at or after the
read's start offset, so a transaction that began before that offset is still filtered.
"""

from __future__ import annotations

import bisect
import heapq
import struct
from collections.abc import Iterable, Iterator

from loglake.records.batch import ATTR_CONTROL, ATTR_TRANSACTIONAL, BatchHeader, Buffer, Record, peek_header
from loglake.records.decode import RecordColumns, decode_batch, decode_batches, decode_batches_columns

__all__ = [
    "ABORT_MARKER",
    "COMMIT_MARKER",
    "ISOLATION_LEVELS",
    "MARKER_KEY",
    "READ_COMMITTED",
    "READ_UNCOMMITTED",
    "AbortedTxns",
    "CommittedFilter",
    "check_isolation",
    "committed_batches",
    "committed_columns",
    "control_type",
    "marker_of",
]

READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)
ABORT_MARKER, COMMIT_MARKER = 0, 1
#: A control record's key: version i16, type i16 (0 ABORT, 1 COMMIT).
MARKER_KEY = struct.Struct(">hh")


def check_isolation(isolation: str) -> str:
    """`isolation` itself when it is read_uncommitted or read_committed, else ValueError."""
    if isolation not in ISOLATION_LEVELS:
        raise ValueError(f"isolation must be 'read_uncommitted' or 'read_committed', got {isolation!r}")
    return isolation


def control_type(key: bytes | None) -> int | None:
    """The type of a control record from its key (0 ABORT, 1 COMMIT); None when the key is malformed."""
    if key is None or len(key) < MARKER_KEY.size:
        return None
    _version, kind = MARKER_KEY.unpack_from(key)
    return int(kind)


class CommittedFilter:
    """Kafka's read_committed rule over the batches of one read, in offset order.

    `aborted` is the read's list of aborted transactions, (producer id, first offset) pairs in
    any order. Call `keep` once per batch, in order: True for a batch whose records the reader
    returns, False for a control batch or a batch of an aborted transaction.
    """

    __slots__ = ("_active", "_pending")

    def __init__(self, aborted: Iterable[tuple[int, int]] = ()) -> None:
        self._pending: list[tuple[int, int]] = [(int(first), int(pid)) for pid, first in aborted]
        heapq.heapify(self._pending)
        self._active: set[int] = set()

    def keep(self, header: BatchHeader, control_key: bytes | None = None) -> bool:
        """Whether the batch's records are returned. For a control batch pass its record's key
        (`control_key`), so an ABORT marker ends its producer's aborted range."""
        if header.producer_id >= 0:
            last = header.base_offset + header.last_offset_delta
            while self._pending and self._pending[0][0] <= last:
                self._active.add(heapq.heappop(self._pending)[1])
            if header.is_control:
                if control_type(control_key) == ABORT_MARKER:
                    self._active.discard(header.producer_id)
                return False
            if header.is_transactional and header.producer_id in self._active:
                return False
        return not header.is_control


def committed_batches(
    buf: Buffer,
    aborted: Iterable[tuple[int, int]] | None,
    *,
    check_crc: bool = True,
    allow_partial_tail: bool = False,
) -> Iterator[tuple[BatchHeader, list[Record], bool]]:
    """Decode the Kafka v2 batches in `buf` and say of each whether a reader returns it.

    `aborted` None means read_uncommitted (only control batches are dropped); otherwise it is the
    read's aborted transactions and the read_committed rule applies. Every batch is yielded, as
    (header, records, keep), so a reader can move its position past the ones it drops.
    """
    flt = CommittedFilter(aborted) if aborted is not None else None
    for header, records in decode_batches(buf, check_crc=check_crc, allow_partial_tail=allow_partial_tail):
        if flt is not None:
            keep = flt.keep(header, records[0].key if header.is_control and records else None)
        else:
            keep = not header.is_control
        yield header, records, keep


def committed_columns(
    buf: Buffer, aborted: Iterable[tuple[int, int]] | None, *, check_crc: bool = True
) -> Iterator[tuple[BatchHeader, RecordColumns, bool]]:
    """:func:`committed_batches` with each batch's records as columns (the embedded API's consume,
    which makes its own record objects from them): the same batches, the same `keep`."""
    flt = CommittedFilter(aborted) if aborted is not None else None
    for header, columns in decode_batches_columns(buf, check_crc=check_crc):
        if flt is not None:
            keep = flt.keep(header, columns.keys[0] if header.is_control and columns.keys else None)
        else:
            keep = not header.is_control
        yield header, columns, keep


def marker_of(buf: Buffer, pos: int = 0) -> tuple[int, int] | None:
    """(producer id, marker type) of the control batch at ``buf[pos]``; None for any other batch
    or a control record whose key is not a marker's (type -1 then would be a guess)."""
    h = peek_header(buf, pos)
    if h.attributes & (ATTR_CONTROL | ATTR_TRANSACTIONAL) != ATTR_CONTROL | ATTR_TRANSACTIONAL:
        return None
    _h, records = decode_batch(buf, pos, check_crc=False)
    kind = control_type(records[0].key) if records else None
    return None if kind is None else (h.producer_id, kind)


class AbortedTxns:
    """Which transactional batches a read_committed reader drops, from the aborted transactions
    (producer id, first offset, ABORT marker offset) around what it reads.

    A producer has at most one transaction open per partition, so its batch at offset o belongs
    to the transaction its next marker after o ends: aborted exactly when some entry has
    first <= o < marker. Of entries for one marker from two sources, the larger first offset counts.
    """

    def __init__(self, entries: Iterable[tuple[int, int, int]]) -> None:
        # Every source's first offset is at or below the transaction's own (a segment's base
        # stands in when its writer did not know it): of two for one marker the larger is nearer.
        by_pid: dict[int, dict[int, int]] = {}
        for pid, first, marker in entries:
            firsts = by_pid.setdefault(int(pid), {})
            firsts[int(marker)] = max(int(first), firsts.get(int(marker), int(first)))
        self._markers: dict[int, list[int]] = {}
        self._firsts: dict[int, list[int]] = {}
        for pid, firsts in by_pid.items():
            self._markers[pid] = sorted(firsts)
            self._firsts[pid] = [firsts[m] for m in self._markers[pid]]

    def __bool__(self) -> bool:
        return bool(self._markers)

    def covers(self, producer_id: int, offset: int) -> bool:
        """Whether the transactional batch of `producer_id` at `offset` was aborted."""
        markers = self._markers.get(producer_id)
        if not markers:
            return False
        i = bisect.bisect_right(markers, offset)
        return i < len(markers) and self._firsts[producer_id][i] <= offset
