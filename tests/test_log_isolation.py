"""The embedded API's isolation option: `Log.consume(..., isolation="read_committed")`.

Transactions are written through the engine calls the broker's coordinator uses (a `txn`
metadata record per state, transactional batches with the producer id, `write_txn_marker`):
committed, aborted and still-open transactions, interleaved with plain records and with each
other. read_committed yields exactly the committed and plain records below the last stable
offset; read_uncommitted every data record; neither a control record.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import loglake
from loglake.broker.txn.id_store import TxnIdStore
from loglake.engine import Engine
from loglake.log import Log
from loglake.records.batch import BatchBuilder

TID = "isolation-tid"


def txn_batch(pid: int, values: list[bytes], seq: int = 0) -> bytearray:
    b = BatchBuilder(producer_id=pid, producer_epoch=0, base_sequence=seq, is_transactional=True)
    for v in values:
        b.append(int(time.time() * 1000), None, v, [])
    return bytearray(b.build())


class Txn:
    """One transaction on partitions of one topic, recorded as the coordinator records it."""

    def __init__(self, engine: Engine, topic: str, partitions: list[int], tid: str = TID) -> None:
        self.engine, self.topic, self.tid = engine, topic, tid
        self.pid = engine.allocate_producer_id()
        self.parts = {p: engine.partition_info(topic, p).next_offset for p in partitions}
        self.seq = dict.fromkeys(partitions, 0)
        self._record("ongoing")

    def _record(self, state: str, **extra: Any) -> None:
        tid_hex = self.engine.topic_id_of(self.topic).hex()
        now = int(time.time() * 1000)
        body = {
            "tid": self.tid, "pid": self.pid, "epoch": 0, "state": state, "timeout_ms": 60_000,
            "start_ms": now, "last_ms": now, "parts": [[tid_hex, p, first] for p, first in self.parts.items()],
            "names": [self.topic], "groups": [], "offsets": {}, **extra,
        }  # fmt: skip
        TxnIdStore.of(self.engine).record(body).result()

    def write(self, partition: int, *values: bytes) -> None:
        self.engine.append_batch(self.topic, partition, txn_batch(self.pid, list(values), self.seq[partition])).result()
        self.seq[partition] += len(values)

    def end(self, commit: bool) -> None:
        self._record("prepare_commit" if commit else "prepare_abort")
        tid = self.engine.topic_id_of(self.topic)
        markers = []
        for p in self.parts:
            fut = self.engine.write_txn_marker(tid, p, self.pid, 0, commit)
            assert fut is not None
            markers.append([tid.hex(), p, fut.result().base_offset])
        self._record("complete_commit" if commit else "complete_abort", **({} if commit else {"markers": markers}))
        for p in self.parts:
            self.engine.wake_readers(tid, p)  # as the coordinator does: the LSO moved


def values(log: Log, topic: str, **kw: Any) -> list[bytes | None]:
    return [r.value for r in log.consume(topic, **kw)]


@pytest.fixture
def log(tmp_path: Path) -> Any:
    with loglake.open(str(tmp_path / "data")) as lg:
        yield lg


def test_committed_aborted_and_open_transactions(log: Log) -> None:
    log.create_topic("t", partitions=1)
    log.produce("t", b"plain-0")
    a = Txn(log.engine, "t", [0], "a")
    b = Txn(log.engine, "t", [0], "b")
    a.write(0, b"a-0", b"a-1")  # a and b interleave; a aborts, b commits
    b.write(0, b"b-0")
    a.write(0, b"a-2")
    log.produce("t", b"plain-1")  # a plain record inside the aborted range is kept
    b.write(0, b"b-1")
    a.end(commit=False)
    b.end(commit=True)
    log.produce("t", b"plain-2")
    assert log.last_stable_offset("t", 0) == log.describe_topic("t").partitions[0].high_watermark
    c = Txn(log.engine, "t", [0], "c")  # left open: holds the LSO at its first offset
    lso = log.last_stable_offset("t", 0)
    c.write(0, b"c-0")
    log.produce("t", b"plain-3")  # above the LSO: read_committed does not see it yet
    hw = log.describe_topic("t").partitions[0].high_watermark
    assert log.last_stable_offset("t", 0) == lso < hw

    committed = [b"plain-0", b"b-0", b"plain-1", b"b-1", b"plain-2"]
    assert values(log, "t", isolation="read_committed") == committed
    assert max(r.offset for r in log.consume("t", isolation="read_committed")) < lso
    every = [b"plain-0", b"a-0", b"a-1", b"b-0", b"a-2", b"plain-1", b"b-1", b"plain-2", b"c-0", b"plain-3"]
    assert values(log, "t") == values(log, "t", isolation="read_uncommitted") == every
    # a start inside the aborted range still filters it (the aborted list covers the read)
    first_a2 = next(r.offset for r in log.consume("t") if r.value == b"a-2")
    assert values(log, "t", start=first_a2, isolation="read_committed") == [b"plain-1", b"b-1", b"plain-2"]
    # 'latest' is the LSO under read_committed (the high watermark otherwise): a follower from
    # there gets the open transaction's records once it commits, and what was held back behind it
    tail = log.consume("t", start="latest", isolation="read_committed", follow=True, idle_timeout=20)
    assert values(log, "t", start="latest", follow=True, idle_timeout=0.2) == []
    timer = threading.Timer(1.0, c.end, kwargs={"commit": True})
    timer.start()
    assert [next(tail).value, next(tail).value] == [b"c-0", b"plain-3"]
    tail.close()
    timer.join()
    assert values(log, "t", isolation="read_committed") == [*committed, b"c-0", b"plain-3"]


def test_control_records_never_yielded(log: Log) -> None:
    log.create_topic("m", partitions=2)
    for i, commit in enumerate((True, False, True)):
        t = Txn(log.engine, "m", [0, 1], f"m{i}")
        t.write(0, b"x%d" % i)
        t.write(1, b"y%d" % i)
        t.end(commit)
    for isolation in ("read_uncommitted", "read_committed"):
        recs = list(log.consume("m", isolation=isolation))
        assert all(r.key is None for r in recs)  # a marker would carry its 4-byte key
        got = sorted(r.value or b"" for r in recs)
        want = [b"x0", b"x2", b"y0", b"y2"] + ([b"x1", b"y1"] if isolation == "read_uncommitted" else [])
        assert got == sorted(want)
    # offsets skip the markers: three data records and three markers per partition
    assert [r.offset for r in log.consume("m", partitions=[0])] == [0, 2, 4]


def test_follow_waits_at_the_lso_until_the_transaction_ends(log: Log) -> None:
    log.create_topic("f", partitions=1)
    log.produce("f", b"before")
    t = Txn(log.engine, "f", [0])
    t.write(0, b"inside")
    log.produce("f", b"after")
    got: list[bytes | None] = []
    seen_first = threading.Event()

    def follow() -> None:
        for r in log.consume("f", isolation="read_committed", follow=True, idle_timeout=20):
            got.append(r.value)
            seen_first.set()
            if len(got) == 3:
                return

    reader = threading.Thread(target=follow)
    reader.start()
    assert seen_first.wait(10)
    time.sleep(0.8)  # more than one wait slice: still held at the LSO
    assert got == [b"before"]
    t.end(commit=True)
    reader.join(20)
    assert not reader.is_alive()
    assert got == [b"before", b"inside", b"after"]


def test_follow_at_the_lso_ends_after_idle_timeout(log: Log) -> None:
    log.create_topic("i", partitions=1)
    t = Txn(log.engine, "i", [0])
    t.write(0, b"open")
    started = time.monotonic()
    assert values(log, "i", isolation="read_committed", follow=True, idle_timeout=0.6) == []
    assert 0.5 < time.monotonic() - started < 5
    assert values(log, "i", start="latest", isolation="read_uncommitted", follow=True, idle_timeout=0.2) == []


def test_invalid_isolation(log: Log) -> None:
    log.create_topic("v", partitions=1)
    with pytest.raises(ValueError, match=r"read_uncommitted.*read_committed.*'serializable'"):
        list(log.consume("v", isolation="serializable"))
