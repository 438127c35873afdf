"""A history checker for the cluster fault tests: operations recorded against a real cluster,
checked against the model of a Kafka log (Jepsen's approach, without Jepsen).

A test records what clients did and saw into a `History` (thread-safe: producers' delivery
callbacks and consumers run in several threads):

- every produce attempt, with its (unique) value and its outcome: `acked` at (partition, offset),
  `failed` (the broker said no for certain, e.g. a non-retriable refusal), or `unknown` (a timeout,
  a connection lost, a retriable error the client gave up on: it may or may not be in the log);
- reads: (topic, partition, offset, value) seen by any reader, from full scans or consumers;
- consumer-group progress: which offsets each group's consumers were handed, and the offsets the
  group committed.

`check(history)` then holds it to the model and returns every anomaly it finds (never stops at
the first: a failing test prints them all, with the seed of the run):

- **lost**: an acked record is missing from the final read of its partition;
- **moved**: an acked record is present at another offset than the one acknowledged;
- **duplicate**: a record appears at two offsets. Forbidden for idempotent producers; without
  idempotence a retried record may legally land twice (Kafka's at-least-once), so
  `idempotent=False` counts those in the stats as `retry_duplicate` instead;
- **double_ack**: two different records acknowledged at one offset;

- **conflict**: two reads saw different records at one offset (an offset written twice);
- **phantom**: a record in the log that no producer ever attempted;
- **failed_present**: a record whose produce failed for certain is in the log;
- **gap**: the final read of a partition skips offsets (a log has none, except where records
  were compacted or aborted, which these tests do not do);
- **consumer_gap**: below a group's committed offset of a partition, an offset no consumer of the
  group was ever handed (consumers did not resume where they committed);
- **commit_regress**: a group's committed offset of a partition went backwards (Kafka lets a
  client do that on purpose; these tests never do, so here it means progress was lost).

An idempotent librdkafka producer may acknowledge a record with no offset: when a batch's
response was lost and a later batch of the same producer succeeds, the earlier batch must have
been persisted (the broker accepts sequences only in order), so librdkafka reports its records
as delivered with the offset unknown ("implicitly acked by subsequent batch success", its
IMPLICITACK debug context). Such a record is counted in the stats as `acked_no_offset` and held
to the rest of the model: present exactly once, in its acknowledged partition (else **lost** or
**duplicate**).

Values must be unique per produce attempt (`value_for` builds them); a record's key is not used
to identify it.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

#: At most this many anomalies of one kind are kept in the report (the count is always exact):
#: a broken run can lose a million records, and the report must stay readable.
EXAMPLES_PER_KIND = 20

ACKED = "acked"
FAILED = "failed"
UNKNOWN = "unknown"
PENDING = "pending"

TP = tuple[str, int]


def value_for(producer: str, seq: int, size: int = 0) -> bytes:
    """A record value unique to (producer, seq), padded with '.' to `size` bytes."""
    head = f"{producer}:{seq}:".encode()
    return head + b"." * max(0, size - len(head))


@dataclass
class ProduceOp:
    """One produce attempt."""

    topic: str
    value: bytes
    key: bytes | None = None
    outcome: str = PENDING
    partition: int | None = None  # the acknowledged partition
    offset: int | None = None  # the acknowledged offset
    error: str | None = None  # what the client said when it was not acked


@dataclass
class Anomaly:
    kind: str
    topic: str
    partition: int | None
    offset: int | None
    detail: str

    def __str__(self) -> str:
        where = self.topic if self.partition is None else f"{self.topic}[{self.partition}]"
        at = "" if self.offset is None else f"@{self.offset}"
        return f"{self.kind}: {where}{at} {self.detail}"


@dataclass
class Report:
    anomalies: dict[str, list[Anomaly]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    #: Outcome counts and other facts about the run (acked, failed, unknown, unknown_present...).
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.counts

    def add(self, a: Anomaly) -> None:
        self.counts[a.kind] = self.counts.get(a.kind, 0) + 1
        kept = self.anomalies.setdefault(a.kind, [])
        if len(kept) < EXAMPLES_PER_KIND:
            kept.append(a)

    def kinds(self) -> set[str]:
        return set(self.counts)

    def __str__(self) -> str:
        lines = [f"history: {self.stats}"]
        if self.ok:
            lines.append("no anomalies")
        for kind, n in sorted(self.counts.items()):
            lines.append(f"{n} x {kind}, e.g.:")
            lines += [f"  {a}" for a in self.anomalies[kind]]
        return "\n".join(lines)


class History:
    """What the clients did and saw. Every method is safe to call from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.produces: list[ProduceOp] = []
        #: (topic, partition) -> offset -> values seen there by any read (normally one).
        self.seen: dict[TP, dict[int, set[bytes]]] = defaultdict(dict)
        #: (topic, partition) -> offset -> value, from the final full read (set by `final_read`).
        self.final: dict[TP, dict[int, bytes]] = {}
        #: group -> (topic, partition) -> offsets its consumers were handed.
        self.consumed: dict[str, dict[TP, set[int]]] = defaultdict(lambda: defaultdict(set))
        #: group -> (topic, partition) -> committed offsets, in the order the commits were seen.
        self.commits: dict[str, dict[TP, list[int]]] = defaultdict(lambda: defaultdict(list))
        #: Who made each commit in `commits` and when (same order).
        self.commit_notes: dict[str, dict[TP, list[str]]] = defaultdict(lambda: defaultdict(list))

    # ---- recording ----------------------------------------------------------------------------

    def attempt(self, topic: str, value: bytes, key: bytes | None = None) -> ProduceOp:
        op = ProduceOp(topic, value, key)
        with self._lock:
            self.produces.append(op)
        return op

    def acked(self, op: ProduceOp, partition: int, offset: int | None) -> None:
        with self._lock:
            op.outcome, op.partition, op.offset = ACKED, partition, offset

    def failed(self, op: ProduceOp, error: str) -> None:
        with self._lock:
            op.outcome, op.error = FAILED, error

    def unknown(self, op: ProduceOp, error: str) -> None:
        with self._lock:
            op.outcome, op.error = UNKNOWN, error

    def read(self, topic: str, partition: int, offset: int, value: bytes) -> None:
        """Any read of a record (a scan or a consumer)."""
        with self._lock:
            self.seen[(topic, partition)].setdefault(offset, set()).add(value)

    def consume(self, group: str, topic: str, partition: int, offset: int, value: bytes) -> None:
        """A record a consumer of `group` was handed (also recorded as a read)."""
        self.read(topic, partition, offset, value)
        with self._lock:
            self.consumed[group][(topic, partition)].add(offset)

    def commit(self, group: str, topic: str, partition: int, offset: int, who: str = "") -> None:
        """A commit of `group` that the broker acknowledged: the next offset to consume. `who`
        (a consumer's name) and the time go into the report of a regression."""
        with self._lock:
            self.commits[group][(topic, partition)].append(offset)
            self.commit_notes[group][(topic, partition)].append(f"{who}@{time.strftime('%H:%M:%S')}")

    def final_read(self, topic: str, partition: int, records: list[tuple[int, bytes]]) -> None:
        """The whole partition from its start, read after the faults healed."""
        with self._lock:
            self.final[(topic, partition)] = dict(records)
        for off, value in records:
            self.read(topic, partition, off, value)

    # ---- checking -----------------------------------------------------------------------------

    def check(self, *, idempotent: bool = True) -> Report:
        with self._lock:
            return _check(self, idempotent)


