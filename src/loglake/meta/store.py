"""The `MetaStore` seam: how the engine reaches metadata.

The engine never reads or writes metadata files itself. It appends change records, reads the
state they built, and may watch the records go by; the single-node implementation is
`loglake.meta.log.LocalMetaStore` (a log plus checkpoints on local disk), and a cluster
implementation keeps the same records in etcd. Records and the state they move are defined in
`loglake.meta.state`.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol

from loglake.meta.state import MetaState

__all__ = ["MetaStore"]


class MetaStore(Protocol):
    @property
    def state(self) -> MetaState:
        """The current state: every record appended so far applied (durable or not yet)."""
        ...

    def open(self) -> MetaState:
        """Recover the state (checkpoint + log) and start accepting records."""
        ...

    def append(self, kind: str, body: dict[str, Any]) -> Future[int]:
        """Apply one change now and log it; the future resolves with its seq once durable.

        Never blocks on durability; callers may hold their own locks (the store's lock is the
        innermost of all) and wait for the future after releasing them.
        """
        ...

    def watch(self, watcher: Any) -> None:
        """Call `watcher(seq, kind, body, encoded)` after every append, in order."""
        ...

    def sync(self) -> None:
        """Block until every record appended so far is durable."""
        ...

    def maybe_checkpoint(self) -> int | None:
        """Compact the log when it passed its bound; returns the checkpoint's seq if one was taken."""
        ...

    def close(self) -> None: ...
