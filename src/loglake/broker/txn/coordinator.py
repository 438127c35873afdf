"""The transaction coordinator (single node: this broker coordinates every transactional id).

State per transactional id (`Txn`) is kept in memory and logged as a ``txn`` metadata record on
every change (loglake.meta.txn), so a restart finds it as it was. Ending a transaction:

1. record prepare_commit / prepare_abort (durable);
2. append a COMMIT / ABORT marker to every partition of the transaction and wait until each is
   durable per its topic's class (the engine writes them: no WriteTxnMarkers hop);
3. on commit, write the transaction's group offsets (TxnOffsetCommit) to their groups;
4. record complete_commit / complete_abort (the partitions' open entries go, aborted entries come).

A crash anywhere in 2-4 leaves the prepare record: `start()` redoes 2-4 (a marker written twice
is harmless; offsets written twice are the same offsets).

Where the records go and how markers reach partitions are the coordinator's two collaborators:
a `TxnStore` (single node: `TxnIdStore`, the metadata log; cluster mode: a store whose writes
are fenced by a claim in etcd, loglake.cluster.txn) and `TxnMarkers` (single node:
`EngineMarkers`, the engine appends them; cluster mode: each partition's leader appends them,
loglake.cluster.txn). A broker coordinates the transactional ids the cluster view gives it
(`view.coordinator_of`): others get NOT_COORDINATOR; when the live set moves the coordinator
reloads the ids it owns now from the store (COORDINATOR_LOAD_IN_PROGRESS meanwhile) and
completes what a deposed coordinator left in a prepare state. A new producer instance (InitProducerId)
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
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

from loglake.broker.groups import GroupCoordinator
from loglake.broker.txn.id_store import TxnIdStore
from loglake.engine import Engine
from loglake.errors import LoglakeError, MetaFencedError, UnknownTopicError
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

__all__ = [
    "EPOCH_MAX",
    "RELOAD_RETRY_S",
    "TXN_PARTITIONS_MAX",
    "ApplyOffsets",
    "EngineMarkers",
    "Txn",
    "TxnBackend",
    "TxnCoordinator",
    "TxnMarkers",
    "TxnOffsetRows",
    "TxnSettings",
    "TxnStore",
]

#: Largest producer epoch handed out; past it the transactional id gets a new producer id (Kafka).
EPOCH_MAX = 32766
#: Most partitions one transaction may span.
TXN_PARTITIONS_MAX = 100_000
#: How long a markers thread waits for the broker's loop to commit a transaction's offsets.
APPLY_WAIT_S = 30.0
#: Most groups (and offsets per group) one transaction may commit offsets to.
TXN_GROUPS_MAX = 1_000
TXN_OFFSETS_PER_GROUP_MAX = 100_000

E = ErrorCode
PartKey = tuple[str, int]  # (topic name, partition)
#: A transaction's pending offset of a partition: (offset, leader epoch, metadata).
OffsetRow = tuple[int, int, str | None]
#: A marker written when a transaction ended: (topic id hex, partition, its offset).
Marker = tuple[str, int, int]
#: Seconds between attempts to reload the transactional ids while the store does not answer.
RELOAD_RETRY_S = 1.0


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
    #: names this ending of the transaction (set with its prepare state): cluster mode's leaders
    #: report the markers they wrote under it (loglake.cluster.txn)
    attempt: str = ""
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
        if self.attempt and self.state in PREPARE_STATES:
            b["attempt"] = self.attempt
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
        txn.attempt = str(b.get("attempt") or "")
        txn.offsets = {
            str(g): {(str(t), int(p)): (int(o), int(e), m) for t, p, o, e, m in rows}
            for g, rows in (b.get("offsets") or {}).items()
        }
        return txn


class TxnStore(Protocol):
    """Where a coordinator records its transactional ids' states (`txn` records)."""

    def load(self, owns: Callable[[str], bool]) -> dict[str, JsonDoc]:
        """The recorded states of the ids `owns` accepts, taken over for this coordinator (blocking)."""
        ...

    def record(self, body: JsonDoc) -> Future[int]:
        """Log an id's new state; resolves once durable (MetaFencedError: another coordinator owns it)."""
        ...


