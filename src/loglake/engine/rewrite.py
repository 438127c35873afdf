"""Rewriting sealed segments: the swap that compaction and merging share.

A rewrite replaces a run of consecutive sealed segments of one partition, all in one tier, by
new segments covering exactly the same offsets:

    1. read each input whole and verify it (CRCs, chain hash): a damaged segment is never
       laundered into a "valid" rewritten one; the rewrite stops and says where
    2. pass each batch through the filter (compaction drops superseded records; merging keeps
       all) into version-2 segments, cut at input boundaries once `target_bytes` is reached
    3. PUT the new objects under new keys (`<base>-g<generation>.seg`) in the inputs' store
    4. one durable `segment_rewritten` metadata record swaps them in    ← the switch
    5. delete the replaced objects

A crash before 4 leaves the old chain (new objects are unreferenced and below the sealed end,
so recovery removes them); after 4 the new chain (recovery removes the replaced leftovers).
Readers holding an old segment get ObjectNotFound after 5 and look the offset up again: the
new segment covers it. Each new segment's provenance names the segments it replaced and their
hashes, so the chain still verifies (docs/FORMAT.md, "Rewritten segments").
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loglake.engine.catalog import Catalog
from loglake.engine.partition import Partition, SegmentRef
from loglake.engine.stores import IndexCache, Stores
from loglake.errors import CorruptionError
from loglake.meta.lifecycle import Tier
from loglake.records.batch import batch_size
from loglake.segment.format import Rewrite, SegmentWriter
from loglake.segment.index import SegmentIndex
from loglake.segment.verify import SegmentReader
from loglake.store.base import segment_file_name

__all__ = ["BatchFilter", "RateLimiter", "RewriteAborted", "RewriteStats", "Rewriter", "build"]

log = logging.getLogger(__name__)

#: A batch in, the batch to keep out (the same view, a rebuilt batch, or None to drop it).
BatchFilter = Callable[[memoryview], "bytes | memoryview | None"]

#: Input is read in chunks of whole batches of about this size (one batch when larger), so a
#: rewrite holds one chunk of input, not a whole segment.
READ_CHUNK_BYTES = 8 * 1024 * 1024
#: Most segments one rewrite replaces (bounds its metadata record and provenance).
REWRITE_SEGMENTS_MAX = 1_000


class RateLimiter:
    """A token bucket over bytes: `acquire(n)` sleeps so that the long-run rate stays at or under
    `bytes_per_s` (0: unlimited). Bursts are bounded by one second's worth."""

    def __init__(self, bytes_per_s: int, stop: threading.Event | None = None) -> None:
        self.bytes_per_s = bytes_per_s
        self._stop = stop or threading.Event()
        self._lock = threading.Lock()
        self._tokens = float(bytes_per_s)
        self._last = time.monotonic()

    def set_rate(self, bytes_per_s: int) -> None:
        """A new rate, from now on (a dynamic broker config); the bucket keeps what it holds, capped."""
        with self._lock:
            self.bytes_per_s = bytes_per_s
            self._tokens = min(self._tokens, float(bytes_per_s))

    def acquire(self, n: int) -> None:
        if self.bytes_per_s <= 0:
            return
        with self._lock:
            now = time.monotonic()
            self._tokens = min(float(self.bytes_per_s), self._tokens + (now - self._last) * self.bytes_per_s)
            self._last = now
            self._tokens -= n
            wait = -self._tokens / self.bytes_per_s if self._tokens < 0 else 0.0
        if wait > 0:
            self._stop.wait(wait)


@dataclass
class RewriteStats:
    segments_in: int = 0
    segments_out: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    batches_in: int = 0
    batches_out: int = 0


def replaced_entry(s: SegmentRef) -> list[object]:
    """One replaced segment in a provenance: [base, last, chain hash, link hash or "" when it is
    the chain hash, generation, size]; hashes in base64. Each one's prev_hash is the previous
    one's link (the first one's is the new segment's prev_hash), so it is not repeated."""
    link = "" if s.link_hash == s.chain_hash else base64.b64encode(s.link_hash).decode()
    return [s.base_offset, s.last_offset, base64.b64encode(s.chain_hash).decode(), link, s.generation, s.size]


class RewriteAborted(Exception):
    """The run changed under the rewrite (retention, relocation, a delete): nothing was swapped."""


