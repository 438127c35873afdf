#!/usr/bin/env python3
"""Restart time after kill -9 with a large unsealed WAL (issue 31, item 10).

A real `loglake serve` child process takes `--produce-mib` (1 GiB) of records from one
confluent-kafka producer (acks=all, 1 KiB values in 16 KiB batches, 8 partitions) on a topic
configured so that nothing seals by size or age on its own (segment.bytes 1 GiB, segment.ms a
day, segment.records off), with a memory budget that never forces an emergency seal: before
issue 31 the whole GiB stayed unsealed in the WAL; now the replay bound (`wal_replay_bytes_max`)
holds. Right after the last acknowledgement the broker is killed with SIGKILL and started again
on the same data directory; the time from the kill to its "loglake listening on" line is the
restart time. Also reported: what the WAL files and the memory pool held at the kill, the
engine's own recovery time and replay counts from its log line, and whether every acknowledged
record is there after the restart (the high watermarks).

    .venv/bin/python benchmarks/restart.py                      # 1 GiB, ~30 s
    .venv/bin/python benchmarks/restart.py --produce-mib 256 --runs 3
    .venv/bin/python benchmarks/restart.py --json-out /tmp/restart.json --engine wal_replay_bytes_max=1073741824

The broker runs from the source tree first on PYTHONPATH (run it with PYTHONPATH=/path/to/src of
another checkout to measure that one). JSON goes to stdout, progress and a table to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from brokerkit import Broker  # noqa: E402

MIB = 1024 * 1024
TOPIC = "restart"
#: Topic configs under which nothing seals by size or age during the run.
UNSEALED_TOPIC = {"segment.bytes": str(1 << 30), "segment.ms": str(24 * 3600 * 1000), "segment.records": "0"}
RECOVERED_RE = re.compile(
    r"recovered \d+ topics / \d+ partitions in ([\d.]+)s: (\d+) WAL frames replayed \((\d+) already sealed\)"
)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rpartition(" ")[2])
    return total


def wal_log_bytes(data: Path) -> int:
    """Bytes of the WAL files a restart reads (`wal-*.log`; spare files are not read)."""
    return sum(f.stat().st_size for f in (data / "wal").rglob("wal-*.log"))


def produce(bootstrap: str, mib: int, value_bytes: int, partitions: int, batch_bytes: int, linger_ms: float) -> dict[str, Any]:
    errors: list[str] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": linger_ms,
            "batch.size": batch_bytes,
            "compression.type": "none",
            "queue.buffering.max.kbytes": 1_048_576,
            "message.timeout.ms": 300_000,
            "delivery.report.only.error": True,
            "on_delivery": lambda err, _msg: errors.append(str(err)),
            "log_level": 3,
        }
    )
    values = [os.urandom(value_bytes) for _ in range(64)]
    count = mib * MIB // value_bytes
    started = time.perf_counter()
    i = 0
    while i < count:
        try:
            producer.produce(TOPIC, values[i % 64], partition=i % partitions)
            i += 1
        except BufferError:
            producer.poll(0.001)
    left = producer.flush(300)
    seconds = time.perf_counter() - started
    if left or errors:
        raise RuntimeError(f"produce failed: {left} undelivered, errors {errors[:3]}")
    return {"records": count, "seconds": seconds, "mib_per_s": count * value_bytes / MIB / seconds}


def high_watermarks(bootstrap: str, partitions: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "restart-bench", "log_level": 3})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)[1] for p in range(partitions))
    finally:
        consumer.close()


def one_run(base: Path, args: argparse.Namespace, run: int) -> dict[str, Any]:
    data = base / f"run-{run}" / "data"
    data.mkdir(parents=True)
    port = free_port()
    env = {
        # room for the whole run unsealed: no emergency seal by memory pressure
        "LOGLAKE_ENGINE__MEMORY_BUDGET_BYTES": str(max(512 * MIB, 3 * args.produce_mib * MIB)),
        **{f"LOGLAKE_ENGINE__{k.upper()}": v for k, v in (e.split("=", 1) for e in args.engine)},
    }
    broker = Broker(data, ["--metrics-listen", f"127.0.0.1:{port}"], env=env)
    metrics = f"http://127.0.0.1:{port}/metrics"
    broker.start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, args.partitions, config=UNSEALED_TOPIC)])[TOPIC].result(30)
        log(f"run {run}: producing {args.produce_mib} MiB of {args.value_bytes} B records ...")
        produced = produce(
            broker.bootstrap, args.produce_mib, args.value_bytes, args.partitions, args.batch_bytes, args.linger_ms
        )
        unsealed = metric(metrics, "loglake_memory_pool_used_bytes")
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGKILL)
        killed = time.perf_counter()
        broker.stop(signal.SIGKILL)
        dead = time.perf_counter()
        wal_bytes = wal_log_bytes(data)  # what the restart reads
        log(f"run {run}: killed with {unsealed / MIB:.0f} MiB unsealed, {wal_bytes / MIB:.0f} MiB of WAL files; restarting ...")
        started = time.perf_counter()
        broker.start()
        restart_s = dead - killed + time.perf_counter() - started  # not the counting in between
        found = RECOVERED_RE.findall(broker.log_text())
        recovery_s, replayed, skipped = (float(found[-1][0]), int(found[-1][1]), int(found[-1][2])) if found else (-1.0, -1, -1)
        recovered = high_watermarks(broker.bootstrap, args.partitions)
    finally:
        code = broker.stop(timeout=300) if broker.running else 0
    return {
        "produced_mib": args.produce_mib,
        "records": produced["records"],
        "produce_mib_per_s": produced["mib_per_s"],
        "unsealed_bytes_at_kill": int(unsealed),
        "wal_file_bytes_at_kill": wal_bytes,
        "restart_seconds": restart_s,
        "recovery_seconds_logged": recovery_s,
        "wal_frames_replayed": replayed,
        "wal_frames_already_sealed": skipped,
        "records_after_restart": recovered,
        "all_acked_records_there": recovered == produced["records"],
        "clean_stop_exit_code": code,
    }


def fmt_table(doc: dict[str, Any]) -> str:
    rows = [
        ("run", "produced", "MiB/s", "unsealed at kill", "WAL files at kill", "kill -9 to listening", "recovery (log)", "frames replayed", "all there"),
    ]
    for i, r in enumerate(doc["runs"]):
        rows.append(
            (
                str(i),
                f"{r['produced_mib']} MiB",
                f"{r['produce_mib_per_s']:.0f}",
                f"{r['unsealed_bytes_at_kill'] / MIB:.0f} MiB",
                f"{r['wal_file_bytes_at_kill'] / MIB:.0f} MiB",
                f"{r['restart_seconds']:.2f} s",
                f"{r['recovery_seconds_logged']:.2f} s",
                f"{r['wal_frames_replayed']:,}",
                "yes" if r["all_acked_records_there"] else "NO",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--produce-mib", type=int, default=1024)
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch-bytes", type=int, default=16384, help="the producer's batch.size (Kafka's default)")
    parser.add_argument("--linger-ms", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--engine", action="append", default=[], metavar="NAME=VALUE", help="an engine setting for the broker")
    parser.add_argument("--dir", help="where the data directories go (default: a temp dir next to the repository)")
    parser.add_argument("--json-out")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="restart-bench-", dir=args.dir or ROOT.parent))
    try:
        runs = [one_run(base, args, i) for i in range(args.runs)]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    import loglake

    doc = {
        "benchmark": "restart",
        "source": os.path.dirname(loglake.__file__),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "settings": {
            "value_bytes": args.value_bytes, "batch_bytes": args.batch_bytes, "linger_ms": args.linger_ms, "partitions": args.partitions, "engine": args.engine, "topic": UNSEALED_TOPIC},
        "runs": runs,
        "restart_seconds_max": max(r["restart_seconds"] for r in runs),
    }
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    log(fmt_table(doc))
    return 0 if all(r["all_acked_records_there"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
