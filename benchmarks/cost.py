#!/usr/bin/env python3
"""Performance as cost (issue 35): what a `loglake serve` process spends per byte and per request,
read from /proc and /sys, beside the machine's limits measured in the same run.

    .venv/bin/python benchmarks/cost.py                      # one run of each event loop, ~2 min
    .venv/bin/python benchmarks/cost.py --runs 4 --json-out /tmp/cost.json   # interleaved, ~8 min
    .venv/bin/python benchmarks/cost.py --event-loops asyncio --ingest-mb 200 --latency-seconds 10

What is measured, per run and event loop (`--event-loops asyncio,uvloop`; a loop that cannot be
imported here is reported as not available), on a fresh broker child (benchmarks' default
engine settings: durability class fsync, one partition, acks=all waits for the WAL fdatasync):

1. **ingest**: `--ingest-mb` of 1 KiB records from one confluent-kafka producer in 1 MB batches
   (batch.size 1,000,000, linger.ms 100), acks=all. The broker's CPU seconds (utime + stime of
   /proc/<pid>/stat, user and system apart) and the data device's written bytes
   (/sys/dev/block/<major>:<minor>/stat of the device holding the data dir) from before the first
   record until the broker is idle again after the last acknowledgement (so the seals the ingest
   caused count). Figures: CPU-s per GB of payload, device bytes per payload byte.
2. **requests**: `--requests` produce requests of one 100 B record (linger.ms 0, paced at
   `--request-rate` in 100 µs ticks); the broker's CPU over the Produce requests its /metrics
   counted: CPU µs per request, records per request (1.0 when every request carried one record),
   and the acknowledgements' p50, p99 and max.
3. **latency**: 100 B records at `--latency-rate` (10,000/s) for `--latency-seconds`, as issue 35
   measured them: benchmarks/broker.py's paced producer (1 ms ticks, linger.ms 1, so ~17 records
   in a request). librdkafka's latency of every sampled record (produce() to delivery report):
   p50, p99, max, and each second's p99 and max beside what the machine did in that second (the
   broker's CPU and its threads' time runnable without a core, the whole machine's busy CPU, the
   data device's writes, discards and flushes and the time it spent on each, the seconds tasks
   stalled for a core or for I/O from /proc/pressure), so a stretch of slow
   acknowledgements (a second whose p99 is above `--stretch-ms`) is named with its time and its
   company; the broker's CPU per record and per request; its collector, WAL and back-pressure
   counters (/metrics) over the phase.

Machine, once per run before the brokers: sequential write of `--machine-mb` in 1 MiB pwrites
with one fdatasync at the end (as `dd conv=fdatasync`) and with one every 1 MiB (what an acks=all
producer of 1 MB batches can get at most), median of 3; 4 KiB pwrite + fdatasync latency on the
data dir's filesystem (benchmarks/disk_limits.py); the load average and the whole machine's busy
CPU seconds over the run (/proc/stat), so other users' load shows beside the figures.

`--runs N` interleaves the event loops (asyncio then uvloop, then uvloop then asyncio, ...) and
summarises each figure as min and median over the runs. JSON on stdout, progress and the table on
stderr (docs/PERFORMANCE.md, "Cost").
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from benchkit import emit, load_benchmark  # noqa: E402

from brokerkit import Broker, free_port  # noqa: E402

client = load_benchmark("broker_client")
disk = load_benchmark("disk_limits")
cores = load_benchmark("cluster_cores")
log = client.log

EVENT_LOOPS = ("asyncio", "uvloop")
INGEST_RECORD_BYTES = 1024
REQUEST_RECORD_BYTES = 100
#: The 1 MB batches of the ingest: librdkafka fills a batch to batch.size or for linger.ms.
INGEST_PRODUCER = {"batch.size": 1_000_000, "linger.ms": 100}
#: The broker is idle again once it spends less than this share of a core over IDLE_PROBE_S, twice.
IDLE_CPU_SHARE = 0.05
IDLE_PROBE_S = 0.5
SETTLE_TIMEOUT_S = 120.0
#: The producer's pacing tick in the one-record phases: at 10,000 records/s a 1 ms tick would put
#: ten records in each request even with linger.ms 0; 100 µs puts one in most.
TICK_S = 0.0001

#: The figures, by key: (label, issue 35's target, the issue's own measurement before it); None
#: where the issue names none. Labels are formatted with the run's settings.
TARGETS: dict[str, tuple[str, float | None, float | None]] = {
    "ingest_cpu_s_per_gb": ("broker CPU-s per GB ingested, 1 KiB records in 1 MB batches, acks=all", 1.5, 5.4),
    "device_bytes_per_payload_byte": ("device bytes written per payload byte, same ingest", 1.3, 2.36),
    "request_cpu_us": ("broker CPU µs per one-record Produce request ({request_rate:,.0f} requests/s)", 100.0, 600.0),
    "request_latency_p99_ms": ("ack p99 ms, {request_rate:,.0f} one-record requests/s", 5.0, None),
    "request_latency_max_ms": ("ack max ms, {request_rate:,.0f} one-record requests/s", 50.0, None),
    "latency_p99_ms": ("ack p99 ms, {latency_rate:,.0f} records/s of 100 B, linger.ms {latency_linger_ms:g}", 5.0, 11.1),
    "latency_max_ms": ("ack max ms, {latency_rate:,.0f} records/s of 100 B, linger.ms {latency_linger_ms:g}", 50.0, 550.0),
    "latency_records_per_request": ("records per Produce request, same run", None, None),
    "latency_cpu_us_per_record": ("broker CPU µs per record, same run", None, 50.0),
}


# ==== the machine ====================================================================================


def machine(directory: str, write_mb: int, fsync_samples: int) -> dict[str, Any]:
    total = write_mb * disk.MiB
    log(f"machine: sequential write {write_mb} MiB, one fdatasync (dd conv=fdatasync) x3 ...")
    dd = disk.repeated(3, lambda: disk.raw_sequential_write(directory, total))
    log(f"machine: sequential write {write_mb} MiB, fdatasync every 1 MiB x3 ...")
    every1 = disk.repeated(3, lambda: disk.raw_sequential_write(directory, total, sync_every=disk.MiB))
    log(f"machine: 4 KiB pwrite + fdatasync latency x{fsync_samples} ...")
    lat = disk.fdatasync_latency(directory, fsync_samples)
    return {
        "device": device_name(directory),
        "write_mb_per_s_one_fdatasync": dd["mb_per_s"],
        "write_mb_per_s_one_fdatasync_runs": dd["runs_mb_per_s"],
        "write_mb_per_s_fdatasync_every_1MiB": every1["mb_per_s"],
        "write_mb_per_s_fdatasync_every_1MiB_runs": every1["runs_mb_per_s"],
        "fdatasync_p50_ms": lat["p50_ms"],
        "fdatasync_p99_ms": lat["p99_ms"],
        "fdatasync_max_ms": lat["max_ms"],
    }


def device_name(path: str) -> str:
    """The block device holding `path` (its /sys name, e.g. vda), or "?"."""
    dev = os.stat(path).st_dev
    try:
        return Path(os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")).name
    except OSError:
        return "?"


# ==== the broker's costs =============================================================================


def cpu(pid: int) -> tuple[float, float]:
    return client.proc_cpu_times(pid)  # type: ignore[no-any-return]


def settle(pid: int) -> float:
    """Wait until the broker is idle (its seals and checkpoints done); seconds waited."""
    started = time.perf_counter()
    quiet = 0
    before = sum(cpu(pid))
    while quiet < 2 and time.perf_counter() - started < SETTLE_TIMEOUT_S:
        time.sleep(IDLE_PROBE_S)
        now = sum(cpu(pid))
        quiet = quiet + 1 if now - before < IDLE_CPU_SHARE * IDLE_PROBE_S else 0
        before = now
    return time.perf_counter() - started


def ingest(broker: Broker, pid: int, megabytes: float) -> dict[str, Any]:
    count = max(1, int(megabytes * 1e6 / INGEST_RECORD_BYTES))
    topic = "cost-ingest"
    cores.create_topic(broker.bootstrap, topic, 1)
    data = str(broker.data_dir)
    log(f"  ingest: {count:,} x 1 KiB in 1 MB batches, acks=all ...")
    u0, s0 = cpu(pid)
    d0 = disk.device_write_bytes(data)
    prod = client.produce_throughput(broker.bootstrap, topic, INGEST_RECORD_BYTES, count, pid, INGEST_PRODUCER)
    u1, s1 = cpu(pid)
    waited = settle(pid)
    u2, s2 = cpu(pid)
    d1 = disk.device_write_bytes(data)
    payload = count * INGEST_RECORD_BYTES
    user, system = u2 - u0, s2 - s0
    row = {
        "records": count,
        "payload_bytes": payload,
        "mb_per_s": prod["mb_per_s"],
        "cpu_s": user + system,
        "cpu_user_s": user,
        "cpu_system_s": system,
        "cpu_s_until_last_ack": (u1 - u0) + (s1 - s0),
        "settle_s": waited,
        "device_write_bytes": d1 - d0 if d0 >= 0 else None,
        "ingest_cpu_s_per_gb": (user + system) / (payload / 1e9),
        "device_bytes_per_payload_byte": (d1 - d0) / payload if d0 >= 0 else None,
    }
    log(
        f"    {row['mb_per_s']:.0f} MB/s; {row['ingest_cpu_s_per_gb']:.2f} CPU-s/GB "
        f"(user {user:.1f} s, system {system:.1f} s, {waited:.1f} s to idle); "
        f"device {row['device_bytes_per_payload_byte'] or float('nan'):.2f} B per payload byte"
    )
    return row


def requests(broker: Broker, pid: int, metrics_url: str, count: int, rate: float) -> dict[str, Any]:
    topic = "cost-requests"
    cores.create_topic(broker.bootstrap, topic, 1)
    log(f"  requests: {count:,} one-record Produce requests of 100 B, linger.ms 0, {rate:,.0f}/s ...")
    m0 = client.scrape(metrics_url)
    u0, s0 = cpu(pid)
    lat = client.produce_latency(
        broker.bootstrap, topic, REQUEST_RECORD_BYTES, rate, count / rate, pid, linger_ms=0, tick_s=TICK_S
    )
    u1, s1 = cpu(pid)
    m1 = client.scrape(metrics_url)
    served = client.request_stats(m0, m1, "Produce")["requests"]
    user, system = u1 - u0, s1 - s0
    row = {
        "records": lat["records"] + 1,  # and produce_latency's warm-up record
        "produce_requests": served,
        "records_per_request": (lat["records"] + 1) / served if served else None,
        "cpu_s": user + system,
        "request_cpu_us": 1e6 * (user + system) / served if served else None,
        "request_cpu_user_us": 1e6 * user / served if served else None,
        "request_cpu_system_us": 1e6 * system / served if served else None,
        "latency_p50_ms": lat["p50_ms"],
        "latency_p99_ms": lat["p99_ms"],
        "latency_max_ms": lat["max_ms"],
    }
    log(
        f"    {served:,} requests, {row['records_per_request'] or 0:.2f} records each; "
        f"{row['request_cpu_us'] or 0:.0f} µs CPU per request (user {row['request_cpu_user_us'] or 0:.0f}); "
        f"ack p50 {lat['p50_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms, max {lat['max_ms']:.1f} ms"
    )
    return row


#: /metrics families whose change over the latency phase names what an acknowledgement waited
#: for: collector pauses, the WAL's fsyncs and stalls, back-pressure on produce.
WAIT_FAMILIES = (
    "loglake_gc_",
    "loglake_wal_fsync",
    "loglake_wal_stalls_total",
    "loglake_wal_groups_total",
    "loglake_memory_pool_waits_total",
    "loglake_produce_throttle",
    "loglake_request_read_pauses_total",
)


def metric_samples(metrics_url: str, families: tuple[str, ...] = WAIT_FAMILIES) -> dict[str, float]:
    """The broker's /metrics samples of `families` (name with labels -> value), summed by name."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(families):
            name, _, value = line.rpartition(" ")
            out[name] = out.get(name, 0.0) + float(value)
    return out


