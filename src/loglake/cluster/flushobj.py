"""The flush object: one object per flush holding the RecordBatches of many partitions.

Cluster mode's durability class `object` acknowledges a produce once its batches are in the
bucket and the metadata pointing at them is committed. Writing one object per partition per
flush would make PUTs grow with the partition count, so a broker writes one object per flush
holding every partition that had data, and an index at its end says where each partition's
range lies. docs/FORMAT.md ("Flush objects") is the byte-level description.

    header   32 bytes   magic "LLFO", version, flags, node_id, seq, created_ms, header_crc
    data     N bytes    per partition, its Kafka v2 RecordBatches back to back, in index order
    index    80 bytes per partition (sorted by topic id, partition)
    footer   60 bytes   index_position, entry_count, index_length, index SHA-256, footer_crc,
                        version, reserved, magic "LLFE"

A reader gets the footer and index with one ranged read of the tail (`read_index`) and one
partition's batches with one ranged read (`read_range`). Every check failure is a
CorruptionError naming the key and byte position; no read returns bytes a check did not pass:

  * header_crc  = CRC-32C(header[0:28])
  * range crc   = CRC-32C of one partition's bytes (in its index entry)
  * index_sha   = SHA-256(index)               -> the index is the one written
  * footer_crc  = CRC-32C(footer[0:48])        -> the footer, including index_sha
  * version/reserved/magic after footer_crc hold their exact values; the sizes must add up.
"""

from __future__ import annotations

import bisect
import hashlib
import struct
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import crc32c

from loglake.errors import CorruptionError, CorruptRecordError, InvalidRecordError
from loglake.records.batch import BATCH_HEADER_SIZE, BatchHeader, peek_header, validate_batch
from loglake.store.base import BytesLike, InvalidObjectKeyError, ObjectStore, cluster_prefix

FLUSH_VERSION = 1
HEADER_MAGIC = b"LLFO"
FOOTER_MAGIC = b"LLFE"

#: magic, version, flags, node_id, seq, created_ms, header_crc
HEADER = struct.Struct("<4sHHiqqI")
HEADER_SIZE = HEADER.size  # 32
HEADER_CRC_OFFSET = 28

#: topic_id (16 raw bytes), partition, batch_count, base_offset, last_offset, position, length,
#: record_count, max_timestamp, crc (CRC-32C of the range), reserved
INDEX_ENTRY = struct.Struct("<16sIIqqQQqqII")
INDEX_ENTRY_SIZE = INDEX_ENTRY.size  # 80

#: index_position, entry_count, index_length, index_sha256, footer_crc, version, reserved, magic
FOOTER = struct.Struct("<QII32sIHH4s")
FOOTER_SIZE = FOOTER.size  # 60
FOOTER_CRC_OFFSET = 48

#: One ranged read of this many bytes from the end gets the footer and the index of up to
#: 3,276 partitions; a bigger index costs a second read (or none, when the caller knows the
#: index length from the metadata and passes it).
FLUSH_TAIL_READ_BYTES = 256 * 1024
#: Largest index a reader accepts (about 200,000 partitions), so a corrupt length never allocates.
INDEX_BYTES_MAX = 16 * 1024 * 1024

#: Folder of flush objects under the cluster's prefix. A topic folder is always
#: `<topic>-<topic id>`, so a name without '-' can never be one.
FLUSH_DIR = "flush"
FLUSH_SUFFIX = ".lfo"
SEQ_DIGITS = 20


# ---- keys ------------------------------------------------------------------------------------


def flush_object_key(cluster_id: str, node_id: int, session: str, seq: int, prefix: str = "") -> str:
    """`<prefix>/loglake-<cluster>/flush/<node id>/<session>/<seq, 20 digits>.lfo`.

    `session` is a random id (uuid4 hex) a Flusher draws when it starts: a broker restarted
    with the same node id, or a paused one still running beside its successor, writes under
    another session, so two writers never produce the same key even when their seqs coincide.
    """
    if node_id < 0 or seq < 0:
        raise InvalidObjectKeyError(f"node id {node_id} and seq {seq} must not be negative")
    if len(session) != 32 or any(c not in "0123456789abcdef" for c in session):
        raise InvalidObjectKeyError(f"session {session!r} is not 32 lowercase hex digits")
    return (
        cluster_prefix(cluster_id, prefix)
        + f"{FLUSH_DIR}/{node_id}/{session}/{seq:0{SEQ_DIGITS}d}{FLUSH_SUFFIX}"
    )


