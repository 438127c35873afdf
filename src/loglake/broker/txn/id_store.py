"""`TxnIdStore`: transactional ids in the metadata store, as ``txn`` records (loglake.meta.txn):
each record is an id's new state, whole; the state keeps the last one per id (a ``dead`` one
removes it). The transaction coordinator (loglake.broker.txn.coordinator) owns their meaning.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

from loglake.broker.meta_facts import MetaFacts
from loglake.meta.records import JsonDoc, TxnRecord

__all__ = ["TxnIdStore"]


class TxnIdStore(MetaFacts):
    def states(self) -> dict[str, JsonDoc]:
        """A copy of every transactional id's last recorded state (its ``txn`` record body)."""
        return self.meta.read(lambda s: {tid: dict(body) for tid, body in s.txns.items()})

    def load(self, owns: Callable[[str], bool]) -> dict[str, JsonDoc]:
        """The states of the ids `owns` accepts (a single node's coordinator: every id; there is
        nobody to take them from)."""
        return {tid: body for tid, body in self.states().items() if owns(tid)}

    def record(self, body: JsonDoc) -> Future[int]:
        """Log a transactional id's new state; resolves with the record's seq once durable."""
        return self._append(TxnRecord.from_body(body))
