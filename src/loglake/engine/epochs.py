"""Leader epochs: each partition's epoch history, when it moves, and lookups on it (KIP-101/320).

A partition's leader epoch names a stretch of its log that no later event rewrote. Consumers
remember the epoch of the last record they read (stamped in each batch's
`partition_leader_epoch` at append) and, when the epoch in Metadata moves, ask with
OffsetForLeaderEpoch where that epoch ends: a position past that end means the log they read was
truncated under them (Kafka's "log truncation detected").

When the epoch moves (one `leader_epoch` metadata record; the new epoch starts at the partition's
log end after recovery), at open:

* **Restored from the cold store** (an empty data directory rebuilt from the bucket): every
  partition. The lost disk's WAL and segments never uploaded are gone, and consumers may have
  read them.
* **After an unclean stop, a partition whose topic is not `durability=fsync`**: `disk` and
  `memory` make appends visible before their fdatasync and `ephemeral` never writes them to the
  WAL, so a crash (or power loss) may take records consumers already read. `fsync` topics need
  no bump: the high watermark passes an append only after its group fdatasync, and WAL recovery
  truncates only the newest, never-fsynced group, so nothing visible is ever lost. A stop is
  clean when `Engine.close` finished and left the `clean-shutdown` mark (below).
* **An operator accepting a loss**: `Engine.bump_leader_epoch(topic, partition, reason)` (e.g.
  after moving a damaged WAL file aside).

Cluster mode moves the epoch at each leadership change instead (a `plog_leader` record; the new
epoch starts at the committed end, loglake.meta.state) and never truncates committed data, so
there an older epoch's end is where the next one that wrote data began.

A bump where nothing was lost is harmless: the old epoch's end offset is then the log end, which
no consumer position passes.

The clean-shutdown mark is an empty file `<data-dir>/clean-shutdown`, written (fsync'd) as the
last step of a clean close and removed at the start of the next open, before anything else.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future

from loglake.engine.catalog import Catalog
from loglake.engine.partition import Partition
from loglake.engine.types import RecoveryReport
from loglake.errors import StorageError
from loglake.fs.base import FileSystem
from loglake.meta.records import LeaderEpoch
from loglake.meta.state import PartitionMeta
from loglake.wal.shard import Durability

__all__ = [
    "CLEAN_MARK",
    "bump_after_recovery",
    "end_offset_for",
    "end_offset_in",
    "epoch_at",
    "epoch_of",
    "record_bump",
    "take_clean_mark",
    "write_clean_mark",
]

log = logging.getLogger(__name__)

#: File name of the clean-shutdown mark in the data directory.
CLEAN_MARK = "clean-shutdown"
#: Kafka's UNDEFINED_EPOCH / UNDEFINED_EPOCH_OFFSET.
UNDEFINED = -1


def end_offset_for(pm: PartitionMeta, log_end: int, requested: int) -> tuple[int, int]:
    """(epoch, end offset) for an OffsetForLeaderEpoch of `requested`, by Kafka's rule
    (`end_offset_in` over the partition's history)."""
    return end_offset_in(pm.epoch_history(), log_end, requested)


def end_offset_in(history: list[list[int]], log_end: int, requested: int) -> tuple[int, int]:
    """(epoch, end offset) of `requested` in `history` ([[epoch, start], ...] ascending).

    The current epoch ends at the log end; an older one at the start of the first later epoch,
    answered with the largest epoch <= `requested` (an epoch older than the whole history: itself,
    with the oldest entry's start). An epoch newer than the current one: (-1, -1).
    """
    if requested == UNDEFINED:
        return UNDEFINED, UNDEFINED
    if requested == history[-1][0]:
        return requested, log_end
    floor = None
    for i, (epoch, _start) in enumerate(history):
        if epoch > requested:
            return (floor if floor is not None else requested), history[i][1]
        floor = epoch
    return UNDEFINED, UNDEFINED  # newer than the current epoch


def epoch_of(pm: PartitionMeta, offset: int) -> int:
    """The epoch that wrote `offset` (at or past the log end: the current epoch)."""
    return epoch_at(pm.epoch_history(), offset)


def epoch_at(history: list[list[int]], offset: int) -> int:
    """The epoch of `history` that wrote `offset`."""
    found = 0
    for epoch, start in history:
        if start > offset:
            break
        found = epoch
    return found


def record_bump(catalog: Catalog, p: Partition, reason: str) -> Future[int]:
    """Start the next epoch at the partition's log end (caller holds `p.lock` or is recovery)."""
    epoch = p.meta.leader_epoch + 1
    start = p.next_offset
    log.warning("%s-%d: leader epoch %d starts at offset %d (%s)", p.topic, p.index, epoch, start, reason)
    return catalog.meta.append(LeaderEpoch(p.topic_id.hex(), p.index, epoch, start, reason))


def bump_after_recovery(catalog: Catalog, *, clean: bool, restored: bool, report: RecoveryReport) -> None:
    """The rule in the module docstring, once the WAL is replayed (log ends are final)."""
    for topic, p in catalog.partitions():
        if restored:
            reason = "restored from the cold store"
        elif not clean and topic.config.durability != Durability.FSYNC:
            reason = f"unclean stop of a durability={topic.config.durability.name.lower()} topic"
        else:
            continue
        record_bump(catalog, p, reason)
        report.leader_epochs_bumped.append(f"{p.topic}-{p.index}")


def take_clean_mark(fs: FileSystem, data_dir: str) -> bool:
    """Whether the last stop was clean; the mark is removed (this run has not stopped cleanly yet)."""
    path = os.path.join(data_dir, CLEAN_MARK)
    if not fs.exists(path):
        return False
    fs.unlink(path)
    fs.fsync_dir(data_dir)
    return True


def write_clean_mark(fs: FileSystem, data_dir: str) -> None:
    """Best effort: without the mark the next open only bumps epochs it did not need to."""
    try:
        fs.write_file_atomic(os.path.join(data_dir, CLEAN_MARK), [b""])
    except (OSError, StorageError) as exc:
        log.warning("could not write the clean-shutdown mark in %s (%s): the next open treats this stop as unclean", data_dir, exc)
