"""Transitional: the `GroupEngine` calls over an engine that has only its metadata snapshot.

Until the engine's append-only metadata log lands, the engine offers `get_extra_meta` /
`set_extra_meta` (a JSON value inside its checksummed snapshot; `set_extra_meta` rewrites the
whole snapshot before it returns). `SnapshotGroupEngine` implements the five `GroupEngine` calls
on top of them so that `EngineGroupStore` works on both engines; the broker picks it only when
the engine lacks `group_metadata`. Each change here costs a snapshot rewrite on the caller's
thread (O(history), as before); delete this module once every engine has the metadata log.

Layout (offsets keep the key and format earlier releases wrote, so existing data dirs load)::

    "groups":       {"version": 1, "groups": {group_id: [[topic, partition, offset, leader_epoch, metadata, commit_ts_ms], ...]}}
    "group_states": {"version": 1, "states": {group_id: state document}}

Values handed to the engine are never mutated afterwards (its snapshot writer may serialize them
from another thread): every change builds fresh top-level mappings.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol

from loglake.broker.groups.engine_store import OffsetRow
from loglake.broker.groups.store import StoreFormatError, resolved

OFFSETS_KEY = "groups"
STATES_KEY = "group_states"
FORMAT_VERSION = 1


class SnapshotEngine(Protocol):
    def get_extra_meta(self, key: str) -> Any: ...

    def set_extra_meta(self, key: str, value: Any, *, durable: bool = True) -> None: ...


class SnapshotGroupEngine:
    def __init__(self, engine: SnapshotEngine) -> None:
        self._engine = engine
        self._offsets = _parse_offsets_doc(engine.get_extra_meta(OFFSETS_KEY))
        self._states = _parse_states_doc(engine.get_extra_meta(STATES_KEY))

    def group_metadata(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for group_id in {*self._offsets, *self._states}:
            rows = self._offsets.get(group_id, [])
            out[group_id] = {
                "offsets": {(r[0], r[1]): [r[2], r[3], r[4], r[5]] for r in rows},
                "state": self._states.get(group_id),
            }
        return out

    def commit_group_offsets(self, group_id: str, rows: list[OffsetRow]) -> Future[None]:
        merged = {(r[0], r[1]): list(r) for r in self._offsets.get(group_id, [])}
        merged.update({(r[0], r[1]): list(r) for r in rows})
        return self._write_offsets(group_id, [merged[k] for k in sorted(merged)])

    def expire_group_offsets(self, group_id: str, partitions: list[tuple[str, int]]) -> Future[None]:
        gone = set(partitions)
        return self._write_offsets(group_id, [r for r in self._offsets.get(group_id, []) if (r[0], r[1]) not in gone])

    def delete_group_metadata(self, group_id: str) -> Future[None]:
        if group_id in self._offsets:
            fut = self._write_offsets(group_id, [], durable=group_id not in self._states)
            if fut.exception() is not None:
                return fut
        return self.save_group_state(group_id, None)

    def save_group_state(self, group_id: str, state: dict[str, Any] | None) -> Future[None]:
        states = dict(self._states)
        if state is None:
            if group_id not in states:
                return resolved()
            del states[group_id]
        else:
            states[group_id] = state
        try:
            self._engine.set_extra_meta(STATES_KEY, {"version": FORMAT_VERSION, "states": states})
        except Exception as exc:
            return resolved(exc)
        self._states = states
        return resolved()

    def _write_offsets(self, group_id: str, rows: list[list[Any]], *, durable: bool = True) -> Future[None]:
        groups = dict(self._offsets)
        if rows:
            groups[group_id] = rows
        else:
            groups.pop(group_id, None)
        try:
            self._engine.set_extra_meta(OFFSETS_KEY, {"version": FORMAT_VERSION, "groups": groups}, durable=durable)
        except Exception as exc:
            return resolved(exc)
        self._offsets = groups  # only once written: a failed write is forgotten by the next one
        return resolved()


def _parse_offsets_doc(doc: Any) -> dict[str, list[list[Any]]]:
    if doc is None:
        return {}
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION or not isinstance(doc.get("groups"), dict):
        raise StoreFormatError(f"stored consumer-group offsets: unsupported layout {str(doc)[:200]!r}")
    groups: dict[str, list[list[Any]]] = {}
    for group_id, rows in doc["groups"].items():
        if not isinstance(group_id, str) or not isinstance(rows, list):
            raise StoreFormatError(f"stored offsets of group {group_id!r}: not a list")
        for row in rows:
            if not (
                isinstance(row, list)
                and len(row) == 6
                and isinstance(row[0], str)
                and all(isinstance(v, int) and not isinstance(v, bool) for v in (row[1], row[2], row[3], row[5]))
                and isinstance(row[4], str)
            ):
                raise StoreFormatError(f"stored offsets of group {group_id!r}: bad row {str(row)[:200]!r}")
        groups[group_id] = rows
    return groups


def _parse_states_doc(doc: Any) -> dict[str, Any]:
    """States are decoded defensively later (per group); only the envelope must be right."""
    if doc is None:
        return {}
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION or not isinstance(doc.get("states"), dict):
        raise StoreFormatError(f"stored consumer-group states: unsupported layout {str(doc)[:200]!r}")
    return {g: s for g, s in doc["states"].items() if isinstance(g, str)}


__all__ = ["OFFSETS_KEY", "STATES_KEY", "SnapshotGroupEngine"]
