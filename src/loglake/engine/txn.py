"""Transactions in the engine: control markers, the last stable offset, read_committed reads.

A partition's transaction state lives in its metadata (`PartitionMeta.txn_open`,
`PartitionMeta.aborted_txns`, moved only by ``txn`` metadata records: loglake.meta.txn), so it
survives restarts through checkpoints and the metadata log like the segment chain does.

* The **last stable offset** (LSO) is the first offset of the earliest open transaction, else
  the high watermark. An open transaction's first offset is the partition's log end when the
  partition joined the transaction (AddPartitionsToTxn), never above its first record.
* **Markers** are Kafka control batches (transactional + control attributes; key = version 0,
  type 0 ABORT / 1 COMMIT; value = version 0, coordinator epoch) appended through the normal
  append path, so the topic's durability class and the WAL apply to them as to any batch.
* A **read_committed** read returns batches below the LSO only, and the aborted transactions
  (producer id, first offset) whose range overlaps what it returns. Which of those batches a
  reader keeps is loglake.records.committed (`CommittedFilter`, Kafka's consumer rule).
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Callable

from loglake.engine.partition import Partition
from loglake.engine.types import Chunk, FileRange, ReadResult
from loglake.records.batch import BASE_AND_LENGTH, LENGTH_FIELD_END, new_builder, peek_last_offset
from loglake.records.committed import (
    ABORT_MARKER,
    COMMIT_MARKER,
    MARKER_KEY,
    READ_COMMITTED,
    READ_UNCOMMITTED,
)

__all__ = [
    "READ_COMMITTED",
    "READ_UNCOMMITTED",
    "aborted_transactions",
    "committed_view",
    "control_batch",
    "last_stable_offset",
    "segment_aborted",
]

_MARKER_VALUE = struct.Struct(">hi")


def control_batch(producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, ts_ms: int) -> bytearray:
    """One Kafka control batch holding a COMMIT or ABORT marker record."""
    builder = new_builder(producer_id=producer_id, producer_epoch=producer_epoch, is_transactional=True, is_control=True)
    key = MARKER_KEY.pack(0, COMMIT_MARKER if commit else ABORT_MARKER)
    builder.append(ts_ms, key, _MARKER_VALUE.pack(0, coordinator_epoch), [])
    return bytearray(builder.build())


def last_stable_offset(p: Partition, hw: int | None = None) -> int:
    """First offset of the earliest open transaction, else the high watermark (`hw`: the one a
    read saw, else the partition's)."""
    if hw is None:
        hw = p.high_watermark
    open_ = p.meta.txn_open
    if not open_:
        return hw
    return min(min(list(open_.values()), default=hw), hw)


def aborted_transactions(p: Partition, start: int, end: int) -> list[tuple[int, int]]:
    """(producer id, first offset) of aborted transactions overlapping [start, end)."""
    entries = p.meta.aborted_txns
    if not entries or end <= start:
        return []
    i = bisect.bisect_left(entries, start, key=lambda e: e[2])  # markers ascending
    return [(e[0], e[1]) for e in entries[i:] if e[1] < end]


def _cut(chunks: list[Chunk], lso: int) -> tuple[list[Chunk], int]:
    """Chunks holding only batches that start below `lso`; and the end offset they reach."""
    out: list[Chunk] = []
    end = -1
    for chunk in chunks:
        assert not isinstance(chunk, FileRange)
        view = memoryview(chunk)
        pos = 0
        while pos + BASE_AND_LENGTH.size <= len(view):
            base, length = BASE_AND_LENGTH.unpack_from(view, pos)
            if base >= lso:
                if pos:
                    out.append(view[:pos])
                return out, end
            end = peek_last_offset(view, pos) + 1
            pos += LENGTH_FIELD_END + length
        out.append(chunk)
    return out, end


def committed_view(
    p: Partition, offset: int, result: ReadResult, reread: Callable[[], ReadResult]
) -> tuple[ReadResult, int, list[tuple[int, int]]]:
    """A read's result cut at the last stable offset: (result, LSO, aborted transactions in it).

    The LSO is taken after the read: transactional data is appended only after its partition
    joined the transaction, so any transaction whose records the read returned is either still
    open (and cut off here) or complete with its aborted entry already recorded. `reread` reads
    the same range as bytes (a cut inside a file range needs the batch headers).
    """
    hw = result.high_watermark
    lso = last_stable_offset(p, hw)
    chunks = result.chunks
    if not chunks:
        return result, lso, []
    if lso < hw:
        if lso <= offset:
            return ReadResult([], hw, result.log_start_offset), lso, []
        if any(isinstance(c, FileRange) for c in chunks):
            chunks = reread().chunks
        chunks, _end = _cut(chunks, lso)
        result = ReadResult(chunks, hw, result.log_start_offset)
        if not chunks:
            return result, lso, []
    # everything returned lies below the LSO; entries past the data are harmless to clients
    return result, lso, aborted_transactions(p, offset, lso)


def segment_aborted(p: Partition, aborts: list[tuple[int, int]], base: int) -> list[tuple[int, int, int]]:
    """The transaction index of a segment being sealed: (producer id, first offset, marker) for
    each ABORT marker (producer id, marker offset) in it, oldest first.

    The first offset is the aborted entry the metadata recorded for that marker; while the
    abort is still being completed (the marker is written before the ``complete_abort`` record)
    the open transaction's first offset; after a crash that wrote a transaction's markers twice,
    the entry of the producer's next marker. Failing all three (data from before transactions
    were indexed) the segment's base offset, so at least this segment's records are covered.
    """
    with p.lock:
        entries = list(p.meta.aborted_txns)
        open_ = dict(p.meta.txn_open)
    markers = [e[2] for e in entries]
    out: list[tuple[int, int, int]] = []
    for pid, marker in aborts:
        first: int | None = None
        i = bisect.bisect_left(markers, marker)
        for e in entries[i:]:
            if e[0] == pid:
                first = e[1]
                break
        if first is None and pid in open_ and open_[pid] <= marker:
            first = open_[pid]
        out.append((pid, min(marker, first if first is not None else base), marker))
    return out
