"""Durable consumer-group metadata: the `GroupStore` protocol, its records, and an in-memory store.

The coordinator holds every group in memory and records each *change* through a `GroupStore`:
a commit records only the partitions of that OffsetCommit, an expiry only the expired
partitions, a membership change one small state document. Every call returns at once with a
`concurrent.futures.Future[None]` that resolves when the change is durable, or fails with the
reason; the caller never blocks. Changes of one store become durable in the order they were
made (the engine's metadata is an append-only log), so replaying them in that order rebuilds
exactly what `load()` returns.

`load()` runs once, at start-up, before any change.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol


class OffsetEntry(NamedTuple):
    """One committed offset; `leader_epoch` is -1 when the client sent none."""

    offset: int
    leader_epoch: int
    metadata: str
    commit_ts_ms: int


TopicPartition = tuple[str, int]
GroupOffsets = dict[TopicPartition, OffsetEntry]
#: A group's saved state document: JSON-able (loglake.broker.groups.persistence writes and reads it).
StateDoc = dict[str, object]


@dataclass
class StoredGroup:
    """What the store holds for one group: its committed offsets and its last saved state
    document (`loglake.broker.groups.persistence` writes and reads it; None: never saved)."""

    offsets: GroupOffsets = field(default_factory=dict)
    state: StateDoc | None = None


class StoreFormatError(ValueError):
    """Stored offsets do not parse: refuse to start rather than silently lose commits."""


class GroupStore(Protocol):
    def load(self) -> dict[str, StoredGroup]:
        """Every group's offsets and saved state, as the recorded changes left them."""
        ...

    def commit(self, group_id: str, offsets: Mapping[TopicPartition, OffsetEntry]) -> Future[None]:
        """Record these committed offsets (only this request's entries; others are kept)."""
        ...

    def expire(self, group_id: str, partitions: list[TopicPartition]) -> Future[None]:
        """Forget these partitions' committed offsets."""
        ...

    def delete_group(self, group_id: str) -> Future[None]:
        """Forget the group: its offsets and its state."""
        ...

    def save_state(self, group_id: str, state: StateDoc | None) -> Future[None]:
        """Replace the group's state document (JSON-able; None clears it). Offsets are kept."""
        ...


class ReloadableGroupStore(GroupStore, Protocol):
    """A `GroupStore` a broker can replace while it runs: cluster mode moves group coordinators
    between brokers when the live set changes (loglake.broker.group_reload); a single node never
    replaces its store, and these calls cost it nothing."""

    @property
    def lost(self) -> frozenset[str] | set[str]:
        """Groups another coordinator claimed from this store (answered NOT_COORDINATOR)."""
        ...

    def prepare(self) -> None:
        """Blocking I/O before `load` (claims, catching up): called off the event loop."""
        ...

    def supersede(self) -> None:
        """A newer store on this broker takes over: its writes fenced from now on are no loss."""
        ...

    def close(self) -> None: ...


#: Makes the store of a new coordinator; `on_lost(group_id, store)` when another coordinator
#: claims one of its groups (from any thread).
GroupStoreFactory = Callable[[Callable[[str, "ReloadableGroupStore"], None]], ReloadableGroupStore]


def resolved(exc: BaseException | None = None) -> Future[None]:
    """A future already resolved (or failed with `exc`)."""
    fut: Future[None] = Future()
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)
    return fut


class InMemoryGroupStore:
    """Not durable; for tests and embedded use. Futures come back already resolved.

    `fail`: when set, every call returns a future failed with it and records nothing.
    `calls`: one ("commit" | "expire" | "delete_group" | "save_state", group_id) per call, for tests.
    States are copied through JSON, so a state that is not JSON-able fails here as it would in
    the engine.
    """

    def __init__(self, initial: Mapping[str, StoredGroup] | None = None) -> None:
        self._data: dict[str, StoredGroup] = {}
        for group_id, stored in (initial or {}).items():
            self._data[group_id] = StoredGroup(dict(stored.offsets), _json_copy(stored.state))
        self.fail: BaseException | None = None
        self.calls: list[tuple[str, str]] = []

    def load(self) -> dict[str, StoredGroup]:
        return {g: StoredGroup(dict(s.offsets), _json_copy(s.state)) for g, s in self._data.items()}

    def commit(self, group_id: str, offsets: Mapping[TopicPartition, OffsetEntry]) -> Future[None]:
        self.calls.append(("commit", group_id))
        if self.fail is not None:
            return resolved(self.fail)
        self._data.setdefault(group_id, StoredGroup()).offsets.update(offsets)
        return resolved()

    def expire(self, group_id: str, partitions: list[TopicPartition]) -> Future[None]:
        self.calls.append(("expire", group_id))
        if self.fail is not None:
            return resolved(self.fail)
        stored = self._data.get(group_id)
        if stored is not None:
            for tp in partitions:
                stored.offsets.pop(tp, None)
        return resolved()

    def delete_group(self, group_id: str) -> Future[None]:
        self.calls.append(("delete_group", group_id))
        if self.fail is not None:
            return resolved(self.fail)
        self._data.pop(group_id, None)
        return resolved()

    def save_state(self, group_id: str, state: StateDoc | None) -> Future[None]:
        self.calls.append(("save_state", group_id))
        if self.fail is not None:
            return resolved(self.fail)
        try:
            copied = _json_copy(state)
        except (TypeError, ValueError) as exc:
            return resolved(exc)
        self._data.setdefault(group_id, StoredGroup()).state = copied
        return resolved()

    def count(self, kind: str, group_id: str | None = None) -> int:
        return sum(1 for k, g in self.calls if k == kind and (group_id is None or g == group_id))


def _json_copy(state: StateDoc | None) -> StateDoc | None:
    if state is None:
        return None
    copied: StateDoc = json.loads(json.dumps(state))
    return copied


__all__ = [
    "GroupOffsets",
    "GroupStore",
    "GroupStoreFactory",
    "InMemoryGroupStore",
    "OffsetEntry",
    "ReloadableGroupStore",
    "StateDoc",
    "StoreFormatError",
    "StoredGroup",
    "TopicPartition",
    "resolved",
]
