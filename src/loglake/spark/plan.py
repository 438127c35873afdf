"""Driver-side planning: published metadata -> partitions -> offset ranges -> segment slices.

No pyspark here: everything is plain Python over the object store, so it is unit-testable and
the same code serves batch and streaming reads. Without a broker only sealed segments (what the
store's copy of the metadata lists: loglake.meta.publish) are visible; hybrid reads
(kafka.bootstrap.servers, spark/broker.py) add the tail after them as BrokerRanges.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from loglake.errors import LoglakeError
from loglake.fs.os_fs import OsFileSystem
from loglake.meta.lifecycle import Tier
from loglake.meta.publish import find_clusters, read_remote_state
from loglake.meta.txn import ABORTED_TXNS_MAX
from loglake.records.decode import decode_batch
from loglake.segment.format import read_tail
from loglake.spark.model import FlushSlice, PartitionMeta, SegmentInfo, Slice, TopicPartition
from loglake.spark.options import EARLIEST, LATEST, LoglakeOptionError, OffsetSpec, ReadOptions
from loglake.store import ObjectStore, open_store

log = logging.getLogger("loglake.spark")

#: Offsets as Spark's streaming engine stores them: {topic: {"partition": next offset}}.
OffsetDict = dict[str, dict[str, int]]


class DataLossError(LoglakeError):
    """Offsets a query needs are gone (retention deleted them, or the topic was re-created)."""


class NoLoglakeDataError(LoglakeOptionError):
    """The `path` option names neither a loglake data directory nor a segment store holding the
    metadata a broker publishes. `message` says which path and what was expected, `hint` what
    to give instead; str() is both (Spark shows only str())."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(f"{message}\nhint: {hint}")
        self.message = message
        self.hint = hint


#: What the `path` option must name, as errors say it.
PATH_EXPECTED = (
    "a loglake data directory (the broker's --data-dir, which has a segments/ folder) or the URL of "
    "a segment store a broker publishes to (its --cold-store: file:///DIR or s3://BUCKET/PREFIX)"
)


def no_data_error(path: str, store_url: str) -> NoLoglakeDataError:
    """The error for a `path` whose store (`store_url`) has no loglake metadata, saying why."""
    local = store_url[len("file://") :] if store_url.startswith("file://") else store_url
    local = local if "://" not in local else ""
    where = repr(path) if os.path.abspath(path) == local else f"{path!r} ({store_url})"
    hint = "give the directory `loglake serve --data-dir` uses (e.g. --path ./data), or in cluster mode the --cold-store URL"
    if local and not os.path.exists(local):
        what = "it does not exist"
    elif local and os.path.basename(local) == "segments" and os.path.isdir(os.path.join(local, "..", "wal")):
        what = "the data directory's segment store holds no published metadata yet"
        hint = (
            "a broker publishes the metadata when it seals a segment (segment.ms, segment.bytes, "
            "a flush, or a clean shutdown): seal some data, then read again"
        )
    else:
        what = "it holds no loglake metadata (loglake-*/meta/)"
        parent = os.path.dirname(local.rstrip("/")) if local else ""
        if parent and os.path.isdir(os.path.join(parent, "segments")):
            hint = f"{parent!r} looks like the data directory this is part of: give that"
    return NoLoglakeDataError(f"no loglake data at {where}: {what}; path must be {PATH_EXPECTED}", hint)


