"""Crash-point sweep over a transaction: crash after every k-th mutating filesystem call of
InitProducerId + AddPartitionsToTxn + transactional appends + EndTxn(commit) on a
FaultyFileSystem, recover the engine, start the transaction coordinator on it (which completes a
transaction left in a prepare state), and check that every partition ends it the same way:

* committed (EndTxn answered, or its prepare record survived): no partition holds the producer
  open, none lists it as aborted, the last stable offset is the high watermark, a
  read_committed read returns every recovered record of the transaction, and every
  acknowledged append of it was recovered;
* not prepared: the transaction is still open (the LSO holds at its start) in every partition
  that recovered data of it, and nothing of it is readable at read_committed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loglake.broker.txn import TxnCoordinator, TxnSettings
from loglake.broker.txn.id_store import TxnIdStore
from loglake.engine import Engine
from loglake.fs.faulty import FaultyFileSystem, SimulatedCrash
from loglake.records.batch import BatchBuilder, split_batches
from loglake.records.decode import iter_records

from enginekit import DATA_DIR, abandon, small_config

TOPIC = "t"
PARTITIONS = 3
TID = "sweep"


async def _off_loop(fn: Any, *args: Any) -> Any:
    return fn(*args)


def coordinator(engine: Engine) -> TxnCoordinator:
    return TxnCoordinator(engine, None, TxnSettings(), off_loop=_off_loop)


def workload(fs: FaultyFileSystem, acked: dict[int, list[bytes]] | None = None) -> bool:
    """Run until done or crashed; True when EndTxn(commit) was answered. `acked` gets the values
    of each partition's acknowledged appends."""
    engine = Engine(DATA_DIR, small_config(), fs=fs, start_background=False)
    answered = [False]

    async def run() -> None:
        coord = coordinator(engine)
        code, pid, epoch = await coord.init_producer_id(TID, 60_000, -1, -1, 4)
        assert code == 0
        codes = await coord.add_partitions(TID, pid, epoch, [(TOPIC, p) for p in range(PARTITIONS)], 3)
        assert set(codes.values()) == {0}
        for p in range(PARTITIONS):
            b = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=0, is_transactional=True)
            for i in range(3):
                b.append(1_000 + i, None, f"v-{p}-{i}".encode() * 40, [])
            engine.append_batch(TOPIC, p, bytearray(b.build())).result()
            if acked is not None:
                acked.setdefault(p, []).extend(f"v-{p}-{i}".encode() * 40 for i in range(3))
        assert await coord.end_txn(TID, pid, epoch, True, 3) == 0
        answered[0] = True

    try:
        engine.open()
        engine.create_topic(TOPIC, PARTITIONS)
        asyncio.run(run())
        engine.close()
    except (SimulatedCrash, Exception):
        abandon(engine)
    return answered[0]


def txn_values(engine: Engine, partition: int, *, committed: bool) -> list[bytes]:
    """Values of non-control records, read at read_committed or read_uncommitted."""
    out: list[bytes] = []
    offset = engine.partition_info(TOPIC, partition).log_start_offset
    while True:
        if committed:
            result, _lso, aborted = engine.read_committed(TOPIC, partition, offset, 1 << 20)
            assert not aborted
        else:
            result = engine.read(TOPIC, partition, offset, 1 << 20)
        if not result.chunks:
            return out
        data = b"".join(bytes(c) for c in result.chunks)  # type: ignore[arg-type]
        for pos, h in split_batches(data):
            if not h.is_control:
                out.extend(r.value or b"" for r in iter_records(data, pos))
            offset = h.base_offset + h.last_offset_delta + 1


def count_calls() -> int:
    fs = FaultyFileSystem(seed=1)
    assert workload(fs)
    return fs.mutating_calls


TOTAL_CALLS = count_calls()


def check(k: int, torn: bool) -> None:
    fs = FaultyFileSystem(seed=k, crash_after=k)
    acked: dict[int, list[bytes]] = {}
    answered = workload(fs, acked)
    after = fs.crash(torn=torn)
    engine = Engine(DATA_DIR, small_config(), fs=after, start_background=False)
    engine.open()
    try:
        if not engine.has_topic(TOPIC):
            # only a crash before anything was acknowledged may lose the topic
            assert not answered and not acked, f"k={k}: the topic is gone after acknowledged appends"
            return
        asyncio.run(coordinator(engine).start_once())
        state = TxnIdStore.of(engine).states().get(TID)
        status = state["state"] if state else None
        if answered:
            assert status == "complete_commit", f"k={k}: an answered commit recovered as {status}"
        for p in range(PARTITIONS):
            pm = engine.catalog.partition(TOPIC, p).meta
            written = txn_values(engine, p, committed=False)
            if status == "complete_commit":
                assert not pm.txn_open and not pm.aborted_txns, f"k={k}: partition {p} not completed"
                assert engine.last_stable_offset(TOPIC, p) == engine.partition_info(TOPIC, p).high_watermark
                assert txn_values(engine, p, committed=True) == written, f"k={k}: partition {p} hides committed data"
                lost = [v[:12] for v in acked.get(p, []) if v not in written]
                assert not lost, f"k={k}: partition {p} lost acknowledged records of a committed transaction: {lost}"
            else:
                assert status in (None, "empty", "ongoing"), f"k={k}: left in {status}"
                assert txn_values(engine, p, committed=True) == [], f"k={k}: uncommitted data readable in {p}"
    finally:
        abandon(engine)


def test_workload_makes_enough_calls() -> None:
    assert TOTAL_CALLS > 20


@pytest.mark.parametrize("torn", [False, True], ids=["clean", "torn"])
def test_crash_at_every_mutating_call_of_a_transaction(torn: bool) -> None:
    for k in range(1, TOTAL_CALLS + 1):
        check(k, torn)