#: A transaction's offsets of one group as TxnOffsetCommit gives them: (topic, partition, offset,
#: leader epoch, metadata).
TxnOffsetRows = list[tuple[str, int, int, int, str | None]]
#: Commits a committed transaction's offsets of one group through this broker's group
#: coordinator (blocking: it runs the coordinator's write on the broker's loop).
ApplyOffsets = Callable[[str, TxnOffsetRows], None]


class TxnMarkers(Protocol):
    """How a transaction's COMMIT / ABORT markers reach its partitions — and its offsets their
    groups, as Kafka's markers reach the groups' __consumer_offsets partitions."""

    async def stage_offsets(self, tid: str, pid: int, epoch: int, group: str,
                            offsets: TxnOffsetRows) -> dict[PartKey, int] | None:
        """TxnOffsetCommit at the group's coordinator: keep the offsets until the transaction
        ends (their codes), or None when the transaction's coordinator keeps them (a single node)."""
        ...

    def attach(self, apply: ApplyOffsets) -> None:
        """How this broker commits the staged offsets of the groups it coordinates."""
        ...

    async def pending_offsets(self, group: str) -> set[PartKey]:
        """Partitions of `group` with offsets staged by a transaction not ended yet (wherever
        `stage_offsets` keeps them); LoglakeError when that cannot be told now."""
        ...

    async def write(self, txn: Txn, commit: bool) -> list[Marker]:
        """Append the markers of `txn` (in its prepare state) to each of its partitions and wait
        until each is durable; the markers written (a partition whose topic is gone has none)."""
        ...

    def forget(self, txn: Txn) -> None:
        """The transaction is complete: drop what `write` left behind."""
        ...

    def close(self) -> None: ...


