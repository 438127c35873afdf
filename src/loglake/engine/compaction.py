"""Key compaction (`cleanup.policy=compact`): keep the newest record of every key.

One pass over a partition, Kafka's cleaner reduced to its rules:

* The **dirty** part starts at the partition's `clean_end` (metadata); it ends at the first
  sealed segment newer than `min.compaction.lag.ms`. Unsealed data is never touched.
* A pass is due when dirty bytes / sealed bytes >= `min.cleanable.dirty.ratio`, or when the
  oldest dirty segment is older than `max.compaction.lag.ms`.
* **Key map**: the dirty records' keys → newest offset, bounded by
  `cleaner_dedupe_buffer_bytes`. When it fills, the pass ends there (possibly mid-segment):
  its `clean_end` is the first offset not mapped, and the next pass goes on from it.
* **Rewrite** of every sealed segment from the first up to the one holding the map's end
  (loglake.engine.rewrite): a record survives when the map has no newer offset for its key.
  Records without a key are dropped (a compacted topic refuses them on produce). A tombstone
  (null value) survives until `delete.retention.ms` after the cleaner first passed it (the
  partition's clean marks record when that was). Control batches stay whole; a producer's
  newest batch stays as an empty header if all its records go, as Kafka keeps it, and so does
  the sealed log's last batch (consumers step over an empty batch to its last offset + 1).
* A partition with nothing dirty gets a pass anyway once the oldest tombstone the last pass
  kept is past `delete.retention.ms` (the partition's `tombstone_ms`), so deletes do finish.
* **Transactions** (docs/TRANSACTIONS.md): only segments wholly below the last stable offset are
  cleaned (an open transaction's records are never touched); records of aborted transactions
  (the partition's aborted list: producer id, first offset, marker offset) neither enter the key
  map, so they never supersede a committed record, nor survive the rewrite, as Kafka's cleaner
  removes them. Transaction markers (control batches) are kept.
* Offsets never change: kept records keep theirs, and batches keep their base and last offset.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from loglake.engine.config import TopicConfig
from loglake.engine.partition import Partition, SegmentRef
from loglake.records.batch import ATTR_CONTROL, ATTR_TRANSACTIONAL, batch_size, peek_header
from loglake.records.rebuild import decode_plain, empty_batch, rebuild_batch

__all__ = [
    "KEY_ENTRY_BYTES",
    "Aborted",
    "CleanPlan",
    "KeyMap",
    "aborted_index",
    "build_key_map",
    "dirty_ratio",
    "first_pass_ms",
    "is_aborted",
    "plan_clean",
    "plan_segments",
    "record_filter",
]

log = logging.getLogger(__name__)

#: What one key costs in the map, measured with sys.getsizeof on CPython 3.11: dict slot and
#: index (~42 B), the key object (bytes: 33 B + its length, at most 32 B: longer keys are kept
#: as a 16-byte BLAKE2b digest) and the offset (int: 32 B). Kafka's map spends 24 B a key; this
#: one trades memory for exact keys up to 32 bytes (no digest collision for typical keys).
KEY_ENTRY_BYTES = 110
#: Keys up to this long are kept as they are; longer ones as a 16-byte digest.
KEY_INLINE_BYTES_MAX = 32


#: A partition's aborted transactions as [producer id, first offset, marker offset] triples.
Aborted = Iterable[Sequence[int]]


def aborted_index(aborted: Aborted) -> dict[int, list[tuple[int, int]]]:
    """Producer id -> its aborted offset ranges [first, marker]."""
    out: dict[int, list[tuple[int, int]]] = {}
    for pid, first, marker in aborted:
        out.setdefault(int(pid), []).append((int(first), int(marker)))
    return out


def is_aborted(index: dict[int, list[tuple[int, int]]], attributes: int, producer_id: int, base_offset: int) -> bool:
    """Is this batch the data of an aborted transaction?"""
    if not attributes & ATTR_TRANSACTIONAL or attributes & ATTR_CONTROL:
        return False
    return any(first <= base_offset <= marker for first, marker in index.get(producer_id, ()))


def first_pass_ms(marks: list[list[int]], offset: int) -> int | None:
    """When the cleaner first passed `offset`, from a partition's clean marks ([[end, ms], ...]
    ascending); None if it never did."""
    for end, ms in marks:
        if offset < end:
            return ms
    return None


def map_key(key: bytes) -> bytes:
    return key if len(key) <= KEY_INLINE_BYTES_MAX else hashlib.blake2b(key, digest_size=16).digest()


@dataclass
class KeyMap:
    """Key -> newest offset, bounded by `bytes_max` (KEY_ENTRY_BYTES + key length per key)."""

    bytes_max: int
    entries: dict[bytes, int] = field(default_factory=dict)
    bytes_used: int = 0

    def full_for(self, new_keys: int, key_bytes: int) -> bool:
        return self.bytes_used + new_keys * KEY_ENTRY_BYTES + key_bytes > self.bytes_max

    def add_batch(self, keys: list[bytes], offsets: list[int], key_bytes: int | None = None) -> None:
        """Map `keys` (already map keys) to `offsets`; `key_bytes` is sum(len(k) for k in keys)
        when the caller has it."""
        entries = self.entries
        before = len(entries)
        entries.update(zip(keys, offsets, strict=True))
        grown = len(entries) - before
        if grown:
            if key_bytes is None:
                key_bytes = sum(map(len, keys))
            self.bytes_used += grown * KEY_ENTRY_BYTES + key_bytes * grown // len(keys)


@dataclass
class CleanPlan:
    """What one pass does: the segments to rewrite and where the cleaned part will end."""

    run: list[SegmentRef]
    dirty: list[SegmentRef]
    dirty_ratio: float


def dirty_ratio(p: Partition) -> float:
    """Uncleaned share of the partition's sealed bytes (0 when it has none)."""
    with p.lock:
        return dirty_ratio_locked(p)


