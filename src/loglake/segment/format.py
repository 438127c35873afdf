"""The segment object format: one immutable object per partition per seal.

Byte layout (all loglake integers little-endian; the Kafka batches keep their own big-endian
encoding). See docs/_format_segment.md for the full description.

    header   32 bytes   magic "LLSG", version, flags, base_offset, created_ms, reserved, header_crc
    data     N bytes    Kafka v2 RecordBatches back to back, exactly as given
    index    40 bytes per batch
    trailer  132 bytes  summary, data_crc, prev_hash, chain_hash, trailer_crc, version, magic "LLSE"

A rewritten segment (compaction, merging) is format version 2: flag REWRITTEN in the header,
offsets may have gaps and the segment covers [base_offset, last_offset] even where its batches
hold fewer (zero batches is allowed), and between index and trailer sits the provenance (JSON:
the replaced segments and their hashes, the rewrite's rules). Its 172-byte trailer adds
link_hash (the replaced range's link, which the next segment's prev_hash names), the
generation and the provenance length; trailer_crc also covers the provenance.

Format version 3 is either of those plus a transaction index: header flag TXN_INDEX, the
version-2 trailer (generation 0 for a sealed segment), and the JSON section holds
"aborted_txns" — [producer id, first offset, ABORT marker offset] for every ABORT marker in the
segment (Kafka's .txnindex placement) — beside a rewrite's provenance keys.

Integrity:
  * header_crc   = CRC-32C(header[0:28])
  * data_crc     = CRC-32C(header ‖ data)            -> any change in header or data
  * trailer_crc  = CRC-32C(index ‖ trailer[0:120])   -> index + trailer checkable from a tail read
  * version/reserved/magic after trailer_crc must hold their exact values
  * chain_hash   = SHA-256(prev_hash ‖ data)         -> tamper evidence across a partition's segments
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import crc32c

from loglake.errors import CorruptionError, CorruptRecordError
from loglake.records import batch as _records
from loglake.segment.index import INDEX_ENTRY, INDEX_ENTRY_SIZE, SegmentIndex
from loglake.store import tail as store_tail
from loglake.store.base import BytesLike, ObjectStore

FORMAT_VERSION = 1
#: Version of rewritten segments (compaction, merging); sealing still writes FORMAT_VERSION.
REWRITE_VERSION = 2
#: Version of segments carrying a transaction index (sealed or rewritten): written only for
#: segments that hold transactional batches, so other data stays byte-identical to version 1/2.
TXN_VERSION = 3
#: Header flag of a rewritten segment.
FLAG_REWRITTEN = 0x1
#: Header flag of a segment with a transaction index (version 3).
FLAG_TXN_INDEX = 0x2
#: The JSON key of the transaction index in a version-3 segment's JSON section.
ABORTED_TXNS_KEY = "aborted_txns"
#: Largest provenance section accepted on read, so a corrupt length never allocates.
PROVENANCE_BYTES_MAX = 1 << 24
HEADER_MAGIC = b"LLSG"
TRAILER_MAGIC = b"LLSE"
ZERO_HASH = bytes(32)

#: magic, version, flags, base_offset, created_ms, reserved, header_crc
HEADER = struct.Struct("<4sHHqqII")
HEADER_SIZE = HEADER.size  # 32
HEADER_CRC_OFFSET = 28

# the index entry and the parsed index live in loglake.segment.index

#: base_offset, last_offset, max_timestamp, record_count, created_ms, index_position,
#: entry_count, data_crc, prev_hash, chain_hash, trailer_crc, version, reserved, magic
TRAILER = struct.Struct("<qqqqqQII32s32sIHH4s")
TRAILER_SIZE = TRAILER.size  # 132
#: Byte offsets of fields inside the trailer (for error messages).
TRAILER_FIELD_OFFSETS = {
    "base_offset": 0,
    "last_offset": 8,
    "max_timestamp": 16,
    "record_count": 24,
    "created_ms": 32,
    "index_position": 40,
    "entry_count": 48,
    "data_crc": 52,
    "prev_hash": 56,
    "chain_hash": 88,
    "trailer_crc": 120,
    "version": 124,
    "reserved": 126,
    "magic": 128,
}
TRAILER_CRC_OFFSET = TRAILER_FIELD_OFFSETS["trailer_crc"]

#: The version-2 trailer: version 1's fields with link_hash, generation and provenance_len
#: between chain_hash and trailer_crc.
TRAILER_V2 = struct.Struct("<qqqqqQII32s32s32sIIIHH4s")
TRAILER_V2_SIZE = TRAILER_V2.size  # 172
TRAILER_V2_FIELD_OFFSETS = {
    **{k: v for k, v in TRAILER_FIELD_OFFSETS.items() if v < 120},
    "link_hash": 120,
    "generation": 152,
    "provenance_len": 156,
    "trailer_crc": 160,
    "version": 164,
    "reserved": 166,
    "magic": 168,
}
#: version, reserved and magic end every trailer: the last 8 bytes tell which trailer it is.
_TRAILER_END = struct.Struct("<HH4s")

#: One ranged read of this many bytes from the end usually gets the trailer and whole index
#: (1635 entries).
TAIL_READ_BYTES = 64 * 1024

# ---- Kafka v2 RecordBatch header: the layout lives in loglake.records.batch ------------------
KAFKA_HEADER = _records.HEADER
KAFKA_HEADER_SIZE = _records.BATCH_HEADER_SIZE  # 61
KAFKA_LENGTH_OVERHEAD = _records.LENGTH_FIELD_END  # base_offset + batch_length precede the counted bytes
KAFKA_CRC_START = _records.CRC_COVERED_START  # the batch CRC covers [21, size)
KAFKA_CRC_FIELD = _records.CRC_OFFSET  # 17
KAFKA_MAGIC_FIELD = _records.MAGIC_OFFSET  # 16
KAFKA_MAGIC = _records.MAGIC_V2
MIN_BATCH_LENGTH = KAFKA_HEADER_SIZE - KAFKA_LENGTH_OVERHEAD  # 49

#: Smallest well-formed segment: header, one minimal batch, one index entry, trailer.
MIN_SEGMENT_SIZE = HEADER_SIZE + KAFKA_HEADER_SIZE + INDEX_ENTRY_SIZE + TRAILER_SIZE


def sealed_size(data_bytes: int, batches: int) -> int:
    """Bytes a seal writes for `batches` Kafka batches of `data_bytes` in one segment: the header,
    the batches, an index entry each and the (larger, version-2) trailer. The free-space reserve
    counts them before it admits the batches (loglake.engine.space); a transaction index adds its
    aborted transactions' few bytes on top."""
    return HEADER_SIZE + data_bytes + batches * INDEX_ENTRY_SIZE + TRAILER_V2_SIZE