def new_session() -> str:
    return uuid.uuid4().hex


def flush_prefix(cluster_id: str, prefix: str = "") -> str:
    """Every flush object of one cluster starts with this (ends with '/')."""
    return cluster_prefix(cluster_id, prefix) + f"{FLUSH_DIR}/"


def topic_id_bytes(topic_id: str) -> bytes:
    """The 16 raw bytes of a topic id given as 32 hex digits (how segment keys spell it)."""
    try:
        raw = bytes.fromhex(topic_id)
    except ValueError:
        raw = b""
    if len(raw) != 16:
        raise InvalidRecordError(f"topic id {topic_id!r} is not 32 hex digits")
    return raw


def check_batch(batch: BytesLike) -> tuple[memoryview, BatchHeader]:
    """One whole Kafka v2 batch (header, length, CRC-32C), as a byte view and its header.
    Malformed: CorruptRecordError (Kafka's CORRUPT_MESSAGE)."""
    view = memoryview(batch)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    h = validate_batch(view)
    if h.size != len(view):
        raise CorruptRecordError(f"batch length field says {h.size} bytes, buffer has {len(view)}")
    return view, h


def check_partition(partition: int) -> None:
    if not 0 <= partition <= PARTITION_MAX:
        raise InvalidRecordError(f"partition {partition} is outside 0..{PARTITION_MAX}")


#: Kafka partitions are int32.
PARTITION_MAX = (1 << 31) - 1


# ---- the index -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FlushIndexEntry:
    """Where one partition's batches lie in a flush object, and what they hold."""

    topic_id: str  # 32 hex digits
    partition: int
    base_offset: int
    last_offset: int
    position: int  # byte offset in the object
    length: int
    record_count: int
    max_timestamp: int
    batch_count: int
    crc: int  # CRC-32C of bytes [position, position + length)

    @property
    def end(self) -> int:
        return self.position + self.length

    def pack(self) -> bytes:
        return INDEX_ENTRY.pack(
            bytes.fromhex(self.topic_id),
            self.partition,
            self.batch_count,
            self.base_offset,
            self.last_offset,
            self.position,
            self.length,
            self.record_count,
            self.max_timestamp,
            self.crc,
            0,
        )


@dataclass(frozen=True, slots=True)
class FlushIndex:
    """The parsed tail of a flush object."""

    key: str
    size: int
    index_position: int
    entries: tuple[FlushIndexEntry, ...]

    def find(self, topic_id: str, partition: int) -> FlushIndexEntry | None:
        """The partition's entry (a binary search: entries are sorted), or None."""
        i = bisect.bisect_left(self.entries, (topic_id, partition), key=lambda e: (e.topic_id, e.partition))
        if i < len(self.entries) and (self.entries[i].topic_id, self.entries[i].partition) == (
            topic_id,
            partition,
        ):
            return self.entries[i]
        return None


# ---- writing ---------------------------------------------------------------------------------


