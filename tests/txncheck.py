"""A history checker for transactional producers under the cluster fault schedule: what the
clients did and saw, held to Kafka's transactional model at the end (tests/logcheck.py's sibling,
with its `Report` and `Anomaly`).

A test records into a `TxnHistory` (thread-safe):

- every transaction a transactional producer began (`begin`), the records it produced in it, in
  produce order, with the partition each went to (`produced`) and the offset a delivery report
  gave (`delivered`), and its outcome as the client saw it: **committed** (commit_transaction
  returned), **aborted** (abort_transaction returned, or the client never asked to commit it:
  only EndTxn(commit) commits, so a transaction a fatal error ended before its commit cannot
  be), or **unknown** (a commit was asked for and no answer settled it: a fatal error or a
  timeout during commit_transaction);
- every record read under read_committed, by the consumer that reads during the schedule
  (`read_committed(live=True)`) and by the final read after the faults healed (`final_committed`),
  and the final read_uncommitted pass (`final_uncommitted`).

`check()` returns every anomaly (never only the first):

- **txn_lost**: a record of a committed transaction is not in the final read_committed read;
- **txn_duplicate**: a record of a transaction is read twice (at two offsets) under read_committed;
- **moved**: a record of a committed transaction is read in another partition than it was
  produced to, or at another offset than its delivery report gave;
- **aborted_read**: a record of an aborted transaction is read under read_committed (live or
  final). A read_uncommitted reader may see such records; that is legal and only counted;
- **txn_partial**: a transaction whose outcome is unknown is neither all in the final
  read_committed read nor all absent from it;
- **dirty_read**: a record read under read_committed during the schedule is not in the final
  read_committed read at that offset (it was read before its transaction was decided, and the
  transaction did not commit);
- **txn_order**: in a partition, one producer's records are read out of order: records of one
  transaction not in produce order, or transactions not in the order the producer ran them;
- **conflict**: two reads (of either isolation) saw different records at one offset;
- **phantom**: a record in the log that no transaction produced.

Values must be built by `txn_value` (unique per producer, transaction and record).

`check_processed(source, sink, offsets)` holds a read-process-write workload to exactly-once: its
transactions (recorded in `sink` as above) turn each input record, read under read_committed from
`source`'s topic, into one output naming it (`parse_source`), and commit the input offsets with
them; `offsets` are the group's committed offsets at the end:

- **eo_duplicate**: an input record is named by two committed outputs (processed twice);
- **eo_lost**: an input record below the group's committed offset is named by no committed
  output (its offset was committed without its output);
- **eo_unatomic**: a committed output names an input at or past the committed offset (the output
  was committed without its offset);
- **eo_wrong_input**: a committed output names an input that is not the committed record at that
  offset (the processor read an aborted or a phantom record).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field

from logcheck import Anomaly, Report

COMMITTED = "committed"
ABORTED = "aborted"
UNKNOWN = "unknown"
#: A transaction the producer has not finished (none should be left when the check runs).
OPEN = "open"

#: (partition, offset) -> value
Log = dict[int, dict[int, bytes]]


def txn_value(producer: str, txn: int, i: int, size: int = 0) -> bytes:
    """The value of record `i` of transaction `txn` of `producer`, padded with '.' to `size`."""
    head = f"{producer}:{txn}:{i}:".encode()
    return head + b"." * max(0, size - len(head))


def parse_txn_value(value: bytes) -> tuple[str, int, int] | None:
    """(producer, txn, i) of a `txn_value`, or None for anything else."""
    parts = value.split(b":", 3)
    if len(parts) != 4:
        return None
    try:
        return parts[0].decode(), int(parts[1]), int(parts[2])
    except ValueError:
        return None


def processed_value(producer: str, txn: int, i: int, partition: int, offset: int, source: bytes) -> bytes:
    """Record `i` of read-process-write transaction `txn`: the output of the input `source` read
    at (partition, offset), a `txn_value` naming it (`parse_source`)."""
    return txn_value(producer, txn, i) + f"{partition}@{offset}|".encode() + source


def parse_source(value: bytes) -> tuple[int, int, bytes] | None:
    """(partition, offset, value) of the input an output of a read-process-write transaction
    names (clusterload.processed_value), or None."""
    parts = value.split(b":", 3)
    if len(parts) != 4 or b"|" not in parts[3]:
        return None
    where, source = parts[3].split(b"|", 1)
    p, _, off = where.partition(b"@")
    try:
        return int(p), int(off), source
    except ValueError:
        return None


@dataclass
class TxnOp:
    """One transaction of one transactional producer."""

    producer: str
    txn: int
    outcome: str = OPEN
    #: (partition, value) of each record, in produce order.
    records: list[tuple[int, bytes]] = field(default_factory=list)
    #: value -> offset from its delivery report (a record may have none).
    offsets: dict[bytes, int] = field(default_factory=dict)
    commit_asked: bool = False
    note: str = ""

    def name(self) -> str:
        return f"{self.producer}:{self.txn}"


class TxnHistory:
    """What transactional producers and read_committed readers did and saw (one topic)."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self._lock = threading.Lock()
        self.txns: list[TxnOp] = []
        #: (partition, offset, value) of every read under read_committed during the schedule.
        self.live: list[tuple[int, int, bytes]] = []
        self.committed_final: Log = {}
        self.uncommitted_final: Log = {}
        #: Producers built again after a fatal error (fenced, ...), for the report.
        self.rebuilt = 0

    # ---- recording ----------------------------------------------------------------------------

    def begin(self, producer: str, txn: int) -> TxnOp:
        op = TxnOp(producer, txn)
        with self._lock:
            self.txns.append(op)
        return op

    def produced(self, op: TxnOp, partition: int, value: bytes) -> None:
        with self._lock:
            op.records.append((partition, value))

    def delivered(self, op: TxnOp, value: bytes, offset: int) -> None:
        with self._lock:
            op.offsets[value] = offset

    def commit_asked(self, op: TxnOp) -> None:
        with self._lock:
            op.commit_asked = True

    def end(self, op: TxnOp, outcome: str, note: str = "") -> None:
        assert outcome in (COMMITTED, ABORTED, UNKNOWN), outcome
        with self._lock:
            op.outcome, op.note = outcome, note

    def read_committed(self, partition: int, offset: int, value: bytes) -> None:
        """A record read under read_committed while the schedule runs."""
        with self._lock:
            self.live.append((partition, offset, value))

    def final_committed(self, partition: int, records: list[tuple[int, bytes]]) -> None:
        with self._lock:
            self.committed_final[partition] = dict(records)

    def final_uncommitted(self, partition: int, records: list[tuple[int, bytes]]) -> None:
        with self._lock:
            self.uncommitted_final[partition] = dict(records)

    def count(self, outcome: str) -> int:
        with self._lock:
            return sum(1 for op in self.txns if op.outcome == outcome)

    # ---- checking -----------------------------------------------------------------------------

    def check(self) -> Report:
        with self._lock:
            return _check(self)


