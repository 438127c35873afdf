"""Cluster partitions in the metadata: leader epochs, committed flush ranges, merged segments.

Durability class `object` (loglake.cluster.plog) keeps a partition's log as metadata records in
the shared log (docs/FORMAT.md, "Cluster partition records"). Every store applies them in log
order, and applying is deterministic, so these checks are the last word on what is committed:
a record that does not fit when its turn comes is skipped by every broker alike.

=============  ==================================================================================
kind           body -> effect
=============  ==================================================================================
plog_leader    {id, p, epoch, leader} -> the partition's leader epoch and leader; `epoch` must be
               above the current one (two brokers racing for one epoch: the first in the log wins)
plog_commit    {key, ranges: [[id, p, epoch, base, last, pos, len, count, max_ts, crc, batches],
               ...]} -> flush-object ranges committed: each range's epoch must be its
               partition's current epoch and its base the partition's committed end (no gap, no
               overlap); the object must not have been swept. All or nothing.
plog_merged    {id, p, epoch, ms, n, seg: [key, base, last, size, index_pos, data_crc, link,
               count, max_ts]} -> the partition's first `n` ranges are replaced by the segment
               (same offsets); a flush object with no range left becomes unreferenced at `ms`
plog_swept     {keys} -> flush objects about to be deleted: unreferenced ones leave the free
               list; never-committed ones (orphans) are condemned, so a late commit of one is
               refused; a deleted topic's merged segment leaves the dropped list. A key still
               referenced refuses the whole record.
plog_start     {id, p, epoch, ms, start} -> the partition's log start offset raised to `start`
               (DeleteRecords, retention) under leader epoch `epoch`, which must be the current
               one; `start` must lie in old start..end. Merged segments and ranges wholly below
               it leave the partition (a segment is dropped at `ms`, a flush object left with no
               range is unreferenced at `ms`: the sweep deletes both after its grace)
plog_compacted {id, p, epoch, ms, old: [key, ...], segs: [seg, ...], clean: [end, ms, tomb_ms]}
               -> compaction (version 1 of the kind): the merged segments named by `old`,
               consecutive in the partition's list, are replaced by `segs` (rewritten segments,
               each row the `seg` of plog_merged plus its generation), which must cover exactly
               their offsets, consecutively, and end on the same link hash (the chain goes on
               unchanged); under leader epoch `epoch`, which must be the current one. The
               replaced segments are dropped at `ms` (the sweep deletes them after its grace);
               `clean` is the pass's clean end and marks (the partition's `clean_end`,
               `clean_marks`, `tombstone_ms` in loglake.meta.state, as on a single node)
topic_deleted  (the topic record; `ms` added in cluster mode) -> the topic's partitions leave the
               table: flush objects left without ranges become unreferenced, its merged
               segments are dropped, both at `ms` (0 when absent), for the sweep
=============  ==================================================================================

Bounds: RANGES_PER_PARTITION_MAX unmerged ranges per partition (a commit past it is refused:
the leader must merge first), FREE_OBJECTS_MAX and CONDEMNED_MAX keys (oldest dropped first:
a dropped free key is an orphan to the sweep, found again by listing; a dropped condemned key
is long past any commit's lifetime).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "CONDEMNED_MAX",
    "DROPPED_SEGMENTS_MAX",
    "FREE_OBJECTS_MAX",
    "RANGES_PER_PARTITION_MAX",
    "Plog",
    "PlogRange",
    "PlogSegment",
    "PlogTable",
    "apply_plog_commit",
    "apply_plog_compacted",
    "apply_plog_leader",
    "apply_plog_merged",
    "apply_plog_start",
    "apply_plog_swept",
    "drop_topic",
    "end_key",
    "epoch_key",
]

#: Unmerged flush ranges one partition may hold; the merge keeps it far below (one range per
#: flush, 2 flushes/s: 10,000 is over an hour of unmerged data).
RANGES_PER_PARTITION_MAX = 10_000
#: Unreferenced flush objects remembered for the sweep (oldest forgotten first; listing finds them).
FREE_OBJECTS_MAX = 100_000
#: Swept orphans remembered so a late commit of one is refused (oldest forgotten first).
CONDEMNED_MAX = 100_000
#: Merged segments of deleted topics remembered for the sweep (oldest forgotten first: a
#: forgotten one stays in the bucket, unreferenced, until an operator removes it).
DROPPED_SEGMENTS_MAX = 100_000

TP = tuple[bytes, int]


def epoch_key(topic_id: str, partition: int) -> str:
    """etcd key (relative to the cluster prefix) holding the partition's leader epoch."""
    return f"plog/{topic_id}/{partition}/epoch"