#: The parsed header (fields, size, last_offset, attribute bits) is the records package's.
KafkaBatchHeader = _records.BatchHeader


def unpack_kafka_header(buf: BytesLike, pos: int = 0) -> KafkaBatchHeader:
    return KafkaBatchHeader._make(KAFKA_HEADER.unpack_from(buf, pos))


@dataclass(frozen=True, slots=True)
class SegmentTrailer:
    """The trailer of a segment object, plus the object size it was read from."""

    version: int
    base_offset: int
    last_offset: int
    max_timestamp: int
    record_count: int
    created_ms: int
    index_position: int
    entry_count: int
    data_crc: int
    prev_hash: bytes
    chain_hash: bytes
    trailer_crc: int
    size: int
    link_hash: bytes = b""  # version 1: the chain hash
    generation: int = 0
    provenance: dict[str, Any] | None = None  # rewritten: what the rewrite replaced, and how
    #: version 3: (producer id, first offset, ABORT marker offset) of each ABORT marker inside
    aborted_txns: tuple[tuple[int, int, int], ...] = ()

    def __post_init__(self) -> None:
        if not self.link_hash:
            object.__setattr__(self, "link_hash", self.chain_hash)

    @property
    def rewritten(self) -> bool:
        return self.version == REWRITE_VERSION or self.generation > 0

    @property
    def txn_index(self) -> bool:
        """Whether the segment carries a transaction index (version 3)."""
        return self.version == TXN_VERSION

    @property
    def header_flags(self) -> int:
        return (FLAG_REWRITTEN if self.rewritten else 0) | (FLAG_TXN_INDEX if self.txn_index else 0)

    @property
    def trailer_size(self) -> int:
        return TRAILER_V2_SIZE if self.version >= REWRITE_VERSION else TRAILER_SIZE

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def data_size(self) -> int:
        """Bytes of Kafka batches in the object."""
        return self.index_position - HEADER_SIZE

    def field_position(self, name: str) -> int:
        """Absolute byte position of a trailer field in the object."""
        if self.version >= REWRITE_VERSION:
            return self.size - TRAILER_V2_SIZE + TRAILER_V2_FIELD_OFFSETS[name]
        return self.size - TRAILER_SIZE + TRAILER_FIELD_OFFSETS[name]