def _bump(rep: Report, stat: str, n: int = 1) -> None:
    rep.stats[stat] = rep.stats.get(stat, 0) + n


def _check(h: TxnHistory) -> Report:
    rep = Report()
    t = h.topic
    owner: dict[bytes, TxnOp] = {}
    for op in h.txns:
        _bump(rep, f"txn_{op.outcome}")
        _bump(rep, "txn_records", len(op.records))
        for _p, v in op.records:
            if v in owner:
                raise ValueError(f"two records with one value {v!r}: values must be unique")
            owner[v] = op
    rep.stats["producers_rebuilt"] = h.rebuilt
    rep.stats["live_committed_reads"] = len(h.live)
    rep.stats["final_committed_records"] = sum(len(r) for r in h.committed_final.values())
    rep.stats["final_uncommitted_records"] = sum(len(r) for r in h.uncommitted_final.values())

    # Conflicts: the three reads must agree on the record at any offset they share.
    seen: dict[tuple[int, int], set[bytes]] = defaultdict(set)
    for p, off, v in h.live:
        seen[(p, off)].add(v)
    for final in (h.committed_final, h.uncommitted_final):
        for p, records in final.items():
            for off, v in records.items():
                seen[(p, off)].add(v)
    for (p, off), values in sorted(seen.items()):
        if len(values) > 1:
            rep.add(Anomaly("conflict", t, p, off, f"read as {sorted(x[:40] for x in values)}"))
        for v in values:
            if v not in owner:
                rep.add(Anomaly("phantom", t, p, off, f"{v[:40]!r} was never produced"))

    # Where each record is in the final read_committed read.
    where: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for p, records in h.committed_final.items():
        for off, v in sorted(records.items()):
            where[v].append((p, off))

    for op in h.txns:
        present = [v for _p, v in op.records if where.get(v)]
        for p, v in op.records:
            places = where.get(v, [])
            if len(places) > 1:
                rep.add(
                    Anomaly("txn_duplicate", t, p, places[0][1], f"{v[:40]!r} ({op.outcome}) at {places}")
                )
        if op.outcome == COMMITTED:
            for p, v in op.records:
                places = where.get(v, [])
                if p not in h.committed_final:
                    rep.add(Anomaly("txn_lost", t, p, None, f"partition never read at the end ({op.name()})"))
                elif not places:
                    rep.add(
                        Anomaly(
                            "txn_lost",
                            t,
                            p,
                            op.offsets.get(v),
                            f"committed {v[:40]!r} is not read ({op.note})",
                        )
                    )
                elif places[0][0] != p or (v in op.offsets and places[0][1] != op.offsets[v]):
                    acked = op.offsets.get(v)
                    rep.add(
                        Anomaly(
                            "moved",
                            t,
                            p,
                            acked,
                            f"committed {v[:40]!r} delivered at {acked}, read at {places}",
                        )
                    )
        elif op.outcome == ABORTED:
            _bump(rep, "aborted_records_delivered", len(op.offsets))
            for v in present:
                p, off = where[v][0]
                rep.add(Anomaly("aborted_read", t, p, off, f"{v[:40]!r} of aborted {op.name()} ({op.note})"))
        else:  # unknown, or left open: all or nothing
            if present and len(present) < len(op.records):
                missing = [(p, v[:40]) for p, v in op.records if not where.get(v)]
                detail = f"{op.name()} ({op.outcome}: {op.note}): {len(present)} of {len(op.records)} read, missing {missing}"
                p0, off0 = where[present[0]][0]
                rep.add(Anomaly("txn_partial", t, p0, off0, detail))
            _bump(rep, f"txn_{op.outcome}_{'committed' if present else 'absent'}")

    # Records read under read_committed during the schedule must be committed in the end.
    for p, off, v in h.live:
        op = owner.get(v)
        if op is None:
            continue  # a phantom, reported above
        if op.outcome == ABORTED:
            rep.add(
                Anomaly("aborted_read", t, p, off, f"{v[:40]!r} of aborted {op.name()} read live ({op.note})")
            )
        elif (p, off) not in where.get(v, []):
            rep.add(
                Anomaly(
                    "dirty_read",
                    t,
                    p,
                    off,
                    f"{v[:40]!r} of {op.name()} ({op.outcome}) read live, not in the end",
                )
            )

    # Per partition, each producer's records in (transaction, produce) order.
    for p, records in h.committed_final.items():
        last: dict[str, tuple[int, int, int]] = {}  # producer -> (txn, index, offset) of its last record
        for off, v in sorted(records.items()):
            op = owner.get(v)
            if op is None:
                continue
            index = next(i for i, (_q, w) in enumerate(op.records) if w == v)
            prev = last.get(op.producer)
            if prev is not None and (op.txn, index) <= prev[:2]:
                detail = f"{v[:40]!r} (txn {op.txn} record {index}) after txn {prev[0]} record {prev[1]} @{prev[2]}"
                rep.add(Anomaly("txn_order", t, p, off, detail))
            last[op.producer] = (op.txn, index, off)

    # Aborted records a read_uncommitted reader sees are legal: only counted.
    for records in h.uncommitted_final.values():
        for v in records.values():
            op = owner.get(v)
            if op is not None and op.outcome == ABORTED:
                _bump(rep, "aborted_records_read_uncommitted")
    return rep


