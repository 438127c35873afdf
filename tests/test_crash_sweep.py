"""Crash-point sweep: crash the engine after every k-th mutating filesystem call.

For each k of a produce + seal + snapshot workload on a FaultyFileSystem, crash (with and
without a torn last write), recover, and check the oracle:

    acked ⊆ recovered ⊆ written, offsets dense from 0, recover(recover(x)) == recover(x)
"""

from __future__ import annotations

import pytest

from loglake.engine import Engine
from loglake.fs.faulty import FaultyFileSystem, SimulatedCrash

from enginekit import DATA_DIR, abandon, read_all, small_config

TOPIC = "t"
PARTITIONS = 2
RECORDS = 24
FLUSH_EVERY = 6


def workload(fs: FaultyFileSystem) -> tuple[set[tuple[int, int, bytes]], set[bytes]]:
    """Run until done or crashed. Returns (acked (partition, offset, value), written values)."""
    acked: set[tuple[int, int, bytes]] = set()
    written: set[bytes] = set()
    engine = Engine(DATA_DIR, small_config(), fs=fs, start_background=False)
    try:
        engine.open()
        engine.create_topic(TOPIC, PARTITIONS, {"segment.bytes": "8192"})
        for i in range(RECORDS):
            value = f"value-{i:04d}-".encode() * 150  # ~1.7 KB: the 64 KiB WAL files roll
            p = i % PARTITIONS
            written.add(value)
            result = engine.append_records(TOPIC, p, [(1_000 + i, f"k{i}".encode(), value, [])]).result()
            acked.add((p, result.base_offset, value))
            if (i + 1) % FLUSH_EVERY == 0:
                engine.flush()
        engine.close()
    except (SimulatedCrash, Exception):
        abandon(engine)
    return acked, written


def recover_state(fs: FaultyFileSystem) -> tuple[Engine, dict[int, list[tuple[int, bytes | None, bytes | None]]]]:
    engine = Engine(DATA_DIR, small_config(), fs=fs, start_background=False)
    engine.open()
    if not engine.has_topic(TOPIC):
        return engine, {}
    return engine, read_all(engine, TOPIC)


def count_calls() -> int:
    fs = FaultyFileSystem(seed=1)
    acked, _ = workload(fs)
    assert len(acked) == RECORDS
    return fs.mutating_calls


TOTAL_CALLS = count_calls()


def check(k: int, torn: bool) -> None:
    fs = FaultyFileSystem(seed=k, crash_after=k)
    acked, written = workload(fs)
    after = fs.crash(torn=torn)
    engine, state = recover_state(after)
    try:
        recovered = {(p, off, v) for p, recs in state.items() for off, _k, v in recs}
        missing = acked - recovered
        assert not missing, f"k={k} torn={torn}: acknowledged records lost: {[(p, o, v[:16]) for p, o, v in sorted(missing)[:3]]}"
        for p, recs in state.items():
            offsets = [off for off, _k, _v in recs]
            assert offsets == list(range(len(offsets))), f"k={k}: partition {p} offsets not dense: {offsets}"
            for _off, _key, value in recs:
                assert value in written, f"k={k}: recovered a record that was never written"
    finally:
        abandon(engine)
    # Recovering the recovered state again (after another crash) changes nothing.
    again_fs = after.crash()
    engine2, state2 = recover_state(again_fs)
    try:
        assert state2 == state, f"k={k} torn={torn}: second recovery differs from the first"
    finally:
        abandon(engine2)


def test_workload_makes_enough_calls() -> None:
    # The sweep must cover WAL rolls, seals and snapshots: well over a hundred mutating calls.
    assert TOTAL_CALLS > 100


@pytest.mark.parametrize("torn", [False, True], ids=["clean", "torn"])
def test_crash_at_every_mutating_call(torn: bool) -> None:
    for k in range(1, TOTAL_CALLS + 1):
        check(k, torn)
