"""Long soak (make test-long): compaction and merging under kill -9 of the process.

A child process (this file run as a script) opens an engine with the cleaner running flat out
(tiny segments, dirty ratio 0.01, merges of 3 segments at once, no I/O limit) and produces keyed
updates and tombstones over a small key space (some keys going quiet for a while) with `fsync` durability. After each acknowledged
append it writes the ack (partition, offset, key, cycle, seq, tombstone?) to a side file and
fsyncs it. We SIGKILL it at a seeded random moment, reopen the directory here (recovery runs,
no cleaner) and check:

* verify_data_dir finds no error and no unreferenced segment object is left in the hot store;
* offsets read are strictly increasing;
* every acked record is read at its offset, byte-identical, or superseded by a newer record of
  its key; the newest record of each key is its newest acked one (a tombstone stays a None:
  delete.retention.ms is huge) or a later record the kill cut off before its ack;
* a record read that was never acked lies after its cycle's last ack (a kill window), never
  inside a cycle's acked range;

then repeat on the same directory until the time budget is spent (LOGLAKE_COMPACTION_SOAK_S,
default 360 s), and check compactions and merges really happened while the kills hit.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future
from itertools import pairwise
from pathlib import Path

import pytest

pytestmark = pytest.mark.long

TOPIC = "soak"
PARTITIONS = 2
HOT_KEYS = 6  # written all the time
WINDOWS = 4  # and 4 windows of 4 cold keys, one written at a time: the others go quiet, so
WINDOW_KEYS = 4  # compaction also rewrites segments holding a key's newest record
WINDOW_RECORDS = 500
IN_FLIGHT = 8
TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "durability": "fsync",
    "segment.records": "16",
    "segment.bytes": "16384",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "250",  # the young tail piles up segments for the merger
    "delete.retention.ms": str(10 * 365 * 86_400_000),
}
CHILD_CONFIG = {
    "wal_shards": 2,
    "wal_file_bytes": 256 * 1024,
    "cleaner_threads": 1,
    "cleaner_backoff_ms": 5,
    "merge_min_segments": 3,
    "merge_min_age_ms": 0,
    "cleaner_io_max_bytes_per_second": 0,
    "cleaner_dedupe_buffer_bytes": 1 << 20,
}
BUDGET_S = float(os.environ.get("LOGLAKE_COMPACTION_SOAK_S", "360"))

Ack = tuple[int, int, int, bool]  # key index, cycle, seq, tombstone


def key_of(k: int) -> bytes:
    return f"key-{k}".encode()


def value_for(k: int, cycle: int, seq: int) -> bytes:
    return f"k{k}-c{cycle}-s{seq}|".encode() * (1 + seq % 8)


# ---- the child ----------------------------------------------------------------------------------


def child_main(data_dir: str, cycle: int, ack_path: str, seed: int) -> None:
    from loglake.engine import open_engine

    engine = open_engine(data_dir, **CHILD_CONFIG)
    if not engine.has_topic(TOPIC):
        engine.create_topic(TOPIC, PARTITIONS, TOPIC_CONFIG)
    stats = engine.cleaner.stats

    def report() -> None:  # the parent keeps the last complete line it got before the kill
        while True:
            sys.stdout.write(f"stats {stats.passes} {stats.merges} {stats.aborted} {stats.errors}\n")
            sys.stdout.flush()
            time.sleep(0.05)

    print("ready", flush=True)
    threading.Thread(target=report, daemon=True).start()
    rng = random.Random(seed)
    fd = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    pending: deque[tuple[int, int, bool, Future]] = deque()  # type: ignore[type-arg]
    seq = 0
    while True:
        if rng.random() < 0.5:
            k = rng.randrange(HOT_KEYS)
        else:
            window = (cycle + seq // WINDOW_RECORDS) % WINDOWS
            k = HOT_KEYS + window * WINDOW_KEYS + rng.randrange(WINDOW_KEYS)
        tomb = rng.random() < 0.15
        value = None if tomb else value_for(k, cycle, seq)
        fut = engine.append_records(TOPIC, k % PARTITIONS, [(None, key_of(k), value, [])])
        pending.append((k, seq, tomb, fut))
        seq += 1
        if len(pending) >= IN_FLIGHT:
            dk, dseq, dtomb, dfut = pending.popleft()
            offset = dfut.result().base_offset
            os.write(fd, f"ack {dk % PARTITIONS} {offset} {dk} {cycle} {dseq} {int(dtomb)}\n".encode())
            os.fsync(fd)


# ---- the parent ---------------------------------------------------------------------------------


def run_cycle(data_dir: Path, ack_path: Path, cycle: int, rng: random.Random) -> tuple[int, int, int, int]:
    """One child life, killed at a random moment; returns its last cleaner stats line."""
    err_path = data_dir.parent / "child.err"
    with open(err_path, "a") as err:
        err.write(f"--- cycle {cycle}\n")
        err.flush()
        child = subprocess.Popen(
            [sys.executable, __file__, str(data_dir), str(cycle), str(ack_path), str(rng.randrange(1 << 30))],
            stdout=subprocess.PIPE, stderr=err, text=True,
        )
        assert child.stdout is not None
        first = child.stdout.readline()
        assert first.strip() == "ready", f"cycle {cycle}: child did not start: {first!r} {err_path.read_text()}"
        time.sleep(rng.uniform(0.2, 1.5))
        assert child.poll() is None, f"cycle {cycle}: child died before the kill: {err_path.read_text()[-3000:]}"
        os.kill(child.pid, signal.SIGKILL)
        out, _ = child.communicate(timeout=30)
    stats = [line.split() for line in out.splitlines() if line.startswith("stats ")]
    stats = [s for s in stats if len(s) == 5]
    return tuple(int(x) for x in stats[-1][1:]) if stats else (0, 0, 0, 0)  # type: ignore[return-value]


def read_acks(ack_path: Path) -> dict[tuple[int, int], Ack]:
    acked: dict[tuple[int, int], Ack] = {}
    if not ack_path.exists():
        return acked
    for line in ack_path.read_text().split("\n")[:-1]:  # the last piece was cut by a kill or is ""
        parts = line.split()
        if len(parts) != 7 or parts[0] != "ack":
            continue  # a torn line: not an ack the child saw through
        p, off, k, c, s, t = (int(x) for x in parts[1:])
        acked[(p, off)] = (k, c, s, bool(t))
    return acked


def check_state(state: dict[int, list[tuple[int, bytes | None, bytes | None]]], acked: dict[tuple[int, int], Ack], where: str) -> int:
    """The oracle of the module docstring; returns how many unacked (kill-window) records were read."""
    last_ack: dict[tuple[int, int], int] = {}  # (cycle, partition) -> its last acked offset
    first_ack: dict[tuple[int, int], int] = {}
    for (p, off), (_k, c, _s, _t) in acked.items():
        last_ack[(c, p)] = max(last_ack.get((c, p), -1), off)
        first_ack[(c, p)] = min(first_ack.get((c, p), off), off)
    unacked = 0
    for p in range(PARTITIONS):
        recs = state.get(p, [])
        offsets = [o for o, _k, _v in recs]
        assert all(a < b for a, b in pairwise(offsets)), f"{where}: offsets not increasing in {p}"
        read = {o: (key, value) for o, key, value in recs}
        newest: dict[bytes | None, int] = {}
        for o, key, _v in recs:
            newest[key] = o
        for o, (key, value) in read.items():
            if (p, o) in acked:
                continue
            unacked += 1
            inside = [c for (c, q), last in last_ack.items() if q == p and first_ack[(c, q)] <= o <= last]
            assert not inside, f"{where}: unacked record at {p}/{o} inside cycle {inside}'s acked range"
            if value is not None:  # a value names its writer: it must be from that cycle's kill window
                k, c, s = (int(x[1:]) for x in value.split(b"|")[0].decode().split("-"))
                assert key == key_of(k) and value == value_for(k, c, s), f"{where}: foreign record at {p}/{o}"
                assert o > last_ack.get((c, p), -1), f"{where}: unacked record at {p}/{o} before cycle {c}'s last ack"
        newest_acked: dict[int, int] = {}
        for (q, off), (k, c, s, tomb) in acked.items():
            if q != p:
                continue
            newest_acked[k] = max(newest_acked.get(k, -1), off)
            if off in read:
                want = (key_of(k), None if tomb else value_for(k, c, s))
                assert read[off] == want, f"{where}: acked record at {p}/{off} changed: {read[off]!r} != {want!r}"
            else:
                assert newest.get(key_of(k), -1) > off, f"{where}: acked record at {p}/{off} (key {k}) lost, not superseded"
        for k, off in newest_acked.items():
            assert newest[key_of(k)] >= off, f"{where}: key {k}'s newest record is older than its newest ack"
    return unacked


@pytest.mark.timeout(3600)
def test_compaction_and_merging_survive_kill_minus_nine(tmp_path: Path) -> None:
    from loglake.engine import open_engine
    from loglake.engine.verify import verify_data_dir

    from enginekit import read_all

    seed = int(os.environ.get("LOGLAKE_SEED", "23"))
    rng = random.Random(seed)
    data_dir = tmp_path / "data"
    ack_path = tmp_path / "acks"
    started = time.monotonic()
    totals = [0, 0, 0, 0]  # cleaner passes, merges, aborted, errors (summed over the children)
    rewritten: set[str] = set()  # distinct `-g<n>.seg` objects seen referenced after a kill
    cycle = unacked = replayed = 0
    orphans: list[str] = []  # what recovery removed: a kill between a rewrite's PUT and its switch, or after
    acked: dict[tuple[int, int], Ack] = {}
    while cycle < 3 or time.monotonic() - started < BUDGET_S:
        where = f"seed={seed} cycle={cycle}"
        for i, n in enumerate(run_cycle(data_dir, ack_path, cycle, rng)):
            totals[i] += n
        acked = read_acks(ack_path)
        engine = open_engine(str(data_dir), wal_shards=2, wal_file_bytes=256 * 1024, cleaner_threads=0)
        try:
            assert engine.recovery_report is not None
            replayed += engine.recovery_report.wal_frames_replayed
            orphans += engine.recovery_report.orphans_removed
            # the open seals the replayed tail in the background: wait for those seals, whose
            # objects are PUT before they are recorded (an object in that window is not an
            # orphan; one left by the killed child is, and recovery removed it above)
            engine.flush()
            report = verify_data_dir(engine)
            assert report.ok, f"{where}: {[str(e) for e in report.errors[:5]]}"
            assert not report.unreferenced, f"{where}: unreferenced objects left: {report.unreferenced[:5]}"
            unacked = check_state(read_all(engine, TOPIC), acked, where)
            assert unacked <= (cycle + 1) * IN_FLIGHT, f"{where}: {unacked} unacked records read"
            for p in range(PARTITIONS):
                rewritten.update(s.key for s in engine.segments(TOPIC, p) if s.generation > 0)
        finally:
            engine.close()
        cycle += 1
    on_disk = sum(1 for f in (data_dir / "segments").rglob("*-g*.seg"))
    seconds = time.monotonic() - started
    print(
        f"\ncompaction soak: seed={seed} cycles={cycle} acked={len(acked)} unacked_read={unacked} "
        f"compaction_passes={totals[0]} merges={totals[1]} aborted={totals[2]} cleaner_errors={totals[3]} "
        f"rewritten_objects_seen={len(rewritten)} g_files_now={on_disk} wal_frames_replayed={replayed} "
        f"orphans_removed={len(orphans)} (rewritten: {sum('-g' in o for o in orphans)}) seconds={seconds:.0f}"
    )
    assert len(acked) > cycle * 10, "the children acknowledged too little for the test to mean anything"
    assert totals[0] > 0 and totals[1] > 0, f"no compaction ({totals[0]}) or merge ({totals[1]}) ran"
    assert rewritten, "no rewritten segment was ever referenced after a kill"
    assert totals[3] == 0, f"the cleaner failed {totals[3]} times (see the children's logs)"
    from longreport import record

    record(
        "compaction_kill9",
        {"seed": seed, "cycles": cycle, "acked": len(acked), "lost": 0, "compaction_passes": totals[0], "merges": totals[1],
         "orphans_removed": len(orphans), "seconds": round(seconds)},
    )


if __name__ == "__main__":
    child_main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
