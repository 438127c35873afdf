"""The transactional history checker (tests/txncheck.py) on hand-made histories: a good one
passes, and each violation a broken cluster's transactions could show is caught and named."""

from __future__ import annotations

import pytest

from txncheck import (
    ABORTED,
    COMMITTED,
    UNKNOWN,
    TxnHistory,
    TxnOp,
    check_processed,
    parse_source,
    parse_txn_value,
    processed_value,
    txn_value,
)

T = "tx"


class Log:
    """Builds a hand-made history: transactions appended to partitions as a broker would (data
    records, then a marker taking an offset), reads filled in from the result."""

    def __init__(self, partitions: int = 2) -> None:
        self.h = TxnHistory(T)
        self.parts: dict[int, list[tuple[int, bytes | None]]] = {p: [] for p in range(partitions)}

    def _next(self, p: int) -> int:
        return len(self.parts[p])

    def txn(self, producer: str, n: int, spread: list[int], outcome: str, *, landed: bool = True) -> TxnOp:
        """Transaction `n` of `producer`, record i to partition spread[i]; `landed` appends its
        records and markers to the log (a committed one's records are then read committed)."""
        op = self.h.begin(producer, n)
        for i, p in enumerate(spread):
            v = txn_value(producer, n, i)
            self.h.produced(op, p, v)
            if landed:
                off = self._next(p)
                self.parts[p].append((off, v))
                self.h.delivered(op, v, off)
        if landed:
            for p in sorted(set(spread)):
                self.parts[p].append((self._next(p), None))  # the marker
        if outcome == COMMITTED:
            self.h.commit_asked(op)
        self.h.end(op, outcome, "test")
        return op

    def read(self) -> TxnHistory:
        """The final reads: read_uncommitted sees every data record; read_committed the records
        of committed transactions (and of unknown ones that landed, which committed)."""
        committed = {v for op in self.h.txns if op.outcome != ABORTED for _p, v in op.records}
        for p, entries in self.parts.items():
            data = [(off, v) for off, v in entries if v is not None]
            self.h.final_uncommitted(p, data)
            self.h.final_committed(p, [(off, v) for off, v in data if v in committed])
        return self.h


def good() -> Log:
    log = Log()
    for n in range(6):
        outcome = ABORTED if n % 5 == 4 else COMMITTED
        log.txn("a", n, [0, 1, n % 2], outcome)
        log.txn("b", n, [1, 0], outcome)
    log.txn("a", 6, [0, 1], UNKNOWN)  # landed: committed
    log.txn("b", 6, [0, 1], UNKNOWN, landed=False)  # never landed
    return log


def test_value_round_trips() -> None:
    assert parse_txn_value(txn_value("tx0", 17, 3, 100)) == ("tx0", 17, 3)
    assert parse_txn_value(b"w0:1:....") is None


def test_a_good_history_passes() -> None:
    h = good().read()
    for p in range(2):  # the live reader saw some committed records
        off, v = sorted(h.committed_final[p].items())[0]
        h.read_committed(p, off, v)
    rep = h.check()
    assert rep.ok, str(rep)
    assert (
        rep.stats["txn_committed"] == 10 and rep.stats["txn_aborted"] == 2 and rep.stats["txn_unknown"] == 2
    )
    assert rep.stats["txn_unknown_committed"] == 1 and rep.stats["txn_unknown_absent"] == 1
    # read_uncommitted sees the aborted records: allowed, counted.
    assert rep.stats["aborted_records_read_uncommitted"] == 3 + 2  # a:4 and b:4
    assert rep.stats["aborted_records_delivered"] == 3 + 2


def test_lost_committed_record_is_caught() -> None:
    h = good().read()
    off = min(h.committed_final[1])
    del h.committed_final[1][off]
    rep = h.check()
    assert rep.kinds() == {"txn_lost"}, str(rep)
    assert rep.anomalies["txn_lost"][0].partition == 1 and rep.anomalies["txn_lost"][0].offset == off


def test_partition_never_read_loses_its_committed_records() -> None:
    h = good().read()
    del h.committed_final[0]
    rep = h.check()
    assert "txn_lost" in rep.kinds() and rep.counts["txn_lost"] >= 10