@dataclass(frozen=True, slots=True)
class BrokerRange:
    """One Spark input partition of a hybrid read: offsets [start, end) of one partition, read
    through the broker by one consumer (spark/broker.py). Offsets in it may be markers, aborted
    or compacted away: the range ends where the consumer's position reaches `end`."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Metadata:
    cluster_id: str
    seq: int
    topics: dict[str, dict[str, Any]]
    partitions: dict[TopicPartition, PartitionMeta]
    #: published by a `loglake serve --cluster` broker (loglake.cluster.publish)
    cluster_mode: bool = False


_FS = OsFileSystem()


@lru_cache(maxsize=16)
def cached_store(url: str) -> ObjectStore:
    """One store object per URL and process (Python workers are reused across tasks)."""
    if url.lower().startswith("s3://"):
        try:
            from loglake.store import s3

            s3.register()
        except ImportError as exc:  # pragma: no cover - boto3 missing
            raise LoglakeError(f"reading {url} needs the S3 store (boto3): {exc}") from exc
    return open_store(url, _FS)


def load_metadata(
    store: ObjectStore, isolation: str = "read_uncommitted", *, path: str | None = None
) -> Metadata:
    """The cluster's metadata as the store's copy has it (newest checkpoint + log pieces);
    NoLoglakeDataError naming `path` (what the user gave, default the store's URL) if it has none.

    At read_committed a partition ends at the last stable offset of its sealed data: the first
    offset of the earliest transaction still open (never above the sealed end), and carries the
    aborted transactions readers must skip."""
    committed = isolation == "read_committed"
    clusters = find_clusters(store)
    if not clusters:
        raise no_data_error(path or store.url, store.url)
    remote = read_remote_state(store, cluster_id=clusters[0] if len(clusters) == 1 else None)
    state = remote.state
    parts: dict[TopicPartition, PartitionMeta] = {}
    topics: dict[str, dict[str, Any]] = {}
    for tm in state.topics.values():
        tid = tm.topic_id.hex()
        topics[tm.name] = {"id": tid, "partitions": tm.partitions, "config": dict(tm.config), "created_ms": tm.created_ms}
        for p in range(tm.partitions):
            plog = state.plogs.parts.get((tm.topic_id, p))
            pm = state.partition(tm.topic_id, p)
            if plog is not None:  # cluster mode (durability class object)
                from loglake.spark.cluster_plan import cluster_partition

                cp = cluster_partition(store.url, tm.name, tid, p, plog)
                if committed:  # the txn records are the metadata's in both modes (loglake.meta.txn)
                    cp = replace(
                        cp,
                        end=max(min([cp.end, *pm.txn_open.values()]), cp.log_start),
                        aborted=tuple((int(a), int(b), int(c)) for a, b, c in pm.aborted_txns),
                        aborted_trimmed=len(pm.aborted_txns) >= ABORTED_TXNS_MAX,
                    )
                parts[(tm.name, p)] = cp
                continue
            segs = tuple(
                SegmentInfo(
                    s.key, s.base_offset, s.last_offset, s.size, s.max_timestamp, s.record_count, s.tier,
                    s.prev_hash.hex(), s.chain_hash.hex(),
                )
                for s in pm.segments
            )
            end = pm.sealed_end
            aborted: tuple[tuple[int, int, int], ...] = ()
            if committed:
                end = min([end, *pm.txn_open.values()])
                aborted = tuple((int(a), int(b), int(c)) for a, b, c in pm.aborted_txns)
            parts[(tm.name, p)] = PartitionMeta(
                tm.name, tid, p, pm.log_start, max(end, pm.log_start), segs, aborted,
                committed and len(pm.aborted_txns) >= ABORTED_TXNS_MAX,
            )
    return Metadata(state.cluster_id, state.seq, topics, parts, bool(state.plogs.parts))


def select_partitions(opts: ReadOptions, meta: Metadata) -> list[PartitionMeta]:
    """The partitions the subscription names, sorted by (topic, partition)."""
    if opts.assign is not None:
        out = []
        for topic, plist in opts.assign.items():
            if topic not in meta.topics:
                raise LoglakeOptionError(f"option assign: topic {topic!r} does not exist")
            for p in plist:
                if (topic, p) not in meta.partitions:
                    raise LoglakeOptionError(
                        f"option assign: topic {topic!r} has no partition {p} (it has {meta.topics[topic]['partitions']})"
                    )
                out.append(meta.partitions[(topic, p)])
        return sorted(out, key=lambda m: m.tp)
    for topic in opts.subscribe:
        if topic not in meta.topics:
            log.warning("loglake: subscribed topic %r does not exist (yet)", topic)
    return sorted((m for tp, m in meta.partitions.items() if opts.matches(tp[0])), key=lambda m: m.tp)


# ---- offsets ----------------------------------------------------------------------------------


def store_for(seg: SegmentInfo, hot_url: str, cold_url: str | None) -> str:
    """The URL of the store holding a segment: the hot store, or the cold one (option coldPath)."""
    if seg.tier == Tier.COLD:
        if not cold_url:
            raise LoglakeOptionError(
                f"segment {seg.key} was moved to the cold tier: give its store URL with the option coldPath"
            )
        return cold_url
    return hot_url


def offset_for_timestamp(
    store: ObjectStore, pm: PartitionMeta, ts: int, cold_url: str | None = None
) -> int | None:
    """The first offset (at or after log start) whose record timestamp is >= ts, else None."""
    for seg in pm.segments:
        if seg.last < pm.log_start or seg.max_ts < ts:
            continue
        if seg.tier == Tier.COLD:
            store = cached_store(store_for(seg, store.url, cold_url))
        _trailer, index = read_tail(store, seg.key, seg.size)
        i = index.find_timestamp(ts)
        while i is not None and i < len(index):
            e = index.entry(i)
            data = store.get_range(seg.key, e.position, e.length)
            header, records = decode_batch(data)
            if not header.is_control:
                for r in records:
                    if r.timestamp >= ts and r.offset >= pm.log_start:
                        return r.offset
            i += 1
    if pm.flush:  # cluster mode: the committed ranges not merged yet
        from loglake.spark.cluster_plan import flush_offset_for_timestamp

        return flush_offset_for_timestamp(store, pm, ts)
    return None


def resolve_offset(
    spec: OffsetSpec,
    pm: PartitionMeta,
    store: ObjectStore,
    *,
    starting: bool,
    strategy: str = "error",
    cold_url: str | None = None,
    tail: Callable[[TopicPartition, int], int | None] | None = None,
) -> int:
    """The concrete offset a starting/ending spec means for one partition. `tail` finds a
    timestamp past the sealed segments (hybrid reads: ListOffsets by time at the broker)."""
    default = pm.log_start if starting else pm.end
    if spec.kind == "earliest":
        return pm.log_start
    if spec.kind == "latest":
        return pm.end
    if spec.kind == "offsets":
        v = spec.per_partition.get(pm.tp)
        if v is None:
            return default
        if v == EARLIEST:
            return pm.log_start
        if v == LATEST:
            return pm.end
        return v
    if spec.kind == "timestamp":
        ts: int | None = spec.timestamp
    else:
        ts = spec.per_partition.get(pm.tp)
        if ts is None:
            return default
    assert ts is not None
    if tail is not None and not cold_url and any(seg.tier == Tier.COLD for seg in pm.segments):
        found = tail(pm.tp, ts)  # tiered segments and no coldPath: the broker reads its cold tier
    else:
        found = offset_for_timestamp(store, pm, ts, cold_url)
        if found is None and tail is not None:
            found = tail(pm.tp, ts)
    if found is not None:
        return found
    if starting and strategy == "error":
        raise LoglakeOptionError(
            f"no record at or after timestamp {ts} in {pm.topic}-{pm.partition} "
            "(set startingOffsetsByTimestampStrategy=latest to start at the end instead)"
        )
    return pm.end


def check_range(pm: PartitionMeta, start: int, end: int, fail_on_data_loss: bool) -> tuple[int, int]:
    """Clamp [start, end) to what exists; data loss raises (failOnDataLoss) or is skipped with a warning."""
    if start < pm.log_start:
        msg = (
            f"{pm.topic}-{pm.partition}: offsets {start}..{min(end, pm.log_start) - 1} are gone "
            f"(log start is now {pm.log_start}, retention deleted them)"
        )
        if fail_on_data_loss:
            raise DataLossError(msg + "; set failOnDataLoss=false to skip ahead instead")
        log.warning("loglake: %s; skipping ahead (failOnDataLoss=false)", msg)
        start = pm.log_start
    if end > pm.end:
        what = "the broker's end" if pm.seam is not None else "the sealed end"
        msg = f"{pm.topic}-{pm.partition}: offset {end} is past {what} {pm.end}"
        if fail_on_data_loss:
            raise DataLossError(msg + " (was the topic re-created?); set failOnDataLoss=false to go on")
        log.warning("loglake: %s; reading up to %d", msg, pm.end)
        end = pm.end
    return start, max(start, end)


# ---- slices -----------------------------------------------------------------------------------


def slices_for(
    store_url: str, pm: PartitionMeta, start: int, end: int, cold_url: str | None = None, *, committed: bool = False
) -> list[Slice]:
    """The segment slices of offsets [start, end); at read_committed each names the aborted
    transactions overlapping it."""
    out = []
    aborted = list(pm.aborted)
    if committed and pm.aborted_trimmed and start < (aborted[0][2] if aborted else end):
        aborted = _indexed_aborted(store_url, pm, start, aborted[0][2] if aborted else end, cold_url) + aborted
    for seg in pm.segments:
        s, e = max(start, seg.base), min(end, seg.last + 1)
        if s < e:
            mine = tuple(a for a in aborted if a[1] < e and a[2] >= s) if committed else None
            out.append(
                Slice(store_for(seg, store_url, cold_url), pm.topic, pm.partition, seg.key, seg.size, s, e, mine)
            )
    for fr in pm.flush:  # cluster mode: committed ranges not merged yet, after the segments
        s, e = max(start, fr.base), min(end, fr.last + 1)
        if s < e:
            mine = tuple(a for a in aborted if a[1] < e and a[2] >= s) if committed else None
            out.append(replace(fr, store_url=store_url, start=s, end=e, aborted=mine))
    return out


def _indexed_aborted(
    store_url: str, pm: PartitionMeta, start: int, upto: int, cold_url: str | None
) -> list[tuple[int, int, int]]:
    """Aborted transactions with markers in [start, upto), from the transaction indexes of the
    segments holding them (format version 3): what the metadata no longer lists."""
    found: list[tuple[int, int, int]] = []
    for seg in pm.segments:
        if seg.last < start or seg.base >= upto:
            continue
        trailer, _index = read_tail(cached_store(store_for(seg, store_url, cold_url)), seg.key, seg.size)
        found.extend(a for a in trailer.aborted_txns if start <= a[2] < upto)
    return found


def ranges_for(
    store_url: str,
    pm: PartitionMeta,
    start: int,
    end: int,
    cold_url: str | None = None,
    *,
    committed: bool = False,
) -> list[Slice | BrokerRange]:
    """Offsets [start, end) of a partition: segment slices below the seam, one BrokerRange from
    it. The seam is fixed here, at plan time, so a seal during the read changes nothing: the
    broker still serves offsets it has sealed since."""
    seam = end if pm.seam is None else max(start, min(end, pm.seam))
    out: list[Slice | BrokerRange] = []
    pos = start
    if pm.seam is not None and not cold_url:
        # no coldPath: the offsets of segments tiered to the cold store (the oldest ones) come
        # through the broker, which reads its own cold tier
        cold_end = max((seg.last + 1 for seg in pm.segments if seg.tier == Tier.COLD), default=start)
        pos = max(start, min(cold_end, seam))
        if pos > start:
            out.append(BrokerRange(pm.topic, pm.partition, start, pos))
    out.extend(slices_for(store_url, pm, pos, seam, cold_url, committed=committed))
    if seam < end:
        out.append(BrokerRange(pm.topic, pm.partition, seam, end))
    return out


def split_slices(slices: list[Slice | BrokerRange], min_partitions: int | None) -> list[Slice | BrokerRange]:
    """Split the biggest slices at batch boundaries (from the segment index) so there are at
    least `min_partitions` of them where the data allows (as Kafka's range calculator). Broker
    ranges split at any offset: each piece's consumer starts where it is told."""
    if not min_partitions or len(slices) >= min_partitions or not slices:
        return slices
    total = sum(s.count for s in slices)
    out: list[Slice | BrokerRange] = []
    for sl in slices:
        pieces = max(1, math.ceil(sl.count / total * min_partitions)) if total else 1
        if pieces <= 1 or isinstance(sl, FlushSlice):  # a flush range is one GET: never split
            out.append(sl)
            continue
        if isinstance(sl, BrokerRange):
            cut_at = sorted({sl.start + (sl.count * k) // pieces for k in range(pieces + 1)})
            out.extend(BrokerRange(sl.topic, sl.partition, a, b) for a, b in itertools.pairwise(cut_at))
            continue
        _trailer, index = read_tail(cached_store(sl.store_url), sl.key, sl.size)
        cuts: list[int] = []
        for k in range(1, pieces):
            ideal = sl.start + (sl.count * k) // pieces
            i = index.find_offset(ideal)
            if i is None:
                continue
            cut = index.entry(i).base_offset
            if sl.start < cut < sl.end and (not cuts or cut > cuts[-1]):
                cuts.append(cut)
        bounds = [sl.start, *cuts, sl.end]
        out.extend(
            Slice(sl.store_url, sl.topic, sl.partition, sl.key, sl.size, a, b, sl.aborted)
            for a, b in itertools.pairwise(bounds)
        )
    return out


# ---- streaming offsets -----------------------------------------------------------------------


def to_offset_dict(offsets: Mapping[TopicPartition, int]) -> OffsetDict:
    out: OffsetDict = {}
    for (t, p), off in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(off)
    return out


def from_offset_dict(doc: Mapping[str, Any]) -> dict[TopicPartition, int]:
    out: dict[TopicPartition, int] = {}
    for t, parts in doc.items():
        for p, off in dict(parts).items():
            out[(str(t), int(p))] = int(off)
    return out


def rate_limit(
    start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], limit: int
) -> dict[TopicPartition, int]:
    """Spread `limit` offsets over the partitions in proportion to what each has available
    (Kafka's KafkaMicroBatchStream.rateLimit)."""
    sizes = {tp: max(0, end - start.get(tp, end)) for tp, end in latest.items()}
    total = sum(sizes.values())
    if total <= limit:
        return dict(latest)
    out: dict[TopicPartition, int] = {}
    for tp, end in latest.items():
        begin = start.get(tp, end)
        size = sizes[tp]
        if size <= 0:
            out[tp] = max(begin, end) if tp in start else end
            continue
        prorate = limit * (size / total)
        step = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        out[tp] = min(end, begin + step)
    return out


def total_offsets(slices: Iterable[Slice | BrokerRange]) -> int:
    return sum(s.count for s in slices)