class FlushObjectWriter:
    """Builds one flush object from partitions' batches whose offsets are already assigned.

    `add(topic_id, partition, batch)` in any order across partitions; within a partition the
    batches must continue one another (dense offsets), since the index gives each partition one
    range [base_offset, last_offset]. Batches are kept by reference until `finish`.
    """

    def __init__(self, node_id: int, seq: int, created_ms: int) -> None:
        self.node_id = node_id
        self.seq = seq
        self.created_ms = created_ms
        self._parts: dict[tuple[str, int], list[memoryview]] = {}
        self._headers: dict[tuple[str, int], list[BatchHeader]] = {}
        self._bytes = 0
        self._finished = False

    @property
    def data_bytes(self) -> int:
        return self._bytes

    @property
    def partition_count(self) -> int:
        return len(self._parts)

    def add(self, topic_id: str, partition: int, batch: BytesLike) -> BatchHeader:
        """Append one Kafka v2 batch of `partition`; returns its header. A malformed batch or a
        bad CRC: CorruptRecordError / InvalidRecordError; offsets that do not continue the
        partition's previous batch in this object: ValueError (the caller assigns offsets)."""
        if self._finished:
            raise ValueError("flush object already finished")
        topic_id_bytes(topic_id)
        check_partition(partition)
        view, h = check_batch(batch)
        self.add_checked(topic_id, partition, view, h)
        return h

    def add_checked(self, topic_id: str, partition: int, view: memoryview, h: BatchHeader) -> None:
        """`add` for a batch `check_batch` already passed (its header `h`)."""
        if self._finished:
            raise ValueError("flush object already finished")
        k = (topic_id, partition)
        headers = self._headers.setdefault(k, [])
        if headers and h.base_offset != headers[-1].last_offset + 1:
            raise ValueError(
                f"{topic_id}-{partition}: batch base offset {h.base_offset} does not continue "
                f"{headers[-1].last_offset} (offsets must be dense within a flush)"
            )
        headers.append(h)
        self._parts.setdefault(k, []).append(view)
        self._bytes += len(view)

    def finish(self) -> tuple[list[bytes | memoryview], FlushIndex]:
        """The object's parts (for ObjectStore.put, batches not copied) and its index; `key`
        of the index is empty until the caller names it (`with_key`)."""
        if self._finished:
            raise ValueError("flush object already finished")
        if not self._parts:
            raise ValueError("a flush object needs at least one batch")
        self._finished = True
        header = bytearray(
            HEADER.pack(HEADER_MAGIC, FLUSH_VERSION, 0, self.node_id, self.seq, self.created_ms, 0)
        )
        struct.pack_into("<I", header, HEADER_CRC_OFFSET, crc32c.crc32c(header[:HEADER_CRC_OFFSET]))
        parts: list[bytes | memoryview] = [bytes(header)]
        entries: list[FlushIndexEntry] = []
        position = HEADER_SIZE
        for topic_id, partition in sorted(self._parts):
            views = self._parts[(topic_id, partition)]
            headers = self._headers[(topic_id, partition)]
            crc = 0
            length = 0
            for v in views:
                crc = crc32c.crc32c(v, crc)
                length += len(v)
            entries.append(
                FlushIndexEntry(
                    topic_id=topic_id,
                    partition=partition,
                    base_offset=headers[0].base_offset,
                    last_offset=headers[-1].last_offset,
                    position=position,
                    length=length,
                    record_count=sum(h.record_count for h in headers),
                    max_timestamp=max(h.max_timestamp for h in headers),
                    batch_count=len(headers),
                    crc=crc,
                )
            )
            parts.extend(views)
            position += length
        index = b"".join(e.pack() for e in entries)
        head = FOOTER.pack(
            position,
            len(entries),
            len(index),
            hashlib.sha256(index).digest(),
            0,
            FLUSH_VERSION,
            0,
            FOOTER_MAGIC,
        )
        footer_crc = crc32c.crc32c(head[:FOOTER_CRC_OFFSET])
        footer = FOOTER.pack(
            position,
            len(entries),
            len(index),
            hashlib.sha256(index).digest(),
            footer_crc,
            FLUSH_VERSION,
            0,
            FOOTER_MAGIC,
        )
        parts.append(index + footer)
        self._parts, self._headers = {}, {}
        size = position + len(index) + FOOTER_SIZE
        return parts, FlushIndex("", size, position, tuple(entries))


def build_flush_object(
    batches: Iterable[tuple[str, int, BytesLike]], node_id: int = 0, seq: int = 0, created_ms: int = 0
) -> tuple[bytes, FlushIndex]:
    """A whole flush object in memory (tests, tools): `(topic_id, partition, batch)` triples."""
    w = FlushObjectWriter(node_id, seq, created_ms)
    for topic_id, partition, batch in batches:
        w.add(topic_id, partition, batch)
    parts, index = w.finish()
    return b"".join(parts), index


# ---- reading ---------------------------------------------------------------------------------


