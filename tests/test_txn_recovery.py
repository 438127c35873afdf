"""Transactions across restarts.

Engine level: the last stable offset, aborted-transaction ranges and read_committed reads, and
that they come back after a restart (metadata log replay and checkpoints). Broker level: a data
directory left with a transaction in a prepare state (markers written to some partitions only,
as a crash in the middle of EndTxn leaves it) is completed consistently in every partition when
the broker starts; an ongoing transaction of a killed broker is aborted after its timeout.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka import KafkaAdminClient

from loglake.broker.txn.id_store import TxnIdStore
from loglake.engine import Engine
from loglake.errors import InvalidProducerEpochError
from loglake.records.batch import BatchBuilder
from loglake.records.decode import iter_records
from loglake.store.memory import MemoryStore

from brokerkit import consume_to_end, serving_broker

WAIT_S = 60.0
TID = "recovery-tid"


def txn_batch(pid: int, epoch: int, seq: int, values: list[bytes]) -> bytearray:
    b = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=True)
    for v in values:
        b.append(int(time.time() * 1000), None, v, [])  # a current time: retention keeps it
    return bytearray(b.build())


def body(engine: Engine, pid: int, state: str, parts: dict[tuple[str, int], int], **extra: Any) -> dict[str, Any]:
    return {
        "tid": TID,
        "pid": pid,
        "epoch": 0,
        "state": state,
        "timeout_ms": 60_000,
        "start_ms": int(time.time() * 1000),
        "last_ms": int(time.time() * 1000),
        "parts": [[engine.topic_id_of(t).hex(), p, first] for (t, p), first in parts.items()],
        "names": [t for (t, _p) in parts],
        "groups": [],
        "offsets": {},
        **extra,
    }


def open_txn(engine: Engine, topic: str, partitions: int, per_partition: int) -> tuple[int, dict[tuple[str, int], int]]:
    """An ongoing transaction with records in every partition (as the coordinator records it)."""
    pid = engine.allocate_producer_id()
    parts = {(topic, p): engine.partition_info(topic, p).next_offset for p in range(partitions)}
    TxnIdStore.of(engine).record(body(engine, pid, "ongoing", parts)).result()
    for p in range(partitions):
        values = [f"{topic}-{p}-{i}".encode() for i in range(per_partition)]
        engine.append_batch(topic, p, txn_batch(pid, 0, 0, values)).result()
    return pid, parts


def committed_values(engine: Engine, topic: str, partition: int) -> list[bytes]:
    """Records a read_committed reader keeps (aborted producer ranges and control batches dropped)."""
    out: list[bytes] = []
    offset = engine.partition_info(topic, partition).log_start_offset
    while True:
        result, lso, aborted = engine.read_committed(topic, partition, offset, 1 << 20)
        if not result.chunks:
            return out
        data = b"".join(bytes(c) for c in result.chunks)  # type: ignore[arg-type]
        pos = 0
        while pos < len(data):
            size = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
            attrs = int.from_bytes(data[pos + 21 : pos + 23], "big")
            pid = int.from_bytes(data[pos + 43 : pos + 51], "big", signed=True)
            base = int.from_bytes(data[pos : pos + 8], "big")
            dropped = any(a_pid == pid and first <= base for a_pid, first in aborted)
            if not attrs & 0x20 and not dropped:
                out.extend(r.value or b"" for r in iter_records(data, pos))
            offset = base + int.from_bytes(data[pos + 23 : pos + 27], "big") + 1
            pos += size
        assert offset <= lso


def test_engine_lso_and_aborted_ranges_survive_restart(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    with Engine(data) as engine:
        engine.create_topic("t", 2)
        engine.append_records("t", 0, [(None, None, b"before", [])]).result()
        pid, parts = open_txn(engine, "t", 2, 3)
        assert engine.last_stable_offset("t", 0) == 1 and engine.partition_info("t", 0).high_watermark == 4
        assert committed_values(engine, "t", 0) == [b"before"]  # held back at the LSO
        TxnIdStore.of(engine).record(body(engine, pid, "prepare_abort", parts)).result()
        markers = []
        for (topic, p) in parts:
            fut = engine.write_txn_marker(engine.topic_id_of(topic), p, pid, 0, False)
            assert fut is not None
            markers.append([engine.topic_id_of(topic).hex(), p, fut.result().base_offset])
        TxnIdStore.of(engine).record(body(engine, pid, "complete_abort", parts, markers=markers)).result()
        engine.append_records("t", 0, [(None, None, b"after", [])]).result()
        assert engine.last_stable_offset("t", 0) == engine.partition_info("t", 0).high_watermark == 6
        assert engine.aborted_transactions("t", 0, 0, 6) == [(pid, 1)]
        assert committed_values(engine, "t", 0) == [b"before", b"after"]
        engine.checkpoint_metadata()
    with Engine(data) as engine:  # from the checkpoint
        assert engine.aborted_transactions("t", 0, 0, 6) == [(pid, 1)]
        assert committed_values(engine, "t", 0) == [b"before", b"after"]
        assert committed_values(engine, "t", 1) == []
        _pid2, parts2 = open_txn(engine, "t", 2, 2)
    with Engine(data) as engine:  # from the log after the checkpoint: still open
        assert engine.last_stable_offset("t", 1) == parts2[("t", 1)]
        assert TxnIdStore.of(engine).states()[TID]["state"] == "ongoing"


def _consume(bootstrap: str, topic: str, partitions: int, isolation: str, want: int) -> list[bytes]:
    return consume_to_end(bootstrap, topic, partitions, isolation, want, WAIT_S)


def _crashed_in_end_txn(data: str, commit: bool) -> None:
    """A data directory as a crash during EndTxn leaves it: prepare recorded, one marker of three."""
    with Engine(data) as engine:
        engine.create_topic("t", 3)
        pid, parts = open_txn(engine, "t", 3, 4)
        TxnIdStore.of(engine).record(body(engine, pid, "prepare_commit" if commit else "prepare_abort", parts)).result()
        fut = engine.write_txn_marker(engine.topic_id_of("t"), 0, pid, 0, commit)
        assert fut is not None
        fut.result()


def test_broker_completes_prepared_commit(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _crashed_in_end_txn(str(data), commit=True)
    with serving_broker(data) as b:
        assert len(_consume(b.bootstrap, "t", 3, "read_committed", 12)) == 12  # all three partitions
        admin = KafkaAdminClient(bootstrap_servers=b.bootstrap)
        try:
            assert "CompleteCommit" in repr(admin.describe_transactions([TID]))
        finally:
            admin.close()
        assert "completed after restart" in b.log_text()


def test_broker_completes_prepared_abort(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _crashed_in_end_txn(str(data), commit=False)
    with serving_broker(data) as b:
        plain = Producer({"bootstrap.servers": b.bootstrap})
        for p in range(3):
            plain.produce("t", value=b"later-%d" % p, partition=p)
        plain.flush()
        assert sorted(_consume(b.bootstrap, "t", 3, "read_committed", 3)) == [b"later-0", b"later-1", b"later-2"]
        assert len(_consume(b.bootstrap, "t", 3, "read_uncommitted", 15)) == 15


def test_killed_broker_aborts_open_transaction_after_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"LOGLAKE_TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS": "200"}
    with serving_broker(data, ["--default-partitions", "2"], env=env) as b:
        p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "killed", "transaction.timeout.ms": 2000})
        p.init_transactions(WAIT_S)
        p.begin_transaction()
        for i in range(10):
            p.produce("k", value=b"open-%d" % i, partition=i % 2)
        p.flush()
        b.stop(signal.SIGKILL)
        b.start()
        plain = Producer({"bootstrap.servers": b.bootstrap})
        plain.produce("k", value=b"after", partition=0)
        plain.flush()
        # the open transaction is aborted after its timeout; read_committed moves past it
        assert _consume(b.bootstrap, "k", 2, "read_committed", 1) == [b"after"]
        assert len(_consume(b.bootstrap, "k", 2, "read_uncommitted", 11)) == 11


def end_txn(engine: Engine, pid: int, parts: dict[tuple[str, int], int], commit: bool) -> None:
    """EndTxn as the coordinator does it: prepare, markers, complete."""
    TxnIdStore.of(engine).record(body(engine, pid, "prepare_commit" if commit else "prepare_abort", parts)).result()
    markers = []
    for topic, p in parts:
        fut = engine.write_txn_marker(engine.topic_id_of(topic), p, pid, 0, commit)
        assert fut is not None
        markers.append([engine.topic_id_of(topic).hex(), p, fut.result().base_offset])
    extra = {} if commit else {"markers": markers}
    TxnIdStore.of(engine).record(body(engine, pid, "complete_commit" if commit else "complete_abort", parts, **extra)).result()


def test_read_committed_over_cold_segments(tmp_path: Path) -> None:
    """Tiered segments keep the control batches; read_committed filters the same after relocation."""
    cold = MemoryStore()
    engine = Engine(str(tmp_path / "d"), cold_store=cold, start_background=False)
    engine.open()
    try:
        engine.create_topic("t", 1, {"segment.bytes": "4096", "hot.retain.segments": "1"})
        kept: list[bytes] = []
        for round_ in range(8):
            pid = engine.allocate_producer_id()
            parts = {("t", 0): engine.partition_info("t", 0).next_offset}
            TxnIdStore.of(engine).record(body(engine, pid, "ongoing", parts)).result()
            values = [f"r{round_}-{i}-".encode() * 40 for i in range(6)]
            for i, v in enumerate(values):
                engine.append_batch("t", 0, txn_batch(pid, 0, i, [v])).result()
            end_txn(engine, pid, parts, commit=round_ % 2 == 0)
            if round_ % 2 == 0:
                kept += values
        engine.flush()
        assert engine.relocate_due() > 0
        assert any(s.tier == "cold" for s in engine.segments("t", 0))
        assert committed_values(engine, "t", 0) == kept
        assert len(engine.aborted_transactions("t", 0, 0, engine.partition_info("t", 0).high_watermark)) == 4
    finally:
        engine.close()


def test_marker_fences_older_epochs_in_the_partition(tmp_path: Path) -> None:
    """A zombie's batch that reaches the engine after the marker of a newer epoch is refused."""
    with Engine(str(tmp_path / "data")) as engine:
        engine.create_topic("t", 1)
        pid = engine.allocate_producer_id()
        engine.append_batch("t", 0, txn_batch(pid, 0, 0, [b"a"])).result()
        fut = engine.write_txn_marker(engine.topic_id_of("t"), 0, pid, 1, False)
        assert fut is not None
        fut.result()
        with pytest.raises(InvalidProducerEpochError):
            engine.append_batch("t", 0, txn_batch(pid, 0, 1, [b"zombie"]))
        engine.append_batch("t", 0, txn_batch(pid, 2, 0, [b"next instance"])).result()
