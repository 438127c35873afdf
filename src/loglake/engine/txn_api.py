"""The engine's transaction calls (a mixin of `Engine`): markers, LSO, read_committed, txn records.

The broker's transaction coordinator and the embedded API use these; engine/txn.py has the rules.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, cast

from loglake.engine import txn
from loglake.engine.types import AppendResult, ReadResult

if TYPE_CHECKING:
    from loglake.engine.engine import Engine

__all__ = ["TxnEngineMixin"]

#: (result, last stable offset, aborted transactions [(producer id, first offset), ...])
CommittedRead = tuple[ReadResult, int, list[tuple[int, int]]]


class TxnEngineMixin:
    def _eng(self) -> Engine:
        return cast("Engine", self)

    def last_stable_offset(self, topic: str, partition: int) -> int:
        """The first offset of the partition's earliest open transaction, else its high watermark."""
        return txn.last_stable_offset(self._eng().catalog.partition(topic, partition))

    def aborted_transactions(self, topic: str, partition: int, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of aborted transactions overlapping [start, end)."""
        return txn.aborted_transactions(self._eng().catalog.partition(topic, partition), start, end)

    def read_committed(self, topic: str, partition: int, offset: int, max_bytes: int, *, min_one: bool = True) -> CommittedRead:
        """`read` at isolation read_committed: batches below the LSO, with the aborted transactions
        a reader must filter out (records of those producer ids from their first offset on, up to
        each one's ABORT marker)."""
        eng = self._eng()
        p = eng.catalog.partition(topic, partition)
        result = eng.read(topic, partition, offset, max_bytes, min_one=min_one)
        return txn.committed_view(p, offset, result, lambda: result)

    def read_committed_async(
        self, topic: str, partition: int, offset: int, max_bytes: int, *, file_ranges: bool = False, min_one: bool = True
    ) -> Future[CommittedRead]:
        """`read_async` at read_committed (the broker's Fetch with isolation_level 1)."""
        eng = self._eng()
        p = eng.catalog.partition(topic, partition)
        out: Future[CommittedRead] = Future()
        pending = eng.read_async(topic, partition, offset, max_bytes, file_ranges=file_ranges, min_one=min_one)

        def done(f: Future[ReadResult]) -> None:
            try:
                out.set_result(
                    txn.committed_view(
                        p, offset, f.result(), lambda: eng.read(topic, partition, offset, max_bytes, min_one=min_one)
                    )
                )
            except BaseException as exc:
                out.set_exception(exc)

        pending.add_done_callback(done)
        return out

    def write_txn_marker(
        self, topic_id: bytes, partition: int, producer_id: int, producer_epoch: int, commit: bool
    ) -> Future[AppendResult] | None:
        """Append a COMMIT or ABORT marker; None when the topic is gone."""
        eng = self._eng()
        eng._check_open()
        return txn.write_marker(eng, topic_id, partition, producer_id, producer_epoch, commit)

    def wake_readers(self, topic_id: bytes, partition: int) -> None:
        """Readers waiting on the partition look again (its last stable offset moved)."""
        topic = self._eng().catalog.topic_by_id(topic_id)
        if topic is not None and 0 <= partition < len(topic.partitions):
            topic.partitions[partition].wake_all()

    def log_end(self, topic_id: bytes, partition: int) -> int | None:
        """The partition's next offset (by topic id), None when the topic is gone."""
        topic = self._eng().catalog.topic_by_id(topic_id)
        if topic is None or not 0 <= partition < len(topic.partitions):
            return None
        return topic.partitions[partition].next_offset

    def topic_id_of(self, name: str) -> bytes:
        return self._eng().catalog.topic(name).topic_id

    def topic_name_of(self, topic_id: bytes) -> str | None:
        topic = self._eng().catalog.topic_by_id(topic_id)
        return topic.name if topic is not None else None

    def record_txn(self, body: dict[str, Any]) -> Future[int]:
        """Log a transactional id's new state (a ``txn`` metadata record, loglake.meta.txn)."""
        eng = self._eng()
        eng._check_open()
        return eng.meta.append("txn", body)

    def drop_lost_markers(self) -> None:
        """After recovery: aborted entries whose marker lies past the recovered log end were lost
        with it (a durability class that does not fsync); their offsets will be written again."""
        for _topic, p in self._eng().catalog.partitions():
            entries = p.meta.aborted_txns
            if entries and entries[-1][2] >= p.next_offset:
                p.meta.aborted_txns = [e for e in entries if e[2] < p.next_offset]

    def txn_states(self) -> dict[str, dict[str, Any]]:
        """A copy of every transactional id's last recorded state."""
        return self._eng().meta.read(lambda s: {t: dict(b) for t, b in s.txns.items()})