@dataclass(frozen=True, slots=True)
class Rewrite:
    """What makes a writer produce a rewritten (version 2) segment.

    The segment covers [base_offset, last_offset] whatever its batches hold; `link_hash` is
    the link of the last segment it replaces; `provenance` is stored in the object.
    """

    last_offset: int
    link_hash: bytes
    generation: int
    provenance: dict[str, Any]


class SegmentWriter:
    """Builds one segment from Kafka batches whose offsets are already assigned.

    Batches are kept by reference (not copied): the caller must not change them until the
    parts returned by `finish` have been written. CRC-32C and SHA-256 run incrementally.
    With `rewrite`, the segment is a version-2 rewritten one (offsets may have gaps). With
    `txn_index` it is version 3 and carries `aborted_txns` (set before `finish`).
    """

    def __init__(
        self, base_offset: int, prev_hash: bytes, created_ms: int, rewrite: Rewrite | None = None, *, txn_index: bool = False
    ) -> None:
        if base_offset < 0:
            raise ValueError(f"base offset {base_offset} is negative")
        if len(prev_hash) != 32:
            raise ValueError(f"prev_hash must be 32 bytes, got {len(prev_hash)}")
        if rewrite is not None and (rewrite.last_offset < base_offset or len(rewrite.link_hash) != 32 or rewrite.generation <= 0):
            raise ValueError(f"bad rewrite {rewrite!r} for a segment at {base_offset}")
        self.base_offset = base_offset
        self.prev_hash = bytes(prev_hash)
        self.created_ms = created_ms
        self.rewrite = rewrite
        self.txn_index = txn_index
        #: (producer id, first offset, ABORT marker offset), for a segment with txn_index
        self.aborted_txns: list[tuple[int, int, int]] = []
        version, flags = (REWRITE_VERSION, FLAG_REWRITTEN) if rewrite is not None else (FORMAT_VERSION, 0)
        if txn_index:
            version, flags = TXN_VERSION, flags | FLAG_TXN_INDEX
        header = bytearray(HEADER.pack(HEADER_MAGIC, version, flags, base_offset, created_ms, 0, 0))
        struct.pack_into("<I", header, HEADER_CRC_OFFSET, crc32c.crc32c(header[:HEADER_CRC_OFFSET]))
        self._header = bytes(header)
        self._crc = crc32c.crc32c(self._header)
        self._sha = hashlib.sha256(self.prev_hash)
        self._batches: list[memoryview] = []  # runs of batches, each one part of the object
        self._entries = 0  # batches (index entries) in them
        self._index = bytearray()
        self._position = HEADER_SIZE
        self._next_offset = base_offset
        self._max_timestamp = -1
        self._record_count = 0
        self._finished = False

    @property
    def size(self) -> int:
        """Bytes the finished object will have with the batches added so far (without a
        rewrite's provenance)."""
        return self._position + len(self._index) + (TRAILER_V2_SIZE if self.rewrite or self.txn_index else TRAILER_SIZE)

    @property
    def batch_count(self) -> int:
        return self._entries

    @property
    def next_offset(self) -> int:
        """The base offset the next batch must have."""
        return self._next_offset

    def add_batch(self, batch: BytesLike) -> None:
        """Append one Kafka v2 batch. Wrong offsets or a malformed batch: ValueError; a batch CRC
        mismatch: CorruptRecordError."""
        self.add_batches(batch, (0,))

    def add_batches(self, data: BytesLike, positions: Sequence[int]) -> list[_records.BatchHeader]:
        """Append the Kafka v2 batches of `data` that start at `positions` (ascending and back to
        back: each ends where the next starts, the last at the end of `data`) as one part of the
        object, kept by reference: the CRC-32C and SHA-256 run over all of them at once and the
        index entries are packed in one pass — a seal of small batches costs a header unpack and a
        batch CRC per batch, not a method call and three hash updates. Returns each batch's header.
        Wrong offsets or a malformed batch: ValueError; a batch
        CRC mismatch: CorruptRecordError; nothing of `data` is added then."""
        if self._finished:
            raise ValueError("segment already finished")
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        k = len(positions)
        if k == 0:
            return []
        unpack = KAFKA_HEADER.unpack_from
        make = _records.BatchHeader._make
        pack_into = INDEX_ENTRY.pack_into
        index = bytearray(INDEX_ENTRY_SIZE * k)
        headers: list[_records.BatchHeader] = []
        rewrite = self.rewrite
        next_offset, position, max_all, records = self._next_offset, self._position, self._max_timestamp, 0
        ends = (*positions[1:], len(view))
        for i in range(k):
            start, end = positions[i], ends[i]
            n = end - start
            if n < KAFKA_HEADER_SIZE:
                raise ValueError(f"batch of {n} bytes is shorter than a batch header")
            h = make(unpack(view, start))
            base, batch_length, _epoch, magic, stored_crc, _attrs, lod, _first_ts, max_ts, _pid, _pepoch, _seq, count = h
            if batch_length + KAFKA_LENGTH_OVERHEAD != n:
                raise ValueError(
                    f"batch length field says {batch_length + KAFKA_LENGTH_OVERHEAD} bytes, buffer has {n}"
                )
            if magic != KAFKA_MAGIC:
                raise ValueError(f"batch magic {magic}, only v2 (2) is supported")
            if lod < 0 or count < 0:
                raise ValueError(f"batch has negative last_offset_delta {lod} or record_count {count}")
            if rewrite is None and base != next_offset:
                raise ValueError(f"batch base offset {base}, expected {next_offset} (offsets must be dense)")
            if rewrite is not None and (base < next_offset or base + lod > rewrite.last_offset):
                raise ValueError(
                    f"batch {base}..{base + lod} is outside the rewrite's remaining range "
                    f"{next_offset}..{rewrite.last_offset}"
                )
            if crc32c.crc32c(view[start + KAFKA_CRC_START : end]) != stored_crc:
                raise CorruptRecordError(f"batch at offset {base}: CRC-32C mismatch")
            pack_into(index, i * INDEX_ENTRY_SIZE, base, position, max_ts, n, lod, count, 0)
            position += n
            next_offset = base + lod + 1
            if max_ts > max_all:
                max_all = max_ts
            records += count
            headers.append(h)
        run = view[positions[0] :]
        self._index += index
        self._crc = crc32c.crc32c(run, self._crc)
        self._sha.update(run)
        self._batches.append(run)
        self._entries += k
        self._position, self._next_offset, self._max_timestamp = position, next_offset, max_all
        self._record_count += records
        return headers

    def finish(self) -> tuple[list[bytes | memoryview], SegmentTrailer, SegmentIndex]:
        """The object's parts (for ObjectStore.put, batches not copied), trailer and index."""
        if self._finished:
            raise ValueError("segment already finished")
        if not self._entries and self.rewrite is None:
            raise ValueError("a segment needs at least one batch")
        self._finished = True
        index = bytes(self._index)
        entry_count = self._entries
        index_position = self._position
        chain_hash = self._sha.digest()
        last_offset = self.rewrite.last_offset if self.rewrite is not None else self._next_offset - 1
        fields = (
            self.base_offset,
            last_offset,
            self._max_timestamp,
            self._record_count,
            self.created_ms,
            index_position,
            entry_count,
            self._crc,
            self.prev_hash,
            chain_hash,
        )
        rw = self.rewrite
        aborted = tuple(sorted((int(p), int(f), int(m)) for p, f, m in self.aborted_txns)) if self.txn_index else ()
        if aborted and (aborted[0][2] < self.base_offset or aborted[-1][2] > last_offset):
            raise ValueError(f"an aborted transaction's marker lies outside the segment: {aborted}")
        version = TXN_VERSION if self.txn_index else FORMAT_VERSION if rw is None else REWRITE_VERSION
        if rw is None and not self.txn_index:
            head = TRAILER.pack(*fields, 0, FORMAT_VERSION, 0, TRAILER_MAGIC)[:TRAILER_CRC_OFFSET]
            trailer_crc = crc32c.crc32c(head, crc32c.crc32c(index))
            tail = index + TRAILER.pack(*fields, trailer_crc, FORMAT_VERSION, 0, TRAILER_MAGIC)
            provenance = None
        else:
            provenance = rw.provenance if rw is not None else None
            section: dict[str, Any] = dict(provenance or {})
            if self.txn_index:
                section[ABORTED_TXNS_KEY] = [list(e) for e in sorted(aborted, key=lambda e: e[2])]
            prov = json.dumps(section, separators=(",", ":"), sort_keys=True).encode("utf-8")
            extra = (rw.link_hash, rw.generation, len(prov)) if rw is not None else (chain_hash, 0, len(prov))
            head = TRAILER_V2.pack(*fields, *extra, 0, version, 0, TRAILER_MAGIC)
            head = head[: TRAILER_V2_FIELD_OFFSETS["trailer_crc"]]
            trailer_crc = crc32c.crc32c(head, crc32c.crc32c(prov, crc32c.crc32c(index)))
            tail = index + prov + TRAILER_V2.pack(*fields, *extra, trailer_crc, version, 0, TRAILER_MAGIC)
        size = index_position + len(tail)
        trailer = SegmentTrailer(
            version=version,
            base_offset=self.base_offset,
            last_offset=last_offset,
            max_timestamp=self._max_timestamp,
            record_count=self._record_count,
            created_ms=self.created_ms,
            index_position=index_position,
            entry_count=entry_count,
            data_crc=self._crc,
            prev_hash=self.prev_hash,
            chain_hash=chain_hash,
            trailer_crc=trailer_crc,
            size=size,
            link_hash=rw.link_hash if rw is not None else chain_hash,
            generation=rw.generation if rw is not None else 0,
            provenance=provenance,
            aborted_txns=tuple(sorted(aborted, key=lambda e: e[2])),
        )
        parts: list[bytes | memoryview] = [self._header, *self._batches, tail]
        self._batches = []
        return parts, trailer, SegmentIndex(index, index_position)


