#!/usr/bin/env python3
"""One host, every core (docs/CLUSTER.md): produce throughput of N `loglake serve --cluster`
brokers over one etcd member and one shared folder (`--cold-store file://`) against one
single-node broker, on the same machine in the same run, with where every CPU second went.

    .venv/bin/python benchmarks/cluster_cores.py                 # ~3 min
    .venv/bin/python benchmarks/cluster_cores.py --seconds 10    # shorter

What is measured, in this order:

1. The machine's limits now: cores, load average, how much faster two CPU-bound Python processes
   run than one (`parallel_speedup`: the most any two brokers can gain here, with whatever else
   the machine is running), the disk's 4 KiB fdatasync latency and sequential write bandwidth
   (benchmarks/disk_limits.py), and the CPU seconds the whole machine spent per phase
   (/proc/stat), so other users' load shows next to ours.
2. Single node: one broker, a topic of `--partitions` partitions, `--producers` producer processes
   (confluent-kafka, acks=all, linger.ms 5, 100 B values, delivery reports for errors only, as
   benchmarks/broker.py) producing as fast as they can for `--seconds`.
3. Cluster: `--brokers` brokers (default 2, one per core) over etcd and one folder, default
   settings otherwise, the same topic and producers, bootstrapping from every broker.

Per phase: records/s (acknowledged records over the time to the last acknowledgement), and CPU
seconds of each broker, of etcd and of the producers (from /proc), and of the whole machine.
The ratio cluster / single is the figure of issue 30 (target >= 1.6x); beside it, the ratio the
servers' CPU per record would allow if each broker had a core of its own (brokers and etcd
counted, clients elsewhere), which tells a CPU-starved run from a broker that does not scale.
Prints a JSON document on stdout and a table on stderr.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import clusterkit  # noqa: E402 - the tests' harness: etcd, brokers (here over a shared folder)
from benchkit import emit, load_benchmark  # noqa: E402

import brokerkit  # noqa: E402

client = load_benchmark("broker_client")
disk = load_benchmark("disk_limits")
log = client.log

TARGET_RATIO = 1.6
RECORD_BYTES = 100
#: /proc/stat cpu fields counted as busy: user nice system irq softirq steal (not idle, iowait)
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


# ==== the machine ====================================================================================


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, every core, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    tck = float(os.sysconf("SC_CLK_TCK"))
    return sum(fields[i] for i in BUSY_FIELDS) / tck, sum(fields[:8]) / tck


def _spin(seconds: float, out: Any) -> None:
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            n += 1
    out.put(n)


def parallel_speedup(seconds: float = 2.0) -> dict[str, Any]:
    """Loop iterations of one CPU-bound Python process alone, then of two at once: how much more
    two processes get done than one on this machine right now."""
    ctx = multiprocessing.get_context("spawn")

    def run(k: int) -> int:
        out = ctx.Queue()
        procs = [ctx.Process(target=_spin, args=(seconds, out)) for _ in range(k)]
        for p in procs:
            p.start()
        total = sum(out.get(timeout=seconds + 60) for _ in procs)
        for p in procs:
            p.join()
        return int(total)

    one = run(1)
    two = run(2)
    return {"one_process": one, "two_processes": two, "speedup": round(two / one, 2)}


def machine_limits(directory: str) -> dict[str, Any]:
    log("machine: parallel speedup of two CPU-bound processes over one ...")
    speed = parallel_speedup()
    log(f"  {speed['speedup']}x")
    log("machine: 4 KiB fdatasync latency, sequential write ...")
    lat = disk.fdatasync_latency(directory, 100)
    write = disk.raw_sequential_write(directory, 64 * disk.MiB, sync_every=4 * disk.MiB)
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    return {
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "parallel_speedup": speed,
        "fdatasync_4KiB": lat,
        "raw_write_fdatasync_every_4MiB": write,
    }


# ==== the load ========================================================================================


def _producer(bootstrap: str, topic: str, seconds: float, start: Any, out: Any) -> None:
    """Child process: produce 100 B values as fast as it can for `seconds`, then wait for every
    acknowledgement; reports (records, seconds to the last acknowledgement, errors, CPU s)."""
    import resource

    from confluent_kafka import Producer

    errors: list[str] = []
    producer = Producer(
        client.producer_config(
            bootstrap, **{"delivery.report.only.error": True, "on_delivery": lambda err, msg: errors.append(str(err))}
        )
    )
    producer.produce(topic, b"warm-up")
    producer.flush(60)
    values = client.payloads(RECORD_BYTES)
    n, nvalues = 0, len(values)
    produce, poll = producer.produce, producer.poll
    start.wait()
    t0 = time.perf_counter()
    end = t0 + seconds
    while True:
        for _ in range(1000):
            try:
                produce(topic, values[n % nvalues])
                n += 1
            except BufferError:
                poll(0.001)
        if time.perf_counter() >= end:
            break
    left = producer.flush(180)
    elapsed = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out.put({"records": n - left, "seconds": elapsed, "errors": errors[:3], "undelivered": left, "cpu_s": ru.ru_utime + ru.ru_stime})


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)


def run_load(bootstrap: str, topic: str, producers: int, seconds: float, pids: dict[str, int]) -> dict[str, Any]:
    """`producers` producer processes at once; CPU seconds of every process in `pids` and of the
    machine over the run."""
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(producers + 1), ctx.Queue()
    procs = [ctx.Process(target=_producer, args=(bootstrap, topic, seconds, start, out)) for _ in range(producers)]
    for p in procs:
        p.start()
    start.wait(120)  # every producer warmed up (metadata, connections, producer id)
    cpu0 = {name: client.proc_cpu_seconds(pid) for name, pid in pids.items()}
    busy0, total0 = machine_cpu_seconds()
    t0 = time.perf_counter()
    results = [out.get(timeout=seconds + 300) for _ in procs]
    wall = time.perf_counter() - t0
    busy1, total1 = machine_cpu_seconds()
    cpu = {name: round(client.proc_cpu_seconds(pid) - cpu0[name], 2) for name, pid in pids.items()}
    for p in procs:
        p.join(60)
    bad = [r for r in results if r["errors"] or r["undelivered"]]
    if bad:
        raise RuntimeError(f"produce failed: {bad}")
    records = sum(r["records"] for r in results)
    seconds_to_last_ack = max(r["seconds"] for r in results)
    producers_cpu = round(sum(r["cpu_s"] for r in results), 2)  # includes each one's warm-up
    ours = sum(cpu.values()) + producers_cpu
    server_cpu = sum(cpu.values())  # the brokers and (in a cluster) etcd: what serving the load cost
    machine_busy = busy1 - busy0
    return {
        "records": records,
        "seconds": round(seconds_to_last_ack, 2),
        "records_per_s": round(records / seconds_to_last_ack),
        "cpu_s": cpu,
        "server_cpu_us_per_record": round(1e6 * server_cpu / records, 3),
        "producers_cpu_s": producers_cpu,
        "machine_busy_cpu_s": round(machine_busy, 2),
        "machine_cpu_s": round(total1 - total0, 2),
        "others_cpu_s": round(max(0.0, machine_busy - ours), 2),
        "wall_s": round(wall, 2),
    }


def single(work: Path, partitions: int, producers: int, seconds: float) -> dict[str, Any]:
    log(f"single node: 1 broker, {partitions} partitions, {producers} producers for {seconds} s ...")
    (work / "single").mkdir()
    with brokerkit.serving_broker(work / "single" / "data", log_level="WARNING") as b:
        assert b.proc is not None
        create_topic(b.bootstrap, "cores", partitions)
        row = run_load(b.bootstrap, "cores", producers, seconds, {"broker": b.proc.pid})
    log(f"  {row['records_per_s']:,} records/s; CPU s {row['cpu_s']}, producers {row['producers_cpu_s']}")
    return {"brokers": 1, "mode": "single node", **row}


def cluster(
    work: Path, brokers: int, partitions: int, producers: int, seconds: float, args: list[str] | None = None
) -> dict[str, Any]:
    log(f"cluster: {brokers} brokers over etcd and one folder, {partitions} partitions, {producers} producers {args or ''}...")
    with clusterkit.running_cluster(work / "cluster", brokers=brokers, cold_store="file", broker_args=args) as c:
        c.create_topic("cores", partitions)
        leaders = c.wait_leaders("cores", partitions)
        pids = {f"broker {b.node_id}": b.pid for b in c.brokers if b.pid is not None}
        etcd = c.etcd.members[0].proc
        if etcd is not None:
            pids["etcd"] = etcd.pid
        row = run_load(c.bootstrap, "cores", producers, seconds, pids)
    led = sorted(leaders.values())
    log(f"  {row['records_per_s']:,} records/s; CPU s {row['cpu_s']}, producers {row['producers_cpu_s']}")
    mode = "cluster, file://" + (f" ({' '.join(args)})" if args else "")
    return {"brokers": brokers, "mode": mode, "broker_args": args or [], "leaders": {n: led.count(n) for n in set(led)}, **row}


def fmt_table(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [
        f"machine: {m['cores']} cores ({m['cores_usable']} usable), two CPU-bound processes "
        f"{m['parallel_speedup']['speedup']}x one; fdatasync 4 KiB p50 {m['fdatasync_4KiB']['p50_ms']:.2f} ms; "
        f"load average before {doc['load_average_before']}, after {doc['load_average_after']}",
        "",
        "| setup | records/s (100 B) | CPU s per process | servers' CPU µs per record | producers' CPU s | machine busy / all CPU s | others' CPU s |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in doc["runs"]:
        per = ", ".join(f"{k} {v:.1f}" for k, v in r["cpu_s"].items())
        lines.append(
            f"| {r['mode']}, {r['brokers']} broker(s) | {r['records_per_s']:,} | {per} | {r['server_cpu_us_per_record']:.2f} "
            f"| {r['producers_cpu_s']:.1f} "
            f"| {r['machine_busy_cpu_s']:.1f} / {r['machine_cpu_s']:.1f} | {r['others_cpu_s']:.1f} |"
        )
    lines.append("")
    lines.append(f"ratio cluster / single: {doc['ratio']:.2f}x (target >= {TARGET_RATIO}x): {'MET' if doc['ratio'] >= TARGET_RATIO else 'MISSED'}")
    lines.append(
        f"ratio the servers' CPU per record allows with a core per broker: {doc['ratio_if_servers_had_the_cores']:.2f}x"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--brokers", type=int, default=2, help="cluster brokers (default 2: one per core here)")
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--producers", type=int, default=2, help="producer processes in each phase")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long each phase produces")
    ap.add_argument(
        "--cluster-arg", action="append", default=[], help="a flag of the cluster brokers (repeat), beside the defaults"
    )
    ap.add_argument("--dir", help="parent directory for data (default: the system temp dir)")
    ap.add_argument("--json-out", help="also write the JSON here")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix=f"loglake-cores-{uuid.uuid4().hex[:6]}-", dir=args.dir))
    doc: dict[str, Any] = {"load_average_before": [round(x, 2) for x in os.getloadavg()]}
    doc["machine"] = machine_limits(str(work))
    doc["runs"] = [
        single(work, args.partitions, args.producers, args.seconds),
        cluster(work, args.brokers, args.partitions, args.producers, args.seconds, args.cluster_arg),
    ]
    shutil.rmtree(work, ignore_errors=True)
    doc["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    doc["ratio"] = round(doc["runs"][1]["records_per_s"] / doc["runs"][0]["records_per_s"], 2)
    doc["target_ratio"] = TARGET_RATIO
    # What the same per-record CPU cost would give with a core per broker (and etcd on those same
    # cores) and clients elsewhere: the ratio the servers' CPU allows, whatever else runs here.
    one, many = (r["server_cpu_us_per_record"] for r in doc["runs"])
    doc["ratio_if_servers_had_the_cores"] = round(args.brokers * one / many, 2)
    emit(doc, args.json_out, fmt_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