def end_key(topic_id: str, partition: int) -> str:
    """etcd key holding the partition's committed end offset (set with every commit)."""
    return f"plog/{topic_id}/{partition}/end"


@dataclass(frozen=True, slots=True)
class PlogRange:
    """One committed range: a partition's batches inside a flush object."""

    key: str
    base: int
    last: int
    pos: int
    length: int
    count: int
    max_ts: int
    crc: int
    batches: int

    def row(self) -> list[Any]:
        return [
            self.key,
            self.base,
            self.last,
            self.pos,
            self.length,
            self.count,
            self.max_ts,
            self.crc,
            self.batches,
        ]


@dataclass(frozen=True, slots=True)
class PlogSegment:
    """A merged segment (single-node format) holding offsets base..last; a compacted one
    (`gen` > 0, its trailer's generation) covers them, its batches may hold fewer."""

    key: str
    base: int
    last: int
    size: int
    index_pos: int
    data_crc: int
    link: str  # link hash, hex: the next segment's prev hash
    count: int
    max_ts: int
    gen: int = 0  # the trailer's generation: 0 as merged, > 0 once rewritten by compaction

    def row(self) -> list[Any]:
        return [
            self.key,
            self.base,
            self.last,
            self.size,
            self.index_pos,
            self.data_crc,
            self.link,
            self.count,
            self.max_ts,
            # only once rewritten: a merged segment's row is the 9 fields it always was
            *([self.gen] if self.gen else []),
        ]


def _range(row: Any) -> PlogRange:
    key, base, last, pos, length, count, max_ts, crc, batches = row
    r = PlogRange(
        str(key), int(base), int(last), int(pos), int(length), int(count), int(max_ts), int(crc), int(batches)
    )
    if r.last < r.base or r.pos < 0 or r.length <= 0:
        raise ValueError(f"range {row!r} is empty or negative")
    return r


def _segment(row: Any) -> PlogSegment:
    key, base, last, size, index_pos, data_crc, link, count, max_ts, *gen = row
    if len(gen) > 1 or (gen and int(gen[0]) <= 0):
        raise ValueError(f"segment {row!r} has {len(row)} fields or a generation not above 0")
    s = PlogSegment(
        str(key),
        int(base),
        int(last),
        int(size),
        int(index_pos),
        int(data_crc),
        str(link),
        int(count),
        int(max_ts),
        int(gen[0]) if gen else 0,
    )
    if s.last < s.base or not 0 < s.index_pos <= s.size:
        raise ValueError(f"segment {row!r} is empty or out of bounds")
    return s


@dataclass(eq=False)
class Plog:
    """One cluster partition: epoch and leader, committed end, merged segments then ranges,
    log start offset."""

    epoch: int = 0
    leader: int = -1
    end: int = 0  # every offset below is committed
    segments: list[PlogSegment] = field(default_factory=list)
    ranges: list[PlogRange] = field(default_factory=list)
    #: raised by `plog_start` (0 before any: the log then starts at its first source)
    start: int = 0

    @property
    def log_start(self) -> int:
        """The first offset a read may ask for: the raised start, or where the first kept
        segment or range begins (the end when there is none)."""
        first = self.segments[0].base if self.segments else self.ranges[0].base if self.ranges else self.end
        return max(self.start, first)


@dataclass(eq=False)
class PlogTable:
    parts: dict[TP, Plog] = field(default_factory=dict)
    #: flush object -> partitions with a committed range in it
    objects: dict[str, set[TP]] = field(default_factory=dict)
    #: flush objects no range references any more -> since when (ms, the merger's clock)
    free: dict[str, int] = field(default_factory=dict)
    #: orphans the sweep condemned: a commit naming one is refused
    condemned: dict[str, None] = field(default_factory=dict)
    #: merged segments of deleted topics, below a raised log start, or replaced by compaction ->
    #: since when (ms, the dropping broker's clock): the sweep deletes them past the grace, as it
    #: does unreferenced flush objects
    dropped: dict[str, int] = field(default_factory=dict)

    def part(self, topic_id: bytes, partition: int) -> Plog:
        return self.parts.setdefault((topic_id, partition), Plog())


def _tp(b: dict[str, Any]) -> TP:
    return bytes.fromhex(str(b["id"])), int(b["p"])


class PlogState(Protocol):
    """The part of the metadata state (`loglake.meta.state.MetaState`, which imports this module)
    cluster partitions live in."""

    @property
    def plogs(self) -> PlogTable: ...