class EngineMarkers:
    """Markers appended by this broker's engine (a single node leads every partition); the
    transaction's offsets stay with its coordinator (`Txn.offsets`), which is every group's."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def stage_offsets(self, tid: str, pid: int, epoch: int, group: str,
                            offsets: TxnOffsetRows) -> dict[PartKey, int] | None:
        return None

    def attach(self, apply: ApplyOffsets) -> None:
        return None

    async def pending_offsets(self, group: str) -> set[PartKey]:
        return set()

    async def write(self, txn: Txn, commit: bool) -> list[Marker]:
        pending = []
        for (_name, index), (tid_hex, _first) in txn.parts.items():
            fut = self.engine.write_txn_marker(bytes.fromhex(tid_hex), index, txn.pid, txn.epoch, commit)
            if fut is not None:
                pending.append((tid_hex, index, fut))
        markers: list[Marker] = []
        for tid_hex, index, fut in pending:
            result = await asyncio.wrap_future(fut)
            markers.append((tid_hex, index, result.base_offset))
        return markers

    def forget(self, txn: Txn) -> None:
        return None

    def close(self) -> None:
        return None


#: How a broker's coordinator records and ends transactions, made over its open engine (cluster
#: mode's: loglake.cluster.txn); none given: a single node's (`TxnIdStore`, `EngineMarkers`).
TxnBackend = Callable[[Engine], tuple[TxnStore, TxnMarkers]]


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
        store: TxnStore | None = None,
        markers: TxnMarkers | None = None,
    ) -> None:
        """`group_coordinator()`: the coordinator a commit writes its offsets to, asked when it
        does (the broker replaces it when the live set moves); None: offsets are not written.
        `store` / `markers`: a single node's (`TxnIdStore`, `EngineMarkers`) unless given."""
        self.engine = engine
        self.view = engine.view
        #: every transactional id's recorded state, as this broker's metadata has it
        self.ids = TxnIdStore.of(engine)
        #: where this coordinator's records go (fenced in cluster mode)
        self.store: TxnStore = store if store is not None else self.ids
        self.markers: TxnMarkers = markers if markers is not None else EngineMarkers(engine)
        self._group_coordinator = group_coordinator
        self.settings = settings
        self._off_loop = off_loop
        self._clock = clock
        self.txns: dict[str, Txn] = {}
        self.by_pid: dict[int, Txn] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self.closed = False
        #: the live node ids the ids in memory were loaded for; another set means a reload is due
        #: (`start` loads them; a coordinator never started begins with none, for these brokers)
        self.loaded_for: frozenset[int] = frozenset(self.view.live_ids())
        self._loading = False
        self._due = False
        self._reloader: asyncio.Future[None] | None = None
        self._completions: set[asyncio.Future[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: producer id -> transactional id of the recorded states (for Produce on a partition
        #: leader that does not coordinate the producer's id); rebuilt when a producer id misses
        self._pid_index: dict[int, str] = {}

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    # ---- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the recorded state; complete transactions caught in a prepare state; start the sweep."""
        self._loop = loop = asyncio.get_running_loop()

        def changed(_live: set[int]) -> None:  # from the view's thread
            loop.call_soon_threadsafe(self.moved)

        self.view.on_change(changed)

        def apply(group: str, rows: TxnOffsetRows) -> None:  # a markers thread's: the write runs on the loop
            asyncio.run_coroutine_threadsafe(self._apply_offsets(group, rows), loop).result(APPLY_WAIT_S)

        self.markers.attach(apply)
        await self.start_once()
        self._sweeper = asyncio.create_task(self._sweep_loop())

    async def start_once(self) -> None:
        """`start` without the periodic sweep (one pass of it runs)."""
        await self._load()
        await self._complete_prepared()
        await self.sweep()

    def _owns(self, tid: str) -> bool:
        return self.view.coordinator_of(tid) == self.view.node_id

    async def _load(self) -> None:
        """Take over the ids this broker coordinates now, in their recorded states."""
        live = frozenset(self.view.live_ids())
        self._loading = True
        try:
            states = await asyncio.get_running_loop().run_in_executor(None, self.store.load, self._owns)
        finally:
            self._loading = False
        self.txns = {}
        self.by_pid = {}
        for tid, body in states.items():
            txn = Txn.from_body(body)
            self.txns[tid] = txn
            self.by_pid[txn.pid] = txn
        self.loaded_for = live

    async def _complete_prepared(self) -> None:
        for txn in list(self.txns.values()):
            if txn.state in PREPARE_STATES:
                try:
                    async with txn.lock:
                        if self.txns.get(txn.tid) is txn and txn.state in PREPARE_STATES:
                            await self._finish(txn, txn.state is TxnState.PREPARE_COMMIT)
                    log.info("transaction of %r completed after restart (%s)", txn.tid, txn.state)
                except LoglakeError as exc:
                    log.error("transaction of %r could not be completed after restart: %s", txn.tid, exc)

    def moved(self) -> None:
        """The live set changed, or a write was fenced (called on the loop): reload once nothing
        else reloads."""
        if self.closed:
            return
        self._due = True
        if self._reloader is None or self._reloader.done():
            self._reloader = asyncio.ensure_future(self._reload())

    async def _reload(self) -> None:
        failing = False
        while self._due and not self.closed:
            self._due = False
            try:
                await self._load()
            except Exception as exc:  # the store is away: try again shortly (one warning per outage)
                (log.debug if failing else log.warning)(
                    "reloading the transaction coordinator failed: %s; retrying every %.0f s", exc, RELOAD_RETRY_S
                )
                failing, self._due = True, True
                await asyncio.sleep(RELOAD_RETRY_S)
                continue
            failing = False
            log.info("live brokers changed; this broker now coordinates %d transactional id(s)", len(self.txns))
            # apart, so a completion waiting for markers never holds up the next reload
            task = asyncio.ensure_future(self._complete_prepared())
            self._completions.add(task)
            task.add_done_callback(self._completions.discard)

    def gate(self, tid: str) -> int:
        """NONE when this broker coordinates `tid` now (its state loaded); NOT_COORDINATOR when
        another live broker does; COORDINATOR_LOAD_IN_PROGRESS while the ids are reloaded after
        the live set moved."""
        if not self._owns(tid):
            return E.NOT_COORDINATOR
        if self._loading or self.loaded_for != frozenset(self.view.live_ids()):
            if not self._loading:
                self.moved()
            return E.COORDINATOR_LOAD_IN_PROGRESS
        return E.NONE

    def close(self) -> None:
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._reloader is not None:
            self._reloader.cancel()
        for task in list(self._completions):
            task.cancel()
        self.markers.close()

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
            if txn.lock.locked() or self._loading:
                continue
            if self._timed_out(txn, now):
                async with txn.lock:
                    if not self._timed_out(txn, now) or self.txns.get(txn.tid) is not txn:
                        continue  # it moved (or was reloaded) while this waited for the lock
                    log.info("transaction of %r timed out after %d ms: aborting", txn.tid, txn.timeout_ms)
                    await self._bump(txn)
                    await self._end(txn, commit=False)
            elif txn.state in IDLE_STATES and now - txn.last_ms > self.settings.id_expiration_ms:
                async with txn.lock:
                    if self.txns.get(txn.tid) is txn:
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
        """Record `txn`'s state (MetaFencedError, and a reload, when this coordinator no longer
        owns it: the memory of a replaced or deposed coordinator never reaches the store)."""
        if self._loading or self.txns.get(txn.tid) is not txn:
            raise MetaFencedError(f"transactional id {txn.tid!r} is being reloaded")
        txn.last_ms = self.now_ms()
        try:
            await asyncio.wrap_future(self.store.record(txn.body(markers)))
        except MetaFencedError:
            self.moved()
            raise

    # ---- InitProducerId ----------------------------------------------------------------------------

    async def init_producer_id(self, tid: str, timeout_ms: int, pid: int, epoch: int, version: int) -> tuple[int, int, int]:
        """(error, producer id, epoch)."""
        if (gated := self.gate(tid)) != E.NONE:
            return gated, -1, -1
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
        if (gated := self.gate(tid)) != E.NONE:
            return dict.fromkeys(parts, gated)
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
            if any(self._led_elsewhere(k) for k in parts if k not in txn.parts or txn.state is not TxnState.ONGOING):
                # Another broker leads it: its end as this broker knows it includes the markers
                # of this producer's earlier transactions only once the metadata caught up (a
                # first offset at or below such a marker would hide a committed transaction).
                await self._off_loop(self._synced)
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
        if (gated := self.gate(tid)) != E.NONE:
            return gated
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
        self, tid: str, pid: int, epoch: int, group: str, offsets: TxnOffsetRows
    ) -> dict[PartKey, int]:
        keys = [(t, p) for t, p, *_ in offsets]
        staged = await self.markers.stage_offsets(tid, pid, epoch, group, offsets)
        if staged is not None:  # the group's coordinator keeps them (cluster mode)
            return staged
        if (gated := self.gate(tid)) != E.NONE:
            return dict.fromkeys(keys, gated)
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
        if (gated := self.gate(tid)) != E.NONE:
            return gated
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
        txn.attempt = uuid.uuid4().hex
        await self._record(txn)
        await self._finish(txn, commit)

    async def _finish(self, txn: Txn, commit: bool) -> None:
        """Markers into every partition, offsets on commit, then the complete record."""
        markers = await self.markers.write(txn, commit)
        groups = self._group_coordinator() if self._group_coordinator is not None else None
        if commit and txn.offsets and groups is not None:
            for group, rows in txn.offsets.items():
                items = [(t, p, int(o), int(e), m) for (t, p), (o, e, m) in rows.items()]
                await groups.commit_txn_offsets(group, items, topic_exists=self._partition_exists)
        txn.transition_to(complete_state(commit))
        await self._record(txn, markers if not commit else None)
        for tid_hex, index, _offset in markers:  # the LSO moved: read_committed fetches look again
            self.engine.wake_readers(bytes.fromhex(tid_hex), index)
        self.markers.forget(txn)
        txn.attempt = ""
        txn.parts.clear()
        txn.groups.clear()
        txn.offsets.clear()

    def _led_elsewhere(self, key: PartKey) -> bool:
        try:
            topic_id = self.engine.topic_id_of(key[0])
        except UnknownTopicError:
            return False
        return self.view.leader_of(topic_id, key[1]) != self.view.node_id

    def _partition_exists(self, name: str, index: int) -> bool:
        try:
            return bool(0 <= index < self.engine.topic(name).partitions)
        except UnknownTopicError:
            return False

    # ---- Produce (KIP-890 part 1: a transactional batch needs its partition in the transaction) ------

    def check_produce(self, pid: int, epoch: int, topic: str, partition: int) -> int:
        """By this coordinator's memory; a producer id it does not coordinate by the recorded
        states (`check_produce_recorded`)."""
        txn = self.by_pid.get(pid)
        if txn is None:
            if self._alone():  # every id is coordinated here: nothing recorded elsewhere to ask
                return E.INVALID_TXN_STATE
            return self._check_recorded(pid, epoch, topic, partition)
        if epoch != txn.epoch:
            return E.INVALID_PRODUCER_EPOCH
        if txn.state is not TxnState.ONGOING or (topic, partition) not in txn.parts:
            return E.INVALID_TXN_STATE
        return E.NONE

    async def check_produce_synced(self, pid: int, epoch: int, topic: str, partition: int) -> int:
        """`check_produce`; a refusal for a producer another broker coordinates is asked again
        once this broker's metadata has every record committed so far (its coordinator recorded
        the partition before it answered AddPartitionsToTxn; the watch may not have brought it)."""
        code = self.check_produce(pid, epoch, topic, partition)
        if code == E.NONE or pid in self.by_pid or self._alone():
            return code
        await self._off_loop(self._synced)
        self._pid_index.clear()
        return self.check_produce(pid, epoch, topic, partition)

    def _alone(self) -> bool:
        return self.view.live_ids() <= {self.view.node_id}

    def _synced(self) -> int:
        self.engine.meta.sync()
        return 0

    def _check_recorded(self, pid: int, epoch: int, topic: str, partition: int) -> int:
        def body_of(index: dict[int, str]) -> JsonDoc | None:
            tid = index.get(pid)
            return None if tid is None else self.engine.meta.read(lambda s: s.txns.get(tid))

        body = body_of(self._pid_index)
        if body is None or int(body["pid"]) != pid:
            self._pid_index = self.engine.meta.read(lambda s: {int(b["pid"]): t for t, b in s.txns.items()})
            body = body_of(self._pid_index)
        if body is None or int(body["pid"]) != pid:
            return E.INVALID_TXN_STATE
        if epoch != int(body["epoch"]):
            return E.INVALID_PRODUCER_EPOCH
        names = body.get("names") or []
        parts = body.get("parts") or []
        listed = any(int(p) == partition and i < len(names) and names[i] == topic for i, (_t, p, _f) in enumerate(parts))
        if parse_txn_state(body["state"]) is not TxnState.ONGOING or not listed:
            return E.INVALID_TXN_STATE
        return E.NONE

    async def _apply_offsets(self, group: str, items: TxnOffsetRows) -> None:
        groups = self._group_coordinator() if self._group_coordinator is not None else None
        if groups is None:
            raise LoglakeError(f"no group coordinator to commit the transaction's offsets of {group!r} with")
        await groups.commit_txn_offsets(group, items, topic_exists=self._partition_exists)

    async def pending_offsets(self, group: str) -> set[PartKey]:
        """Partitions with offsets of `group` in a transaction not yet complete (KIP-447: an
        OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for them); LoglakeError
        when the markers cannot tell now (cluster mode: etcd away)."""
        out: set[PartKey] = await self.markers.pending_offsets(group)
        for txn in self.txns.values():
            if txn.state in OPEN_STATES and group in txn.offsets:
                out.update(txn.offsets[group])
        return out

    # ---- admin --------------------------------------------------------------------------------------

    def describe(self, tid: str) -> Txn | None:
        return self.txns.get(tid)

    def list(self) -> list[Txn]:
        return list(self.txns.values())