def check_processed(source: TxnHistory, sink: TxnHistory, offsets: dict[int, int]) -> Report:
    """Exactly-once of a read-process-write workload (see the module doc); `offsets`: the group's
    committed offset of each source partition (-1 for none)."""
    rep = Report()
    t = source.topic
    named: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)  # input -> outputs
    for q, records in sink.committed_final.items():
        for out_off, v in records.items():
            ref = parse_source(v)
            if ref is None:
                continue  # not an output: sink's own check reports it as a phantom
            p, off, src = ref
            named[(p, off)].append((q, out_off))
            inputs = source.committed_final.get(p, {})
            if inputs.get(off) != src:
                detail = f"output {sink.topic}[{q}]@{out_off} names {src[:40]!r}, the committed record is {inputs.get(off, b'')[:40]!r}"
                rep.add(Anomaly("eo_wrong_input", t, p, off, detail))
            if off >= offsets.get(p, -1):
                detail = f"output {sink.topic}[{q}]@{out_off} committed, the group's offset is {offsets.get(p, -1)}"
                rep.add(Anomaly("eo_unatomic", t, p, off, detail))
    for (p, off), outs in sorted(named.items()):
        if len(outs) > 1:
            rep.add(
                Anomaly("eo_duplicate", t, p, off, f"processed into {len(outs)} committed outputs: {outs}")
            )
    for p, records in source.committed_final.items():
        below = [off for off in records if off < offsets.get(p, -1)]
        rep.stats["eo_inputs_committed"] = rep.stats.get("eo_inputs_committed", 0) + len(below)
        for off in sorted(below):
            if (p, off) not in named:
                rep.add(Anomaly("eo_lost", t, p, off, f"below the group's offset {offsets[p]}, never output"))
    rep.stats["eo_outputs"] = sum(len(outs) for outs in named.values())
    return rep