def _check(h: History, idempotent: bool) -> Report:
    rep = Report()
    by_value: dict[bytes, ProduceOp] = {}
    for op in h.produces:
        if op.value in by_value:
            raise ValueError(f"two produce attempts with one value {op.value!r}: values must be unique")
        by_value[op.value] = op
        rep.stats[op.outcome] = rep.stats.get(op.outcome, 0) + 1

    # Conflicts: any offset any reader saw two different records at.
    for (topic, p), offsets in h.seen.items():
        for off, values in offsets.items():
            if len(values) > 1:
                shown = sorted(v[:40] for v in values)
                rep.add(
                    Anomaly("conflict", topic, p, off, f"read as {len(values)} different records: {shown}")
                )

    # Where each record is in the final log.
    where: dict[bytes, list[tuple[str, int, int]]] = defaultdict(list)
    for (topic, p), records in h.final.items():
        offsets = sorted(records)
        if offsets and offsets != list(range(offsets[0], offsets[0] + len(offsets))):
            missing = sorted(set(range(offsets[0], offsets[-1] + 1)) - set(offsets))
            rep.add(Anomaly("gap", topic, p, missing[0], f"{len(missing)} offsets missing: {missing[:10]}"))
        for off in offsets:
            where[records[off]].append((topic, p, off))
    rep.stats["final_records"] = sum(len(r) for r in h.final.values())

    for value, places in where.items():
        op = by_value.get(value)
        topic, p, off = places[0]
        if op is None:
            rep.add(Anomaly("phantom", topic, p, off, f"{value[:40]!r} was never produced"))
            continue
        if len(places) > 1:
            kind = "duplicate" if idempotent else "retry_duplicate"
            at = [f"{t}[{q}]@{o}" for t, q, o in places]
            rep.add(Anomaly(kind, topic, p, off, f"{value[:40]!r} ({op.outcome}) is at {at}"))
        if op.outcome == FAILED:
            rep.add(
                Anomaly(
                    "failed_present", topic, p, off, f"{value[:40]!r} failed ({op.error}) yet is in the log"
                )
            )
        elif op.outcome == UNKNOWN:
            rep.stats["unknown_present"] = rep.stats.get("unknown_present", 0) + 1

    acked_at: dict[tuple[str, int, int], bytes] = {}
    for op in h.produces:
        if op.outcome != ACKED:
            continue
        assert op.partition is not None
        tp = (op.topic, op.partition)
        places = where.get(op.value, [])
        if op.offset is None:
            here = [o for t, q, o in places if (t, q) == tp]
            at = [f"{t}[{q}]@{o}" for t, q, o in places]
            rep.stats["acked_no_offset"] = rep.stats.get("acked_no_offset", 0) + 1
            if tp not in h.final:
                rep.add(Anomaly("lost", op.topic, op.partition, None, "partition never read at the end"))
            elif not here:
                detail = f"acked (offset unknown) {op.value[:40]!r} is not in the partition: at {at}"
                rep.add(Anomaly("lost", op.topic, op.partition, None, detail))
            continue
        other = acked_at.setdefault((op.topic, op.partition, op.offset), op.value)
        if other != op.value:
            rep.add(
                Anomaly(
                    "double_ack",
                    op.topic,
                    op.partition,
                    op.offset,
                    f"acked for {other[:40]!r} and {op.value[:40]!r}",
                )
            )
        if tp not in h.final:
            rep.add(Anomaly("lost", op.topic, op.partition, op.offset, "partition never read at the end"))
            continue
        if not places:
            rep.add(
                Anomaly(
                    "lost", op.topic, op.partition, op.offset, f"acked {op.value[:40]!r} is not in the log"
                )
            )
        elif (op.topic, op.partition, op.offset) not in places:
            at = [f"{t}[{q}]@{o}" for t, q, o in places]
            rep.add(
                Anomaly("moved", op.topic, op.partition, op.offset, f"acked {op.value[:40]!r} is at {at}")
            )
    if "retry_duplicate" in rep.counts:  # a note, not an anomaly, without idempotence
        rep.stats["retry_duplicate"] = rep.counts.pop("retry_duplicate")
        rep.anomalies.pop("retry_duplicate")

    # Consumer groups: resuming from committed offsets leaves no offset unconsumed below them.
    for group, tps in h.commits.items():
        for (topic, p), committed in tps.items():
            notes = h.commit_notes[group][(topic, p)]
            for i, (before, after) in enumerate(itertools.pairwise(committed)):
                if after < before:
                    who = f" ({notes[i]} then {notes[i + 1]})" if len(notes) == len(committed) else ""
                    detail = f"group {group} committed {before} then {after}{who}"
                    rep.add(Anomaly("commit_regress", topic, p, after, detail))
            top = max(committed)
            final = h.final.get((topic, p))
            start = min(final) if final else 0
            handed = h.consumed[group].get((topic, p), set())
            missing = [o for o in range(start, top) if o not in handed]
            if missing:
                rep.add(
                    Anomaly(
                        "consumer_gap",
                        topic,
                        p,
                        missing[0],
                        f"group {group} committed {top} but never consumed {len(missing)} offsets below it: {missing[:10]}",
                    )
                )
    return rep
