"""`MetaGroupStore`: the production `GroupStore`, one small metadata record per change.

Group metadata lives in the metadata store (`loglake.meta.store.MetaStore`: the local log, durable
by group commit, DESIGN.md section 3; or etcd in cluster mode) as `offset_commit`,
`offset_expire`, `group_deleted` and `group_state` records (loglake.meta.state). `MetaGroupLog`
writes and reads them — the five calls of `GroupLog` below, each returning a
`concurrent.futures.Future` resolved when the record is durable — and `MetaGroupStore` translates
for the coordinator: offsets travel as rows `(topic, partition, offset, leader_epoch, metadata,
commit_ts_ms)` and come back from `group_metadata()` as
`{group_id: {"offsets": {(topic, partition): [offset, leader_epoch, metadata, commit_ts_ms]},
"state": dict | None}}`.

Offsets that do not parse stop the start-up (`StoreFormatError`): silently dropping commits would
make consumers re-read or skip data. A state that is not a dict is logged and dropped here; the
coordinator decodes the state document itself, defensively (`persistence.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Protocol

from loglake.broker.groups.store import (
    GroupOffsets,
    OffsetEntry,
    StoredGroup,
    StoreFormatError,
    TopicPartition,
)
from loglake.meta.records import GroupDeleted, GroupState, JsonDoc, OffsetCommit, OffsetExpire, OffsetRow
from loglake.meta.state import MetaState
from loglake.meta.store import MetaStore

log = logging.getLogger(__name__)


class GroupLog(Protocol):
    """Where group changes are recorded (`MetaGroupLog`; tests give a fake)."""

    def group_metadata(self) -> dict[str, JsonDoc]: ...

    def commit_group_offsets(self, group_id: str, rows: list[OffsetRow]) -> Future[int]: ...

    def expire_group_offsets(self, group_id: str, partitions: list[tuple[str, int]]) -> Future[int]: ...

    def delete_group_metadata(self, group_id: str) -> Future[int]: ...

    def save_group_state(self, group_id: str, state: JsonDoc | None) -> Future[int]: ...


class MetaGroupLog:
    """The group records of a metadata store."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta

    def group_metadata(self) -> dict[str, JsonDoc]:
        def copy(state: MetaState) -> dict[str, JsonDoc]:
            return {
                g: {"offsets": {tp: list(row) for tp, row in gm.offsets.items()}, "state": gm.state}
                for g, gm in state.groups.items()
            }

        return self.meta.read(copy)

    def commit_group_offsets(self, group_id: str, rows: list[OffsetRow]) -> Future[int]:
        return self.meta.append(OffsetCommit(group_id, rows))

    def expire_group_offsets(self, group_id: str, partitions: list[tuple[str, int]]) -> Future[int]:
        return self.meta.append(OffsetExpire(group_id, partitions))

    def delete_group_metadata(self, group_id: str) -> Future[int]:
        return self.meta.append(GroupDeleted(group_id))

    def save_group_state(self, group_id: str, state: JsonDoc | None) -> Future[int]:
        return self.meta.append(GroupState(group_id, state))


class MetaGroupStore:
    """Group offsets and states as metadata records: O(1) per change, never blocks. The store of
    a broker that coordinates every group it is asked about (a single node): nothing to claim,
    nothing to lose."""

    lost: frozenset[str] = frozenset()

    def __init__(self, records: GroupLog) -> None:
        self._engine = records

    def prepare(self) -> None:
        return None

    def supersede(self) -> None:
        return None

    def close(self) -> None:
        return None

    def load(self) -> dict[str, StoredGroup]:
        raw = self._engine.group_metadata()
        if not isinstance(raw, dict):
            raise StoreFormatError(f"engine group metadata: expected a mapping, got {type(raw).__name__}")
        out: dict[str, StoredGroup] = {}
        for group_id, doc in raw.items():
            if not isinstance(group_id, str) or not isinstance(doc, dict):
                raise StoreFormatError(f"engine group metadata of {group_id!r}: not a mapping")
            state = doc.get("state")
            if state is not None and not isinstance(state, dict):
                log.warning("group %r: stored state is a %s, not a document; loading the group Empty",
                            group_id, type(state).__name__)
                state = None
            out[group_id] = StoredGroup(_parse_offsets(group_id, doc.get("offsets") or {}), state)
        return out

    def commit(self, group_id: str, offsets: Mapping[TopicPartition, OffsetEntry]) -> Future[None]:
        rows: list[OffsetRow] = [
            (t, p, e.offset, e.leader_epoch, e.metadata, e.commit_ts_ms) for (t, p), e in sorted(offsets.items())
        ]
        return settled(self._engine.commit_group_offsets(group_id, rows))

    def expire(self, group_id: str, partitions: list[TopicPartition]) -> Future[None]:
        return settled(self._engine.expire_group_offsets(group_id, list(partitions)))

    def delete_group(self, group_id: str) -> Future[None]:
        return settled(self._engine.delete_group_metadata(group_id))

    def save_state(self, group_id: str, state: JsonDoc | None) -> Future[None]:
        return settled(self._engine.save_group_state(group_id, state))


def settled(inner: Future[int]) -> Future[None]:
    """A Future[None] that settles as `inner` does (the coordinator needs no record seq)."""
    out: Future[None] = Future()

    def done(f: Future[int]) -> None:
        exc = f.exception()
        if exc is not None:
            out.set_exception(exc)
        else:
            out.set_result(None)

    inner.add_done_callback(done)
    return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_offsets(group_id: str, offsets: object) -> GroupOffsets:
    if not isinstance(offsets, dict):
        raise StoreFormatError(f"stored offsets of group {group_id!r}: not a mapping")
    out: GroupOffsets = {}
    for key, row in offsets.items():
        if not (
            isinstance(key, (tuple, list))
            and len(key) == 2
            and isinstance(key[0], str)
            and _is_int(key[1])
            and isinstance(row, (tuple, list))
            and len(row) == 4
            and _is_int(row[0])
            and _is_int(row[1])
            and isinstance(row[2], str)
            and _is_int(row[3])
        ):
            raise StoreFormatError(f"stored offsets of group {group_id!r}: bad entry {str(key)[:100]!r}: {str(row)[:200]!r}")
        out[(key[0], key[1])] = OffsetEntry(row[0], row[1], row[2], row[3])
    return out


__all__ = ["GroupLog", "MetaGroupLog", "MetaGroupStore", "OffsetRow", "settled"]
