"""Cluster mode: share-partition states written only by the partition's current leader, and
admin writes that a leader's stale copy cannot overwrite.

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

Admin writes — AlterShareGroupOffsets / DeleteShareGroupOffsets / DeleteGroups, answered by the
group's coordinator, which is often not the partition's leader — replace the state under a new
`gen`. The share-partition's `gen` is also kept in etcd, in its gen key (`gen_key`; absent until
an admin first writes the share-partition), and both sides compare it:

* an admin write is a compare-and-swap: it reads the gen key, and commits its record with the gen
  key moved to gen + 1 only if the key still holds what it read; when another admin write got
  there first it reads again, at most `ADMIN_WRITE_ATTEMPTS_MAX` times;
* a leader's write is also guarded by the gen key holding the `gen` the leader loaded (absent for
  0). Once an admin's write committed, the leader's next write is refused however late its
  metadata state applies the admin's record: the store catches up with etcd (so the admin's
  record is applied here), the coordinator forgets its copy and loads the admin's state at its
  next use, and the acknowledgement is answered NOT_LEADER_OR_FOLLOWER (the client acknowledges
  again, and a record the admin's state no longer has acquired is INVALID_RECORD_STATE).

A removed state (DeleteGroups) leaves its gen key behind: a leader starting the share-partition
afresh starts at that `gen` (`generation`), learnt when its first write is refused. A state
stored with a `gen` before gen keys existed gets its key at the first refused leader write.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from loglake.broker.share.partition import StateBatch
from loglake.broker.share.store import MetaShareStore, ShareKey
from loglake.cluster import etcd_client as ec
from loglake.cluster.etcd import EtcdMetaStore, Guard
from loglake.errors import MetaFencedError
from loglake.meta.cluster import epoch_key
from loglake.meta.records import ShareState

__all__ = ["ADMIN_WRITE_ATTEMPTS_MAX", "GEN_KEY_PREFIX", "FencedShareStore", "gen_key"]

log = logging.getLogger("loglake.broker.share")

#: Gen keys live under this (relative to the cluster prefix): one per share-partition an admin wrote.
GEN_KEY_PREFIX = "shares/gen/"
#: Compare-and-swap attempts of one admin write before it fails with MetaFencedError; each lost
#: attempt means another admin write to the same share-partition committed in between.
ADMIN_WRITE_ATTEMPTS_MAX = 5


def gen_key(key: ShareKey) -> str:
    """The share-partition's gen key (the group id last: it may hold any character)."""
    g, tid, p = key
    return f"{GEN_KEY_PREFIX}{tid}/{p}/{g}"


def _gen_guard(key: ShareKey, gen: int) -> Guard:
    return Guard(gen_key(key), value=str(gen).encode()) if gen else Guard(gen_key(key), mod_revision=0)


class FencedShareStore(MetaShareStore):
    """The `ShareStore` of a cluster broker: a leader's writes fenced by its partition's epoch key
    and the share-partition's gen key, admin writes a compare-and-swap on the gen key."""

    def __init__(self, etcd: EtcdMetaStore) -> None:
        super().__init__(etcd)
        self.etcd = etcd
        #: the gen keys of share-partitions whose state an admin removed: where a new state starts.
        #: Written from the admin thread, read on the event loop: single dict operations only.
        self._removed: dict[ShareKey, int] = {}
        # One thread: admin writes wait on etcd, and a refused leader write catches up, off the
        # event loop and off the metadata store's writer thread (which resolves the futures).
        self._admin = ThreadPoolExecutor(1, thread_name_prefix="loglake-share-admin")

    def generation(self, key: ShareKey) -> int | None:
        stored = super().generation(key)
        return stored if stored is not None else self._removed.get(key)

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
        g, tid, p = key
        record = ShareState(g, tid, p, start, end, list(batches), gen)
        guards = [_gen_guard(key, gen)]
        if leader_epoch is not None:
            guards.append(Guard(epoch_key(tid, p), value=str(leader_epoch).encode()))
        written = self.etcd.append_if(record, guards)
        out: Future[int] = Future()

        def done(f: Future[int]) -> None:
            exc = f.exception()
            if isinstance(exc, MetaFencedError):
                # answered once this broker's state shows why: the next load sees the winner's
                self._admin.submit(self._caught_up, key, exc, out)
            elif exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(f.result())

        written.add_done_callback(done)
        return out

    def _caught_up(self, key: ShareKey, exc: MetaFencedError, out: Future[int]) -> None:
        try:
            raw, _ = self.etcd.get_key(gen_key(key))
            self.etcd.sync()  # every record committed before the gen key was read is applied now
            stored = super().generation(key)
            if raw is None and stored:
                # stored with a `gen` before gen keys existed: give it its key (if still absent)
                full = self.etcd.keys.key(gen_key(key))
                self.etcd.client.txn([ec.cmp_mod(full, 0)], [ec.op_put(full, str(stored).encode())], [])
            elif raw is not None and stored is None:
                self._removed[key] = int(raw)
        except Exception as caught:  # the refusal is what the caller must see, not this
            log.warning("share-partition %s-%s-%d: catching up after a refused write failed: %s", *key, caught)
        out.set_exception(exc)

    def reset(self, key: ShareKey, start: int) -> Future[int]:
        return self._admin.submit(self._swap, key, start)

    def forget(self, key: ShareKey) -> Future[int]:
        return self._admin.submit(self._swap, key, None)

    def _swap(self, key: ShareKey, start: int | None) -> int:
        """One admin write as a compare-and-swap on the gen key (`start` None: remove the state)."""
        g, tid, p = key
        k = gen_key(key)
        for _ in range(ADMIN_WRITE_ATTEMPTS_MAX):
            raw, _ = self.etcd.get_key(k)
            # a state stored before gen keys existed carries its gen only in the record
            gen = max(int(raw) if raw is not None else 0, super().generation(key) or 0) + 1
            record = ShareState(g, tid, p, None) if start is None else ShareState(g, tid, p, start, start, [], gen)
            guard = Guard(k, value=raw) if raw is not None else Guard(k, mod_revision=0)
            try:
                seq = self.etcd.append_if(record, [guard], {k: str(gen).encode()}).result()
            except MetaFencedError:
                continue  # another admin write committed in between: read again
            if start is None:
                self._removed[key] = gen
            else:
                self._removed.pop(key, None)
            return seq
        raise MetaFencedError(
            f"share-partition {g}-{tid}-{p}: {ADMIN_WRITE_ATTEMPTS_MAX} admin writes in a row lost their "
            "compare on the share-partition's gen key to other admin writes"
        )
