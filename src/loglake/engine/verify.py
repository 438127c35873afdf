"""Whole-data-directory verification: every sealed segment, every partition's hash chain.

`verify_data_dir(engine)` walks each partition's segments in offset order and

* fully checks each object (header, every batch CRC, data CRC, index against the batches,
  trailer CRC, chain hash recomputed as SHA-256(prev_hash ‖ data)), streamed through ranged
  reads so memory stays bounded however large a segment is;
* checks the chain across segments: each segment's prev_hash is the chain hash of the one
  before it and its offsets continue the previous segment's (the partition's first segment
  may start anywhere, e.g. after retention; its prev_hash must be what the metadata records);
* checks the metadata against the objects: the recorded base/last offset, size, prev_hash,
  chain_hash and link_hash of each segment, and the partition's chain head (the last segment's
  link hash);
* checks compaction's invariant where a partition was compacted: below its clean end every
  record has a key and no key appears twice (what a cleaner pass guarantees; a rewritten
  segment's provenance and place in the chain are checked with the segment itself).

An attacker who edits batch bytes and recomputes every CRC and even the segment's own chain
hash still breaks the link to the next segment and the chain hash the metadata recorded.

Errors are collected, not raised: a run reports every bad segment, first one first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from loglake.engine.compaction import map_key
from loglake.errors import CorruptionError, LoglakeError
from loglake.records.batch import ATTR_CONTROL, batch_size, peek_header
from loglake.records.rebuild import decode_plain
from loglake.segment.format import SegmentTrailer, read_tail
from loglake.segment.verify import SegmentReader, verify_chain, verify_segment_in_store
from loglake.store.base import ObjectNotFoundError, cluster_prefix, parse_segment_key

if TYPE_CHECKING:
    from loglake.engine.catalog import Catalog
    from loglake.engine.partition import SegmentRef
    from loglake.engine.stores import Stores
    from loglake.store.base import ObjectStore

log = logging.getLogger(__name__)

__all__ = ["CatalogSource", "VerifyError", "VerifyReport", "VerifySource", "verify_data_dir", "verify_source"]

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class VerifyError:
    """One problem: the segment object key, the byte offset in it, and what is wrong."""

    key: str
    offset: int
    detail: str

    def __str__(self) -> str:
        return f"{self.key} @ byte {self.offset}: {self.detail}"


@dataclass(slots=True)
class VerifyReport:
    segments_checked: int = 0
    bytes_checked: int = 0
    partitions: int = 0
    errors: list[VerifyError] = field(default_factory=list)
    #: Segment objects of this cluster that no partition's metadata references (recovery left
    #: them in place because they do not continue a chain). Reported, not an error.
    unreferenced: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def first_error(self) -> VerifyError | None:
        return self.errors[0] if self.errors else None

    @property
    def bad_segments(self) -> list[str]:
        """Keys of the segments with at least one error, in the order found, without repeats."""
        return list(dict.fromkeys(e.key for e in self.errors))

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "segments_checked": self.segments_checked,
            "bytes_checked": self.bytes_checked,
            "partitions": self.partitions,
            "seconds": round(self.seconds, 6),
            "first_error": _error_json(self.first_error),
            "errors": [_error_json(e) for e in self.errors],
            "unreferenced": list(self.unreferenced),
        }


def _error_json(e: VerifyError | None) -> dict[str, object] | None:
    return None if e is None else {"key": e.key, "offset": e.offset, "detail": e.detail}


class VerifySource(Protocol):
    """What a verification walks: an open engine (`verify_data_dir`), or a running broker's data
    directory read without its lock (loglake.engine.verify_live)."""

    @property
    def cluster_id(self) -> str: ...
    @property
    def store(self) -> ObjectStore: ...
    def partitions(self) -> list[tuple[str, int]]: ...
    def segments(self, topic: str, partition: int) -> list[SegmentRef]: ...
    def store_for(self, seg: SegmentRef) -> ObjectStore: ...
    def clean_end(self, topic: str, partition: int) -> int: ...
    def chain_heads(self) -> dict[tuple[str, int], bytes]: ...
    def refresh(self) -> None:
        """Re-read the segment lists (a running broker changed them); an engine's are live."""


class CatalogSource:
    """A `VerifySource` over an open local log: its catalog's segment chains and its stores."""

    def __init__(self, catalog: Catalog, stores: Stores) -> None:
        self.catalog = catalog
        self.stores = stores

    @property
    def cluster_id(self) -> str:
        return self.catalog.cluster_id

    @property
    def store(self) -> ObjectStore:
        return self.stores.hot

    def partitions(self) -> list[tuple[str, int]]:
        return [(t.name, p.index) for t, p in self.catalog.partitions()]

    def segments(self, topic: str, partition: int) -> list[SegmentRef]:
        p = self.catalog.partition(topic, partition)
        with p.lock:
            return p.segments.slice(0)

    def store_for(self, seg: SegmentRef) -> ObjectStore:
        return self.stores.store_for(seg)

    def clean_end(self, topic: str, partition: int) -> int:
        return self.catalog.partition(topic, partition).meta.clean_end

    def refresh(self) -> None:
        pass

    def chain_heads(self) -> dict[tuple[str, int], bytes]:
        """Each partition's chain head as the metadata records it (what the next seal links to)."""
        return {(topic.name, p.index): p.chain_hash for topic, p in self.catalog.partitions()}