def build(
    store: Any,
    key_prefix: str,
    run: list[SegmentRef],
    keep: BatchFilter | None,
    *,
    kind: str,
    params: dict[str, Any],
    target_bytes: int,
    now_ms: int,
    limiter: RateLimiter,
    alive: Callable[[], bool] | None = None,
    generation: int | None = None,
) -> tuple[list[tuple[SegmentRef, SegmentIndex]], RewriteStats]:
    """Steps 1-3 of the module docstring: the new segments, PUT, not yet switched to.

    Each new segment's generation (key and trailer) is one more than its first replaced
    segment's, or `generation` when given: cluster mode picks one in its leader epoch's own
    range, so a deposed leader's output never has its successor's key (loglake.cluster.compact).

    Pure with respect to the engine (it needs only the store), so a worker process can run it.
    Inputs are read and verified in chunks (READ_CHUNK_BYTES); with a filter, kept batches
    are copied, so a chunk is freed once it was filtered rather than pinned by the output. `alive()` is asked before each PUT
    (a worker whose engine is gone must not write). On failure the objects already PUT are
    deleted again.
    """
    if not run or len(run) > REWRITE_SEGMENTS_MAX:
        raise ValueError(f"a rewrite takes 1..{REWRITE_SEGMENTS_MAX} segments, got {len(run)}")
    if len({s.tier for s in run}) != 1:
        raise ValueError("a rewrite's segments must all be in one tier")
    stats = RewriteStats()
    outputs: list[tuple[SegmentRef, SegmentIndex]] = []
    group: list[SegmentRef] = []
    writer: SegmentWriter | None = None
    try:
        readers = [SegmentReader(store, seg.key, seg.size, READ_CHUNK_BYTES) for seg in run]
        # any transaction index in the run: every output carries one (format version 3)
        txn_index = any(r.trailer.txn_index for r in readers)
        for seg, reader in zip(run, readers, strict=True):
            if writer is None:
                placeholder = Rewrite(run[-1].last_offset, seg.link_hash, seg.generation + 1, {})
                writer = SegmentWriter(seg.base_offset, seg.prev_hash, now_ms, placeholder, txn_index=txn_index)
            writer.aborted_txns.extend(reader.trailer.aborted_txns)
            for chunk in reader.chunks():
                limiter.acquire(len(chunk))
                pos, end = 0, len(chunk)
                while pos < end:
                    size = batch_size(chunk, pos)
                    batch = chunk[pos : pos + size]
                    pos += size
                    stats.batches_in += 1
                    out = batch if keep is None else keep(batch)
                    if out is not None:
                        writer.add_batch(bytes(out) if keep is not None and out is batch else out)
                        stats.batches_out += 1
            trailer = reader.finish(seg.prev_hash)
            stats.bytes_read += reader.bytes_read
            if trailer.chain_hash != seg.chain_hash or trailer.link_hash != seg.link_hash:
                raise CorruptionError(seg.key, trailer.field_position("chain_hash"), "segment does not match its metadata")
            group.append(seg)
            if writer.size >= target_bytes or seg is run[-1]:
                if alive is not None and not alive():
                    raise RewriteAborted("the engine that asked for this rewrite is gone")
                outputs.append(_finish(store, key_prefix, writer, group, kind, params, now_ms, limiter, generation))
                stats.bytes_written += outputs[-1][0].size
                writer, group = None, []
    except BaseException:
        for ref, _index in outputs:
            _delete_quietly(store, ref.key)
        raise
    stats.segments_in = len(run)
    stats.segments_out = len(outputs)
    return outputs, stats


def _finish(
    store: Any,
    key_prefix: str,
    writer: SegmentWriter,
    group: list[SegmentRef],
    kind: str,
    params: dict[str, Any],
    now_ms: int,
    limiter: RateLimiter,
    generation: int | None = None,
) -> tuple[SegmentRef, SegmentIndex]:
    first, last = group[0], group[-1]
    gen = first.generation + 1 if generation is None else generation
    provenance = {"kind": kind, "ms": now_ms, "params": params, "replaced": [replaced_entry(s) for s in group]}
    writer.rewrite = Rewrite(last.last_offset, last.link_hash, gen, provenance)
    parts, trailer, index = writer.finish()
    key = key_prefix + segment_file_name(first.base_offset, gen)
    limiter.acquire(trailer.size)
    store.put(key, parts)
    return SegmentRef.from_trailer(key, trailer, first.tier, None), index


def _delete_quietly(store: Any, key: str) -> None:
    try:
        store.delete(key)
    except Exception:
        log.exception("could not delete %s from %s after a failed rewrite; recovery removes it", key, store.url)


class Rewriter:
    """Steps 4-5 against the engine: the switch to segments `build` made, then the deletes."""

    def __init__(
        self,
        catalog: Catalog,
        stores: Stores,
        indexes: IndexCache,
        before_delete: Callable[[], object] | None = None,
    ) -> None:
        self.catalog = catalog
        self.stores = stores
        self.indexes = indexes
        #: called between the durable switch and the deletes: the engine publishes its metadata,
        #: so readers of the stores' copy (Spark) stop naming the replaced objects before they go
        self.before_delete = before_delete

    def swap(
        self, p: Partition, run: list[SegmentRef], outputs: list[tuple[SegmentRef, SegmentIndex]], clean: dict[str, int] | None
    ) -> None:
        """Steps 4-5: one durable metadata switch, then the replaced objects go. RewriteAborted
        (and the outputs deleted) when the run is no longer in place."""
        try:
            with p.lock:
                fut = self.catalog.record_rewrite(p, run, [ref for ref, _ in outputs], clean)
        except ValueError as exc:
            fut, reason = None, str(exc)
        else:
            reason = f"segments {run[0].base_offset}..{run[-1].last_offset} changed during the rewrite"
        if fut is None:
            for ref, _index in outputs:
                self.stores.delete_segment(ref.key, ref.tier)
            raise RewriteAborted(reason)
        # From here the switch is applied: the new objects must stay whatever happens.
        fut.result()  # 4. the switch is durable
        for ref, index in outputs:
            if ref.tier == Tier.HOT:
                self.indexes.put(ref.key, index)
        if self.before_delete is not None:
            try:
                self.before_delete()
            except Exception as exc:  # the deletes go on: a reader of a stale copy retries
                log.warning("publishing the metadata before deleting replaced segments failed: %s", exc)
        for seg in run:  # 5. the replaced objects go
            self.indexes.forget(seg.key)
            self.stores.delete_segment(seg.key, seg.tier)