def apply_plog_leader(state: PlogState, b: dict[str, Any]) -> None:
    plog = state.plogs.part(*_tp(b))
    epoch = int(b["epoch"])
    if epoch <= plog.epoch:
        raise ValueError(f"leader epoch {epoch} is not above the current {plog.epoch}")
    plog.epoch, plog.leader = epoch, int(b["leader"])


def apply_plog_commit(state: PlogState, b: dict[str, Any]) -> None:
    _commit(state.plogs, str(b["key"]), b["ranges"])


def apply_plog_merged(state: PlogState, b: dict[str, Any]) -> None:
    _merged(state.plogs, b)


def apply_plog_start(state: PlogState, b: dict[str, Any]) -> None:
    t = state.plogs
    tp = _tp(b)
    plog = t.parts.get(tp)
    start, ms = int(b["start"]), int(b["ms"])
    if plog is None or int(b["epoch"]) != plog.epoch:
        raise ValueError(f"log start of epoch {b['epoch']} but the partition is at {plog.epoch if plog else 0}")
    if not plog.log_start <= start <= plog.end:
        raise ValueError(f"log start {start} is outside {plog.log_start}..{plog.end}")
    # checked: now apply (a record that does not fit changed nothing)
    plog.start = start
    n = 0
    while n < len(plog.segments) and plog.segments[n].last < start:
        t.dropped[plog.segments[n].key] = ms
        n += 1
    del plog.segments[:n]
    n = 0
    while n < len(plog.ranges) and plog.ranges[n].last < start:
        n += 1
    gone, plog.ranges = plog.ranges[:n], plog.ranges[n:]
    _release(t, tp, gone, ms)
    _trim(t.free, FREE_OBJECTS_MAX)
    _trim(t.dropped, DROPPED_SEGMENTS_MAX)


def apply_plog_compacted(state: PlogState, b: dict[str, Any]) -> None:
    """The segment switch of a `plog_compacted` record (the clean marks are the caller's:
    loglake.meta.state keeps them with the partition's other compaction facts)."""
    t = state.plogs
    tp = _tp(b)
    plog = t.parts.get(tp)
    if plog is None or int(b["epoch"]) != plog.epoch:
        raise ValueError(f"compaction of epoch {b['epoch']} but the partition is at {plog.epoch if plog else 0}")
    old = [str(k) for k in b["old"]]
    segs = [_segment(row) for row in b["segs"]]
    keys = [s.key for s in plog.segments]
    i = keys.index(old[0]) if old and old[0] in keys else -1
    if i < 0 or keys[i : i + len(old)] != old:
        raise ValueError(f"compaction replaces segments {old[:1]}..., which are not in place")
    replaced = plog.segments[i : i + len(old)]
    if not segs or any(b2.base != a.last + 1 for a, b2 in itertools.pairwise(segs)):
        raise ValueError("compacted segments must be consecutive")
    if (segs[0].base, segs[-1].last, segs[-1].link) != (replaced[0].base, replaced[-1].last, replaced[-1].link):
        raise ValueError(
            f"compacted segments {segs[0].base}..{segs[-1].last} do not cover {replaced[0].base}..{replaced[-1].last} "
            "or break the hash chain"
        )
    if {s.key for s in segs} & set(keys):
        raise ValueError("a compacted segment's key is already in the partition")
    # checked: now apply
    plog.segments[i : i + len(old)] = segs
    ms = int(b["ms"])
    for seg in replaced:
        t.dropped[seg.key] = ms
    _trim(t.dropped, DROPPED_SEGMENTS_MAX)


def apply_plog_swept(state: PlogState, b: dict[str, Any]) -> None:
    t = state.plogs
    keys = [str(k) for k in b["keys"]]
    held = [k for k in keys if k in t.objects]
    if held:
        raise ValueError(f"sweep names {held[0]}, which committed ranges still reference")
    for k in keys:
        if t.dropped.pop(k, None) is not None:
            continue
        if t.free.pop(k, None) is None:
            t.condemned[k] = None
    _trim(t.condemned, CONDEMNED_MAX)