def parse_footer(tail: BytesLike, object_size: int, key: str) -> FlushIndex | int:
    """The index from the last `len(tail)` bytes of an object of `object_size`, or the tail
    length needed when `tail` is too short. Checks magic, version, reserved, footer CRC, that
    the sizes add up, the index's SHA-256, and that the ranges tile the data section in order."""
    n = len(tail)
    if n > object_size:
        raise ValueError(f"tail of {n} bytes is longer than the object ({object_size})")
    if object_size < HEADER_SIZE + FOOTER_SIZE:
        raise CorruptionError(key, 0, f"object of {object_size} bytes is too small for a flush object")
    if n < FOOTER_SIZE:
        return FOOTER_SIZE
    at = object_size - FOOTER_SIZE
    (index_position, entry_count, index_length, index_sha, footer_crc, version, reserved, magic) = (
        FOOTER.unpack_from(tail, n - FOOTER_SIZE)
    )
    if magic != FOOTER_MAGIC:
        raise CorruptionError(
            key, object_size - 4, f"bad footer magic {bytes(magic)!r} (truncated or not a flush object)"
        )
    if version != FLUSH_VERSION:
        raise CorruptionError(key, object_size - 8, f"unsupported flush object version {version}")
    if reserved:
        raise CorruptionError(key, object_size - 6, f"footer reserved field is {reserved}, expected 0")
    crc = crc32c.crc32c(memoryview(tail)[n - FOOTER_SIZE : n - FOOTER_SIZE + FOOTER_CRC_OFFSET])
    if crc != footer_crc:
        raise CorruptionError(
            key,
            at + FOOTER_CRC_OFFSET,
            f"footer CRC-32C mismatch (stored {footer_crc:#010x}, computed {crc:#010x})",
        )
    if (
        index_length != entry_count * INDEX_ENTRY_SIZE
        or index_length > INDEX_BYTES_MAX
        or index_position + index_length != at
        or index_position < HEADER_SIZE
        or entry_count < 1
    ):
        raise CorruptionError(
            key,
            at,
            f"index of {entry_count} entries ({index_length} bytes) at {index_position} does not end at the footer ({at})",
        )
    if n < FOOTER_SIZE + index_length:
        return FOOTER_SIZE + int(index_length)
    raw = bytes(memoryview(tail)[n - FOOTER_SIZE - index_length : n - FOOTER_SIZE])
    if hashlib.sha256(raw).digest() != index_sha:
        raise CorruptionError(key, index_position, "index SHA-256 mismatch")
    entries: list[FlushIndexEntry] = []
    expect = HEADER_SIZE
    for i in range(entry_count):
        (tid, partition, batch_count, base, last, position, length, records, max_ts, rcrc, res) = (
            INDEX_ENTRY.unpack_from(raw, i * INDEX_ENTRY_SIZE)
        )
        e = FlushIndexEntry(
            tid.hex(), partition, base, last, position, length, records, max_ts, batch_count, rcrc
        )
        at_entry = index_position + i * INDEX_ENTRY_SIZE
        if res or position != expect or length < BATCH_HEADER_SIZE * max(batch_count, 1) or batch_count < 1:
            raise CorruptionError(
                key, at_entry, f"index entry {i} {e} does not continue the data section at {expect}"
            )
        if base < 0 or last < base or records < 0:
            raise CorruptionError(key, at_entry, f"index entry {i} has impossible offsets {base}..{last}")
        if entries and (entries[-1].topic_id, entries[-1].partition) >= (e.topic_id, e.partition):
            raise CorruptionError(key, at_entry, f"index entry {i} is out of order or repeats a partition")
        entries.append(e)
        expect = position + length
    if expect != index_position:
        raise CorruptionError(
            key, index_position, f"data ranges end at {expect}, the index starts at {index_position}"
        )
    return FlushIndex(key, object_size, index_position, tuple(entries))


def read_index(
    store: ObjectStore, key: str, size: int | None = None, index_length: int | None = None
) -> FlushIndex:
    """The index of a stored flush object: one ranged read of the tail (FLUSH_TAIL_READ_BYTES,
    or exactly footer + index when `size` and `index_length` are known), a second one only
    when the index is bigger than the first read."""
    want = FLUSH_TAIL_READ_BYTES if index_length is None else FOOTER_SIZE + index_length
    if size is None:
        tail, size = store.get_tail(key, want)
    else:
        start = max(0, size - want)
        tail = store.get_range(key, start, size - start)
        if len(tail) != size - start:
            raise CorruptionError(key, start + len(tail), f"object is shorter than the expected {size} bytes")
    parsed = parse_footer(tail, size, key)
    if isinstance(parsed, int):
        more = parsed - len(tail)
        head = store.get_range(key, size - parsed, more)
        if len(head) != more:
            raise CorruptionError(
                key, size - parsed + len(head), "object changed size while reading its tail"
            )
        parsed = parse_footer(head + tail, size, key)
        if isinstance(parsed, int):  # pragma: no cover - parse_footer asks for its full need at once
            raise CorruptionError(key, size - parsed, "tail still too short after a second read")
    return parsed


