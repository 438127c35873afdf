"""Cluster mode: share-partition states written only by the partition's current leader.

A share-partition lives where ShareFetch is served, on its partition's leader
(loglake.broker.share.coordinator), and the leader writes its state whole after every change.
Leadership moves (a broker stops, the assignment changes, a lagging watch) and for a moment the
old leader may still answer a share consumer it had, so two brokers could write one
share-partition: the deposed one's late write would put back records the new leader had already
acknowledged or handed out. So every write a leader makes is an `append_if` guarded by the
partition's leader epoch key in etcd (loglake.meta.cluster.epoch_key) still holding the epoch the
share-partition was loaded at — the fence `plog_start` and `plog_merged` use. A new leader bumps
that key in the same etcd transaction as its `plog_leader` record, so:

* a share-partition loaded at epoch E (read from the metadata state, where `plog_leader` E is
  applied) saw every state a leader of an earlier epoch committed: those commits were guarded by
  the older epoch, so they come before the bump in the log;
* once another broker took epoch E+1, nothing the leader of E writes commits (MetaFencedError):
  the share coordinator forgets its copy and the handler answers NOT_LEADER_OR_FOLLOWER, so the
  client asks the new leader, whose state wins.

Writes without a leader epoch — an admin's AlterShareGroupOffsets / DeleteShareGroupOffsets /
DeleteGroups, answered by the group's coordinator — are plain appends: they move the state's
`gen`, which makes the leader load it again.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future

from loglake.broker.share.partition import StateBatch
from loglake.broker.share.store import MetaShareStore, ShareKey
from loglake.cluster.etcd import EtcdMetaStore, Guard
from loglake.meta.cluster import epoch_key
from loglake.meta.records import ShareState

__all__ = ["FencedShareStore"]


class FencedShareStore(MetaShareStore):
    """The `ShareStore` of a cluster broker: a leader's writes fenced by its partition's epoch key."""

    def __init__(self, etcd: EtcdMetaStore) -> None:
        super().__init__(etcd)
        self.etcd = etcd

    def save(
        self,
        key: ShareKey,
        start: int,
        end: int,
        batches: Sequence[StateBatch],
        gen: int = 0,
        *,
        leader_epoch: int | None = None,
    ) -> Future[int]:
        if leader_epoch is None:
            return super().save(key, start, end, batches, gen)
        g, tid, p = key
        record = ShareState(g, tid, p, start, end, list(batches), gen)
        return self.etcd.append_if(record, [Guard(epoch_key(tid, p), value=str(leader_epoch).encode())])
