"""The `MetaStore` seam: how the engine (and the broker's stores) reach metadata.

Nothing else reads or writes metadata files or keys. Callers append change records (the typed
records of `loglake.meta.records`), read the state they built, and may watch the records go by. Two implementations:
`loglake.meta.log.LocalMetaStore` (a log plus checkpoints on local disk; a record is applied when
it is appended) and cluster mode's etcd store (records are applied when committed, in log order,
on every broker alike). Records and the state they move are defined in `loglake.meta.state`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from loglake.meta.records import MetaRecord, RecordKind
from loglake.meta.state import MetaState

__all__ = ["MetaStore", "Watcher"]

T = TypeVar("T")

#: Called with (seq, kind, body, encoded record) after each record is applied, under the store's
#: lock: a watcher only notes what it needs (a flag, a counter) and never calls back into the store.
Watcher = Callable[[int, RecordKind, dict[str, Any], bytes], None]


class MetaStore(Protocol):
    @property
    def state(self) -> MetaState:
        """The current state: every record applied so far. Read it only through `read` while
        other threads may append."""
        ...

    @property
    def last_seq(self) -> int:
        """The seq of the last record applied (-1: none)."""
        ...

    @property
    def failure(self) -> BaseException | None:
        """Why the store stopped taking records for good (an I/O error), else None."""
        ...

    def open(self) -> MetaState:
        """Recover the state (checkpoint + log) and start accepting records."""
        ...

    def read(self, fn: Callable[[MetaState], T]) -> T:
        """`fn(state)` under the store's lock: a consistent read (keep it short, copy out)."""
        ...

    def append(self, record: MetaRecord) -> Future[int]:
        """Log one change (`record.body()`, under `record.kind`); the future resolves with its seq once durable (local) or committed
        (etcd). A record that does not apply to the state is refused with
        MetaRecordRejectedError: raised here by the local store, through the future by etcd's.

        Never blocks on durability; callers may hold their own locks (the store's lock is the
        innermost of all) and wait for the future after releasing them.
        """
        ...

    def watch(self, watcher: Watcher) -> None:
        """Call `watcher(seq, kind, body, encoded)` after every record applied, in order."""
        ...

    def sync(self) -> None:
        """Block until every record appended so far is durable (and, in cluster mode, every
        record any broker committed before the call is applied here)."""
        ...

    def maybe_checkpoint(self) -> int | None:
        """Compact the log when it passed its bound; returns the checkpoint's seq if one was taken."""
        ...

    def checkpoint(self) -> int | None:
        """Write a checkpoint now; its seq (None when there was nothing to write)."""
        ...

    def close(self) -> None: ...