class Verifiable(Protocol):
    def verify(self, progress: Progress | None = None) -> VerifyReport: ...


def verify_data_dir(engine: Verifiable, progress: Progress | None = None) -> VerifyReport:
    """Verify every sealed segment of every partition of an open engine (`Engine.verify`)."""
    return engine.verify(progress)


def verify_source(engine: VerifySource, progress: Progress | None = None) -> VerifyReport:
    """Verify every sealed segment of every partition `engine` lists.

    `progress(bytes_done, bytes_total)` is called as data is read (sizes from the metadata).
    Segments removed by retention while the walk runs are skipped, not reported.
    """
    started = time.perf_counter()
    report = VerifyReport()
    plan: list[tuple[str, int, list[SegmentRef]]] = []
    for topic_name, p in engine.partitions():
        try:
            plan.append((topic_name, p, engine.segments(topic_name, p)))
        except LoglakeError:  # deleted meanwhile
            continue
    heads = engine.chain_heads()
    total = sum(seg.size for _, _, segs in plan for seg in segs)
    done = 0
    if progress:
        progress(0, total)

    referenced: set[str] = set()
    for topic, partition, segments in plan:
        report.partitions += 1
        prev: SegmentTrailer | None = None
        prev_key = ""
        for seg in segments:
            referenced.add(seg.key)
            base_done = done

            def on_progress(seg_done: int, base_done: int = base_done, size: int = seg.size) -> None:
                if progress:
                    progress(base_done + min(seg_done, size), total)

            trailer, errors = _check_segment(engine, topic, partition, seg, on_progress)
            if trailer is None and not errors:
                done += seg.size  # removed by retention meanwhile
                if progress:
                    progress(done, total)
                continue
            report.segments_checked += 1
            report.bytes_checked += trailer.size if trailer is not None else 0
            report.errors.extend(errors)
            if trailer is not None:
                report.errors.extend(_check_metadata(seg, trailer))
                if prev is not None:
                    try:
                        verify_chain([prev, trailer], [prev_key, seg.key])
                    except CorruptionError as exc:
                        report.errors.append(VerifyError(exc.path, exc.offset, exc.detail))
            prev, prev_key = trailer, seg.key
            done = base_done + seg.size
            if progress:
                progress(done, total)
        report.errors.extend(_check_compacted(engine, topic, partition, segments))
        if segments:
            head = heads.get((topic, partition))
            last = segments[-1]
            if head is not None and head != last.link_hash and _still_last(engine, topic, partition, last):
                report.errors.append(
                    VerifyError(
                        last.key,
                        0,
                        f"partition {topic}-{partition} records chain head {head.hex()}, "
                        f"but its last segment's link hash is {last.link_hash.hex()}",
                    )
                )

    report.unreferenced = _unreferenced(engine, referenced)
    report.seconds = time.perf_counter() - started
    log.info(
        "verified %d segments (%d bytes) of %d partitions in %.3fs: %d errors",
        report.segments_checked,
        report.bytes_checked,
        report.partitions,
        report.seconds,
        len(report.errors),
    )
    return report


def _check_segment(
    engine: VerifySource, topic: str, partition: int, seg: SegmentRef, progress: Callable[[int], None]
) -> tuple[SegmentTrailer | None, list[VerifyError]]:
    """Full check of one object. Returns its trailer (also when the data is bad but the tail
    reads, so the chain can still be followed) and the problems found; (None, []) when the
    segment is gone because retention removed it during the walk."""
    store = engine.store_for(seg)
    try:
        return verify_segment_in_store(store, seg.key, None, progress), []
    except ObjectNotFoundError:
        if not _still_listed(engine, topic, partition, seg):
            return None, []
        return None, [VerifyError(seg.key, 0, f"segment object listed in the metadata is missing from {store.url}")]
    except CorruptionError as exc:
        errors = [VerifyError(exc.path, exc.offset, exc.detail)]
    except LoglakeError as exc:  # storage errors: unreadable, not known to be corrupt
        return None, [VerifyError(seg.key, 0, f"could not read segment: {exc}")]
    try:
        trailer, _index = read_tail(store, seg.key)
    except LoglakeError:
        return None, errors
    return trailer, errors


