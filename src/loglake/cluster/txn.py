"""Cluster mode's transactions: coordinators fenced in etcd, markers appended by partition leaders.

The transaction coordinator (loglake.broker.txn.coordinator) is the single node's; cluster mode
gives it two collaborators (docs/TRANSACTIONS.md, docs/CLUSTER.md):

* `FencedTxnStore` — where its ``txn`` records go. A transactional id is coordinated by the live
  broker `coordinator_of` picks (as groups are). A coordinator *claims* the ids it owns — puts a
  token fresh at every load in `txn/coordinator/<id>` under the cluster prefix — and only then
  catches up with the metadata log and loads their states, so it sees every record a previous
  coordinator committed. Every record it writes is an `append_if` guarded by the claim still
  holding its token: once another coordinator claimed the id, nothing the deposed one writes
  commits (MetaFencedError; the coordinator reloads, the client retries). An id it did not load
  (a new one) is claimed at its first write, guarded on the claim key being as it was at load.

* `EtcdTxnMarkers` — how a transaction's markers reach partitions another broker leads, through
  etcd rather than broker-to-broker WriteTxnMarkers: the coordinator's prepare record (durable
  before any marker) names the transaction's partitions and its `attempt`; every broker's
  `LeaderMarkers` thread sees prepare records (the metadata watch, and a scan every
  MARKER_SCAN_S), appends the marker to each partition of it that it leads, and once that marker
  is committed puts `txn/markers/<attempt>/<topic id>.<partition>` = its offset. The coordinator
  waits for every partition's key, then writes the complete record (which moves the partitions'
  open and aborted transactions on every broker) and deletes the keys. A leader that dies before
  its key is put is replaced by one that finds the prepare record at its next scan and appends
  the marker again (two markers of one transaction are harmless, as after a single node's crash);
  a coordinator that dies is replaced by one that loads the prepare record and waits again.

* `GroupTxnOffsets` — offsets in transactions (TxnOffsetCommit), which the client sends to the
  group's coordinator, not the transaction's. The group's coordinator checks the transaction's
  recorded state (ongoing, this producer id and epoch, the group added by AddOffsetsToTxn) and
  stages the offsets in etcd under `txn/offsets/<tid hex>/<group hex>`; when the transaction's
  prepare record names the group, the broker that coordinates the group commits the staged
  offsets through its group coordinator (prepare_commit) or drops them (prepare_abort), then
  reports `txn/markers/<attempt>/group.<group hex>`, which the transaction's coordinator waits
  for beside the partitions' markers — Kafka's markers on `__consumer_offsets`, through etcd.

A partition's open and aborted transactions are the metadata's (`txn` records applied on every
broker, loglake.meta.txn), so the last stable offset and read_committed fetches are the same on
every broker, read replicas included, and survive any leader change.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from loglake.broker.txn.coordinator import (
    TXN_OFFSETS_PER_GROUP_MAX,
    ApplyOffsets,
    Marker,
    PartKey,
    Txn,
    TxnMarkers,
    TxnOffsetRows,
    TxnStore,
)
from loglake.cluster import etcd_client as ec
from loglake.cluster.etcd import EtcdMetaStore, Guard
from loglake.cluster.shared_log import SharedPartitionLog
from loglake.engine import Engine
from loglake.engine.types import AppendResult
from loglake.engine.view import ClusterView
from loglake.errors import LoglakeError, MetaFencedError
from loglake.kafka_errors import ErrorCode as E
from loglake.logsafe import RateLimitedLog
from loglake.meta.records import JsonDoc, RecordKind, TxnRecord
from loglake.meta.state import MetaState
from loglake.meta.txn_states import OPEN_STATES, PREPARE_STATES, TxnState, parse_txn_state

log = logging.getLogger(__name__)
_limited = RateLimitedLog(log)

__all__ = [
    "CLAIM_KEY_PREFIX",
    "MARKERS_PREFIX",
    "MARKERS_WAIT_S",
    "OFFSETS_PREFIX",
    "EtcdTxnMarkers",
    "FencedTxnStore",
    "GroupTxnOffsets",
    "LeaderMarkers",
    "txn_backend",
]

#: Claim keys of transactional ids (relative to the cluster prefix); one per id ever coordinated.
CLAIM_KEY_PREFIX = "txn/coordinator/"
#: Where leaders report the markers they appended: <attempt>/<topic id hex>.<partition> = offset
#: (and groups' coordinators the offsets they committed: <attempt>/group.<group hex> = 0).
MARKERS_PREFIX = "txn/markers/"
#: Offsets of transactions staged by their groups' coordinators: <tid hex>/<group hex> = JSON.
OFFSETS_PREFIX = "txn/offsets/"
#: Claims put by one etcd transaction at load (etcd's --max-txn-ops default is 128).
CLAIMS_PER_TXN_MAX = 100
#: How long a txn write waits for its claim and commit before failing (the client retries).
WRITE_WAIT_S = 30.0
#: How long a coordinator waits for every partition's marker before EndTxn fails (retriable:
#: the transaction stays in its prepare state and a retry, or the next coordinator, waits again).
MARKERS_WAIT_S = 30.0
#: Seconds between the coordinator's looks at the marker keys.
MARKER_POLL_S = 0.02
#: Seconds between a leader's scans for prepared transactions (a watch wakes it sooner).
MARKER_SCAN_S = 0.25
#: Seconds between sweeps of marker reports no transaction waits for (a coordinator that died
#: between its complete record and deleting the reports left them).
MARKER_GC_S = 60.0


class FencedTxnStore:
    """The `TxnStore` of a cluster broker's coordinator (see the module doc).

    `load` does the etcd I/O and runs off the event loop; `record` never blocks: a write of an
    id already claimed is one guarded append, the first write of a new id runs its claim on the
    store's one writer thread."""

    def __init__(self, etcd: EtcdMetaStore, view: ClusterView) -> None:
        self.etcd = etcd
        self.node_id = view.node_id
        self.token = b""
        self.claimed: set[str] = set()
        self._seen: dict[str, int] = {}  # claim key mod revision at load, for ids not claimed then
        self._lock = threading.Lock()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="loglake-txn-claims")

    def _key(self, tid: str) -> bytes:
        return self.etcd.keys.key(CLAIM_KEY_PREFIX + tid)

    def load(self, owns: Callable[[str], bool]) -> dict[str, JsonDoc]:
        token = f"{self.node_id}:{uuid.uuid4().hex}".encode()
        with self._lock:  # writes from here on are this load's (the coordinator refuses them meanwhile)
            self.token, self.claimed, self._seen = token, set(), {}
        client = self.etcd.client
        base = self.etcd.keys.key(CLAIM_KEY_PREFIX)
        kvs, _ = client.range_all(base, ec.prefix_end(base))
        seen = {kv.key[len(base) :].decode(): kv.mod_revision for kv in kvs}
        self.etcd.sync()
        owned = sorted(t for t in self.etcd.read(lambda s: list(s.txns)) if owns(t))
        for i in range(0, len(owned), CLAIMS_PER_TXN_MAX):
            client.txn([], [ec.op_put(self._key(t), token) for t in owned[i : i + CLAIMS_PER_TXN_MAX]], [])
        # Every record a previous coordinator committed is before the claims: catch up, then load.
        self.etcd.sync()
        mine = set(owned)
        states: dict[str, JsonDoc] = self.etcd.read(lambda s: {t: dict(b) for t, b in s.txns.items() if t in mine})
        with self._lock:
            self.claimed = mine
            self._seen = {t: m for t, m in seen.items() if t not in mine}
        if owned:
            log.info("cluster: node %d claimed %d transactional id(s) as their coordinator", self.node_id, len(owned))
        return states

    def record(self, body: JsonDoc) -> Future[int]:
        tid = str(body["tid"])
        with self._lock:
            claimed, token = tid in self.claimed, self.token
        if claimed:
            return self._guarded(tid, body, token)
        return self._writer.submit(self._claim_then_record, tid, body, token)

    def _guarded(self, tid: str, body: JsonDoc, token: bytes) -> Future[int]:
        out: Future[int] = Future()
        try:
            inner = self.etcd.append_if(TxnRecord.from_body(body), [Guard(CLAIM_KEY_PREFIX + tid, value=token)])
        except Exception as exc:  # the store closed or failed: the coordinator answers retriably
            out.set_exception(exc)
            return out

        def done(f: Future[int]) -> None:
            exc = f.exception()
            if isinstance(exc, MetaFencedError):
                with self._lock:
                    self.claimed.discard(tid)
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(f.result())

        inner.add_done_callback(done)
        return out

    def _claim_then_record(self, tid: str, body: JsonDoc, token: bytes) -> int:
        """Claim an id this coordinator did not load (on the writer thread), then record it."""
        with self._lock:
            if token != self.token:
                raise MetaFencedError(f"transactional id {tid!r}: the coordinator reloaded")
            claimed, seen = tid in self.claimed, self._seen.get(tid, 0)
        if not claimed:
            key = self._key(tid)
            ok, _, _ = self.etcd.client.txn([ec.cmp_mod(key, seen)], [ec.op_put(key, token)], [])
            if ok:
                self.etcd.sync()  # records committed before the claim are applied here now
                # A state recorded meanwhile by another coordinator: this one must load it first.
                ok = self.etcd.read(lambda s: tid not in s.txns)
            if not ok:
                raise MetaFencedError(f"transactional id {tid!r} is coordinated by another broker now")
            with self._lock:
                if token == self.token:
                    self.claimed.add(tid)
        return self._guarded(tid, body, token).result(WRITE_WAIT_S)

    def close(self) -> None:
        self._writer.shutdown(wait=False)