def test_duplicate_under_read_committed_is_caught() -> None:
    h = good().read()
    _off, v = sorted(h.committed_final[0].items())[0]
    h.committed_final[0][100] = v
    h.uncommitted_final[0][100] = v
    rep = h.check()
    assert "txn_duplicate" in rep.kinds(), str(rep)


def test_aborted_record_read_committed_is_caught() -> None:
    log = good()
    h = log.read()
    aborted = next(op for op in h.txns if op.outcome == ABORTED)
    p, v = aborted.records[0]
    off = next(o for o, w in h.uncommitted_final[p].items() if w == v)
    h.committed_final[p][off] = v
    rep = h.check()
    assert rep.kinds() == {"aborted_read"}, str(rep)
    assert rep.anomalies["aborted_read"][0].offset == off


def test_aborted_record_read_live_is_caught() -> None:
    h = good().read()
    aborted = next(op for op in h.txns if op.outcome == ABORTED)
    p, v = aborted.records[1]
    off = next(o for o, w in h.uncommitted_final[p].items() if w == v)
    h.read_committed(p, off, v)
    assert h.check().kinds() == {"aborted_read"}


def test_unknown_transaction_partly_visible_is_caught() -> None:
    log = Log()
    log.txn("a", 0, [0, 1], COMMITTED)
    op = log.txn("a", 1, [0, 1, 1], UNKNOWN)
    h = log.read()
    p, v = op.records[2]
    off = next(o for o, w in h.committed_final[p].items() if w == v)
    del h.committed_final[p][off]  # only two of its three records committed
    rep = h.check()
    assert rep.kinds() == {"txn_partial"}, str(rep)


def test_unknown_all_or_nothing_passes_either_way() -> None:
    for landed in (True, False):
        log = Log()
        log.txn("a", 0, [0, 1, 0], UNKNOWN, landed=landed)
        rep = log.read().check()
        assert rep.ok, str(rep)
        assert rep.stats[f"txn_unknown_{'committed' if landed else 'absent'}"] == 1


def test_records_of_a_transaction_out_of_produce_order_are_caught() -> None:
    log = Log(partitions=2)
    op = log.txn("a", 0, [0, 0, 1], COMMITTED)
    h = log.read()
    (o0, v0), (o1, v1) = sorted(h.committed_final[0].items())[:2]
    for final in (h.committed_final, h.uncommitted_final):
        final[0][o0], final[0][o1] = v1, v0  # record 1 before record 0
    op.offsets[v0], op.offsets[v1] = o1, o0  # as delivered (else it is also "moved")
    rep = h.check()
    assert rep.kinds() == {"txn_order"}, str(rep)


def test_transactions_out_of_order_are_caught() -> None:
    log = Log(partitions=2)
    log.txn("a", 0, [0, 1], COMMITTED)
    log.txn("b", 0, [0, 1], COMMITTED)  # another producer's between: fine
    log.txn("a", 1, [0, 1], COMMITTED)
    h = log.read()
    assert h.check().ok
    # Partition 1 holds a:1 before a:0.
    by_value = {v: o for o, v in h.committed_final[1].items()}
    a0, a1 = txn_value("a", 0, 1), txn_value("a", 1, 1)
    for final in (h.committed_final, h.uncommitted_final):
        final[1][by_value[a0]], final[1][by_value[a1]] = a1, a0
    for op in h.txns:
        for p, v in op.records:
            if p == 1 and v in (a0, a1):
                op.offsets[v] = by_value[a1] if v == a0 else by_value[a0]
    rep = h.check()
    assert rep.kinds() == {"txn_order"}, str(rep)


def test_committed_record_at_another_offset_than_delivered_is_caught() -> None:
    h = good().read()
    op = next(op for op in h.txns if op.outcome == COMMITTED)
    _p, v = op.records[0]
    op.offsets[v] += 1
    assert h.check().kinds() == {"moved"}


def test_live_read_of_a_record_not_committed_in_the_end_is_a_dirty_read() -> None:
    h = good().read()
    op = next(op for op in h.txns if op.outcome == UNKNOWN and not op.offsets)
    # A record of the unknown transaction that never landed... read live at some offset past
    # the end: it was exposed, then vanished.
    p, v = op.records[0]
    h.read_committed(p, 500, v)
    assert h.check().kinds() == {"dirty_read"}