def _still_listed(engine: VerifySource, topic: str, partition: int, seg: SegmentRef) -> bool:
    try:
        engine.refresh()
        return any(s.key == seg.key for s in engine.segments(topic, partition))
    except LoglakeError:  # the topic was deleted meanwhile
        return False


#: Most keys the compaction check holds per partition (about 100 bytes each); a partition with more
#: is checked up to here and the rest is reported as not checked.
VERIFY_KEYS_MAX = 5_000_000


def _check_compacted(engine: VerifySource, topic: str, partition: int, segments: list[SegmentRef]) -> list[VerifyError]:
    """Below the partition's clean end: every record keyed, no key twice (see the module doc)."""
    try:
        clean_end = engine.clean_end(topic, partition)
    except LoglakeError:
        return []
    seen: dict[bytes, int] = {}
    for seg in segments:
        if seg.base_offset >= clean_end:
            break
        try:
            for chunk in SegmentReader(engine.store_for(seg), seg.key, seg.size, check=False).chunks():
                error = _check_compacted_chunk(seg.key, chunk, clean_end, seen)
                if error is not None:
                    return [error]
        except LoglakeError:
            continue  # unreadable or gone: the segment check reported it already
        except _KeysCapped:
            log.warning("%s-%d: key uniqueness checked for the first %d keys only", topic, partition, VERIFY_KEYS_MAX)
            return []
    return []


class _KeysCapped(Exception):
    """VERIFY_KEYS_MAX keys were seen: the compaction check stops there."""


def _check_compacted_chunk(key: str, chunk: memoryview, clean_end: int, seen: dict[bytes, int]) -> VerifyError | None:
    """The compaction invariant over one chunk of whole batches (records below `clean_end`)."""
    pos = 0
    while pos < len(chunk):
        size = batch_size(chunk, pos)
        at = pos
        pos += size
        if peek_header(chunk, at).attributes & ATTR_CONTROL:
            continue
        try:
            _h, records = decode_plain(chunk[at : at + size])
        except LoglakeError as exc:
            return VerifyError(key, 0, f"batch at offset {peek_header(chunk, at).base_offset} does not decode: {exc}")
        for r in records:
            if r.offset >= clean_end:
                return None
            if r.key is None:
                return VerifyError(key, 0, f"record {r.offset} below the clean end {clean_end} has no key")
            mapped = map_key(r.key)
            if mapped in seen:
                return VerifyError(
                    key, 0, f"key {r.key[:64]!r} appears at offsets {seen[mapped]} and {r.offset}, both below the clean end {clean_end}"
                )
            if len(seen) >= VERIFY_KEYS_MAX:
                raise _KeysCapped
            seen[mapped] = r.offset
    return None


def _check_metadata(seg: SegmentRef, t: SegmentTrailer) -> list[VerifyError]:
    """The metadata's record of a segment against the object's trailer."""
    errors: list[VerifyError] = []
    for name, recorded, actual in (
        ("base_offset", seg.base_offset, t.base_offset),
        ("last_offset", seg.last_offset, t.last_offset),
        ("prev_hash", seg.prev_hash, t.prev_hash),
        ("chain_hash", seg.chain_hash, t.chain_hash),
        ("link_hash", seg.link_hash, t.link_hash),
        ("generation", seg.generation, t.generation),
    ):
        if recorded == b"":
            continue  # not recorded by this metadata (a cluster's records link hashes only)
        if recorded != actual:
            shown_recorded = recorded.hex() if isinstance(recorded, bytes) else recorded
            shown_actual = actual.hex() if isinstance(actual, bytes) else actual
            errors.append(
                VerifyError(
                    seg.key,
                    t.field_position(name) if name in ("base_offset", "last_offset", "prev_hash", "chain_hash") or t.rewritten else 0,
                    f"metadata records {name} {shown_recorded}, the segment has {shown_actual}",
                )
            )
    if seg.size != t.size:
        errors.append(
            VerifyError(seg.key, t.size, f"metadata records a size of {seg.size} bytes, the object has {t.size}")
        )
    return errors


def _still_last(engine: VerifySource, topic: str, partition: int, seg: SegmentRef) -> bool:
    """False when a seal appended a segment after the walk's plan was taken."""
    try:
        engine.refresh()
        now = engine.segments(topic, partition)
    except LoglakeError:
        return False
    return bool(now) and now[-1].key == seg.key


def _unreferenced(engine: VerifySource, referenced: set[str]) -> list[str]:
    try:
        keys = engine.store.list(cluster_prefix(engine.cluster_id))
        engine.refresh()
        for topic_name, p in engine.partitions():  # segments sealed while the walk ran are referenced too
            referenced.update(s.key for s in engine.segments(topic_name, p))
    except LoglakeError:
        return []
    out: list[str] = []
    for key in keys:
        try:
            parse_segment_key(key)
        except LoglakeError:
            continue
        if key not in referenced:
            out.append(key)
    return out