def _commit(t: PlogTable, key: str, rows: Any) -> None:
    if key in t.condemned:
        raise ValueError(f"flush object {key} was swept as an orphan; its commit is refused")
    checked: list[tuple[TP, Plog, PlogRange]] = []
    seen: set[TP] = set()
    for row in rows:
        tid, p, epoch, *rest = row
        tp = (bytes.fromhex(str(tid)), int(p))
        plog = t.parts.get(tp)
        r = _range([key, *rest])
        if plog is None or int(epoch) != plog.epoch or tp in seen:
            raise ValueError(
                f"{tid}-{p}: range of epoch {epoch} but the partition is at {plog.epoch if plog else 0}"
            )
        if r.base != plog.end:
            raise ValueError(f"{tid}-{p}: range at {r.base} does not continue the committed end {plog.end}")
        if len(plog.ranges) >= RANGES_PER_PARTITION_MAX:
            raise ValueError(f"{tid}-{p}: {RANGES_PER_PARTITION_MAX} unmerged ranges; merge first")
        seen.add(tp)
        checked.append((tp, plog, r))
    if not checked:
        raise ValueError("commit without ranges")
    for tp, plog, r in checked:  # every range fits: apply them all
        plog.ranges.append(r)
        plog.end = r.last + 1
        t.objects.setdefault(key, set()).add(tp)
    t.free.pop(key, None)


def _merged(t: PlogTable, b: dict[str, Any]) -> None:
    tp = _tp(b)
    plog = t.parts.get(tp)
    n = int(b["n"])
    seg = _segment(b["seg"])
    if plog is None or int(b["epoch"]) != plog.epoch:
        raise ValueError(f"merge of epoch {b['epoch']} but the partition is at {plog.epoch if plog else 0}")
    if not 0 < n <= len(plog.ranges) or (seg.base, seg.last) != (
        plog.ranges[0].base,
        plog.ranges[n - 1].last,
    ):
        raise ValueError(f"merged segment {seg.base}..{seg.last} is not the partition's first {n} ranges")
    gone, plog.ranges = plog.ranges[:n], plog.ranges[n:]
    plog.segments.append(seg)
    _release(t, tp, gone, int(b["ms"]))
    _trim(t.free, FREE_OBJECTS_MAX)


def _release(t: PlogTable, tp: TP, ranges: list[PlogRange], ms: int) -> None:
    """`tp` no longer references the flush objects of `ranges`; an object no partition references
    any more is unreferenced from `ms` (the sweep deletes it after its grace)."""
    for r in ranges:
        holders = t.objects.get(r.key)
        if holders is None:
            continue
        holders.discard(tp)
        if not holders:
            del t.objects[r.key]
            t.free[r.key] = ms


def drop_topic(t: PlogTable, topic_id: bytes, ms: int) -> None:
    """A topic was deleted (`topic_deleted`): its partitions leave the table, its ranges stop
    referencing their flush objects (one left with none is unreferenced from `ms`, swept as after
    a merge) and its merged segments are dropped from `ms` (swept after the same grace)."""
    for tp in [tp for tp in t.parts if tp[0] == topic_id]:
        plog = t.parts.pop(tp)
        _release(t, tp, plog.ranges, ms)
        for seg in plog.segments:
            t.dropped[seg.key] = ms
    _trim(t.free, FREE_OBJECTS_MAX)
    _trim(t.dropped, DROPPED_SEGMENTS_MAX)


def _trim(table: dict[str, Any], bound: int) -> None:
    while len(table) > bound:
        del table[next(iter(table))]


# ---- checkpoints -------------------------------------------------------------------------------


def plogs_doc(state: PlogState) -> dict[str, Any]:
    t = state.plogs
    return {
        "parts": [
            [
                tid.hex(),
                p,
                pl.epoch,
                pl.leader,
                pl.end,
                [s.row() for s in pl.segments],
                [r.row() for r in pl.ranges],
                # the raised log start only when there is one: a checkpoint of a partition that
                # never had one is the bytes of the releases before `plog_start`
                *([pl.start] if pl.start else []),
            ]
            for (tid, p), pl in t.parts.items()
        ],
        "free": dict(t.free),
        "condemned": list(t.condemned),
        "dropped": dict(t.dropped),
    }


def load_plogs(state: PlogState, doc: dict[str, Any]) -> None:
    """The cluster partitions of a checkpoint (absent before cluster mode: none)."""
    raw = doc.get("plogs")
    if not raw:
        return
    t = state.plogs
    for tid, p, epoch, leader, end, segs, ranges, *start in raw["parts"]:
        tp = (bytes.fromhex(str(tid)), int(p))
        pl = Plog(int(epoch), int(leader), int(end), [_segment(s) for s in segs], [_range(r) for r in ranges])
        if start:  # absent before `plog_start`, and while a partition's start was never raised
            pl.start = int(start[0])
        t.parts[tp] = pl
        for r in pl.ranges:
            t.objects.setdefault(r.key, set()).add(tp)
    t.free = {str(k): int(v) for k, v in raw["free"].items()}
    t.condemned = dict.fromkeys(str(k) for k in raw["condemned"])
    t.dropped = {str(k): int(v) for k, v in raw.get("dropped", {}).items()}  # absent in older checkpoints
