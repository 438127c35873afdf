"""Full verification of segment objects, hash-chain checks, and a human-readable description.

`verify_segment` (bytes in memory) and `verify_segment_in_store` (streamed through ranged
reads) run the same checks through `_DataChecker`, which consumes the data section in chunks
of any size, so batches may straddle chunk boundaries.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import crc32c

from loglake import canary
from loglake.errors import CorruptionError
from loglake.records.batch import ATTR_CONTROL, BATCH_LENGTH_OFFSET
from loglake.records.committed import ABORT_MARKER, marker_of
from loglake.records.compression import codec_name
from loglake.segment.format import (
    HEADER,
    HEADER_CRC_OFFSET,
    HEADER_MAGIC,
    HEADER_SIZE,
    KAFKA_CRC_FIELD,
    KAFKA_CRC_START,
    KAFKA_HEADER,
    KAFKA_HEADER_SIZE,
    KAFKA_LENGTH_OVERHEAD,
    KAFKA_MAGIC,
    KAFKA_MAGIC_FIELD,
    MIN_BATCH_LENGTH,
    MIN_SEGMENT_SIZE,
    SegmentTrailer,
    parse_tail,
    read_tail,
    unpack_kafka_header,
)
from loglake.segment.index import INDEX_ENTRY, INDEX_ENTRY_SIZE, SegmentIndex
from loglake.store.base import BytesLike, ObjectStore

#: Chunk size of streamed verification.
VERIFY_CHUNK_BYTES = 8 * 1024 * 1024

_INDEX_FIELD_OFFSETS = {
    "base_offset": 0,
    "position": 8,
    "max_timestamp": 16,
    "length": 24,
    "last_offset_delta": 28,
    "record_count": 32,
    "reserved": 36,
}


def check_header(header: BytesLike, trailer: SegmentTrailer, key: str) -> None:
    """Check the 32-byte header on its own and against the (already checked) trailer."""
    magic, version, flags, base_offset, created_ms, reserved, header_crc = HEADER.unpack_from(header, 0)
    if magic != HEADER_MAGIC:
        raise CorruptionError(key, 0, f"bad header magic {bytes(magic)!r}")
    if version != trailer.version:
        raise CorruptionError(key, 4, f"header says format version {version}, trailer {trailer.version}")
    if flags != trailer.header_flags:
        raise CorruptionError(key, 6, f"header flags {flags:#06x} do not fit a version-{version} segment")
    crc = crc32c.crc32c(memoryview(header)[:HEADER_CRC_OFFSET])
    if crc != header_crc:
        raise CorruptionError(
            key,
            HEADER_CRC_OFFSET,
            f"header CRC-32C mismatch (stored {header_crc:#010x}, computed {crc:#010x})",
        )
    if reserved:
        raise CorruptionError(key, 24, f"header reserved field is {reserved}, expected 0")
    if base_offset != trailer.base_offset:
        raise CorruptionError(
            key, 8, f"header base offset {base_offset} != trailer base offset {trailer.base_offset}"
        )
    if created_ms != trailer.created_ms:
        raise CorruptionError(
            key, 16, f"header created_ms {created_ms} != trailer created_ms {trailer.created_ms}"
        )


class _DataChecker:
    """Checks the data section, fed in order in chunks, against the index and trailer."""

    def __init__(self, key: str, trailer: SegmentTrailer, index: SegmentIndex, header: BytesLike) -> None:
        self.key = key
        self.trailer = trailer
        self.index = index
        self.data_end = trailer.index_position
        self.crc = crc32c.crc32c(header)
        self.sha = hashlib.sha256(trailer.prev_hash)
        self.pos = HEADER_SIZE  # absolute position of the next unchecked batch
        self.fed = HEADER_SIZE  # absolute position after the last byte fed
        self.carry = bytearray()  # start of a batch that straddles chunks
        self.n = 0
        self.next_offset = trailer.base_offset
        self.max_timestamp = -1
        self.record_count = 0
        self.aborts: set[tuple[int, int]] = set()  # (producer id, offset) of ABORT markers seen

    def _fail(self, offset: int, detail: str) -> CorruptionError:
        return CorruptionError(self.key, offset, detail)

    def _batch_size(self, buf: BytesLike, at: int) -> int:
        """Size of the batch whose header starts at buf[at] (object position self.pos), with the
        length checked against the data section."""
        field = memoryview(buf)[at + BATCH_LENGTH_OFFSET : at + KAFKA_LENGTH_OVERHEAD]
        batch_length = int.from_bytes(field, "big", signed=True)
        size = batch_length + KAFKA_LENGTH_OVERHEAD
        if batch_length < MIN_BATCH_LENGTH or size > self.data_end - self.pos:
            raise self._fail(
                self.pos + BATCH_LENGTH_OFFSET,
                f"batch length {batch_length} impossible (data section ends at {self.data_end})",
            )
        return size

    def feed(self, chunk: BytesLike) -> None:
        view = memoryview(chunk).cast("B")
        if self.fed + len(view) > self.data_end:
            raise ValueError("fed past the data section")
        self.fed += len(view)
        self.crc = crc32c.crc32c(view, self.crc)
        self.sha.update(view)
        off = 0
        carry = self.carry
        if carry:
            if len(carry) < KAFKA_HEADER_SIZE:
                take = min(KAFKA_HEADER_SIZE - len(carry), len(view))
                carry += view[:take]
                off = take
                if len(carry) < KAFKA_HEADER_SIZE:
                    return
            size = self._batch_size(carry, 0)
            take = min(size - len(carry), len(view) - off)
            carry += view[off : off + take]
            off += take
            if len(carry) < size:
                return
            self._check_batch(carry, 0, size)
            self.carry = bytearray()
        end = len(view)
        while off + KAFKA_HEADER_SIZE <= end:
            size = self._batch_size(view, off)
            if off + size > end:
                break
            self._check_batch(view, off, size)
            off += size
        if off < end:
            self.carry = bytearray(view[off:])

    def _check_batch(self, buf: BytesLike, at: int, size: int) -> None:
        pos = self.pos
        (
            base,
            _len,
            _epoch,
            magic,
            stored_crc,
            attrs,
            lod,
            _first_ts,
            max_ts,
            pid,
            _pepoch,
            _seq,
            count,
        ) = KAFKA_HEADER.unpack_from(buf, at)
        if magic != KAFKA_MAGIC:
            raise self._fail(pos + KAFKA_MAGIC_FIELD, f"batch magic {magic}, expected {KAFKA_MAGIC}")
        crc = crc32c.crc32c(memoryview(buf)[at + KAFKA_CRC_START : at + size])
        if crc != stored_crc:
            raise self._fail(
                pos + KAFKA_CRC_FIELD,
                f"batch CRC-32C mismatch (stored {stored_crc:#010x}, computed {crc:#010x})",
            )
        if lod < 0 or count < 0:
            raise self._fail(pos, f"batch has negative last_offset_delta {lod} or record_count {count}")
        if base != self.next_offset and not (self.trailer.rewritten and base > self.next_offset):
            raise self._fail(
                pos, f"batch base offset {base}, expected {self.next_offset} (offsets must be dense)"
            )
        if self.trailer.txn_index and attrs & ATTR_CONTROL:
            marker = marker_of(memoryview(buf)[at : at + size])
            if marker is not None and marker[1] == ABORT_MARKER:
                self.aborts.add((pid, base))
        i = self.n
        if i >= self.trailer.entry_count:
            raise self._fail(pos, f"more batches than the {self.trailer.entry_count} index entries")
        stored = INDEX_ENTRY.unpack_from(self.index.raw, i * INDEX_ENTRY_SIZE)
        actual = (base, pos, max_ts, size, lod, count, 0)
        if stored != actual:
            self._index_mismatch(i, pos, stored, actual)
        self.n = i + 1
        self.pos = pos + size
        self.next_offset = base + lod + 1
        if max_ts > self.max_timestamp:
            self.max_timestamp = max_ts
        self.record_count += count

    def _index_mismatch(self, i: int, pos: int, stored: tuple[int, ...], actual: tuple[int, ...]) -> None:
        for name, s, a in zip(_INDEX_FIELD_OFFSETS, stored, actual, strict=True):
            if s != a:
                raise self._fail(
                    self.data_end + i * INDEX_ENTRY_SIZE + _INDEX_FIELD_OFFSETS[name],
                    f"index entry {i} {name} is {s}, batch at byte {pos} has {a}",
                )

    def finish(self, expected_prev_hash: bytes | None) -> SegmentTrailer:
        t = self.trailer
        if self.fed != self.data_end:
            raise ValueError("data section not fully fed")
        if self.carry or self.pos != self.data_end:
            raise self._fail(
                self.pos,
                f"truncated batch: {self.data_end - self.pos} bytes before the index are not a batch",
            )
        if self.n != t.entry_count:
            raise self._fail(
                t.field_position("entry_count"), f"trailer says {t.entry_count} batches, data has {self.n}"
            )
        if self.crc != t.data_crc:
            raise self._fail(
                0,
                f"data CRC-32C over bytes [0, {self.data_end}) mismatch (stored {t.data_crc:#010x}, computed {self.crc:#010x})",
            )
        if t.rewritten and self.next_offset - 1 > t.last_offset:
            raise self._fail(
                t.field_position("last_offset"),
                f"batches reach offset {self.next_offset - 1}, past the segment's last {t.last_offset}",
            )
        for name, stored, actual in (
            ("last_offset", t.last_offset, t.last_offset if t.rewritten else self.next_offset - 1),
            ("max_timestamp", t.max_timestamp, self.max_timestamp),
            ("record_count", t.record_count, self.record_count),
        ):
            if stored != actual:
                raise self._fail(t.field_position(name), f"trailer {name} is {stored}, batches give {actual}")
        if t.rewritten:
            check_provenance(t, self.key)
        for pid, _first, marker in t.aborted_txns:
            if (pid, marker) not in self.aborts:
                raise self._fail(
                    t.size - t.trailer_size,
                    f"transaction index names an ABORT marker of producer {pid} at offset {marker}, the data has none",
                )
        if canary.SKIP_CHAIN_CHECK:  # test-only mutation (loglake/canary.py)
            return t
        chain = self.sha.digest()
        if chain != t.chain_hash:
            raise self._fail(
                t.field_position("chain_hash"),
                f"chain hash mismatch: stored {t.chain_hash.hex()}, SHA-256(prev_hash ‖ data) is {chain.hex()}",
            )
        if expected_prev_hash is not None and expected_prev_hash != t.prev_hash:
            raise self._fail(
                t.field_position("prev_hash"),
                f"prev_hash {t.prev_hash.hex()} does not match the previous segment's chain hash {expected_prev_hash.hex()}",
            )
        return t


def check_provenance(t: SegmentTrailer, key: str) -> None:
    """A rewritten segment's provenance must name a run of segments that starts at this one's
    base offset, has no hole, and ends at its last offset with the link hash this one carries
    forward, so the chain around the rewrite is the chain the run had."""
    at = t.size - t.trailer_size
    prov = t.provenance or {}
    try:
        replaced = []
        for r in prov["replaced"]:
            chain = base64.b64decode(r[2], validate=True)
            link = base64.b64decode(r[3], validate=True) if r[3] else chain
            if len(chain) != 32 or len(link) != 32:
                raise ValueError("a hash is not 32 bytes")
            replaced.append((int(r[0]), int(r[1]), link))
    except (KeyError, TypeError, ValueError, IndexError, binascii.Error) as exc:
        raise CorruptionError(
            key, at, f"provenance has no valid list of replaced segments: {exc!r}"
        ) from None
    if not replaced:
        raise CorruptionError(key, at, "provenance names no replaced segment")
    if replaced[0][0] != t.base_offset:
        raise CorruptionError(
            key,
            t.field_position("base_offset"),
            "the first replaced segment does not start where this one does",
        )
    if replaced[-1][1] != t.last_offset or replaced[-1][2] != t.link_hash:
        raise CorruptionError(
            key, t.field_position("link_hash"), "the last replaced segment does not end where this one does"
        )
    for a, b in itertools.pairwise(replaced):
        if b[0] != a[1] + 1:
            raise CorruptionError(key, at, f"replaced segments at {a[0]} and {b[0]} were not neighbours")


def verify_segment(data: BytesLike, key: str, expected_prev_hash: bytes | None = None) -> SegmentTrailer:
    """Check a whole segment object in memory; the first failure raises CorruptionError with
    the key and byte offset. Catches any single-bit flip, truncation or trailing bytes."""
    view = memoryview(data).cast("B")
    parsed = parse_tail(view, len(view), key)
    if isinstance(parsed, int):  # pragma: no cover - the whole object is the tail
        raise CorruptionError(key, 0, "segment tail unreadable")
    trailer, index = parsed
    check_header(view[:HEADER_SIZE], trailer, key)
    checker = _DataChecker(key, trailer, index, view[:HEADER_SIZE])
    checker.feed(view[HEADER_SIZE : trailer.index_position])
    return checker.finish(expected_prev_hash)


def verify_segment_in_store(
    store: ObjectStore,
    key: str,
    expected_prev_hash: bytes | None = None,
    progress: Callable[[int], None] | None = None,
    *,
    chunk_bytes: int = VERIFY_CHUNK_BYTES,
) -> SegmentTrailer:
    """`verify_segment` streamed through ranged reads of `chunk_bytes`; `progress(bytes_done)`
    is called after each read."""
    if chunk_bytes < HEADER_SIZE:
        raise ValueError(f"chunk_bytes {chunk_bytes} is too small")
    trailer, index = read_tail(store, key)
    done = trailer.size - trailer.index_position
    if progress:
        progress(done)
    pos = 0
    checker: _DataChecker | None = None
    while pos < trailer.index_position:
        want = min(chunk_bytes, trailer.index_position - pos)
        chunk = store.get_range(key, pos, want)
        if len(chunk) != want:
            raise CorruptionError(
                key, pos + len(chunk), f"object ended early (expected {trailer.size} bytes)"
            )
        if checker is None:
            check_header(chunk[:HEADER_SIZE], trailer, key)
            checker = _DataChecker(key, trailer, index, chunk[:HEADER_SIZE])
            checker.feed(memoryview(chunk)[HEADER_SIZE:])
        else:
            checker.feed(chunk)
        pos += want
        done += want
        if progress:
            progress(done)
    if checker is None:  # pragma: no cover - parse_tail guarantees a data section
        raise CorruptionError(key, 0, "segment has no data section")
    return checker.finish(expected_prev_hash)


class SegmentReader:
    """A stored segment read in chunks of whole batches (at most `chunk_bytes`, or one batch),
    each checked as it arrives: batch CRCs, index, offsets. `finish` then checks what needs the
    whole data section (data CRC, chain hash, counts). Memory stays at one chunk however large
    the segment is (compaction and merging read their inputs this way)."""

    def __init__(
        self,
        store: ObjectStore,
        key: str,
        size: int | None = None,
        chunk_bytes: int = VERIFY_CHUNK_BYTES,
        *,
        check: bool = True,
    ) -> None:
        self.store = store
        self.key = key
        self.chunk_bytes = chunk_bytes
        self.trailer, self.index = read_tail(store, key, size)
        self.bytes_read = self.trailer.size - self.trailer.index_position
        self._checker: _DataChecker | None = None
        if check:  # without it, only the tail's own checks (trailer and index CRC) are made
            header = store.get_range(key, 0, HEADER_SIZE)
            if len(header) != HEADER_SIZE:
                raise CorruptionError(key, len(header), "object ended inside the header")
            check_header(header, self.trailer, key)
            self._checker = _DataChecker(key, self.trailer, self.index, header)
            self.bytes_read += HEADER_SIZE

    def chunks(self) -> Iterator[memoryview]:
        i, n = 0, len(self.index)
        while i < n:
            pos, length, count = self.index.byte_range(i, self.chunk_bytes)
            if length <= 0 or pos < HEADER_SIZE or pos + length > self.trailer.index_position:
                # positions out of order or outside the data section (the trailer CRC only says the
                # index is as written, not that it was written right)
                raise CorruptionError(
                    self.key,
                    self.trailer.index_position + i * INDEX_ENTRY_SIZE,
                    f"index entry {i} gives bytes {pos}..{pos + length}, outside the data section "
                    f"({HEADER_SIZE}..{self.trailer.index_position})",
                )
            data = self.store.get_range(self.key, pos, length)
            if len(data) != length:
                raise CorruptionError(
                    self.key, pos + len(data), f"object ended early (expected {self.trailer.size} bytes)"
                )
            if self._checker is not None:
                self._checker.feed(data)
            self.bytes_read += length
            yield memoryview(data)
            i += count

    def finish(self, expected_prev_hash: bytes | None) -> SegmentTrailer:
        if self._checker is None:
            raise ValueError("a reader made with check=False has nothing to finish")
        return self._checker.finish(expected_prev_hash)


def verify_chain(
    trailers: Sequence[SegmentTrailer], keys: Sequence[str], *, check_offsets: bool = True
) -> None:
    """Check that consecutive segments of one partition link up: each prev_hash is the link
    hash of the one before (its chain hash, or for a rewritten one the replaced range's link) (and, with `check_offsets`, its offsets continue densely).
    The first break raises CorruptionError naming the later segment's key."""
    if len(trailers) != len(keys):
        raise ValueError(f"{len(trailers)} trailers but {len(keys)} keys")
    for i in range(1, len(trailers)):
        prev, cur = trailers[i - 1], trailers[i]
        if cur.prev_hash != prev.link_hash and not canary.SKIP_CHAIN_CHECK:  # test-only mutation (loglake/canary.py)
            raise CorruptionError(
                keys[i],
                cur.field_position("prev_hash"),
                f"hash chain broken: prev_hash {cur.prev_hash.hex()} != link hash {prev.link_hash.hex()} of {keys[i - 1]}",
            )
        if check_offsets and cur.base_offset != prev.last_offset + 1:
            raise CorruptionError(
                keys[i],
                cur.field_position("base_offset"),
                f"base offset {cur.base_offset} does not follow last offset {prev.last_offset} of {keys[i - 1]}",
            )


def describe_segment(
    source: BytesLike | ObjectStore, key: str = "<segment>", *, max_batches: int | None = None
) -> dict[str, Any]:
    """A JSON-friendly description: header, trailer, index summary and batch list.

    `source` is the object's bytes or a store holding `key` (then only the tail and header are
    read and batch details come from the index). Does not verify (see verify_segment), but
    raises CorruptionError when the tail itself is unreadable.
    """
    data: memoryview | None = None
    if isinstance(source, ObjectStore):
        trailer, index = read_tail(source, key)
        header = source.get_range(key, 0, HEADER_SIZE)
    else:
        data = memoryview(source).cast("B")
        parsed = parse_tail(data, len(data), key)
        if isinstance(parsed, int):  # pragma: no cover
            raise CorruptionError(key, 0, "segment tail unreadable")
        trailer, index = parsed
        header = bytes(data[:HEADER_SIZE])
    magic, version, flags, base_offset, created_ms, _reserved, header_crc = HEADER.unpack_from(header, 0)
    batches: list[dict[str, Any]] = []
    limit = len(index) if max_batches is None else min(max_batches, len(index))
    for i in range(limit):
        e = index.entry(i)
        batch: dict[str, Any] = {
            "base_offset": e.base_offset,
            "last_offset": e.last_offset,
            "position": e.position,
            "length": e.length,
            "record_count": e.record_count,
            "max_timestamp": e.max_timestamp,
        }
        if data is not None and e.position + KAFKA_HEADER_SIZE <= len(data):
            h = unpack_kafka_header(data, e.position)
            batch.update(
                first_timestamp=h.first_timestamp,
                compression=codec_name(h.compression),
                transactional=h.is_transactional,
                control=h.is_control,
                producer_id=h.producer_id,
                producer_epoch=h.producer_epoch,
                base_sequence=h.base_sequence,
                crc=f"{h.crc:#010x}",
            )
        batches.append(batch)
    return {
        "key": key,
        "size": trailer.size,
        "header": {
            "magic": bytes(magic).decode("ascii", "replace"),
            "version": version,
            "flags": flags,
            "base_offset": base_offset,
            "created_ms": created_ms,
            "header_crc": f"{header_crc:#010x}",
        },
        "trailer": {
            "version": trailer.version,
            "base_offset": trailer.base_offset,
            "last_offset": trailer.last_offset,
            "max_timestamp": trailer.max_timestamp,
            "record_count": trailer.record_count,
            "created_ms": trailer.created_ms,
            "index_position": trailer.index_position,
            "entry_count": trailer.entry_count,
            "data_crc": f"{trailer.data_crc:#010x}",
            "trailer_crc": f"{trailer.trailer_crc:#010x}",
            "prev_hash": trailer.prev_hash.hex(),
            "chain_hash": trailer.chain_hash.hex(),
        },
        "index": {
            "entries": len(index),
            "first_offset": index.base_offset,
            "last_offset": index.last_offset,
            "data_bytes": trailer.data_size,
            "index_bytes": len(index) * INDEX_ENTRY_SIZE,
        },
        "batches": batches,
        "batches_omitted": len(index) - limit,
        **({"aborted_txns": [list(e) for e in trailer.aborted_txns]} if trailer.txn_index else {}),
    }


__all__ = [
    "MIN_SEGMENT_SIZE",
    "VERIFY_CHUNK_BYTES",
    "check_header",
    "describe_segment",
    "verify_chain",
    "verify_segment",
    "verify_segment_in_store",
]