def dirty_ratio_locked(p: Partition) -> float:
    """`dirty_ratio` for a caller that holds the partition's lock (O(segments past the clean end))."""
    total = p.segments.total_bytes()
    return p.segments.bytes_from(p.meta.clean_end) / total if total else 0.0


def plan_clean(p: Partition, config: TopicConfig, now_ms: int, *, force: bool = False) -> CleanPlan | None:
    """The next pass for `p`, or None when none is due."""
    with p.lock:
        segments = p.segments.slice(0)
        clean_end = p.meta.clean_end
        stable_end = min(p.meta.txn_open.values(), default=None)  # first offset of an open transaction
        tombstone_ms = p.meta.tombstone_ms
    return plan_segments(segments, clean_end, stable_end, tombstone_ms, config, now_ms, force=force)


def plan_segments(
    segments: list[SegmentRef],
    clean_end: int,
    stable_end: int | None,
    tombstone_ms: int,
    config: TopicConfig,
    now_ms: int,
    *,
    force: bool = False,
) -> CleanPlan | None:
    """`plan_clean`'s rules over a partition's sealed segments (oldest first), its clean end, the
    first offset of its oldest open transaction (None: none open) and its `tombstone_ms`; both
    modes' cleaners plan with it (cluster mode over its merged segments)."""
    if not segments:
        return None
    lag_limit = now_ms - config.min_compaction_lag_ms
    # only a prefix: the first segment inside the lag window, or reaching an open transaction,
    # ends the cleanable part
    n = next(
        (i for i, s in enumerate(segments) if s.max_timestamp > lag_limit or (stable_end is not None and s.last_offset >= stable_end)),
        len(segments),
    )
    dirty = [s for s in segments[:n] if s.last_offset >= clean_end]
    tombstones_due = 0 <= tombstone_ms <= now_ms - config.delete_retention_ms
    if not dirty:
        # nothing new to map, but tombstones the last pass kept may be due to go
        cleaned = [s for s in segments[:n] if s.base_offset < clean_end]
        return CleanPlan(cleaned, [], 0.0) if tombstones_due and cleaned else None
    total = sum(s.size for s in segments)
    ratio = sum(s.size for s in segments if s.last_offset >= clean_end) / total if total else 0.0
    oldest_dirty_ms = dirty[0].created_ms
    forced = config.max_compaction_lag_ms < 2**63 - 1 and oldest_dirty_ms <= now_ms - config.max_compaction_lag_ms
    if not (force or forced or ratio >= config.min_cleanable_dirty_ratio):
        return None
    return CleanPlan(segments[:n], dirty, ratio)