def test_conflicting_reads_and_phantoms_are_caught() -> None:
    h = good().read()
    off, v = sorted(h.committed_final[0].items())[0]
    other = next(w for w in h.committed_final[0].values() if w != v)
    h.read_committed(0, off, other)
    assert "conflict" in h.check().kinds()
    h = good().read()
    h.uncommitted_final[1][999] = b"nobody:0:0:"
    assert h.check().kinds() == {"phantom"}


def test_every_anomaly_is_reported_not_only_the_first() -> None:
    h = good().read()
    for p in range(2):
        for off in sorted(h.committed_final[p])[:2]:
            del h.committed_final[p][off]
    rep = h.check()
    assert rep.counts["txn_lost"] == 4 and len(rep.anomalies["txn_lost"]) == 4


def test_values_must_be_unique() -> None:
    h = TxnHistory(T)
    op = h.begin("a", 0)
    h.produced(op, 0, txn_value("a", 0, 0))
    h.produced(op, 1, txn_value("a", 0, 0))
    with pytest.raises(ValueError, match="unique"):
        h.check()


# ---- read-process-write: exactly once ------------------------------------------------------------


def processed(source: TxnHistory, upto: dict[int, int]) -> TxnHistory:
    """The outputs of a correct processor that committed offsets `upto`: each committed input
    below them output once, in a transaction per input partition (plus an aborted one)."""
    sink = TxnHistory("out")
    for n, (p, records) in enumerate(sorted(source.committed_final.items())):
        op = sink.begin("rpw", n)
        out = []
        for i, (off, v) in enumerate(sorted(r for r in records.items() if r[0] < upto[p])):
            value = processed_value("rpw", n, i, p, off, v)
            sink.produced(op, p, value)
            sink.delivered(op, value, i)
            out.append((i, value))
        sink.commit_asked(op)
        sink.end(op, COMMITTED)
        sink.final_committed(p, out)
        sink.final_uncommitted(p, out)
    return sink


def test_exactly_once_processing_passes() -> None:
    source = good().read()
    upto = {0: 8, 1: 6}
    sink = processed(source, upto)
    assert parse_source(sink.committed_final[0][0]) == (0, 0, source.committed_final[0][0])
    assert sink.check().ok, str(sink.check())
    rep = check_processed(source, sink, upto)
    assert rep.ok, str(rep)
    below = sum(1 for p, r in source.committed_final.items() for off in r if off < upto[p])
    assert rep.stats["eo_outputs"] == rep.stats["eo_inputs_committed"] == below > 0


def test_input_processed_twice_is_caught() -> None:
    source = good().read()
    upto = {0: 8, 1: 6}
    sink = processed(source, upto)
    off, v = sorted(source.committed_final[1].items())[0]
    again = processed_value("rpw", 9, 0, 1, off, v)
    op = sink.begin("rpw", 9)
    sink.produced(op, 1, again)
    sink.end(op, COMMITTED)
    sink.committed_final[1][100] = again
    assert check_processed(source, sink, upto).kinds() == {"eo_duplicate"}


def test_offset_committed_without_its_output_is_caught() -> None:
    source = good().read()
    sink = processed(source, {0: 8, 1: 6})
    rep = check_processed(source, sink, {0: 8, 1: 12})
    assert rep.kinds() == {"eo_lost"}, str(rep)


def test_output_committed_without_its_offset_is_caught() -> None:
    source = good().read()
    sink = processed(source, {0: 8, 1: 6})
    rep = check_processed(source, sink, {0: 8, 1: 2})
    assert rep.kinds() == {"eo_unatomic"}, str(rep)


def test_output_of_an_aborted_input_is_caught() -> None:
    source = good().read()
    upto = {0: 100, 1: 100}
    sink = processed(source, upto)
    aborted = next(op for op in source.txns if op.outcome == ABORTED)
    p, v = aborted.records[0]
    off = next(o for o, w in source.uncommitted_final[p].items() if w == v)
    bad = processed_value("rpw", 9, 0, p, off, v)
    sink.committed_final[p][100] = bad
    assert check_processed(source, sink, upto).kinds() == {"eo_wrong_input"}