def pressure_stall_us(resource: str) -> float:
    """Microseconds some task waited on `resource` (cpu, io) since boot: /proc/pressure (PSI), or
    NaN where the kernel has none."""
    try:
        with open(f"/proc/pressure/{resource}") as f:
            return float(f.readline().rsplit("total=", 1)[1])
    except (OSError, IndexError, ValueError):
        return float("nan")


#: Fields of /sys/block/<dev>/stat (Documentation/block/stat.rst), 0-based: sectors written,
#: writes completed, ms writing, sectors discarded, ms discarding, flushes completed, ms flushing.
DEVICE_FIELDS = (6, 4, 7, 13, 14, 15, 16)


def device_stat(path: str) -> tuple[int, ...]:
    """`DEVICE_FIELDS` of the device holding `path` since boot (every process's I/O), -1 for a
    field this kernel does not report (discards since 4.18, flushes since 5.5)."""
    dev = os.stat(path).st_dev
    try:
        with open(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat") as f:
            fields = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        fields = []
    return tuple(fields[i] if i < len(fields) else -1 for i in DEVICE_FIELDS)


def runqueue_wait_s(pid: int) -> float:
    """Seconds the threads of `pid` have been runnable without a core (/proc/<pid>/task/*/schedstat,
    the second field; threads that ended are not counted)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


#: What `Sampler` reads each second: the broker's CPU and the time its threads waited for a core,
#: the machine's busy CPU, the data device's writes, discards and flushes, and the time tasks
#: stalled waiting for a core or for I/O (PSI, machine-wide).
SAMPLED = (
    "broker_cpu",
    "broker_runqueue_wait",
    "machine_busy_cpu",
    "device_write_mb",
    "device_writes",
    "device_write_ms",
    "device_discard_mb",
    "device_discard_ms",
    "device_flushes",
    "device_flush_ms",
    "cpu_stall",
    "io_stall",
)


class Sampler:
    """Each wall-clock second's costs beside the latency phase, on a thread of its own, so a slow
    second can be told apart: the broker busy, the machine busy (others' load), or the disk."""

    def __init__(self, pid: int, data_dir: str) -> None:
        self.pid = pid
        self.data_dir = data_dir
        self.samples: list[tuple[float, tuple[float, ...]]] = []  # (unix time, counters so far)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cost-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _read(self) -> tuple[float, ...]:
        sectors, writes, write_ms, discarded, discard_ms, flushes, flush_ms = device_stat(self.data_dir)
        return (
            sum(cpu(self.pid)),
            runqueue_wait_s(self.pid),
            cores.machine_cpu_seconds()[0],
            sectors * 512 / 1e6,
            float(writes),
            float(write_ms),
            discarded * 512 / 1e6,
            float(discard_ms),
            float(flushes),
            float(flush_ms),
            pressure_stall_us("cpu") / 1e6,
            pressure_stall_us("io") / 1e6,
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), self._read()))
            self._stop.wait(1.0)

    def second_at(self, unix: float) -> dict[str, float] | None:
        """Per wall-clock second over the sampling second holding `unix`: CPU in cores, the
        broker's threads' seconds runnable without a core (summed over threads), device MB and
        writes and ms writing, stall seconds (cpu_stall 0.5: some task waited for a core half of it)."""
        for (t0, c0), (t1, c1) in zip(self.samples, self.samples[1:], strict=False):
            if t0 <= unix < t1:
                return {k: round((b - a) / (t1 - t0), 3) for k, a, b in zip(SAMPLED, c0, c1, strict=True)}
        return None


