"""The cluster `MetaStore`: the metadata log and its checkpoints in etcd (docs/CLUSTER.md).

Key layout under the cluster's PREFIX::

    PREFIX/meta/head                      the seq of the last record (decimal)
    PREFIX/meta/log/<seq, 20 digits>      one record: batch id (8 bytes) + encode_record(kind, body)
    PREFIX/meta/checkpoint                the manifest of the newest checkpoint (JSON)
    PREFIX/meta/ckpt/<seq>-<tag>/<i>      its chunks (CHECKPOINT_CHUNK_BYTES each)

Theory of operation
-------------------
The records and `MetaState` are those of the single-node store (loglake.meta.state); only
where they live differs. Several brokers append to one log, so a record's seq is decided by etcd:
one writer thread per store takes the records queued by `append`, reads every record other
brokers added since its last look (applying them), then commits its batch with one transaction
that puts the records at head+1.. and moves the head, compared on the head's mod revision. When
another broker got there first the compare fails: the thread catches up and tries again. So the
log is one total order, every store applies it in that order, and no record is lost or written
twice.

Unlike LocalMetaStore, `append` does not apply the record at once: the record is applied when it
is committed, in log order, and its future resolves then (with its seq). A record that does not
apply to the state when its turn comes (written by a broker whose view was stale) is skipped by
every store alike — `MetaState.apply` is deterministic — logged once, and its future fails.
Records of other brokers are applied as a replay is (`state.replaying`): this broker's engine did
not see them live.

`append_if(record, guards, sets)` adds compares on other keys (a partition's leader epoch) to
the same transaction and may set keys with it: when a guard no longer holds, nothing is
committed and the future fails with MetaFencedError. That is the fencing primitive: a leader
that lost its epoch can never commit. Guarded records without `sets` are group-committed like
plain ones (offset commits of many groups, each guarded by its coordinator's claim): one
transaction compares every guard of the records it carries, so each record still commits only
while its own guards hold; when some guard fails, exactly the records guarded by it fail and the
others go again in the next transaction. A record that sets keys goes alone, and so does one
whose guard on a key differs from a guard on that key already in the batch.

Offset commits come from clients that commit again as soon as they are answered (a consumer
committing synchronously in a loop). Taking whatever is queued the moment a transaction returns
splits such clients into cohorts that alternate for good: those answered by one transaction come
back while the next one is in flight, and each transaction carries about half of them. So after a
transaction that answered offset commits, the writer gathers (`_gather`): it waits until as many
records are queued as it just answered plus those that were already waiting, at most as long as
that transaction took (GATHER_WAIT_MAX_S at most), and at once when anything but an offset
commit is queued. The cohorts merge into one transaction, and each transaction's fixed cost
(etcd's request, raft entry and WAL sync; this store's HTTP request) is shared by all of them.

An uncertain answer (a timeout after the request was sent) may hide a commit: each batch carries
an id unique among all stores' batches (`_next_batch_id`) in front of every record, and a catch-up that finds the batch in flight resolves it
as committed instead of writing it again.

Checkpoints (loglake.cluster.etcd_checkpoint): any store may take one when `checkpoint_records` /
`checkpoint_bytes` were added since the last; chunks, then a manifest swapped in by a compare,
which also deletes the log up to the *previous* checkpoint, so a broker lagging by less than
one checkpoint interval still finds every record it misses (one lagging more reloads from the
newest checkpoint). Opening reads the manifest and its chunks at one etcd revision, then the log
after it.

etcd unreachable: requests retry over every endpoint for `unavailable_s` (loglake.cluster.etcd_client,
one warning per outage); then the batch's futures fail with EtcdUnavailableError and the thread
keeps trying to catch up, so the store recovers by itself when etcd is back.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from loglake.cluster import etcd_client as ec
from loglake.cluster.etcd_checkpoint import (
    CHECKPOINT_CHUNK_BYTES,
    MetaKeys,
    load_checkpoint,
    newest_checkpoint_seq,
    write_checkpoint,
)
from loglake.cluster.etcd_client import EtcdClient, EtcdCompactedError, Guard
from loglake.errors import (
    CorruptionError,
    EngineFailedError,
    EtcdUnavailableError,
    LoglakeError,
    MetaFencedError,
    MetaRecordRejectedError,
)
from loglake.locks import Rank, ranked_lock
from loglake.meta.checkpoint import capture
from loglake.meta.log import META_CHECKPOINT_BYTES_DEFAULT, META_CHECKPOINT_RECORDS_DEFAULT, Watcher
from loglake.meta.records import MetaRecord, RecordKind, decode_record, encode_record
from loglake.meta.state import MetaState
from loglake.meta.store import MetaStore

__all__ = ["CHECKPOINT_CHUNK_BYTES", "EtcdMetaStore", "Guard", "MetaRecordRejectedError"]

T = TypeVar("T")

log = logging.getLogger(__name__)

#: Records committed by one transaction (etcd's --max-txn-ops default is 128: each record is one
#: put, plus the head and the guards)...
TXN_RECORDS_MAX = 100
#: ...and their bytes (base64 grows them by 4/3; etcd refuses requests past 1.5 MiB).
TXN_BYTES_MAX = 768 * 1024
#: Records queued for the writer before `append` waits (back-pressure on a slow or absent etcd).
PENDING_RECORDS_MAX = 10_000
#: How long `append` waits for room in that queue before EtcdUnavailableError.
PENDING_WAIT_S = 30.0
#: Lost compares in a row (other brokers committed first) before a batch fails; each one means
#: another broker made progress, so this is reached only under pathological contention.
CONFLICTS_MAX = 1000
#: How often the writer looks for other brokers' records without a watch event (the watch is the
#: fast path; this bounds the delay when it is down).
POLL_INTERVAL_S = 1.0
#: For this long after a commit lost its compare to another broker's append, the writer reads
#: the log before each transaction instead of letting the transaction's compare find out.
CONTENDED_READ_FIRST_S = 1.0
#: Record kinds the writer gathers after answering (see `_gather`): offset commits, whose clients
#: commit again as soon as they are answered. Others (a produce's flush, a leader epoch, a sync
#: marker) never wait for company.
GATHER_KINDS = frozenset({RecordKind.OFFSET_COMMIT})
#: The longest the writer gathers offset commits after a transaction that answered some (it waits
#: at most as long as that transaction took, and never longer than this).
GATHER_WAIT_MAX_S = 0.005
#: Attempts to open (a checkpoint swapped or compacted away while it was being read starts over).
OPEN_ATTEMPTS_MAX = 5
_BATCH_ID_BYTES = 8
_BATCH_ID_MASK = (1 << (8 * _BATCH_ID_BYTES)) - 1
#: Guards whose compares `_compare` keeps (cleared when full).
_COMPARES_CACHED_MAX = 10_000
#: Record kinds whose rejection is an expected race, not damage, logged at debug (see `_apply`):
#: two brokers creating one topic name, or taking the same next producer id, at once; a topic
#: deleted, altered or grown on one broker after another broker deleted it (its writer's client
#: gets UNKNOWN_TOPIC_OR_PARTITION).
QUIET_REJECTED_KINDS = frozenset(
    {
        RecordKind.TOPIC_CREATED,
        RecordKind.TOPIC_DELETED,
        RecordKind.TOPIC_CONFIG,
        RecordKind.PARTITIONS_ADDED,
        RecordKind.PRODUCER_IDS,
    }
)


@dataclass
class _Pending:
    kind: RecordKind | None  # None: a sync marker
    body: dict[str, Any]
    raw: bytes
    future: Future[int]
    guards: tuple[Guard, ...] = ()
    sets: tuple[tuple[str, bytes], ...] = ()


def _batchable(batch: list[_Pending], p: _Pending, held: dict[str, Guard] | None = None) -> bool:
    """Whether `p` may join `batch` in one transaction: neither sets keys (a set may be what
    another record's guard compares: a new leader epoch), `p`'s guards agree with the guards on
    the same keys already in the batch (one compare per key, which all of them expect), and the
    batch still compares at most TXN_RECORDS_MAX keys. `held`: the batch's guards by key, when
    the caller keeps them (else they are collected here)."""
    if p.sets or batch[0].sets:
        return False
    if not p.guards:
        return True
    if held is None:
        held = {g.key: g for q in batch for g in q.guards}
    if len(held.keys() | {g.key for g in p.guards}) > TXN_RECORDS_MAX:
        return False  # one compare each: etcd refuses more than --max-txn-ops (128) of them
    return all(held.get(g.key, g) == g for g in p.guards)


@dataclass
class EtcdOpenReport:
    checkpoint_seq: int | None = None
    records_replayed: int = 0
    attempts: int = 0
    seconds: float = 0.0


@dataclass
class _Batch:
    id: bytes
    items: list[_Pending] = field(default_factory=list)


class EtcdMetaStore:
    """The cluster `MetaStore` (see loglake.meta.store for the interface and the module doc)."""

    def __init__(
        self,
        client: EtcdClient,
        prefix: str,
        *,
        checkpoint_records: int = META_CHECKPOINT_RECORDS_DEFAULT,
        checkpoint_bytes: int = META_CHECKPOINT_BYTES_DEFAULT,
        poll_interval_s: float = POLL_INTERVAL_S,
    ) -> None:
        if checkpoint_records < 1 or checkpoint_bytes < 1:
            raise ValueError("checkpoint_records and checkpoint_bytes must be at least 1")
        self.client = client
        self.prefix = "/" + prefix.strip("/")
        self.checkpoint_records = checkpoint_records
        self.checkpoint_bytes = checkpoint_bytes
        self.poll_interval_s = poll_interval_s
        self.keys = MetaKeys(self.prefix)
        self._k_head = self.keys.head
        self._k_log = self.keys.log
        #: the state, watchers and counters; never held over I/O
        self._lock = ranked_lock(Rank.META, "EtcdMetaStore._lock")
        self._cond = threading.Condition(threading.Lock())  # the pending queue and the writer's wake-ups
        self._checkpoint_lock = threading.Lock()
        self._state = MetaState()
        self._head_mod = 0  # mod revision of the head key as last read or written (0: no head yet)
        self._pending: deque[_Pending] = deque()
        #: the batch whose compare just failed, by id, while the writer catches up: finding it in the
        #: log means an earlier answer was lost and it is committed (at most one; the writer's own)
        self._in_doubt: dict[bytes, _Batch] = {}
        #: when a commit last lost its compare to another broker's append (`_run` reads first then)
        self._contended_at = float("-inf")
        #: what `_gather` waits for next: this many records queued, until this monotonic time
        #: (0: nothing to gather; set by a committed transaction that answered offset commits)
        self._gather_count = 0
        self._gather_until = 0.0
        #: the queue length that wakes the writer (under `_cond`): 0 while it is busy (it looks at
        #: the queue before it waits again), so `append` wakes it only when it waits for that
        #: record: a thread switch per record cost the broker more than its transaction did
        self._writer_wants = 0
        self._batch_seq = int.from_bytes(os.urandom(_BATCH_ID_BYTES), "big")  # see _next_batch_id
        self._compares: dict[Guard, dict[str, Any]] = {}
        self._woken = False  # by the watch (re)connecting or close(): catch up
        self._head_seen = 0  # the newest head mod revision the watch reported
        self._caught_up_at = float("-inf")  # monotonic time of the last catch-up (the poll)
        self._watchers: list[Watcher] = []
        self._since_records = 0
        self._since_bytes = 0
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None
        self._watch: ec.Watch | None = None
        self._outage_logged = False
        self._failure: BaseException | None = None
        self._checkpoint_error = ""
        self.report = EtcdOpenReport()

    def _key(self, rel: str) -> bytes:
        return self.keys.key(rel)

    def _log_key(self, seq: int) -> bytes:
        return self.keys.log_key(seq)

    # ---- MetaStore -----------------------------------------------------------------------------

    @property
    def state(self) -> MetaState:
        return self._state

    @property
    def last_seq(self) -> int:
        return self._state.seq

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def read(self, fn: Callable[[MetaState], T]) -> T:
        with self._lock:
            return fn(self._state)

    def open(self) -> MetaState:
        """Load the checkpoint and the log after it; start the writer and the watch."""
        started = time.perf_counter()
        self.report.attempts = self._load_and_replay(opening=True)
        self._state.replaying = False
        self.report.seconds = time.perf_counter() - started
        self._writer = threading.Thread(target=self._run, name="loglake-meta-etcd", daemon=True)
        self._writer.start()
        self._watch = self.client.watch(
            self._k_head, None, self._wake, name="loglake-meta-etcd-watch", on_event=self._head_moved
        )
        return self._state

    def watch(self, watcher: Watcher) -> None:
        with self._lock:
            self._watchers.append(watcher)

    def append(self, record: MetaRecord) -> Future[int]:
        """Queue one record; the future resolves with its seq once committed and applied."""
        kind, body = record.kind, record.body()
        return self._submit(_Pending(kind, body, encode_record(kind, body), Future()))

    def append_if(
        self,
        record: MetaRecord,
        guards: Sequence[Guard],
        sets: Mapping[str, bytes] | None = None,
    ) -> Future[int]:
        """Append only if every guard holds at commit (MetaFencedError otherwise); `sets` puts
        keys (relative to the prefix) in the same transaction (a new leader epoch, say)."""
        kind, body = record.kind, record.body()
        pending = _Pending(
            kind, body, encode_record(kind, body), Future(), tuple(guards), tuple((sets or {}).items())
        )
        return self._submit(pending)

    def get_key(self, key: str) -> tuple[bytes | None, int]:
        """(value, mod revision) of a key relative to the prefix ((None, 0) when absent): what a
        Guard compares."""
        kv, _ = self.client.get(self._key(key))
        return (kv.value, kv.mod_revision) if kv is not None else (None, 0)

    def _submit(self, pending: _Pending) -> Future[int]:
        if self._failure is not None:
            raise EngineFailedError(f"metadata store failed: {self._failure}")
        if self._writer is None or self._stop.is_set():
            raise EngineFailedError("metadata store is not open")
        deadline = time.monotonic() + PENDING_WAIT_S
        with self._cond:
            while len(self._pending) >= PENDING_RECORDS_MAX:
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    raise EtcdUnavailableError(f"{PENDING_RECORDS_MAX} metadata records wait for etcd")
                self._cond.wait(left)
            self._pending.append(pending)
            wants = self._writer_wants
            if wants and (len(self._pending) >= wants or pending.kind not in GATHER_KINDS):
                self._cond.notify_all()
        return pending.future

    def sync(self) -> None:
        """Block until every record appended so far is committed, and every record any broker
        committed before this call is applied here."""
        if self._failure is not None:
            raise EngineFailedError(f"metadata store failed: {self._failure}")
        if self._writer is None or self._stop.is_set():
            raise EngineFailedError("metadata store is not open")
        marker: Future[int] = Future()
        with self._cond:
            self._pending.append(_Pending(None, {}, b"", marker))  # a no-op the writer resolves in order
            self._cond.notify_all()
        marker.result()

    def _head_moved(self, mod_revision: int) -> None:
        """The watch saw the head change at `mod_revision`. The writer catches up only when that
        is news (`_news`): the watch reports this store's own commits too, often before their
        transaction's answer is read, and those need no read."""
        with self._cond:
            if mod_revision > self._head_seen:
                self._head_seen = mod_revision
                if self._writer_wants and self._news():
                    self._cond.notify_all()

    def _news(self) -> bool:
        """Whether the watch saw a head change this store has not applied (under `_cond`).
        `_head_mod` passes a head change only once every record before it is applied here
        (`_commit`, `_catch_up`); a transaction of this store moving the head compared on it."""
        return self._head_seen > self._head_mod

    def _wake(self) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    # ---- the writer thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                if not self._pending and not self._woken and not self._news():
                    self._writer_wants = 1
                    self._cond.wait(self.poll_interval_s)
                    self._writer_wants = 0
                woken = self._woken or self._news()
                self._woken = False
                writes = bool(self._pending)
            if self._stop.is_set():
                break
            try:
                # With records to write, their transaction's compare on the head is the look:
                # it fails only when another broker appended, and then `_commit` catches up and
                # goes again, so a read first would cost every commit a second round trip. While
                # other brokers are appending too (the last compare lost), reading first is the
                # cheaper way: a lost compare costs a transaction more. Idle, it reads when the
                # watch brought news (another broker's commit, not its own) or the poll is due.
                now = time.monotonic()
                idle_look = woken or now - self._caught_up_at >= self.poll_interval_s
                if (not writes and idle_look) or now - self._contended_at < CONTENDED_READ_FIRST_S:
                    self._catch_up(replay=False)
                self._write_pending()
                if self._outage_logged:
                    log.debug("metadata store %s: etcd reachable again", self.prefix)
                    self._outage_logged = False
            except EtcdUnavailableError as exc:
                self._fail_pending(exc)
                if not self._outage_logged:  # the client logged the outage (one line); this adds detail
                    log.debug(
                        "metadata store %s: %s; metadata changes fail until it is back", self.prefix, exc
                    )
                    self._outage_logged = True
            except Exception as exc:  # a corrupt log (or a bug): the store fails, as LocalMetaStore does
                self._failure = exc
                log.error(
                    "metadata store %s failed; metadata changes are refused until restart: %s",
                    self.prefix,
                    exc,
                )
                self._fail_pending(exc)
                break
        self._fail_pending(EngineFailedError("metadata store closed"))

    def _fail_pending(self, exc: BaseException) -> None:
        with self._cond:
            items, self._pending = list(self._pending), deque()
            self._cond.notify_all()
        for p in items:
            if not p.future.done():
                p.future.set_exception(exc if isinstance(exc, Exception) else EngineFailedError(repr(exc)))

    def _take_batch(self) -> tuple[list[_Pending], _Pending | None]:
        """The next records to commit together (a guarded append goes alone), or a sync marker
        when one is next in the queue."""
        out: list[_Pending] = []
        held: dict[str, Guard] = {}  # the guards of `out` by key
        size = 0
        with self._cond:
            while self._pending:
                p = self._pending[0]
                if p.kind is None:  # a sync marker: everything before it is committed
                    if out:
                        break
                    self._pending.popleft()
                    self._cond.notify_all()
                    return [], p
                if out and not _batchable(out, p, held):
                    break
                if out and (len(out) >= TXN_RECORDS_MAX or size + len(p.raw) > TXN_BYTES_MAX):
                    break
                out.append(self._pending.popleft())
                held.update((g.key, g) for g in p.guards)
                size += len(p.raw)
            self._cond.notify_all()
        return out, None

    def _gather(self) -> None:
        """Wait for the offset commits of the clients the last transaction answered (module doc):
        until `_gather_count` records are queued, anything but an offset commit is, the store
        stops, or `_gather_until` passes."""
        count, self._gather_count = self._gather_count, 0
        if count <= 0:
            return
        with self._cond:
            self._writer_wants = count
            try:
                while len(self._pending) < count and not self._stop.is_set():
                    if any(p.kind not in GATHER_KINDS for p in self._pending):
                        return
                    left = self._gather_until - time.monotonic()
                    if left <= 0:
                        return
                    self._cond.wait(left)
            finally:
                self._writer_wants = 0

    def _write_pending(self) -> None:
        while True:
            self._gather()
            items, marker = self._take_batch()
            if marker is not None:
                # What other brokers committed before sync() was called is applied first.
                try:
                    self._catch_up(replay=False)
                except BaseException as exc:
                    marker.future.set_exception(
                        exc if isinstance(exc, Exception) else EngineFailedError(repr(exc))
                    )
                    raise
                marker.future.set_result(self._state.seq)
                continue
            if not items:
                return
            batch = _Batch(self._next_batch_id(), items)
            try:
                self._commit(batch)
            except EtcdUnavailableError as exc:
                for p in items:
                    if not p.future.done():
                        p.future.set_exception(
                            EtcdUnavailableError(f"{exc}; metadata record {p.kind} may have been committed")
                        )
                raise

    def _next_batch_id(self) -> bytes:
        """Unique among every store's batches: a random start per store, counted up (os.urandom per
        batch was a system call per transaction)."""
        self._batch_seq = (self._batch_seq + 1) & _BATCH_ID_MASK
        return self._batch_seq.to_bytes(_BATCH_ID_BYTES, "big")

    def _compare(self, guard: Guard) -> dict[str, Any]:
        """The transaction compare of a guard (the same few guards recur: a group's claim, a
        partition's epoch, so they are built once)."""
        out = self._compares.get(guard)
        if out is None:
            if len(self._compares) >= _COMPARES_CACHED_MAX:
                self._compares.clear()
            out = self._compares[guard] = guard.compare(self._key(guard.key))
        return out

    def _commit(self, batch: _Batch) -> None:
        for _ in range(CONFLICTS_MAX):
            base = self._state.seq + 1
            last = base + len(batch.items) - 1
            # every record's guards (one compare per distinct guard: `_batchable` keeps them consistent)
            guards = list(dict.fromkeys(g for p in batch.items for g in p.guards))
            compare = [ec.cmp_mod(self._k_head, self._head_mod)]
            compare += [self._compare(g) for g in guards]
            success = [ec.op_put(self._k_head, str(last).encode())]
            success += [
                ec.op_put(self._log_key(base + i), batch.id + p.raw) for i, p in enumerate(batch.items)
            ]
            success += [ec.op_put(self._key(k), v) for p in batch.items for k, v in p.sets]
            failure = [ec.op_get(self._k_head)] + [ec.op_get(self._key(g.key)) for g in guards]
            sent = time.monotonic()
            ok, responses, revision = self.client.txn(compare, success, failure)
            if ok:
                self._head_mod = revision
                took = time.monotonic() - sent
                answered = sum(p.kind in GATHER_KINDS for p in batch.items)
                if answered:
                    with self._cond:
                        waiting = len(self._pending)
                    self._gather_count = min(answered + waiting, TXN_RECORDS_MAX)
                self._apply_batch(base, batch, own=True)  # answers them
                self._gather_until = time.monotonic() + min(took, GATHER_WAIT_MAX_S)
                return
            head = ec.response_kvs(responses[0])
            if (head[0].mod_revision if head else 0) != self._head_mod:
                self._contended_at = time.monotonic()
            else:
                # Not committed: a guard failed. Exactly the records it guards fail; the others
                # go again (the head did not move, so nothing is to be caught up first).
                broken = {g for g, r in zip(guards, responses[1:], strict=True) if not g.holds(ec.response_kvs(r))}
                fenced = [p for p in batch.items if broken.intersection(p.guards)] or batch.items[:1]
                for p in fenced:
                    changed = ", ".join(sorted(g.key for g in broken.intersection(p.guards))) or "a guard"
                    p.future.set_exception(MetaFencedError(f"metadata record {p.kind} fenced: {changed} changed"))
                batch.items = [p for p in batch.items if not p.future.done()]
                if not batch.items:
                    return
                continue
            self._in_doubt[batch.id] = batch  # the uncertain case: our own txn may be what moved the head
            try:
                self._catch_up(replay=False)
            finally:
                found = batch.id not in self._in_doubt
                self._in_doubt.pop(batch.id, None)
            if found:
                return
        for p in batch.items:
            p.future.set_exception(
                EtcdUnavailableError(f"metadata append lost {CONFLICTS_MAX} compares in a row")
            )

    # ---- reading the log ------------------------------------------------------------------------

    def _catch_up(self, *, replay: bool) -> None:
        """Apply every record after the state's seq, up to the head (read at one revision)."""
        self._caught_up_at = time.monotonic()
        head, revision = self.client.get(self._k_head)
        if head is None:
            if self._state.seq >= 0:  # never deleted by loglake: someone removed the prefix
                raise CorruptionError(
                    self._k_head.decode(),
                    0,
                    f"the metadata log's head is gone (this store is at record {self._state.seq})",
                )
            self._head_mod = 0
            return
        try:
            target = int(head.value)
        except ValueError:
            raise CorruptionError(
                self._k_head.decode(),
                0,
                f"the metadata log's head is {head.value[:40]!r}, not a record number",
            ) from None
        if target < self._state.seq:
            raise CorruptionError(
                self._k_head.decode(),
                0,
                f"the metadata log's head went back from record {self._state.seq} to {target}",
            )
        if head.mod_revision == self._head_mod and target == self._state.seq:
            return
        nxt = self._state.seq + 1
        while nxt <= target:
            end = min(target, nxt + ec.RANGE_PAGE_KEYS - 1)
            kvs, _, _ = self.client.range(self._log_key(nxt), self._log_key(end + 1), revision=revision)
            if not kvs or int(kvs[0].key[len(self._k_log) :]) != nxt:
                if replay and self._checkpoint_passed(nxt):
                    # Another store's newer checkpoint deleted the log after the one this store
                    # is replaying from, while it read: not damage; the caller starts over.
                    raise EtcdCompactedError(f"a newer checkpoint covers record {nxt}")
                if replay:
                    raise CorruptionError(
                        self._log_key(nxt).decode(),
                        0,
                        f"metadata record {nxt} is missing (log ends at {target})",
                    )
                log.warning(
                    "metadata store %s fell behind the log's compaction at record %d; reloading",
                    self.prefix,
                    nxt,
                )
                self._reload()
                return
            for kv in kvs:
                seq = int(kv.key[len(self._k_log) :])
                if seq != nxt:
                    raise CorruptionError(
                        kv.key.decode(), 0, f"metadata log jumps from record {nxt} to {seq}"
                    )
                self._apply_one(seq, kv.value, replay=replay)
                nxt += 1
        self._head_mod = head.mod_revision

    def _apply_one(self, seq: int, value: bytes, *, replay: bool) -> None:
        batch_id, raw = value[:_BATCH_ID_BYTES], value[_BATCH_ID_BYTES:]
        kind, body = decode_record(raw, where=self._log_key(seq).decode(), position=seq)
        doubt = self._in_doubt.get(batch_id)
        if doubt is not None:  # our own batch, committed though the answer was lost
            index = next((i for i, p in enumerate(doubt.items) if not p.future.done()), None)
            pending = doubt.items[index] if index is not None else None
            if index is not None and index == len(doubt.items) - 1:
                del self._in_doubt[batch_id]
            self._apply(seq, kind, body, raw, replaying=False, future=pending.future if pending else None)
            return
        self._apply(seq, kind, body, raw, replaying=True)

    def _apply_batch(self, base: int, batch: _Batch, *, own: bool) -> None:
        for i, p in enumerate(batch.items):
            assert p.kind is not None  # a batch holds records, never a sync marker (_take_batch)
            self._apply(base + i, p.kind, p.body, p.raw, replaying=not own, future=p.future)

    def _apply(
        self,
        seq: int,
        kind: RecordKind,
        body: dict[str, Any],
        raw: bytes,
        *,
        replaying: bool,
        future: Future[int] | None = None,
    ) -> None:
        error: Exception | None = None
        with self._lock:
            state = self._state
            was = state.replaying
            state.replaying = was or replaying
            try:
                state.apply(kind, body)
            except Exception as exc:  # deterministic on every store: all skip it alike
                error = MetaRecordRejectedError(f"metadata record {seq} ({kind}) does not apply: {exc!r}")
            finally:
                state.replaying = was
            state.seq = seq
            self._since_records += 1
            self._since_bytes += len(raw)
            if error is None:
                for watcher in self._watchers:
                    watcher(seq, kind, body, raw)
        if error is not None:
            # Two brokers creating one topic, or taking one producer id, at once: the loser's
            # record is skipped by every broker, which is the rule working, not damage.
            quiet = kind in QUIET_REJECTED_KINDS
            (log.debug if quiet else log.error)(
                "metadata store %s: %s; every broker skips it", self.prefix, error
            )
        if future is not None and not future.done():
            if error is None:
                future.set_result(seq)
            else:
                future.set_exception(error)

    def _reload(self) -> None:
        """Adopt the newest checkpoint (this store lagged past the log's compaction)."""
        self._load_and_replay(opening=False)

    def _load_and_replay(self, *, opening: bool) -> int:
        """Load the newest checkpoint and apply the log after it (the state stays `replaying`
        while `opening`; a running store's reload is not a recovery); the attempts it took.
        Another store may checkpoint again meanwhile and delete the log being read: then it
        starts over from that newer checkpoint."""
        for attempt in range(1, OPEN_ATTEMPTS_MAX + 1):
            try:
                state = self._load_checkpoint()
                with self._lock:
                    state.replaying = opening
                    self._state = state
                self._catch_up(replay=True)
                return attempt
            except EtcdCompactedError:
                if attempt == OPEN_ATTEMPTS_MAX:
                    raise EngineFailedError(
                        f"etcd {self.prefix}: the checkpoint kept changing while being read"
                    ) from None
        raise AssertionError("unreachable")

    def _checkpoint_passed(self, seq: int) -> bool:
        """Whether the newest checkpoint holds record `seq` (so the log before it may be gone)."""
        newest = newest_checkpoint_seq(self.client, self.keys)
        return newest is not None and newest >= seq

    # ---- checkpoints ----------------------------------------------------------------------------

    def _load_checkpoint(self) -> MetaState:
        state, seq = load_checkpoint(self.client, self.keys)
        self.report.checkpoint_seq = seq
        return state

    def checkpoint_due(self) -> bool:
        return self._since_records >= self.checkpoint_records or self._since_bytes >= self.checkpoint_bytes

    def maybe_checkpoint(self) -> int | None:
        if not self.checkpoint_due():
            return None
        try:
            return self.checkpoint()
        except (EtcdUnavailableError, EtcdCompactedError) as exc:
            log.debug("metadata checkpoint in %s failed: %s; retried at the next tick", self.prefix, exc)
            return None
        except CorruptionError as exc:  # a damaged manifest: said once per distinct damage
            if str(exc) != self._checkpoint_error:
                log.error("metadata checkpoint in %s failed: %s", self.prefix, exc)
                self._checkpoint_error = str(exc)
            return None

    def checkpoint(self) -> int | None:
        """Write the state as the newest checkpoint; its seq, or None when another broker's
        checkpoint at the same or a later seq won."""
        with self._checkpoint_lock:
            with self._lock:
                if self._state.seq < 0:
                    return None  # nothing to keep yet
                image = capture(self._state)
                self._since_records = 0
                self._since_bytes = 0
            return write_checkpoint(self.client, self.keys, image)

    # ---- closing --------------------------------------------------------------------------------

    def close(self) -> None:
        """Commit what is queued (while etcd answers), then stop the threads."""
        if self._writer is None:
            return
        try:
            if not self._stop.is_set():
                self.sync()
        except LoglakeError as exc:
            log.warning("metadata store %s closed with records not committed: %s", self.prefix, exc)
        self._stop.set()
        self._wake()
        self._writer.join()
        self._writer = None
        if self._watch is not None:
            self._watch.stop()
            self._watch = None


if TYPE_CHECKING:  # mypy checks that the store meets the seam the engine uses
    _conforms: type[MetaStore] = EtcdMetaStore