def build_key_map(
    read: Callable[[SegmentRef], Iterable[memoryview]],
    dirty: list[SegmentRef],
    start: int,
    bytes_max: int,
    aborted: Aborted = (),
) -> tuple[KeyMap, int]:
    """Map the dirty records' keys from offset `start` on; returns the map and the first offset
    not mapped (the pass's clean end). `read(seg)` yields a segment's data in chunks of whole
    batches. Records of `aborted` transactions are not mapped."""
    keymap = KeyMap(bytes_max)
    index = aborted_index(aborted)
    end = start
    for seg in dirty:
        for chunk in read(seg):
            pos = 0
            while pos < len(chunk):
                size = batch_size(chunk, pos)
                batch = chunk[pos : pos + size]
                pos += size
                mapped = _map_batch(keymap, batch, start, seg.key, index)
                if mapped is None:
                    return keymap, end
                end = max(end, mapped)
        end = max(end, seg.end_offset)
    return keymap, end


def _map_batch(
    keymap: KeyMap, batch: memoryview, start: int, where: str, aborted: dict[int, list[tuple[int, int]]] | None = None
) -> int | None:
    """Map one batch's keys; the offset after it, or None when the map is full."""
    h = peek_header(batch)
    after = h.base_offset + h.last_offset_delta + 1
    if h.attributes & ATTR_CONTROL or after <= start:
        return after
    if aborted and is_aborted(aborted, h.attributes, h.producer_id, h.base_offset):
        return after
    _h, records = decode_plain(batch)
    # The common batch (every record keyed, short keys, all at or after `start`) is mapped by
    # C-level comprehensions; anything else record by record.
    keys = [r.key for r in records]
    offsets = [r.offset for r in records]
    try:
        longest = max(map(len, keys), default=0)
    except TypeError:  # a record without a key
        longest = KEY_INLINE_BYTES_MAX + 1
    if longest > KEY_INLINE_BYTES_MAX or h.base_offset < start:
        pairs = [(map_key(k), o) for k, o in zip(keys, offsets, strict=True) if k is not None and o >= start]
        keys = [k for k, _o in pairs]
        offsets = [o for _k, o in pairs]
    key_bytes = sum(map(len, keys))
    if keys and keymap.full_for(len(keys), key_bytes):
        if not keymap.entries:
            raise ValueError(
                f"cleaner_dedupe_buffer_bytes ({keymap.bytes_max}) cannot hold the keys of one batch "
                f"at offset {h.base_offset} of {where}"
            )
        return None
    keymap.add_batch(keys, offsets, key_bytes)
    return after


def record_filter(
    keymap: KeyMap,
    map_end: int,
    passed_ms: Callable[[int], int | None],
    delete_retention_ms: int,
    now_ms: int,
    retain_empty: set[tuple[int, int]],
    stats: dict[str, int],
    log_last_offset: int = -1,
    aborted: Aborted = (),
) -> Callable[[memoryview], bytes | memoryview | None]:
    """The batch filter of one pass (see the module docstring for the rules)."""
    entries = keymap.entries
    index = aborted_index(aborted)

    def keep_batch(batch: memoryview) -> bytes | memoryview | None:
        h = peek_header(batch)
        if h.attributes & ATTR_CONTROL:
            return batch
        if index and is_aborted(index, h.attributes, h.producer_id, h.base_offset):
            stats["aborted_dropped"] = stats.get("aborted_dropped", 0) + h.last_offset_delta + 1
            return empty_batch(h) if (h.producer_id, h.base_offset) in retain_empty else None
        _h, records = decode_plain(batch)
        kept = []
        for r in records:
            key = r.key
            if key is None:
                continue  # a compacted topic has no use for it (and refuses it on produce)
            newest = entries.get(map_key(key))
            if newest is not None and newest > r.offset:
                continue  # superseded
            if r.value is None and r.offset < map_end:
                passed = passed_ms(r.offset)
                if passed is not None and passed + delete_retention_ms <= now_ms:
                    stats["tombstones_dropped"] = stats.get("tombstones_dropped", 0) + 1
                    continue
                since = now_ms if passed is None else passed
                oldest = stats.get("tomb_ms", -1)
                stats["tomb_ms"] = since if oldest < 0 else min(oldest, since)
            kept.append(r)
        stats["records_in"] = stats.get("records_in", 0) + len(records)
        stats["records_out"] = stats.get("records_out", 0) + len(kept)
        if len(kept) == len(records):
            return batch
        if kept:
            return rebuild_batch(h, kept)
        if (h.producer_id, h.base_offset) in retain_empty or h.base_offset + h.last_offset_delta == log_last_offset:
            # a producer's newest batch (its sequence state), or the sealed log's very last batch:
            # without it a consumer whose position is in an emptied tail would have no batch to
            # step over and would wait at that position with a phantom lag
            return empty_batch(h)
        return None

    return keep_batch