def latency(
    broker: Broker, pid: int, metrics_url: str, rate: float, seconds: float, linger_ms: float, stretch_ms: float
) -> dict[str, Any]:
    topic = "cost-latency"
    cores.create_topic(broker.bootstrap, topic, 1)
    log(f"  latency: 100 B records at {rate:,.0f}/s in 1 ms ticks for {seconds:.0f} s, linger.ms {linger_ms:g} ...")
    g0 = metric_samples(metrics_url)
    m0 = client.scrape(metrics_url)
    c0 = sum(cpu(pid))
    with Sampler(pid, str(broker.data_dir)) as sampler:
        lat = client.produce_latency(
            broker.bootstrap, topic, REQUEST_RECORD_BYTES, rate, seconds, pid, linger_ms=linger_ms, per_second=True
        )
    c1 = sum(cpu(pid))
    m1 = client.scrape(metrics_url)
    g1 = metric_samples(metrics_url)
    served = client.request_stats(m0, m1, "Produce")["requests"]
    for sec in lat["per_second"]:
        sec["machine"] = sampler.second_at(lat["started_unix"] + sec["second"] + 0.5)
    slow = [s for s in lat["per_second"] if s["p99_ms"] > stretch_ms]
    counted = sorted(k for k in g1 if "pause_max" not in k and "frozen" not in k and g1[k] != g0.get(k, 0.0))
    row = {
        "rate": rate,
        "seconds": seconds,
        "linger_ms": linger_ms,
        "achieved_rate": lat["achieved_rate"],
        "samples": lat["samples"],
        "produce_requests": served,
        "records_per_request": (lat["records"] + 1) / served if served else None,
        "cpu_s": c1 - c0,
        "cpu_us_per_record": 1e6 * (c1 - c0) / (lat["records"] + 1),
        "cpu_us_per_request": 1e6 * (c1 - c0) / served if served else None,
        "latency_p50_ms": lat["p50_ms"],
        "latency_p99_ms": lat["p99_ms"],
        "latency_p999_ms": lat["p999_ms"],
        "latency_max_ms": lat["max_ms"],
        "ticks_behind": lat["ticks_behind"],
        "broker_cpu_pct": lat["broker_cpu_pct"],
        "started_unix": lat["started_unix"],
        "per_second": lat["per_second"],
        "stretch_ms": stretch_ms,
        "slow_seconds": [
            {**s, "at": time.strftime("%H:%M:%S", time.gmtime(lat["started_unix"] + s["second"]))} for s in slow
        ],
        "waits": {k: g1[k] - g0.get(k, 0.0) for k in counted},
        "gc_pause_max_s": {k: v for k, v in g1.items() if "pause_max" in k},
    }
    log(
        f"    p50 {row['latency_p50_ms']:.2f} ms, p99 {row['latency_p99_ms']:.2f} ms, max {row['latency_max_ms']:.1f} ms; "
        f"{row['records_per_request'] or 0:.1f} records per request, CPU {row['cpu_us_per_record']:.0f} µs per record, "
        f"{row['cpu_us_per_request'] or 0:.0f} per request; "
        f"{len(slow)} second(s) with p99 > {stretch_ms:g} ms"
        + (f" at {', '.join(s['at'] for s in row['slow_seconds'])} UTC" if slow else "")
    )
    return row


