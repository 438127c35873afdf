"""Where share-partition states are kept: a narrow interface over the metadata store.

`ShareStore` is what the coordinator needs (`load` one share-partition's state, `save` it whole,
`forget` it); `MetaShareStore` keeps them as `share_state` records in `engine.meta` (the local
metadata log, or etcd in cluster mode: the same records either way); cluster mode's
`FencedShareStore` (loglake.cluster.shares) also fences a deposed leader's writes. Every `save`
returns a future resolved when the record is durable; an acknowledgement is answered only after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, NamedTuple, Protocol

from loglake.broker.share.partition import StateBatch
from loglake.meta.records import ShareState
from loglake.meta.state import MetaState
from loglake.meta.store import MetaStore

#: A share-partition's key: (group id, topic id as 32 hex digits, partition).
ShareKey = tuple[str, str, int]


class StoredShare(NamedTuple):
    #: -1 (and `end` -1): uninitialised (an admin deleted the state)
    start: int
    end: int
    batches: list[StateBatch]
    #: moves when an admin alters or deletes the state
    gen: int = 0


class ShareStore(Protocol):
    def load(self, key: ShareKey) -> StoredShare | None: ...

    def keys(self, group_id: str) -> list[ShareKey]: ...

    def generation(self, key: ShareKey) -> int | None: ...

    def save(self, key: ShareKey, start: int, end: int, batches: Sequence[StateBatch], gen: int = 0, *,
             leader_epoch: int | None = None) -> Future[int]:
        """Store the state whole. `leader_epoch`: the partition's leader epoch the writer loaded the
        share-partition at (None: an admin's write); a store may refuse the write with
        MetaFencedError once another leader took the partition (cluster mode,
        loglake.cluster.shares)."""
        ...

    def reset(self, key: ShareKey, start: int) -> Future[int]:
        """An admin's write (Alter/DeleteShareGroupOffsets): the state replaced by one starting at
        `start` (-1: uninitialised) with nothing in flight, under a new `gen`, so a leader holding
        the old one loads it again."""
        ...

    def forget(self, key: ShareKey) -> Future[int]:
        """An admin's removal (DeleteGroups)."""
        ...


class MetaShareStore:
    """Share-partition states as `share_state` metadata records."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta

    def load(self, key: ShareKey) -> StoredShare | None:
        def read(state: MetaState) -> StoredShare | None:
            doc: dict[str, Any] | None = state.shares.get(key)
            if doc is None:
                return None
            return StoredShare(doc["start"], doc["end"], [(f, la, st, n) for f, la, st, n in doc["batches"]],
                               doc.get("gen", 0))

        return self.meta.read(read)

    def keys(self, group_id: str) -> list[ShareKey]:
        return self.meta.read(lambda state: sorted(k for k in state.shares if k[0] == group_id))

    def generation(self, key: ShareKey) -> int | None:
        """The stored state's `gen`, None if there is none (a lookup, no copy); a store may also
        know the `gen` of a state an admin removed (cluster mode), which a new state starts at."""

        def read(state: MetaState) -> int | None:
            doc = state.shares.get(key)
            return None if doc is None else int(doc.get("gen", 0))

        return self.meta.read(read)

    def save(self, key: ShareKey, start: int, end: int, batches: Sequence[StateBatch], gen: int = 0, *,
             leader_epoch: int | None = None) -> Future[int]:
        # one broker leads every partition here: nothing to fence
        g, tid, p = key
        return self.meta.append(ShareState(g, tid, p, start, end, list(batches), gen))

    def reset(self, key: ShareKey, start: int) -> Future[int]:
        # the event loop orders it with every leader write here: nothing to compare
        g, tid, p = key
        return self.meta.append(ShareState(g, tid, p, start, start, [], (self.generation(key) or 0) + 1))

    def forget(self, key: ShareKey) -> Future[int]:
        g, tid, p = key
        return self.meta.append(ShareState(g, tid, p, None))


__all__ = ["MetaShareStore", "ShareKey", "ShareStore", "StoredShare"]