class LeaderMarkers:
    """Appends the markers of prepared transactions to the partitions this broker leads (a
    thread; see the module doc)."""

    def __init__(self, engine: Engine, plog: SharedPartitionLog, etcd: EtcdMetaStore,
                 groups: GroupTxnOffsets | None = None) -> None:
        self.engine = engine
        self.plog = plog
        self.etcd = etcd
        #: the groups' side: their staged offsets committed or dropped as prepare records name them
        self.groups = groups
        self._wake = threading.Event()
        self._stop = threading.Event()
        #: <attempt>/<topic id>.<partition> whose marker is known to be written
        self._done: set[str] = set()
        #: ... whose marker is appended and not reported yet (its report runs on `_reports`)
        self._pending: set[str] = set()
        self._lock = threading.Lock()  # _done and _pending: this thread and the report threads
        # Reports (an etcd put each) run as markers commit, so a scan never waits for a flush.
        self._reports = ThreadPoolExecutor(2, thread_name_prefix="loglake-txn-marker-reports")
        self._thread = threading.Thread(target=self._run, name="loglake-txn-markers", daemon=True)
        etcd.watch(self._on_record)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._reports.shutdown(wait=False, cancel_futures=True)

    def wake(self) -> None:
        self._wake.set()

    def _on_record(self, seq: int, kind: RecordKind, body: dict[str, Any], raw: bytes) -> None:
        if kind == RecordKind.TXN:  # under the store's lock: only a wake-up
            self._wake.set()

    def _run(self) -> None:
        swept = time.monotonic()
        while not self._stop.is_set():
            self._wake.wait(MARKER_SCAN_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.run_once()
                if time.monotonic() - swept > MARKER_GC_S:
                    swept = time.monotonic()
                    self.sweep()
                    if self.groups is not None:
                        self.groups.sweep()
            except Exception as exc:  # etcd or the bucket away: the next scan tries again
                _limited.warning("markers", "cluster: writing transaction markers failed: %s", exc)

    def sweep(self) -> int:
        """Delete marker reports whose transaction is no longer prepared; how many attempts.

        Keys are listed first, then the metadata caught up: a report is put only after its
        prepare record was applied, so each listed key's prepare record is applied by then, and an
        attempt not in a prepare state any more is complete (nobody waits for its reports)."""
        client = self.etcd.client
        base = self.etcd.keys.key(MARKERS_PREFIX)
        kvs, _ = client.range_all(base, ec.prefix_end(base))
        listed = {kv.key[len(base) :].decode().split("/", 1)[0] for kv in kvs}
        if not listed:
            return 0
        self.etcd.sync()
        prepared = self.etcd.read(
            lambda s: {str(b.get("attempt")) for b in s.txns.values() if parse_txn_state(b["state"]) in PREPARE_STATES}
        )
        gone = sorted(listed - prepared)
        for attempt in gone:
            prefix = base + f"{attempt}/".encode()
            client.delete_range(prefix, ec.prefix_end(prefix))
        return len(gone)

    def run_once(self) -> int:
        """One scan: append and report the markers due on partitions this broker leads; how many."""

        def prepared(s: MetaState) -> list[dict[str, Any]]:
            return [dict(b) for b in s.txns.values() if b.get("attempt") and parse_txn_state(b["state"]) in PREPARE_STATES]

        due = self.etcd.read(prepared)
        if self.groups is not None and any(b.get("groups") for b in due):
            self.groups.run_once([b for b in due if b.get("groups")])
        attempts = {str(b["attempt"]) for b in due}
        with self._lock:
            self._done = {n for n in self._done if n.split("/", 1)[0] in attempts}
            busy = self._done | self._pending
        todo: list[tuple[str, str, int, int, int, bool]] = []
        for b in due:
            commit = parse_txn_state(b["state"]) is TxnState.PREPARE_COMMIT
            for tid_hex, p, _first in b.get("parts") or ():
                name = f"{b['attempt']}/{tid_hex}.{int(p)}"
                if name not in busy and self.plog.leads(str(tid_hex), int(p)):
                    todo.append((name, str(tid_hex), int(p), int(b["pid"]), int(b["epoch"]), commit))
        if not todo:
            return 0
        client = self.etcd.client
        base = self.etcd.keys.key(MARKERS_PREFIX)
        appended = 0
        for name, tid_hex, p, pid, epoch, commit in todo:
            kv, _ = client.get(base + name.encode())
            if kv is not None:  # written already (by this broker or an earlier leader)
                with self._lock:
                    self._done.add(name)
                continue
            try:
                fut = self.engine.write_txn_marker(bytes.fromhex(tid_hex), p, pid, epoch, commit)
            except LoglakeError as exc:  # not the leader any more, or it stopped: the next scan sees
                _limited.warning(("marker", tid_hex, p), "cluster: marker for %s-%d not appended: %s", tid_hex, p, exc)
                continue
            appended += 1
            with self._lock:
                self._pending.add(name)
            if fut is None:  # the topic is gone: nothing to wait for
                self._reports.submit(self._report, name, None)
            else:
                fut.add_done_callback(functools.partial(self._submit_report, name))
        return appended

    def _submit_report(self, name: str, fut: Future[AppendResult]) -> None:
        try:  # on the flusher's thread: hand the etcd put to a report thread
            self._reports.submit(self._report, name, fut)
        except RuntimeError:  # stopping
            pass

    def _report(self, name: str, fut: Future[AppendResult] | None) -> None:
        """Put the marker's offset once it is committed (-1: its topic is gone)."""
        try:
            offset = fut.result().base_offset if fut is not None else -1
            self.etcd.client.put(self.etcd.keys.key(MARKERS_PREFIX) + name.encode(), str(offset).encode())
        except Exception as exc:  # the next scan appends it again (two markers are harmless)
            _limited.warning(("marker", name), "cluster: marker %s not reported: %s", name, exc)
            with self._lock:
                self._pending.discard(name)
            self._wake.set()
            return
        with self._lock:
            self._pending.discard(name)
            self._done.add(name)


def group_report(attempt: str, group: str) -> str:
    """The marker report name of a group's offsets in the transaction ending as `attempt`."""
    return f"{attempt}/group.{group.encode().hex()}"


class GroupTxnOffsets:
    """The group side of offsets in transactions on a cluster broker (see the module doc):
    stages TxnOffsetCommit's offsets in etcd, and commits or drops them when the transaction's
    prepare record names a group this broker coordinates."""

    def __init__(self, engine: Engine, etcd: EtcdMetaStore) -> None:
        self.engine = engine
        self.etcd = etcd
        self.view = engine.view
        self.apply: ApplyOffsets | None = None

    def key(self, tid: str, group: str) -> bytes:
        return self.etcd.keys.key(f"{OFFSETS_PREFIX}{tid.encode().hex()}/{group.encode().hex()}")

    def _staged_docs(self, group: str | None) -> list[tuple[str, str, ec.KeyValue, JsonDoc]]:
        """(tid, group, key, staged doc) of every staged key (of `group` only, unless None)."""
        client = self.etcd.client
        base = self.etcd.keys.key(OFFSETS_PREFIX)
        listed, _ = client.range_all(base, ec.prefix_end(base), keys_only=True)
        out: list[tuple[str, str, ec.KeyValue, JsonDoc]] = []
        for listed_kv in listed:
            tid_hex, _, group_hex = listed_kv.key[len(base) :].decode().partition("/")
            name = bytes.fromhex(group_hex).decode()
            if group is not None and name != group:
                continue
            kv, _ = client.get(listed_kv.key)
            if kv is not None:  # gone since: its offsets were applied or dropped
                out.append((bytes.fromhex(tid_hex).decode(), name, kv, json.loads(kv.value)))
        return out

    def _open_docs(self, staged: list[tuple[str, str, ec.KeyValue, JsonDoc]]) -> list[bool]:
        """Whether each staged doc belongs to a transaction still open (the metadata caught up
        first). A staged key is deleted only after its offsets were applied or dropped, which is
        before the transaction's complete record: a listed key whose transaction is not open —
        complete, or another producer id or epoch's, or no longer naming the group — is a
        leftover (stage raced an abort), never offsets still to come."""
        self.etcd.sync()
        tids = {tid for tid, *_ in staged}
        txns: dict[str, JsonDoc] = self.etcd.read(lambda s: {t: dict(s.txns.get(t) or {}) for t in tids})
        out = []
        for tid, group, _kv, doc in staged:
            b = txns[tid]
            out.append(
                bool(b) and doc.get("pid") == int(b["pid"]) and doc.get("epoch") == int(b["epoch"])
                and parse_txn_state(b["state"]) in OPEN_STATES and group in (b.get("groups") or ())
            )  # fmt: skip
        return out

    def stage(self, tid: str, pid: int, epoch: int, group: str, offsets: TxnOffsetRows) -> dict[PartKey, int]:
        """Blocking (etcd): check the transaction's recorded state, then merge `offsets` into what
        is staged for (tid, group); their codes."""
        keys = [(t, p) for t, p, *_ in offsets]
        self.etcd.sync()  # AddOffsetsToTxn's record, written by the transaction's coordinator
        b: JsonDoc = self.etcd.read(lambda s: dict(s.txns.get(tid) or {}))
        if not b or int(b["pid"]) != pid:
            return dict.fromkeys(keys, E.INVALID_PRODUCER_ID_MAPPING)
        if int(b["epoch"]) != epoch:
            return dict.fromkeys(keys, E.INVALID_PRODUCER_EPOCH)
        if parse_txn_state(b["state"]) is not TxnState.ONGOING or group not in (b.get("groups") or []):
            return dict.fromkeys(keys, E.INVALID_TXN_STATE)  # AddOffsetsToTxn comes first
        key = self.key(tid, group)
        kv, _ = self.etcd.client.get(key)
        doc = json.loads(kv.value) if kv is not None else {}
        rows: dict[PartKey, list[object]] = {}
        if doc.get("pid") == pid and doc.get("epoch") == epoch:  # an earlier transaction's are stale
            rows = {(str(t), int(p)): list(r) for t, p, *r in doc.get("rows") or ()}
        out: dict[PartKey, int] = {}
        for t, p, offset, leader_epoch, metadata in offsets:
            if not self.engine.has_topic(t):
                out[(t, p)] = E.UNKNOWN_TOPIC_OR_PARTITION
            elif len(rows) >= TXN_OFFSETS_PER_GROUP_MAX and (t, p) not in rows:
                out[(t, p)] = E.INVALID_REQUEST
            else:
                rows[(t, p)] = [offset, leader_epoch, metadata or ""]
                out[(t, p)] = E.NONE
        body = {"pid": pid, "epoch": epoch, "rows": [[t, p, *r] for (t, p), r in rows.items()]}
        self.etcd.client.put(key, json.dumps(body).encode())
        return out

    def pending(self, group: str) -> set[PartKey]:
        """Blocking (etcd): the partitions of `group` with offsets staged by a transaction still
        open (KIP-447's pending), whichever broker coordinated the group when they were staged:
        they are read from etcd, where they are kept, so a broker that took the group over
        answers for what its predecessor staged."""
        staged = self._staged_docs(group)
        return {
            (str(t), int(p))
            for (_tid, _g, _kv, doc), is_open in zip(staged, self._open_docs(staged), strict=True) if is_open
            for t, p, *_ in doc.get("rows") or ()
        }

    def sweep(self) -> int:
        """Delete staged offsets no open transaction will apply (`_open_docs`: a stage that
        raced the transaction's abort left them); how many. Each delete holds only while the key
        is as it was read, so offsets a new transaction staged meanwhile stay."""
        staged = self._staged_docs(None)
        if not staged:
            return 0
        gone = 0
        for (_tid, _group, kv, _doc), is_open in zip(staged, self._open_docs(staged), strict=True):
            if not is_open:
                ok, _, _ = self.etcd.client.txn([ec.cmp_mod(kv.key, kv.mod_revision)], [ec.op_delete(kv.key)])
                gone += ok
        return gone

    def run_once(self, due: list[dict[str, Any]]) -> int:
        """Commit or drop the staged offsets of prepared transactions' groups this broker
        coordinates, and report each; how many groups were done."""
        done = 0
        client = self.etcd.client
        base = self.etcd.keys.key(MARKERS_PREFIX)
        for b in due:
            commit = parse_txn_state(b["state"]) is TxnState.PREPARE_COMMIT
            tid, pid, epoch = str(b["tid"]), int(b["pid"]), int(b["epoch"])
            for group in b.get("groups") or ():
                if self.view.coordinator_of(group) != self.view.node_id:
                    continue
                report = base + group_report(str(b["attempt"]), group).encode()
                kv, _ = client.get(report)
                if kv is not None:
                    continue  # done already (by this broker or the group's previous coordinator)
                key = self.key(tid, group)
                staged, _ = client.get(key)
                doc = json.loads(staged.value) if staged is not None else {}
                rows: TxnOffsetRows = [
                    (str(t), int(p), int(o), int(e), str(m)) for t, p, o, e, m in doc.get("rows") or ()
                ] if doc.get("pid") == pid and doc.get("epoch") == epoch else []  # fmt: skip
                if commit and rows:
                    if self.apply is None:
                        raise LoglakeError("the group coordinator is not attached yet")
                    self.apply(group, rows)
                client.put(report, b"0")
                client.delete_range(key)
                done += 1
        return done


class EtcdTxnMarkers:
    """The `TxnMarkers` of a cluster coordinator: waits for the leaders' reports (module doc)."""

    def __init__(self, engine: Engine, etcd: EtcdMetaStore, leaders: LeaderMarkers, store: FencedTxnStore,
                 groups: GroupTxnOffsets) -> None:
        self.engine = engine
        self.etcd = etcd
        self.leaders = leaders
        self.store = store
        self.groups = groups
        self._cleaner = ThreadPoolExecutor(1, thread_name_prefix="loglake-txn-markers-gc")

    async def stage_offsets(self, tid: str, pid: int, epoch: int, group: str,
                            offsets: TxnOffsetRows) -> dict[PartKey, int] | None:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.groups.stage, tid, pid, epoch, group, offsets)

    def attach(self, apply: ApplyOffsets) -> None:
        self.groups.apply = apply

    async def pending_offsets(self, group: str) -> set[PartKey]:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(None, self.groups.pending, group)
        except LoglakeError:
            raise
        except Exception as exc:  # etcd's client errors: the caller cannot tell what is pending
            raise LoglakeError(f"staged offsets of group {group!r} not read: {exc}") from exc

    def _prefix(self, txn: Txn) -> bytes:
        return self.etcd.keys.key(f"{MARKERS_PREFIX}{txn.attempt}/")

    async def write(self, txn: Txn, commit: bool) -> list[Marker]:
        if not txn.attempt:
            raise LoglakeError(f"transaction of {txn.tid!r} has no attempt to wait for")
        self.leaders.wake()  # this broker may lead some of them
        loop = asyncio.get_running_loop()
        prefix = self._prefix(txn)
        want = {f"{tid_hex}.{index}": (tid_hex, index) for (_n, index), (tid_hex, _f) in txn.parts.items()}
        groups = {group_report(txn.attempt, g)[len(txn.attempt) + 1 :] for g in txn.groups}
        deadline = time.monotonic() + MARKERS_WAIT_S
        while True:
            kvs, _ = await loop.run_in_executor(None, self.etcd.client.range_all, prefix, ec.prefix_end(prefix))
            got = {kv.key[len(prefix) :].decode(): int(kv.value) for kv in kvs}
            missing = [
                n for n, (tid_hex, index) in want.items()
                if n not in got and self.engine.log_end(bytes.fromhex(tid_hex), index) is not None
            ] + sorted(groups - set(got))  # fmt: skip
            if not missing:
                return [(tid_hex, index, got[n]) for n, (tid_hex, index) in want.items() if got.get(n, -1) >= 0]
            if time.monotonic() > deadline:
                raise LoglakeError(
                    f"transaction of {txn.tid!r}: no marker on {len(missing)} partition(s) or group(s) after "
                    f"{MARKERS_WAIT_S:.0f} s (e.g. {missing[0]}: no live leader or coordinator?)"
                )
            await asyncio.sleep(MARKER_POLL_S)

    def forget(self, txn: Txn) -> None:
        prefix = self._prefix(txn)

        def delete() -> None:
            try:
                self.etcd.client.delete_range(prefix, ec.prefix_end(prefix))
            except Exception as exc:  # a leftover key names an attempt nobody waits for: harmless
                _limited.warning("markers_gc", "cluster: deleting marker reports failed: %s", exc)

        self._cleaner.submit(delete)

    def close(self) -> None:
        self.leaders.stop()
        self.store.close()
        self._cleaner.shutdown(wait=False)


def txn_backend(etcd: EtcdMetaStore, view: ClusterView, plog: SharedPartitionLog) -> Callable[[Engine], tuple[TxnStore, TxnMarkers]]:
    """The transaction coordinator's collaborators of a cluster broker (loglake.broker.context)."""

    def make(engine: Engine) -> tuple[TxnStore, TxnMarkers]:
        store = FencedTxnStore(etcd, view)
        groups = GroupTxnOffsets(engine, etcd)
        leaders = LeaderMarkers(engine, plog, etcd, groups)
        leaders.start()
        return store, EtcdTxnMarkers(engine, etcd, leaders, store, groups)

    return make