def one_loop(work: Path, loop: str, run: int, args: argparse.Namespace) -> dict[str, Any]:
    if loop != "asyncio" and importlib.util.find_spec(loop) is None:
        log(f"{loop}: not available in this venv (pip install 'loglake[fast]')")
        return {"event_loop": loop, "run": run, "available": False}
    port = free_port()
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    data = work / f"data-{loop}-{run}"
    broker_args = ["--metrics-listen", f"127.0.0.1:{port}", "--event-loop", loop, *args.broker_arg]
    log(f"run {run}, {loop}: a fresh broker ...")
    broker = Broker(data, broker_args, log_level=args.log_level).start()
    assert broker.proc is not None
    pid = broker.proc.pid
    row: dict[str, Any] = {"event_loop": loop, "run": run, "available": True, "broker_args": broker_args}
    try:
        busy0, _ = cores.machine_cpu_seconds()
        started = time.perf_counter()
        row["ingest"] = ingest(broker, pid, args.ingest_mb)
        row["requests"] = requests(broker, pid, metrics_url, args.requests, args.request_rate)
        row["latency"] = latency(
            broker, pid, metrics_url, args.latency_rate, args.latency_seconds, args.latency_linger_ms, args.stretch_ms
        )
        busy1, _ = cores.machine_cpu_seconds()
        row["wall_s"] = time.perf_counter() - started
        row["machine_busy_cpu_s"] = busy1 - busy0
        row["broker_exit_code"] = broker.stop()
        row["broker_log_warnings"] = [
            line for line in broker.log_text().splitlines() if " WARNING " in line or " ERROR " in line
        ][:10]
        if args.keep:
            row["broker_log"] = str(broker.log_path)
    finally:
        if broker.running:
            broker.stop()
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)
    return row


