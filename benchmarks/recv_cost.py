#!/usr/bin/env python3
"""Broker CPU per request and per GB, read from /proc: the receive path's cost (issue 35).

    .venv/bin/python benchmarks/recv_cost.py                                   # this tree, 2 runs
    .venv/bin/python benchmarks/recv_cost.py --tree before=/work/main/src --tree after=src --runs 3

Each `--tree LABEL=PATH` is a source tree put first on the broker's PYTHONPATH; runs go
interleaved (before, after, before, after, ...) so that the machine's drift falls on both. Per
run, a fresh `loglake serve` child (default settings: durability fsync, acks=all waits for the
WAL's fdatasync) and two phases, each on its own one-partition topic, driven by confluent-kafka:

* small: `--requests` Produce requests of one `--small-bytes` record each (linger.ms 0,
  batch.num.messages 1, so one record per batch and, on one partition, one batch per request;
  5 requests in flight); the broker's CPU seconds (utime + stime of its /proc/<pid>/stat)
  over the phase divided by the requests: microseconds of broker CPU per request;
* bulk: `--bulk-mb` MB of 1 KiB records in batches of up to 1,000,000 bytes (linger.ms 100);
  broker CPU seconds per GB (10^9 bytes) of record values.

CPU is read once the producer has connected and a warm-up record is acknowledged, and again
when every delivery report is in and the broker has gone quiet (the seals the phase started
count against it). A JSON document goes to stdout, a table (min and median per
tree) to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(utime, stime) of `pid` (all its threads), seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


class Broker:
    """A `loglake serve` child with `tree` first on its PYTHONPATH."""

    def __init__(self, tree: str, directory: Path) -> None:
        self.tree = tree
        self.directory = directory
        self.proc: subprocess.Popen[str] | None = None
        self.bootstrap = ""

    def __enter__(self) -> Broker:
        port_file = self.directory / "port"
        env = {**os.environ, "PYTHONPATH": self.tree}
        cmd = [
            sys.executable, "-m", "loglake.cli.main", "--log-level", "WARNING", "serve",
            "--data-dir", str(self.directory / "data"), "--listen", "127.0.0.1:0", "--port-file", str(port_file),
        ]
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(self.directory / "broker.log", "w"), text=True
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if port_file.exists() and port_file.read_text().strip():
                self.bootstrap = f"127.0.0.1:{port_file.read_text().split()[0]}"
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"broker did not start: {(self.directory / 'broker.log').read_text()[-2000:]}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @property
    def cpu(self) -> tuple[float, float]:
        assert self.proc is not None
        return cpu_seconds(self.proc.pid)


def _producer(bootstrap: str, extra: dict[str, Any]) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "acks": "all", **extra})


def _delivered(errors: list[str]) -> Any:
    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    return report


def _run_phase(broker: Broker, topic: str, config: dict[str, Any], count: int, value: bytes) -> tuple[float, float, float]:
    """Produce `count` records of `value` to `topic`; broker (CPU seconds, of them in the kernel, wall seconds)."""
    errors: list[str] = []
    report = _delivered(errors)
    p = _producer(broker.bootstrap, config)
    for _ in range(3):  # topic auto-created, connection and metadata warm
        p.produce(topic, value, callback=report)
        p.flush(30)
    errors.clear()
    cpu0, t0 = broker.cpu, time.monotonic()
    for _ in range(count):
        while True:
            try:
                p.produce(topic, value, callback=report)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    if p.flush(300) != 0:
        raise RuntimeError(f"{topic}: records still undelivered")
    t1 = time.monotonic()
    cpu1 = _settled(broker)
    if errors:
        raise RuntimeError(f"{topic}: {len(errors)} delivery errors, first: {errors[0]}")
    user, system = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    return user + system, system, t1 - t0


def _settled(broker: Broker, quiet_s: float = 0.01, cap_s: float = 20.0) -> tuple[float, float]:
    """The broker's CPU once the work a phase left behind (seals of the buffered data, WAL
    rolls) is done: it used less than `quiet_s` in half a second (at most `cap_s` of waiting)."""
    last = broker.cpu
    deadline = time.monotonic() + cap_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = broker.cpu
        if sum(now) - sum(last) < quiet_s:
            return now
        last = now
    return last


def one_run(label: str, tree: str, args: argparse.Namespace, base: Path) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(prefix=f"recv-{label}-", dir=base))
    try:
        with Broker(str(Path(tree).resolve()), directory) as b:
            small_cfg = {"linger.ms": 0, "batch.num.messages": 1, "max.in.flight.requests.per.connection": 5}
            cpu, system, wall = _run_phase(b, "small", small_cfg, args.requests, b"x" * args.small_bytes)
            small = {"requests": args.requests, "cpu_s": cpu, "system_s": system, "wall_s": wall,
                     "cpu_us_per_request": cpu / args.requests * 1e6}
            records = args.bulk_mb * 1_000_000 // 1024
            bulk_cfg = {"linger.ms": 100, "batch.size": 1_000_000, "queue.buffering.max.kbytes": 512 * 1024}
            cpu, system, wall = _run_phase(b, "bulk", bulk_cfg, records, b"y" * 1024)
            payload = records * 1024
            bulk = {"bytes": payload, "cpu_s": cpu, "system_s": system, "wall_s": wall, "cpu_s_per_gb": cpu / (payload / 1e9),
                    "mb_per_s": payload / 1e6 / wall}
        return {"tree": label, "path": tree, "small": small, "bulk": bulk}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def summarize(runs: list[dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label in labels:
        mine = [r for r in runs if r["tree"] == label]
        per_req = [r["small"]["cpu_us_per_request"] for r in mine]
        per_gb = [r["bulk"]["cpu_s_per_gb"] for r in mine]
        # user space alone: what the receive path's copies and Python cost (the kernel's part is
        # the socket, fsync and page cache work, the same for both)
        user_gb = [(r["bulk"]["cpu_s"] - r["bulk"]["system_s"]) / (r["bulk"]["bytes"] / 1e9) for r in mine]
        out[label] = {
            "cpu_us_per_request": {"min": min(per_req), "median": statistics.median(per_req), "all": per_req},
            "cpu_s_per_gb": {"min": min(per_gb), "median": statistics.median(per_gb), "all": per_gb},
            "user_cpu_s_per_gb": {"min": min(user_gb), "median": statistics.median(user_gb), "all": user_gb},
        }
    return out


def table(summary: dict[str, Any]) -> str:
    lines = [
        f"{'tree':<10} {'µs CPU/request min':>19} {'median':>8} {'CPU-s/GB min':>13} {'median':>8}"
        f" {'user CPU-s/GB min':>18} {'median':>8}",
    ]
    for label, s in summary.items():
        r, g, u = s["cpu_us_per_request"], s["cpu_s_per_gb"], s["user_cpu_s_per_gb"]
        lines.append(
            f"{label:<10} {r['min']:>19.0f} {r['median']:>8.0f} {g['min']:>13.2f} {g['median']:>8.2f}"
            f" {u['min']:>18.2f} {u['median']:>8.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", default=[], help="LABEL=PATH of a source tree (repeatable; default: this tree)")
    ap.add_argument("--runs", type=int, default=2, help="runs per tree, interleaved")
    ap.add_argument("--requests", type=int, default=20_000, help="one-record Produce requests per run")
    ap.add_argument("--small-bytes", type=int, default=100, help="value size of the one-record requests")
    ap.add_argument("--bulk-mb", type=int, default=1000, help="MB of 1 KiB records in the bulk phase")
    ap.add_argument("--dir", default=str(ROOT), help="where the brokers' data directories go (a real disk: fsync counts)")
    args = ap.parse_args(argv)
    trees = [t.split("=", 1) for t in args.tree] or [["this", str(ROOT / "src")]]
    labels = [label for label, _ in trees]
    runs: list[dict[str, Any]] = []
    for i in range(args.runs):
        for label, path in trees:
            r = one_run(label, path, args, Path(args.dir))
            print(
                f"run {i + 1} {label}: {r['small']['cpu_us_per_request']:.0f} µs CPU/request "
                f"({r['small']['system_s'] / r['small']['cpu_s']:.0%} kernel), {r['bulk']['cpu_s_per_gb']:.2f} CPU-s/GB "
                f"({r['bulk']['system_s'] / r['bulk']['cpu_s']:.0%} kernel, {r['bulk']['mb_per_s']:.0f} MB/s)",
                file=sys.stderr, flush=True,
            )
            runs.append(r)
    summary = summarize(runs, labels)
    print(table(summary), file=sys.stderr)
    json.dump({"runs": runs, "summary": summary}, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
