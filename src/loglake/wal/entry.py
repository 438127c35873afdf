"""What a WAL shard queues and keeps: entries (one append each), the durability classes that say
when an entry is acknowledged, and the files with the partitions their frames belong to.
Re-exported by `loglake.wal.shard`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

from loglake.fs.base import BytesLike


class Durability(IntEnum):
    """Per-topic durability class (DESIGN.md §4)."""

    FSYNC = 0  # ack after the group fdatasync
    DISK = 1  # ack after write(); fsync on an interval
    MEMORY = 2  # ack at enqueue; written and fsynced on the interval
    EPHEMERAL = 3  # never written to the WAL

    @classmethod
    def parse(cls, name: str) -> Durability:
        return cls[name.upper()]


DoneCallback = Callable[["WalEntry", BaseException | None], None]


class WalEntry:
    """One append waiting for the writer. `on_done(entry, error)` runs on the writer thread."""

    __slots__ = (
        "base_offset",
        "context",
        "durability",
        "end_offset",
        "on_done",
        "partition",
        "payload",
        "seq",
        "topic_id",
    )

    def __init__(
        self,
        topic_id: bytes,
        partition: int,
        base_offset: int,
        end_offset: int,
        payload: BytesLike,
        durability: Durability,
        on_done: DoneCallback,
        context: object = None,
    ) -> None:
        self.context = context  # the submitter's own bookkeeping, handed back through on_done
        self.topic_id = topic_id
        self.partition = partition
        self.base_offset = base_offset
        self.end_offset = end_offset
        self.payload = payload
        self.durability = durability
        self.on_done = on_done
        self.seq = -1


@dataclass
class WalFile:
    """A WAL file and, per (topic id, partition), the end offset of its last frame there."""

    path: str
    first_seq: int
    partitions: dict[tuple[bytes, int], int] = field(default_factory=dict)


def wal_file_name(first_seq: int) -> str:
    return f"wal-{first_seq:020d}.log"


def parse_wal_file_name(name: str) -> int | None:
    if name.startswith("wal-") and name.endswith(".log") and len(name) == 28:
        digits = name[4:24]
        if digits.isdigit():
            return int(digits)
    return None
