"""Transaction state in the metadata: the coordinator's transactions and each partition's view.

One record kind, ``txn``, carries a transactional id's whole state (it replaces the previous one):

    {tid, pid, epoch, state, timeout_ms, start_ms, last_ms,
     parts: [[topic id hex, partition, first offset], ...],
     groups: [group id, ...], offsets: {group: [[topic, partition, offset, leader_epoch, metadata], ...]},
     markers: [[topic id hex, partition, marker offset], ...]}   (complete_abort only)

`state` is a `TxnState` value (loglake.meta.txn_states, with the transition table); ``dead``
removes the transactional id. Applying a record moves the partitions too, so a partition's
transaction state is always the one the metadata implies:

* ongoing / prepare_commit / prepare_abort: each partition of `parts` lists the producer id as
  having an open transaction from `first` (the partition's log end when the partition joined
  the transaction: a lower bound of the transaction's first offset, so the last stable offset
  computed from it is never too high);
* complete_commit / complete_abort: the producer id leaves every partition's open list; on
  abort each partition gains an aborted-transaction entry [pid, first, marker offset].

A partition's aborted entries are bounded (ABORTED_TXNS_MAX) and trimmed as its log start moves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from loglake.meta.txn_states import OPEN_STATES, TxnState, parse_txn_state

__all__ = [
    "ABORTED_TXNS_MAX",
    "OPEN_STATES",
    "STATES",
    "apply_txn",
    "load_partition_txns",
    "load_txns",
    "partition_txn_doc",
    "trim_aborted",
    "txns_doc",
]

#: Every state a record may name.
STATES = tuple(TxnState)
#: Most aborted-transaction entries one partition keeps; past this the oldest are dropped (a
#: read_committed reader of offsets that old would then see that transaction's records).
ABORTED_TXNS_MAX = 100_000


class TxnPartition(Protocol):
    """A partition's transaction fields (`loglake.meta.state.PartitionMeta`)."""

    txn_open: dict[int, int]
    aborted_txns: list[list[int]]


class TxnMetaState(Protocol):
    """What a ``txn`` record moves of the metadata state (`loglake.meta.state.MetaState`, which
    imports this module): the transactional ids and their partitions."""

    @property
    def partitions(self) -> Mapping[tuple[bytes, int], TxnPartition]: ...
    @property
    def txns(self) -> dict[str, dict[str, Any]]: ...


def apply_txn(state: TxnMetaState, b: dict[str, Any]) -> None:
    tid = str(b["tid"])
    st = parse_txn_state(b["state"])
    pid = int(b["pid"])
    for tid_hex, index, first in b.get("parts", ()):
        pm = state.partitions.get((bytes.fromhex(tid_hex), int(index)))
        if pm is None:
            continue  # the topic was deleted meanwhile
        if st in OPEN_STATES:
            known = pm.txn_open.get(pid)
            pm.txn_open[pid] = int(first) if known is None else min(known, int(first))
        else:
            pm.txn_open.pop(pid, None)
    if st is TxnState.COMPLETE_ABORT:
        for tid_hex, index, marker in b.get("markers", ()):
            pm = state.partitions.get((bytes.fromhex(tid_hex), int(index)))
            if pm is None:
                continue
            first = next((int(f) for t, i, f in b["parts"] if t == tid_hex and int(i) == int(index)), int(marker))
            pm.aborted_txns.append([pid, first, int(marker)])
            if len(pm.aborted_txns) > ABORTED_TXNS_MAX:
                del pm.aborted_txns[: len(pm.aborted_txns) - ABORTED_TXNS_MAX]
    if st is TxnState.DEAD:
        state.txns.pop(tid, None)
    else:
        state.txns[tid] = dict(b)


def trim_aborted(pm: TxnPartition, log_start: int) -> None:
    """Entries whose marker is below the log start describe nothing a reader can fetch."""
    if pm.aborted_txns and pm.aborted_txns[0][2] < log_start:
        pm.aborted_txns = [e for e in pm.aborted_txns if e[2] >= log_start]


def partition_txn_doc(pm: TxnPartition) -> dict[str, Any]:
    """Checkpoint fields of one partition (absent in checkpoints written before transactions)."""
    return {"txn_open": {str(k): v for k, v in dict(pm.txn_open).items()}, "aborted_txns": [list(e) for e in pm.aborted_txns]}


def load_partition_txns(pm: TxnPartition, raw: dict[str, Any]) -> None:
    pm.txn_open = {int(k): int(v) for k, v in (raw.get("txn_open") or {}).items()}
    pm.aborted_txns = [[int(p), int(f), int(last)] for p, f, last in raw.get("aborted_txns") or ()]


def txns_doc(state: TxnMetaState) -> dict[str, Any]:
    return {tid: dict(b) for tid, b in state.txns.items()}


def load_txns(state: TxnMetaState, doc: dict[str, Any]) -> None:
    for tid, b in (doc.get("txns") or {}).items():
        if not isinstance(b, dict):
            raise ValueError(f"transaction {tid!r} is not an object")
        parse_txn_state(b.get("state"))  # a checkpoint naming no known state is corrupt, as a record would be
        state.txns[str(tid)] = dict(b)
