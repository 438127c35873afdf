"""The life of a sealed segment: its tiers, its stages, and the moves between them.

Theory of operation
-------------------
A partition's data starts in its buffer and ends deleted; on the way it is one segment object
whose authoritative copy the metadata names. Only the tier of a segment the chain holds is
recorded (`Tier`, in `segment_published` / `segment_rewritten` segment lists,
`segment_tier` records and, as a one-byte code, checkpoint entries — loglake.meta.segments);
the other stages are windows between records, or the absence of the segment from the chain.

==========  ====================================================================================
stage       what is true
==========  ====================================================================================
ACTIVE      appends buffered in memory and the WAL; no object yet
SEALED      the object is PUT (hot store, or the run's store for a rewrite output) but no record
            names it: a crash leaves an orphan that recovery adopts or deletes
HOT         the chain holds it with tier hot: the local folder's copy is authoritative
RELOCATING  hot in the metadata while the relocator uploads and verifies a cold copy
COLD        the chain holds it with tier cold: the cold store's copy is authoritative
REPLACED    a `segment_rewritten` record named it (compaction, merge); the object goes next
DELETED     a `log_start` record passed it (retention, DeleteRecords), its topic was deleted,
            or a disaster restore found it only on the lost disk; the object goes next
==========  ====================================================================================

`TRANSITIONS` is every move there is, with what makes it. REPLACED and DELETED are final: no
record brings a segment back, and no move leads from cold to hot (cold data is read in place).
The movers call `move` where they record a change (loglake.engine.catalog's `record_*`): an
illegal move raises `IllegalSegmentMove` — a bug in the mover, refused before it is durable.
Replaying the metadata log does not check: it applies what a release wrote, as it wrote it.
"""

from __future__ import annotations

import enum

from loglake.errors import LoglakeError

__all__ = ["TRANSITIONS", "IllegalSegmentMove", "Stage", "Tier", "move", "stage_of"]


class Tier(enum.StrEnum):
    """Where a chained segment's authoritative copy is. The values are written in metadata
    records and store URLs' maps: they never change."""

    HOT = "hot"
    COLD = "cold"


class Stage(enum.Enum):
    """A segment's stage (see the module docstring)."""

    ACTIVE = "active"
    SEALED = "sealed"
    HOT = Tier.HOT.value
    RELOCATING = "relocating"
    COLD = Tier.COLD.value
    REPLACED = "replaced"
    DELETED = "deleted"


_STAGE_OF_TIER = {Tier.HOT: Stage.HOT, Tier.COLD: Stage.COLD}

#: (from, to) -> who makes the move (and with which metadata record, if any).
TRANSITIONS: dict[tuple[Stage, Stage], str] = {
    (Stage.ACTIVE, Stage.SEALED): "seal: the segment object is PUT to the hot store",
    (Stage.SEALED, Stage.HOT): "segment_published (seal, recovery adopting an unrecorded object) "
    "or segment_rewritten (the output of a hot run)",
    (Stage.SEALED, Stage.COLD): "segment_rewritten (the output of a cold run), "
    "or a disaster restore adopting an object uploaded after the last published metadata",
    (Stage.SEALED, Stage.DELETED): "the topic was deleted or the rewrite aborted before the record; "
    "recovery removes an orphan",
    (Stage.HOT, Stage.RELOCATING): "the relocator uploads and verifies a cold copy (no record)",
    (Stage.RELOCATING, Stage.COLD): "segment_tier {tier: cold}: the authoritative switch; the hot copy goes",
    (Stage.RELOCATING, Stage.HOT): "the upload or its verification failed: retried later (no record)",
    (Stage.RELOCATING, Stage.REPLACED): "a rewrite won the race: the cold copy is deleted",
    (Stage.RELOCATING, Stage.DELETED): "retention or a topic delete won the race: the cold copy is deleted",
    (Stage.HOT, Stage.COLD): "a disaster restore: the local disk is lost, the bucket's copy is the one left",
    (Stage.HOT, Stage.REPLACED): "segment_rewritten (compaction, merge)",
    (Stage.COLD, Stage.REPLACED): "segment_rewritten (compaction, merge)",
    (Stage.HOT, Stage.DELETED): "log_start (retention, DeleteRecords), topic_deleted",
    (Stage.COLD, Stage.DELETED): "log_start (retention, DeleteRecords), topic_deleted, "
    "or a disaster restore that lost it",
}


class IllegalSegmentMove(LoglakeError):
    """A mover asked for a move `TRANSITIONS` does not have (a bug, refused before it is recorded)."""

    def __init__(self, key: str, frm: Stage, to: Stage) -> None:
        super().__init__(f"segment {key or '?'} cannot move from {frm.name} to {to.name}")
        self.key = key
        self.frm = frm
        self.to = to


def stage_of(state: Tier | Stage) -> Stage:
    """The stage of a chained segment in `state`'s tier (a stage is itself)."""
    return _STAGE_OF_TIER[state] if isinstance(state, Tier) else state


def move(frm: Tier | Stage, to: Tier | Stage, key: str = "") -> Stage:
    """The stage after moving from `frm` to `to`; IllegalSegmentMove when there is no such move."""
    pair = (stage_of(frm), stage_of(to))
    if pair not in TRANSITIONS:
        raise IllegalSegmentMove(key, *pair)
    return pair[1]
