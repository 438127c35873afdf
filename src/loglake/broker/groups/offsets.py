"""Durable committed offsets: the `OffsetsStore` protocol and two implementations.

The coordinator keeps every group's committed offsets in memory and calls `save(group_id,
offsets)` with the *whole* new offset map of one group once per OffsetCommit request (and with an
empty map when a group is deleted or its last offsets expire). `save` must return only once the
data is durable; the coordinator answers the commit after it returns, and treats an exception as
"not committed" (the partitions get COORDINATOR_NOT_AVAILABLE, which clients retry).

`EngineOffsetsStore` keeps all groups under one key of the engine's metadata snapshot
(`engine.set_extra_meta`, which writes a checksummed snapshot before returning)::

    {"version": 1, "groups": {group_id: [[topic, partition, offset, leader_epoch, metadata, commit_ts_ms], ...]}}

Values handed to the engine are never mutated afterwards (the snapshot writer may serialize them
from another thread), so each save builds a fresh top-level mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

ENGINE_META_KEY = "groups"
FORMAT_VERSION = 1


class OffsetEntry(NamedTuple):
    """One committed offset; `leader_epoch` is -1 when the client sent none."""

    offset: int
    leader_epoch: int
    metadata: str
    commit_ts_ms: int


TopicPartition = tuple[str, int]
GroupOffsets = dict[TopicPartition, OffsetEntry]


class OffsetsFormatError(ValueError):
    """The stored offsets do not parse: refuse to start rather than silently lose commits."""


class OffsetsStore(Protocol):
    def load(self) -> dict[str, GroupOffsets]:
        """Every group's committed offsets, as last saved."""
        ...

    def save(self, group_id: str, offsets: Mapping[TopicPartition, OffsetEntry]) -> None:
        """Replace one group's offsets (empty = forget the group); durable on return."""
        ...


class InMemoryOffsetsStore:
    """Not durable; for tests and embedded use. `saves` counts calls, `fail` makes them raise."""

    def __init__(self, initial: Mapping[str, Mapping[TopicPartition, OffsetEntry]] | None = None) -> None:
        self._data: dict[str, GroupOffsets] = {g: dict(o) for g, o in (initial or {}).items()}
        self.saves = 0
        self.fail: BaseException | None = None

    def load(self) -> dict[str, GroupOffsets]:
        return {g: dict(o) for g, o in self._data.items()}

    def save(self, group_id: str, offsets: Mapping[TopicPartition, OffsetEntry]) -> None:
        if self.fail is not None:
            raise self.fail
        self.saves += 1
        if offsets:
            self._data[group_id] = dict(offsets)
        else:
            self._data.pop(group_id, None)


class _EngineLike(Protocol):
    def get_extra_meta(self, key: str) -> Any: ...

    def set_extra_meta(self, key: str, value: Any, *, durable: bool = True) -> None: ...


class EngineOffsetsStore:
    """Offsets in the engine's metadata snapshot (see the module docstring for the layout).

    Each save rewrites the engine snapshot (all topics and all groups): fine for consumer commit
    rates (one commit per consumer every few seconds), not for thousands of commits per second.
    """

    def __init__(self, engine: _EngineLike, key: str = ENGINE_META_KEY) -> None:
        self._engine = engine
        self._key = key
        self._groups: dict[str, list[list[Any]]] | None = None  # the JSON last handed to the engine

    def _current(self) -> dict[str, list[list[Any]]]:
        if self._groups is None:
            self._groups = _parse_doc(self._engine.get_extra_meta(self._key))
        return self._groups

    def load(self) -> dict[str, GroupOffsets]:
        self._groups = None
        out: dict[str, GroupOffsets] = {}
        for group_id, rows in self._current().items():
            out[group_id] = {(r[0], r[1]): OffsetEntry(r[2], r[3], r[4], r[5]) for r in rows}
        return out

    def save(self, group_id: str, offsets: Mapping[TopicPartition, OffsetEntry]) -> None:
        groups = dict(self._current())
        if offsets:
            groups[group_id] = [
                [t, p, e.offset, e.leader_epoch, e.metadata, e.commit_ts_ms]
                for (t, p), e in sorted(offsets.items())
            ]
        else:
            groups.pop(group_id, None)
        self._engine.set_extra_meta(self._key, {"version": FORMAT_VERSION, "groups": groups})
        self._groups = groups  # only once durable: a failed save is forgotten by the next one


def _parse_doc(doc: Any) -> dict[str, list[list[Any]]]:
    if doc is None:
        return {}
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION or not isinstance(doc.get("groups"), dict):
        raise OffsetsFormatError(f"stored consumer-group offsets: unsupported layout {str(doc)[:200]!r}")
    groups: dict[str, list[list[Any]]] = {}
    for group_id, rows in doc["groups"].items():
        if not isinstance(group_id, str) or not isinstance(rows, list):
            raise OffsetsFormatError(f"stored offsets of group {group_id!r}: not a list")
        checked: list[list[Any]] = []
        for row in rows:
            if not (
                isinstance(row, list)
                and len(row) == 6
                and isinstance(row[0], str)
                and all(isinstance(v, int) and not isinstance(v, bool) for v in (row[1], row[2], row[3], row[5]))
                and isinstance(row[4], str)
            ):
                raise OffsetsFormatError(f"stored offsets of group {group_id!r}: bad row {str(row)[:200]!r}")
            checked.append(row)
        groups[group_id] = checked
    return groups


__all__ = [
    "ENGINE_META_KEY",
    "EngineOffsetsStore",
    "GroupOffsets",
    "InMemoryOffsetsStore",
    "OffsetEntry",
    "OffsetsFormatError",
    "OffsetsStore",
    "TopicPartition",
]
