"""`MetaFacts`: what the broker's small stores over the metadata store share.

The broker keeps its facts in the engine's metadata store (`loglake.meta.store.MetaStore`), each
kind in a store next to the code that gives it meaning: ACL bindings
(loglake.broker.security.acl_store), SCRAM credentials (security.scram_store), client quotas
(security.quota_store), dynamic broker and group configs (loglake.broker.config_store),
transactional ids (loglake.broker.txn.id_store); consumer groups have their own
(loglake.broker.groups.meta_store). Each reads through `meta.read` and copies out, and writes one
typed record (loglake.meta.records) with `meta.append`.

A write while the engine is closed (before `open`, from the start of `close`) raises
EngineClosedError: the engine's own check (`of`), so a store refuses exactly when the engine's
other writes do. A record the state refuses raises MetaRecordRejectedError (a ValueError), and a
metadata store that failed EngineFailedError, both from the store.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Self

from loglake.engine import Engine
from loglake.meta.records import MetaRecord
from loglake.meta.store import MetaStore

__all__ = ["MetaFacts", "OpenCheck"]

#: Raises (EngineClosedError) when writes are not taken now.
OpenCheck = Callable[[], None]


class MetaFacts:
    """A store of broker facts over a metadata store."""

    def __init__(self, meta: MetaStore, check_open: OpenCheck) -> None:
        self.meta = meta
        self._check_open = check_open

    @classmethod
    def of(cls, engine: Engine) -> Self:
        """The store over `engine`'s metadata store, taking writes while the engine is open."""
        return cls(engine.meta, engine.check_writable)

    def _append(self, record: MetaRecord) -> Future[int]:
        """Log one record; the future resolves with its seq once durable (committed in etcd)."""
        self._check_open()
        return self.meta.append(record)
