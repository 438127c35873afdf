"""Idempotent producer state per partition (Kafka's ProducerStateManager, reduced).

An idempotent producer numbers its batches per partition: base_sequence .. base_sequence +
record_count - 1, under a producer id and epoch. The partition remembers, per producer id, the
epoch and the last few batches it appended. A retried batch that matches one of them is a
duplicate: it is answered with the offsets it got the first time and not appended again. A
batch that skips ahead or goes back is OUT_OF_ORDER_SEQUENCE_NUMBER; one from an older epoch is
INVALID_PRODUCER_EPOCH. State is carried by segment_published metadata records and checkpoints and rebuilt from replayed WAL
frames on recovery.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from loglake.errors import InvalidProducerEpochError, OutOfOrderSequenceError

#: Batches remembered per producer for duplicate detection; Kafka's clients keep at most 5
#: requests in flight per connection when idempotent, so 5 covers every retry.
PRODUCER_BATCHES_REMEMBERED = 5
#: Producer ids remembered per partition; the least recently used is forgotten beyond this.
PRODUCERS_PER_PARTITION_MAX = 10_000
SEQUENCE_MAX = 2**31 - 1


class BatchHead(Protocol):
    """What the rules read of a Kafka batch header (loglake.records.batch.BatchHeader)."""

    @property
    def producer_id(self) -> int: ...
    @property
    def producer_epoch(self) -> int: ...
    @property
    def base_sequence(self) -> int: ...
    @property
    def record_count(self) -> int: ...
    @property
    def last_offset_delta(self) -> int: ...
    @property
    def is_control(self) -> bool: ...


def next_sequence(seq: int, count: int) -> int:
    """Sequence after `count` records from `seq`, wrapping like Kafka's int32 sequences."""
    return (seq + count) % (SEQUENCE_MAX + 1)


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    # (first_seq, last_seq, base_offset, last_offset) of the newest batches, oldest first
    batches: deque[tuple[int, int, int, int]] = field(default_factory=lambda: deque(maxlen=PRODUCER_BATCHES_REMEMBERED))

    @property
    def last_seq(self) -> int:
        return self.batches[-1][1] if self.batches else -1


class ProducerStates:
    """Producer id -> state for one partition. Callers hold the partition lock."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[int, ProducerEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def last_batches(self) -> set[tuple[int, int]]:
        """(producer id, base offset) of each producer's newest batch (compaction keeps it)."""
        return {(pid, e.batches[-1][2]) for pid, e in self._entries.items() if e.batches}

    def check(self, producer_id: int, epoch: int, first_seq: int, count: int) -> tuple[int, int] | None:
        """Validate a batch before it is appended.

        Returns (base_offset, last_offset) of the original append when the batch is a duplicate,
        None when it may be appended; raises for fenced epochs and sequence gaps.
        """
        entry = self._entries.get(producer_id)
        if entry is None:
            return None  # first batch we know of from this producer (or its state expired)
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"producer {producer_id} epoch {epoch} is older than the current epoch {entry.epoch}"
            )
        if epoch > entry.epoch:
            if first_seq != 0:
                raise OutOfOrderSequenceError(
                    f"producer {producer_id} starts epoch {epoch} at sequence {first_seq}, expected 0"
                )
            return None
        last_seq = next_sequence(first_seq, count - 1)
        for b_first, b_last, base, last in entry.batches:
            if b_first == first_seq and b_last == last_seq:
                return base, last
        expected = next_sequence(entry.last_seq, 1)
        if first_seq != expected:
            raise OutOfOrderSequenceError(
                f"producer {producer_id} epoch {epoch}: sequence {first_seq}, expected {expected}"
            )
        return None

    def check_batches(self, heads: Iterable[BatchHead]) -> tuple[int, int] | None:
        """The rule every partition log applies before it appends a produce's batches: (base,
        last) offsets of the original append when they are a retry, None when they may be
        appended; raises for a fenced epoch or a sequence gap."""
        for h in heads:
            if h.producer_id >= 0 and h.base_sequence >= 0:
                duplicate = self.check(h.producer_id, h.producer_epoch, h.base_sequence, h.record_count)
                if duplicate is not None:
                    return duplicate
        return None

    def record_batches(self, heads: Iterable[BatchHead], base_offset: int) -> None:
        """After the batches were given offsets from `base_offset` (in order): remember each
        idempotent producer's batch; a control batch (a transaction marker) fences older epochs."""
        offset = base_offset
        for h in heads:
            if h.producer_id >= 0 and h.base_sequence >= 0:
                self.record(h.producer_id, h.producer_epoch, h.base_sequence, h.record_count, offset)
            elif h.producer_id >= 0 and h.is_control:
                self.fence(h.producer_id, h.producer_epoch)
            offset += h.last_offset_delta + 1

    def record(self, producer_id: int, epoch: int, first_seq: int, count: int, base_offset: int) -> None:
        entry = self._entries.get(producer_id)
        if entry is None or epoch != entry.epoch:
            if entry is None and len(self._entries) >= PRODUCERS_PER_PARTITION_MAX:
                self._entries.pop(next(iter(self._entries)))
            entry = ProducerEntry(epoch)
        else:
            del self._entries[producer_id]  # re-insert: dict order doubles as LRU order
        self._entries[producer_id] = entry
        if entry.batches and entry.batches[-1][2] >= base_offset:
            return  # replaying something the metadata already knew
        entry.batches.append((first_seq, next_sequence(first_seq, count - 1), base_offset, base_offset + count - 1))

    def fence(self, producer_id: int, epoch: int) -> None:
        """A transaction marker with this epoch was appended: batches of older epochs are refused
        from now on (a zombie's write that raced its fencing never lands after the marker)."""
        entry = self._entries.get(producer_id)
        if entry is None:
            if len(self._entries) >= PRODUCERS_PER_PARTITION_MAX:
                self._entries.pop(next(iter(self._entries)))
            self._entries[producer_id] = ProducerEntry(epoch)
        elif epoch > entry.epoch:
            self._entries[producer_id] = ProducerEntry(epoch)

    def describe(self) -> list[tuple[int, int, int, int]]:
        """(producer id, epoch, last sequence, base offset of its newest batch or -1) of each producer."""
        return [
            (pid, e.epoch, e.last_seq, e.batches[-1][2] if e.batches else -1) for pid, e in dict(self._entries).items()
        ]

    def to_json(self, below: int | None = None) -> dict[str, Any]:
        """JSON form; with `below`, only batches that start below that offset (sealed data)."""
        out: dict[str, Any] = {}
        for pid, e in dict(self._entries).items():  # dict() copies atomically: appenders may run
            batches = [list(b) for b in list(e.batches) if below is None or b[2] < below]
            out[str(pid)] = [e.epoch, batches]
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ProducerStates:
        states = cls()
        for pid, (epoch, batches) in raw.items():
            entry = ProducerEntry(int(epoch))
            for b in batches:
                entry.batches.append((int(b[0]), int(b[1]), int(b[2]), int(b[3])))
            states._entries[int(pid)] = entry
        return states
