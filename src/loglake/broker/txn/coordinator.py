"""The transaction coordinator (single node: this broker coordinates every transactional id).

State per transactional id (`Txn`) is kept in memory and logged as a ``txn`` metadata record on
every change (loglake.meta.txn), so a restart finds it as it was. Ending a transaction:

1. record prepare_commit / prepare_abort (durable);
2. append a COMMIT / ABORT marker to every partition of the transaction and wait until each is
   durable per its topic's class (the engine writes them: no WriteTxnMarkers hop);
3. on commit, write the transaction's group offsets (TxnOffsetCommit) to their groups;
4. record complete_commit / complete_abort (the partitions' open entries go, aborted entries come).

A crash anywhere in 2-4 leaves the prepare record: `start()` redoes 2-4 (a marker written twice
is harmless; offsets written twice are the same offsets). A new producer instance (InitProducerId)
bumps the epoch, which fences the old one, and aborts its open transaction first; an ongoing
transaction past its timeout is aborted the same way by the periodic sweep.

Operations on one transactional id are serialized by its lock; different ids run concurrently.
The states and their transition table are loglake.meta.txn_states (the meta layer reads them
too); `Txn.transition_to` is the one place a state moves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from loglake.broker.groups import GroupCoordinator
from loglake.broker.txn.id_store import TxnIdStore
from loglake.engine import Engine
from loglake.errors import LoglakeError, UnknownTopicError
from loglake.kafka_errors import ErrorCode
from loglake.logsafe import RateLimitedLog
from loglake.meta.records import JsonDoc
from loglake.meta.txn_states import (
    IDLE_STATES,
    OPEN_STATES,
    PREPARE_STATES,
    TxnState,
    check_transition,
    complete_state,
    parse_txn_state,
    prepare_state,
)

log = logging.getLogger(__name__)
_limited = RateLimitedLog(log)

__all__ = ["EPOCH_MAX", "TXN_PARTITIONS_MAX", "Txn", "TxnCoordinator", "TxnSettings"]

#: Largest producer epoch handed out; past it the transactional id gets a new producer id (Kafka).
EPOCH_MAX = 32766
#: Most partitions one transaction may span.
TXN_PARTITIONS_MAX = 100_000
#: Most groups (and offsets per group) one transaction may commit offsets to.
TXN_GROUPS_MAX = 1_000
TXN_OFFSETS_PER_GROUP_MAX = 100_000

E = ErrorCode
PartKey = tuple[str, int]  # (topic name, partition)
#: A transaction's pending offset of a partition: (offset, leader epoch, metadata).
OffsetRow = tuple[int, int, str | None]
#: A marker written when a transaction ended: (topic id hex, partition, its offset).
Marker = tuple[str, int, int]


@dataclass
class TxnSettings:
    max_timeout_ms: int = 900_000
    id_expiration_ms: int = 604_800_000
    cleanup_interval_ms: int = 10_000
    ids_max: int = 100_000


@dataclass(eq=False)
class Txn:
    tid: str
    pid: int
    epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    start_ms: int = -1
    last_ms: int = 0
    #: (topic, partition) -> (topic id hex, first offset)
    parts: dict[PartKey, tuple[str, int]] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)
    #: group -> (topic, partition) -> [offset, leader_epoch, metadata]
    offsets: dict[str, dict[PartKey, OffsetRow]] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def transition_to(self, target: TxnState) -> None:
        """Move to `target`; IllegalTxnTransition when the table does not allow it (a bug)."""
        check_transition(self.tid, self.state, target)
        self.state = target

    def body(self, markers: list[Marker] | None = None) -> dict[str, object]:
        """The ``txn`` record of this state (loglake.meta.txn), with the markers an abort wrote."""
        b: dict[str, object] = {
            "tid": self.tid,
            "pid": self.pid,
            "epoch": self.epoch,
            "state": self.state.value,
            "timeout_ms": self.timeout_ms,
            "start_ms": self.start_ms,
            "last_ms": self.last_ms,
            "parts": [[tid_hex, p, first] for (_t, p), (tid_hex, first) in self.parts.items()],
            "names": [t for (t, _p) in self.parts],
            "groups": list(self.groups),
            "offsets": {g: [[t, p, *row] for (t, p), row in rows.items()] for g, rows in self.offsets.items()},
        }
        if markers is not None:
            b["markers"] = [list(m) for m in markers]
        return b

    @classmethod
    def from_body(cls, b: JsonDoc) -> Txn:
        txn = cls(str(b["tid"]), int(b["pid"]), int(b["epoch"]), int(b["timeout_ms"]), parse_txn_state(b["state"]))
        txn.start_ms = int(b.get("start_ms", -1))
        txn.last_ms = int(b.get("last_ms", 0))
        names = b.get("names") or []
        for i, (tid_hex, p, first) in enumerate(b.get("parts") or []):
            name = str(names[i]) if i < len(names) else tid_hex
            txn.parts[(name, int(p))] = (str(tid_hex), int(first))
        txn.groups = [str(g) for g in b.get("groups") or []]
        txn.offsets = {
            str(g): {(str(t), int(p)): (int(o), int(e), m) for t, p, o, e, m in rows}
            for g, rows in (b.get("offsets") or {}).items()
        }
        return txn


def fenced_code(api_fenced_from: int, version: int) -> int:
    """PRODUCER_FENCED from the version that knows it (KIP-588), INVALID_PRODUCER_EPOCH before."""
    return E.PRODUCER_FENCED if 0 <= api_fenced_from <= version else E.INVALID_PRODUCER_EPOCH


class TxnCoordinator:
    def __init__(
        self,
        engine: Engine,
        group_coordinator: Callable[[], GroupCoordinator | None] | None,
        settings: TxnSettings,
        *,
        off_loop: Callable[[Callable[[], int]], Awaitable[int]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`group_coordinator()`: the coordinator a commit writes its offsets to, asked when it
        does (the broker replaces it when the live set moves); None: offsets are not written."""
        self.engine = engine
        #: the transactional ids' recorded states (`txn` records)
        self.ids = TxnIdStore.of(engine)
        self._group_coordinator = group_coordinator
        self.settings = settings
        self._off_loop = off_loop
        self._clock = clock
        self.txns: dict[str, Txn] = {}
        self.by_pid: dict[int, Txn] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self.closed = False

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    # ---- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the recorded state; complete transactions caught in a prepare state; start the sweep."""
        await self.start_once()
        self._sweeper = asyncio.create_task(self._sweep_loop())

    async def start_once(self) -> None:
        """`start` without the periodic sweep (one pass of it runs)."""
        for tid, body in self.ids.states().items():
            txn = Txn.from_body(body)
            self.txns[tid] = txn
            self.by_pid[txn.pid] = txn
        for txn in list(self.txns.values()):
            if txn.state in PREPARE_STATES:
                try:
                    async with txn.lock:
                        await self._finish(txn, txn.state is TxnState.PREPARE_COMMIT)
                    log.info("transaction of %r completed after restart (%s)", txn.tid, txn.state)
                except LoglakeError as exc:
                    log.error("transaction of %r could not be completed after restart: %s", txn.tid, exc)
        await self.sweep()

    def close(self) -> None:
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()

    async def _sweep_loop(self) -> None:
        while not self.closed:
            await asyncio.sleep(self.settings.cleanup_interval_ms / 1000.0)
            try:
                await self.sweep()
            except Exception as exc:  # one line, and the sweep runs again next interval
                _limited.warning("sweep", "transaction sweep failed: %r", exc)

    async def sweep(self) -> None:
        """Abort ongoing transactions past their timeout (bumping the epoch fences the producer);
        forget transactional ids idle longer than transactional.id.expiration.ms."""
        now = self.now_ms()
        for txn in list(self.txns.values()):
            if txn.lock.locked():
                continue
            if self._timed_out(txn, now):
                async with txn.lock:
                    if not self._timed_out(txn, now):  # it moved while this waited for the lock
                        continue
                    log.info("transaction of %r timed out after %d ms: aborting", txn.tid, txn.timeout_ms)
                    await self._bump(txn)
                    await self._end(txn, commit=False)
            elif txn.state in IDLE_STATES and now - txn.last_ms > self.settings.id_expiration_ms:
                async with txn.lock:
                    await self._forget(txn)

    @staticmethod
    def _timed_out(txn: Txn, now: int) -> bool:
        return txn.state is TxnState.ONGOING and now - txn.start_ms > txn.timeout_ms

    async def _forget(self, txn: Txn) -> None:
        txn.transition_to(TxnState.DEAD)
        try:
            await self._record(txn)
        finally:
            # Gone from memory even when the record failed: a dead Txn has no way back, and the
            # metadata's idle state of the id is replaced by the next record of a new one.
            self.txns.pop(txn.tid, None)
            if self.by_pid.get(txn.pid) is txn:
                del self.by_pid[txn.pid]

    async def _record(self, txn: Txn, markers: list[Marker] | None = None) -> None:
        txn.last_ms = self.now_ms()
        await asyncio.wrap_future(self.ids.record(txn.body(markers)))

    # ---- InitProducerId ----------------------------------------------------------------------------

    async def init_producer_id(self, tid: str, timeout_ms: int, pid: int, epoch: int, version: int) -> tuple[int, int, int]:
        """(error, producer id, epoch)."""
        if not 0 < timeout_ms <= self.settings.max_timeout_ms:
            return E.INVALID_TRANSACTION_TIMEOUT, -1, -1
        txn = self.txns.get(tid)
        if txn is None:
            if len(self.txns) >= self.settings.ids_max:
                await self.sweep()
                if len(self.txns) >= self.settings.ids_max:
                    _limited.warning(
                        "ids_max", "transactional id %r refused: %d ids kept (transactional_ids_max)", tid, len(self.txns)
                    )
                    return E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1
            new_pid = await self._off_loop(self.engine.allocate_producer_id)
            txn = self.txns.get(tid)
            if txn is None:
                txn = Txn(tid, new_pid, 0, timeout_ms)
                self.txns[tid] = txn
                self.by_pid[new_pid] = txn
                async with txn.lock:
                    await self._record(txn)
                return E.NONE, txn.pid, txn.epoch
        if self._completing(txn):
            return E.CONCURRENT_TRANSACTIONS, -1, -1
        async with txn.lock:
            if txn.state is TxnState.DEAD:  # the sweep forgot the id while this waited: the retry starts afresh
                return E.CONCURRENT_TRANSACTIONS, -1, -1
            if pid >= 0:  # KIP-360: a producer resuming after an error names its id and epoch
                if pid != txn.pid:
                    return E.INVALID_PRODUCER_ID_MAPPING, -1, -1
                if epoch != txn.epoch:
                    return fenced_code(4, version), -1, -1
            if txn.state in PREPARE_STATES:
                await self._finish(txn, txn.state is TxnState.PREPARE_COMMIT)
            if txn.state is TxnState.ONGOING:  # the previous instance's transaction: fence it, then abort it
                await self._bump(txn)
                await self._end(txn, commit=False)
            await self._bump(txn)
            txn.timeout_ms = timeout_ms
            txn.transition_to(TxnState.EMPTY)
            await self._record(txn)
            return E.NONE, txn.pid, txn.epoch

    async def _bump(self, txn: Txn) -> None:
        if txn.epoch >= EPOCH_MAX:
            new_pid = await self._off_loop(self.engine.allocate_producer_id)
            if self.by_pid.get(txn.pid) is txn:
                del self.by_pid[txn.pid]
            txn.pid, txn.epoch = new_pid, 0
            self.by_pid[new_pid] = txn
        else:
            txn.epoch += 1

    # ---- checks shared by the transactional requests -------------------------------------------------

    def _check(self, tid: str, pid: int, epoch: int, fenced: int) -> tuple[int, Txn | None]:
        txn = self.txns.get(tid)
        if txn is None or txn.pid != pid:
            return E.INVALID_PRODUCER_ID_MAPPING, None
        if epoch != txn.epoch:
            return fenced, None
        return E.NONE, txn

    @staticmethod
    def _completing(txn: Txn) -> bool:
        """An EndTxn (or an abort by the coordinator) is writing markers: Kafka answers
        CONCURRENT_TRANSACTIONS and the client retries, rather than queueing behind it."""
        return txn.lock.locked() and txn.state in PREPARE_STATES

    def _begin(self, txn: Txn) -> None:
        if txn.state is not TxnState.ONGOING:
            txn.transition_to(TxnState.ONGOING)
            txn.start_ms = self.now_ms()
            txn.parts.clear()
            txn.groups.clear()
            txn.offsets.clear()

    # ---- AddPartitionsToTxn / AddOffsetsToTxn / TxnOffsetCommit --------------------------------------

    async def add_partitions(
        self, tid: str, pid: int, epoch: int, parts: list[PartKey], version: int, *, verify_only: bool = False
    ) -> dict[PartKey, int]:
        code, txn = self._check(tid, pid, epoch, fenced_code(2, version))
        if txn is None:
            return dict.fromkeys(parts, code)
        if self._completing(txn):
            return dict.fromkeys(parts, E.CONCURRENT_TRANSACTIONS)
        async with txn.lock:
            code, txn2 = self._check(tid, pid, epoch, fenced_code(2, version))
            if txn2 is not txn:
                return dict.fromkeys(parts, code)
            if verify_only:
                ok = txn.state is TxnState.ONGOING
                return {k: E.NONE if ok and k in txn.parts else E.INVALID_TXN_STATE for k in parts}
            if txn.state in PREPARE_STATES:
                return dict.fromkeys(parts, E.CONCURRENT_TRANSACTIONS)
            found: dict[PartKey, tuple[str, int]] = {}
            errors: dict[PartKey, int] = {}
            for name, index in parts:
                if (name, index) in txn.parts and txn.state is TxnState.ONGOING:
                    continue
                try:
                    topic_id = self.engine.topic_id_of(name)
                except UnknownTopicError:
                    errors[(name, index)] = E.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                end = self.engine.log_end(topic_id, index)
                if end is None:
                    errors[(name, index)] = E.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                found[(name, index)] = (topic_id.hex(), end)
            if errors:  # Kafka: one bad partition fails the request; the others were not attempted
                return {k: errors.get(k, E.OPERATION_NOT_ATTEMPTED) for k in parts}
            if found or txn.state is not TxnState.ONGOING:
                self._begin(txn)
                if len(txn.parts) + len(found) > TXN_PARTITIONS_MAX:
                    return dict.fromkeys(parts, E.INVALID_REQUEST)
                txn.parts.update(found)
                await self._record(txn)
            return dict.fromkeys(parts, E.NONE)

    async def add_offsets(self, tid: str, pid: int, epoch: int, group: str, version: int) -> int:
        code, txn = self._check(tid, pid, epoch, fenced_code(2, version))
        if txn is None:
            return code
        if self._completing(txn):
            return E.CONCURRENT_TRANSACTIONS
        async with txn.lock:
            if txn.state is TxnState.DEAD:  # the sweep forgot the id while this waited
                return E.INVALID_PRODUCER_ID_MAPPING
            if txn.state in PREPARE_STATES:
                return E.CONCURRENT_TRANSACTIONS
            if txn.epoch != epoch:
                return fenced_code(2, version)
            if group not in txn.groups or txn.state is not TxnState.ONGOING:
                self._begin(txn)
                if len(txn.groups) >= TXN_GROUPS_MAX:
                    return E.INVALID_REQUEST
                txn.groups.append(group)
                await self._record(txn)
            return E.NONE

    async def txn_offset_commit(
        self, tid: str, pid: int, epoch: int, group: str, offsets: list[tuple[str, int, int, int, str | None]]
    ) -> dict[PartKey, int]:
        keys = [(t, p) for t, p, *_ in offsets]
        code, txn = self._check(tid, pid, epoch, E.INVALID_PRODUCER_EPOCH)
        if txn is None:
            return dict.fromkeys(keys, code)
        async with txn.lock:
            if txn.epoch != epoch:
                return dict.fromkeys(keys, E.INVALID_PRODUCER_EPOCH)
            if txn.state is not TxnState.ONGOING or group not in txn.groups:
                return dict.fromkeys(keys, E.INVALID_TXN_STATE)  # AddOffsetsToTxn comes first
            rows = txn.offsets.setdefault(group, {})
            out: dict[PartKey, int] = {}
            for t, p, offset, leader_epoch, metadata in offsets:
                if not self.engine.has_topic(t):
                    out[(t, p)] = E.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                if len(rows) >= TXN_OFFSETS_PER_GROUP_MAX and (t, p) not in rows:
                    out[(t, p)] = E.INVALID_REQUEST
                    continue
                rows[(t, p)] = (offset, leader_epoch, metadata or "")
                out[(t, p)] = E.NONE
            await self._record(txn)
            return out

    # ---- EndTxn ----------------------------------------------------------------------------------------

    async def end_txn(self, tid: str, pid: int, epoch: int, commit: bool, version: int) -> int:
        code, txn = self._check(tid, pid, epoch, fenced_code(2, version))
        if txn is None:
            return code
        async with txn.lock:
            if txn.epoch != epoch or txn.pid != pid:
                return fenced_code(2, version)
            if txn.state is complete_state(commit):
                return E.NONE  # a retry of what was already answered
            if txn.state is prepare_state(commit):
                await self._finish(txn, commit)  # a retry after a failed completion
                return E.NONE
            if txn.state is not TxnState.ONGOING:
                return E.INVALID_TXN_STATE
            await self._end(txn, commit)
            return E.NONE

    async def _end(self, txn: Txn, commit: bool) -> None:
        txn.transition_to(prepare_state(commit))
        await self._record(txn)
        await self._finish(txn, commit)

    async def _finish(self, txn: Txn, commit: bool) -> None:
        """Markers into every partition, offsets on commit, then the complete record."""
        pending = []
        for (_name, index), (tid_hex, _first) in txn.parts.items():
            fut = self.engine.write_txn_marker(bytes.fromhex(tid_hex), index, txn.pid, txn.epoch, commit)
            if fut is not None:
                pending.append((tid_hex, index, fut))
        markers: list[Marker] = []
        for tid_hex, index, fut in pending:
            result = await asyncio.wrap_future(fut)
            markers.append((tid_hex, index, result.base_offset))
        groups = self._group_coordinator() if self._group_coordinator is not None else None
        if commit and txn.offsets and groups is not None:
            for group, rows in txn.offsets.items():
                items = [(t, p, int(o), int(e), m) for (t, p), (o, e, m) in rows.items()]
                await groups.commit_txn_offsets(group, items, topic_exists=self._partition_exists)
        txn.transition_to(complete_state(commit))
        await self._record(txn, markers if not commit else None)
        for tid_hex, index, _offset in markers:  # the LSO moved: read_committed fetches look again
            self.engine.wake_readers(bytes.fromhex(tid_hex), index)
        txn.parts.clear()
        txn.groups.clear()
        txn.offsets.clear()

    def _partition_exists(self, name: str, index: int) -> bool:
        try:
            return bool(0 <= index < self.engine.topic(name).partitions)
        except UnknownTopicError:
            return False

    # ---- Produce (KIP-890 part 1: a transactional batch needs its partition in the transaction) ------

    def check_produce(self, pid: int, epoch: int, topic: str, partition: int) -> int:
        txn = self.by_pid.get(pid)
        if txn is None:
            return E.INVALID_TXN_STATE
        if epoch != txn.epoch:
            return E.INVALID_PRODUCER_EPOCH
        if txn.state is not TxnState.ONGOING or (topic, partition) not in txn.parts:
            return E.INVALID_TXN_STATE
        return E.NONE

    def pending_offsets(self, group: str) -> set[PartKey]:
        """Partitions with offsets of `group` in a transaction not yet complete (KIP-447: an
        OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for them)."""
        out: set[PartKey] = set()
        for txn in self.txns.values():
            if txn.state in OPEN_STATES and group in txn.offsets:
                out.update(txn.offsets[group])
        return out

    # ---- admin --------------------------------------------------------------------------------------

    def describe(self, tid: str) -> Txn | None:
        return self.txns.get(tid)

    def list(self) -> list[Txn]:
        return list(self.txns.values())