# ---- reading the tail --------------------------------------------------------------------------


def parse_tail(tail: BytesLike, object_size: int, key: str) -> tuple[SegmentTrailer, SegmentIndex] | int:
    """Parse trailer and index from the last `len(tail)` bytes of an object of `object_size`.

    Returns the tail length needed when `tail` is too short. Checks magic, version, sizes and
    trailer_crc (which covers the index, and a rewritten segment's provenance), plus the
    index's first and last entries against the trailer; the full index-vs-data check is
    `verify_segment`'s.
    """
    if object_size < HEADER_SIZE + TRAILER_SIZE:
        raise CorruptionError(key, 0, f"object of {object_size} bytes is too small for a segment")
    n = len(tail)
    if n > object_size:
        raise ValueError(f"tail of {n} bytes is longer than the object ({object_size})")
    if n < _TRAILER_END.size:
        return TRAILER_V2_SIZE
    version, reserved, magic = _TRAILER_END.unpack_from(tail, n - _TRAILER_END.size)
    if magic != TRAILER_MAGIC:
        raise CorruptionError(
            key, object_size - 4, f"bad trailer magic {bytes(magic)!r} (truncated or not a segment)"
        )
    if version not in (FORMAT_VERSION, REWRITE_VERSION, TXN_VERSION):
        raise CorruptionError(key, object_size - 8, f"unsupported segment format version {version}")
    if reserved:
        raise CorruptionError(key, object_size - 6, f"trailer reserved field is {reserved}, expected 0")
    v2 = version >= REWRITE_VERSION  # the wide trailer and a JSON section (versions 2 and 3)
    tsize = TRAILER_V2_SIZE if v2 else TRAILER_SIZE
    if object_size < HEADER_SIZE + tsize + (0 if v2 else KAFKA_HEADER_SIZE + INDEX_ENTRY_SIZE):
        raise CorruptionError(key, 0, f"object of {object_size} bytes is too small for a segment")
    if n < tsize:
        return tsize
    trailer_at = object_size - tsize
    if v2:
        (base_offset, last_offset, max_timestamp, record_count, created_ms, index_position, entry_count, data_crc,
         prev_hash, chain_hash, link_hash, generation, prov_len, trailer_crc, *_end) = TRAILER_V2.unpack_from(tail, n - tsize)
        crc_at = TRAILER_V2_FIELD_OFFSETS["trailer_crc"]
    else:
        (base_offset, last_offset, max_timestamp, record_count, created_ms, index_position, entry_count, data_crc,
         prev_hash, chain_hash, trailer_crc, *_end) = TRAILER.unpack_from(tail, n - tsize)
        link_hash, generation, prov_len = chain_hash, 0, 0
        crc_at = TRAILER_CRC_OFFSET
    rewritten = version == REWRITE_VERSION or generation > 0
    if version == REWRITE_VERSION and generation < 1:
        raise CorruptionError(key, trailer_at + 152, f"a rewritten segment has generation {generation}")
    if prov_len > PROVENANCE_BYTES_MAX or prov_len > trailer_at - HEADER_SIZE:
        raise CorruptionError(key, trailer_at + 156, f"provenance length {prov_len} impossible for the object size")
    max_entries = (trailer_at - prov_len - HEADER_SIZE) // (INDEX_ENTRY_SIZE + KAFKA_HEADER_SIZE)
    if not (0 if rewritten else 1) <= entry_count <= max_entries:
        raise CorruptionError(
            key, trailer_at + 48, f"entry count {entry_count} impossible for the object size"
        )
    if index_position != trailer_at - prov_len - entry_count * INDEX_ENTRY_SIZE:
        raise CorruptionError(
            key,
            trailer_at + 40,
            f"index position {index_position} + {entry_count} entries does not end at the trailer ({trailer_at})",
        )
    needed = object_size - int(index_position)
    if n < needed:
        return needed
    view = memoryview(tail)[n - needed :]
    crc = crc32c.crc32c(view[: needed - tsize + crc_at])
    if crc != trailer_crc:
        raise CorruptionError(
            key,
            trailer_at + crc_at,
            f"trailer CRC-32C mismatch (stored {trailer_crc:#010x}, computed {crc:#010x})",
        )
    index_len = entry_count * INDEX_ENTRY_SIZE
    index = SegmentIndex(bytes(view[:index_len]), index_position)
    provenance = None
    aborted: tuple[tuple[int, int, int], ...] = ()
    if v2:
        try:
            provenance = json.loads(bytes(view[index_len : index_len + prov_len]).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptionError(key, index_position + index_len, f"provenance does not parse: {exc}") from None
        if not isinstance(provenance, dict):
            raise CorruptionError(key, index_position + index_len, "provenance is not a JSON object")
        if version == TXN_VERSION:
            aborted = _aborted_txns(provenance.pop(ABORTED_TXNS_KEY, None), base_offset, last_offset, key, index_position + index_len)
            if not rewritten:
                if provenance:
                    raise CorruptionError(key, index_position + index_len, f"unknown keys {sorted(provenance)} in a sealed segment")
                provenance = None
    trailer = SegmentTrailer(
        version,
        base_offset,
        last_offset,
        max_timestamp,
        record_count,
        created_ms,
        index_position,
        entry_count,
        data_crc,
        bytes(prev_hash),
        bytes(chain_hash),
        trailer_crc,
        object_size,
        bytes(link_hash),
        generation,
        provenance,
        aborted,
    )
    if not entry_count:
        if index_position != HEADER_SIZE:
            raise CorruptionError(key, trailer_at + 40, "a segment without batches has data bytes")
        return trailer, index
    first, last = index.entry(0), index.entry(-1)
    starts_ok = first.base_offset >= base_offset if rewritten else first.base_offset == base_offset
    if not starts_ok or first.position != HEADER_SIZE:
        raise CorruptionError(
            key, index_position, f"first index entry {first} does not start the segment at {base_offset}"
        )
    ends_ok = last.last_offset <= last_offset if rewritten else last.last_offset == last_offset
    if last.end != index_position or not ends_ok:
        raise CorruptionError(
            key,
            index_position + (entry_count - 1) * INDEX_ENTRY_SIZE,
            f"last index entry {last} does not end the segment",
        )
    return trailer, index


def _aborted_txns(raw: Any, base: int, last: int, key: str, at: int) -> tuple[tuple[int, int, int], ...]:
    """A version-3 segment's transaction index: [[producer id, first, marker], ...] in marker
    order, every marker inside the segment, every first at or before its marker."""
    if not isinstance(raw, list):
        raise CorruptionError(key, at, "a version-3 segment has no list of aborted transactions")
    out: list[tuple[int, int, int]] = []
    for e in raw:
        if not (isinstance(e, list) and len(e) == 3 and all(type(v) is int for v in e)):
            raise CorruptionError(key, at, f"aborted transaction entry {e!r} is not [producer id, first, marker]")
        pid, first, marker = e
        if not (0 <= first <= marker and base <= marker <= last and pid >= 0) or (out and marker <= out[-1][2]):
            raise CorruptionError(key, at, f"aborted transaction entry {e!r} does not fit the segment {base}..{last}")
        out.append((pid, first, marker))
    return tuple(out)


def read_tail(store: ObjectStore, key: str, size: int | None = None) -> tuple[SegmentTrailer, SegmentIndex]:
    """Trailer and index of a stored segment: one ranged read of the tail (TAIL_READ_BYTES),
    a second one only when the index is bigger. `size` (if known) saves the size lookup."""
    return store_tail.read_tail(store, key, TAIL_READ_BYTES, size, parse_tail)