def check_range(data: BytesLike, entry: FlushIndexEntry, key: str) -> list[BatchHeader]:
    """Check one partition's bytes against its index entry: CRC-32C, then that the batches fill
    it exactly, continue one another and agree with the entry's offsets and counts."""
    view = memoryview(data).cast("B")
    if len(view) != entry.length:
        raise CorruptionError(
            key, entry.position + len(view), f"range of {entry.topic_id}-{entry.partition} ended early"
        )
    crc = crc32c.crc32c(view)
    if crc != entry.crc:
        raise CorruptionError(
            key,
            entry.position,
            f"{entry.topic_id}-{entry.partition}: range CRC-32C mismatch (stored {entry.crc:#010x}, computed {crc:#010x})",
        )
    headers: list[BatchHeader] = []
    pos = 0
    while pos < len(view):
        try:
            h = peek_header(view, pos)
        except (CorruptRecordError, InvalidRecordError) as exc:
            raise CorruptionError(
                key, entry.position + pos, f"{entry.topic_id}-{entry.partition}: {exc}"
            ) from None
        expected = entry.base_offset if not headers else headers[-1].last_offset + 1
        if h.base_offset != expected or pos + h.size > len(view):
            raise CorruptionError(
                key,
                entry.position + pos,
                f"{entry.topic_id}-{entry.partition}: batch at {h.base_offset} does not fit the range",
            )
        headers.append(h)
        pos += h.size
    if (
        not headers
        or headers[-1].last_offset != entry.last_offset
        or len(headers) != entry.batch_count
        or sum(h.record_count for h in headers) != entry.record_count
    ):
        raise CorruptionError(
            key, entry.position, f"{entry.topic_id}-{entry.partition}: batches disagree with the index entry"
        )
    return headers


def read_range(store: ObjectStore, key: str, entry: FlushIndexEntry) -> bytes:
    """One partition's batches from a stored flush object, one ranged read, checked."""
    data = store.get_range(key, entry.position, entry.length)
    check_range(data, entry, key)
    return data


def iter_batches(data: BytesLike) -> Iterator[memoryview]:
    """The batches of a range `check_range` passed, as views."""
    view = memoryview(data).cast("B")
    pos = 0
    while pos < len(view):
        h = peek_header(view, pos)
        yield view[pos : pos + h.size]
        pos += h.size


def check_header(header: BytesLike, key: str) -> tuple[int, int, int]:
    """(node_id, seq, created_ms) of a flush object's header, checked."""
    if len(header) < HEADER_SIZE:
        raise CorruptionError(key, len(header), "object ended inside the header")
    magic, version, flags, node_id, seq, created_ms, header_crc = HEADER.unpack_from(header)
    if magic != HEADER_MAGIC:
        raise CorruptionError(key, 0, f"bad header magic {bytes(magic)!r}")
    crc = crc32c.crc32c(memoryview(header)[:HEADER_CRC_OFFSET])
    if crc != header_crc:
        raise CorruptionError(
            key,
            HEADER_CRC_OFFSET,
            f"header CRC-32C mismatch (stored {header_crc:#010x}, computed {crc:#010x})",
        )
    if version != FLUSH_VERSION or flags:
        raise CorruptionError(key, 4, f"header version {version} / flags {flags} not understood")
    return node_id, seq, created_ms


def verify_flush_object(data: BytesLike, key: str) -> FlushIndex:
    """Check a whole flush object in memory: header, footer, index, every range. Catches any
    single-bit flip and any truncation or appended bytes."""
    view = memoryview(data).cast("B")
    parsed = parse_footer(view, len(view), key)
    if isinstance(parsed, int):  # pragma: no cover - the whole object is the tail
        raise CorruptionError(key, 0, "flush object tail unreadable")
    check_header(view[:HEADER_SIZE], key)
    for e in parsed.entries:
        check_range(view[e.position : e.end], e, key)
    return parsed


def ranges_by_partition(
    indexes: Sequence[FlushIndex],
) -> dict[tuple[str, int], list[tuple[str, FlushIndexEntry]]]:
    """(topic id, partition) -> [(key, entry)] in the order given (a merge's inputs)."""
    out: dict[tuple[str, int], list[tuple[str, FlushIndexEntry]]] = {}
    for idx in indexes:
        for e in idx.entries:
            out.setdefault((e.topic_id, e.partition), []).append((idx.key, e))
    return out