# ==== the figures ====================================================================================


def figures(row: dict[str, Any]) -> dict[str, float | None]:
    """The four figures of issue 35's table (latency as p99 and max) of one broker run."""
    return {
        "ingest_cpu_s_per_gb": row["ingest"]["ingest_cpu_s_per_gb"],
        "device_bytes_per_payload_byte": row["ingest"]["device_bytes_per_payload_byte"],
        "request_cpu_us": row["requests"]["request_cpu_us"],
        "request_latency_p99_ms": row["requests"]["latency_p99_ms"],
        "request_latency_max_ms": row["requests"]["latency_max_ms"],
        "latency_p99_ms": row["latency"]["latency_p99_ms"],
        "latency_max_ms": row["latency"]["latency_max_ms"],
        "latency_records_per_request": row["latency"]["records_per_request"],
        "latency_cpu_us_per_record": row["latency"]["cpu_us_per_record"],
    }


def spread(values: list[float]) -> dict[str, Any]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "runs": values}


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for loop in doc["event_loops"]:
        rows = [r for r in doc["runs"] if r["event_loop"] == loop and r["available"]]
        if not rows:
            out[loop] = {"available": False}
            continue
        per = [figures(r) for r in rows]
        out[loop] = {
            "available": True,
            **{k: spread([v for f in per if (v := f[k]) is not None]) for k in TARGETS if any(f[k] is not None for f in per)},
            "records_per_request": spread([r["requests"]["records_per_request"] or 0.0 for r in rows]),
        }
    out["machine"] = {
        k: spread([m[k] for m in doc["machine"]])
        for k in ("write_mb_per_s_one_fdatasync", "write_mb_per_s_fdatasync_every_1MiB", "fdatasync_p50_ms", "fdatasync_p99_ms")
    }
    return out


