"""Transaction states: the one table of their names and of which state may follow which.

Theory of operation (Kafka's TransactionState; docs/TRANSACTIONS.md):

* **empty** - InitProducerId gave the transactional id a producer id and epoch; no transaction.
* **ongoing** - the first AddPartitionsToTxn or AddOffsetsToTxn began a transaction; further
  ones add to it without a transition.
* **prepare_commit / prepare_abort** - EndTxn (or the coordinator: a timed-out transaction, a
  new producer instance fencing the old one) decided the outcome and recorded it; the markers
  and, on commit, the group offsets are being written. A crash here is finished at start-up.
* **complete_commit / complete_abort** - every marker is durable; the next transaction starts
  from here (ongoing), as does a new producer instance (empty).
* **dead** - idle longer than transactional.id.expiration.ms: the id is forgotten (its record
  removes it from the metadata).

Loading a recorded state (start-up, a checkpoint) is not a transition. The coordinator moves a
state only through `check_transition`, which raises `IllegalTxnTransition` (a coordinator bug)
for a move the table does not hold. Kafka's PrepareEpochFence has no counterpart: loglake bumps
the epoch and aborts under the transactional id's lock, in one step; and EndTxn(abort) of an
id with no ongoing transaction (KIP-890 part 2) is answered INVALID_TXN_STATE, not a transition.

The values are written into ``txn`` metadata records and checkpoints (loglake.meta.txn): they
are an on-disk format and never change. `tests/test_state_tables.py` fails if any other module
of `src/` spells one of them.
"""

from __future__ import annotations

import enum

__all__ = [
    "IDLE_STATES",
    "KAFKA_NAMES",
    "OPEN_STATES",
    "PREPARE_STATES",
    "VALID_PREVIOUS_STATES",
    "IllegalTxnTransition",
    "TxnState",
    "by_kafka_name",
    "check_transition",
    "complete_state",
    "parse_txn_state",
    "prepare_state",
]


class TxnState(enum.StrEnum):
    EMPTY = "empty"
    ONGOING = "ongoing"
    PREPARE_COMMIT = "prepare_commit"
    PREPARE_ABORT = "prepare_abort"
    COMPLETE_COMMIT = "complete_commit"
    COMPLETE_ABORT = "complete_abort"
    DEAD = "dead"


S = TxnState

#: States with no transaction in flight: a new one may begin, a new producer instance may take
#: over, and an id idle in one of them may expire.
IDLE_STATES = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
#: States whose markers are being written: requests on the id wait (CONCURRENT_TRANSACTIONS).
PREPARE_STATES = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})
#: States in which the transaction's partitions hold back the last stable offset.
OPEN_STATES = frozenset({S.ONGOING, *PREPARE_STATES})

#: target state -> the states it may be entered from (Kafka's validPreviousStates).
VALID_PREVIOUS_STATES: dict[TxnState, frozenset[TxnState]] = {
    S.EMPTY: IDLE_STATES,
    S.ONGOING: IDLE_STATES,
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: IDLE_STATES,
}

#: Kafka's names of the states (DescribeTransactions, ListTransactions' state filters).
KAFKA_NAMES: dict[TxnState, str] = {
    S.EMPTY: "Empty",
    S.ONGOING: "Ongoing",
    S.PREPARE_COMMIT: "PrepareCommit",
    S.PREPARE_ABORT: "PrepareAbort",
    S.COMPLETE_COMMIT: "CompleteCommit",
    S.COMPLETE_ABORT: "CompleteAbort",
    S.DEAD: "Dead",
}
_BY_KAFKA_NAME = {name: state for state, name in KAFKA_NAMES.items()}
_BY_VALUE = {state.value: state for state in TxnState}


class IllegalTxnTransition(RuntimeError):
    """A coordinator bug: a transition the table does not allow."""


def check_transition(tid: str, current: TxnState, target: TxnState) -> None:
    if current not in VALID_PREVIOUS_STATES[target]:
        raise IllegalTxnTransition(
            f"transactional id {tid!r}: {current.value} -> {target.value} is not a transaction state transition "
            f"({target.value} follows only {', '.join(sorted(VALID_PREVIOUS_STATES[target]))})"
        )


def prepare_state(commit: bool) -> TxnState:
    return S.PREPARE_COMMIT if commit else S.PREPARE_ABORT


def complete_state(commit: bool) -> TxnState:
    return S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT


def by_kafka_name(name: str) -> TxnState | None:
    """The state Kafka calls `name`; None for a name Kafka does not have."""
    return _BY_KAFKA_NAME.get(name)


def parse_txn_state(value: object) -> TxnState:
    """The state a ``txn`` record or checkpoint names. ValueError for one no release wrote: the
    metadata readers report it as a CorruptionError naming the file (or key) and position."""
    if isinstance(value, str) and value in _BY_VALUE:
        return _BY_VALUE[value]
    raise ValueError(f"unknown transaction state {value!r} (a txn record holds one of {', '.join(TxnState)})")