def fmt(value: float, key: str) -> str:
    if "cpu_us" in key:
        return f"{value:,.0f}"
    if key.endswith("max_ms"):
        return f"{value:,.1f}"
    return f"{value:,.2f}"


def fmt_table(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    runs = len(doc["machine"])
    m = s["machine"]
    loops = [loop for loop in doc["event_loops"] if s[loop]["available"]]
    lines = [
        f"machine ({runs} run(s), min / median): device {doc['machine'][0]['device']}; sequential write, one fdatasync "
        f"{m['write_mb_per_s_one_fdatasync']['min']:,.0f} / {m['write_mb_per_s_one_fdatasync']['median']:,.0f} MB/s; "
        f"fdatasync every 1 MiB {m['write_mb_per_s_fdatasync_every_1MiB']['min']:,.0f} / "
        f"{m['write_mb_per_s_fdatasync_every_1MiB']['median']:,.0f} MB/s; 4 KiB fdatasync p50 "
        f"{m['fdatasync_p50_ms']['min']:.2f} / {m['fdatasync_p50_ms']['median']:.2f} ms, p99 "
        f"{m['fdatasync_p99_ms']['min']:.2f} / {m['fdatasync_p99_ms']['median']:.2f} ms",
        "",
        "| figure | " + " | ".join(f"{loop} min / median" for loop in loops) + " | issue 35: target (before) |",
        "|---|" + "---:|" * len(loops) + "---|",
    ]
    for key, (label, target, before) in TARGETS.items():
        cells = [
            f"{fmt(s[loop][key]['min'], key)} / {fmt(s[loop][key]['median'], key)}" if key in s[loop] else "n/a"
            for loop in loops
        ]
        goal = (f"≤ {target:g}" if target is not None else "-") + (f" ({before:g})" if before is not None else "")
        lines.append(f"| {label.format(**doc['settings'])} | " + " | ".join(cells) + f" | {goal} |")
    cells = [f"{s[loop]['records_per_request']['min']:.2f} / {s[loop]['records_per_request']['median']:.2f}" for loop in loops]
    lines.append("| records per Produce request, one-record requests | " + " | ".join(cells) + " | 1.00 |")
    for loop in doc["event_loops"]:
        if not s[loop]["available"]:
            lines.append(f"\n{loop}: not available in this venv (pip install 'loglake[fast]')")
    lines.append("")
    for r in doc["runs"]:
        if not r["available"]:
            continue
        i, q, lat = r["ingest"], r["requests"], r["latency"]
        slow = lat["slow_seconds"]
        lines.append(
            f"run {r['run']} {r['event_loop']:<8} ingest {i['mb_per_s']:.0f} MB/s, {i['ingest_cpu_s_per_gb']:.2f} CPU-s/GB "
            f"(user {i['cpu_user_s']:.1f}, sys {i['cpu_system_s']:.1f}), "
            f"{i['device_bytes_per_payload_byte'] or float('nan'):.2f} dev B/B; requests {q['request_cpu_us'] or 0:.0f} µs "
            f"(user {q['request_cpu_user_us'] or 0:.0f}); latency p50 {lat['latency_p50_ms']:.2f} p99 "
            f"{lat['latency_p99_ms']:.2f} max {lat['latency_max_ms']:.1f} ms; machine busy {r['machine_busy_cpu_s']:.0f} CPU-s "
            f"in {r['wall_s']:.0f} s"
        )
        if slow:
            waits = ", ".join(f"{k} {v:g}" for k, v in lat["waits"].items())
            lines.append(f"    over the latency phase: {waits}")
        for sec in slow:
            lines.append(
                f"    slow second {sec['at']} UTC (+{sec['second']} s): p99 {sec['p99_ms']:.1f} ms, max {sec['max_ms']:.1f} ms, "
                + (", ".join(f"{k} {v:g}" for k, v in (sec["machine"] or {}).items()))
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1, help="runs of every event loop, interleaved (default 1)")
    ap.add_argument("--event-loops", default=",".join(EVENT_LOOPS), help="comma-separated, of: asyncio, uvloop")
    ap.add_argument("--ingest-mb", type=float, default=1000.0, help="payload of the ingest phase, MB (default 1000)")
    ap.add_argument("--requests", type=int, default=20_000, help="one-record requests of the requests phase")
    ap.add_argument(
        "--request-rate", type=float, default=2_000.0,
        help="requests/s of the requests phase (default 2,000: one record in each; at 5,000 here librdkafka puts ~1.3 in each)",
    )
    ap.add_argument("--latency-rate", type=float, default=10_000.0, help="records/s of the latency phase")
    ap.add_argument(
        "--latency-linger-ms", type=float, default=client.LATENCY_LINGER_MS,
        help="linger.ms of the latency phase (default: benchmarks/broker.py's half-load producer's)",
    )
    ap.add_argument("--latency-seconds", type=float, default=30.0, help="length of the latency phase")
    ap.add_argument("--stretch-ms", type=float, default=100.0, help="a second whose p99 is above this is named")
    ap.add_argument("--machine-mb", type=int, default=256, help="MiB of each sequential-write measurement")
    ap.add_argument("--fsync-samples", type=int, default=500, help="4 KiB fdatasyncs timed")
    ap.add_argument("--broker-arg", action="append", default=[], help="extra `loglake serve` argument (repeatable)")
    ap.add_argument("--log-level", default="INFO", help="the brokers' --log-level (DEBUG names seals)")
    ap.add_argument("--dir", help="parent directory for data (default: next to the repository)")
    ap.add_argument("--keep", action="store_true", help="keep the data and broker logs (their folder is printed)")
    ap.add_argument("--json-out", help="also write the JSON here")
    args = ap.parse_args(argv)
    loops = [x.strip() for x in args.event_loops.split(",") if x.strip()]
    if set(loops) - set(EVENT_LOOPS) or not loops:
        ap.error(f"--event-loops: of {', '.join(EVENT_LOOPS)}")
    work = Path(tempfile.mkdtemp(prefix="loglake-cost-", dir=args.dir or str(ROOT.parent)))
    doc: dict[str, Any] = {
        "benchmark": "cost",
        "event_loops": loops,
        "settings": {k: v for k, v in vars(args).items() if k not in ("json_out", "dir", "keep")},
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "machine": [],
        "runs": [],
    }
    try:
        for run in range(args.runs):
            doc["machine"].append(machine(str(work), args.machine_mb, args.fsync_samples))
            for loop in loops if run % 2 == 0 else loops[::-1]:
                doc["runs"].append(one_loop(work, loop, run, args))
    finally:
        if args.keep:
            log(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    doc["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    doc["summary"] = summary(doc)
    emit(doc, args.json_out, fmt_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
