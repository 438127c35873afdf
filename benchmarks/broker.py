#!/usr/bin/env python3
"""loglake broker benchmark: disk limits, then a real `loglake serve` process driven by
confluent-kafka (librdkafka) — produce, consume, latency at half load — in one run.

    .venv/bin/python benchmarks/broker.py            # full run (~8 min on 2 cores: four 60 s half-load runs)
    .venv/bin/python benchmarks/broker.py --quick    # smoke run (< 60 s)
    .venv/bin/python benchmarks/broker.py --json-out /tmp/broker.json --profile-seconds 10
    .venv/bin/python benchmarks/broker.py --quick --mode cluster   # the same runs against cluster mode

`--mode cluster` runs the produce, consume and latency phases against one `loglake serve
--cluster` broker over real etcd and moto's S3 server (tests/clusterkit.py; durability class
`object`: an acknowledgement waits for the flush object's PUT and its etcd commit, flushed every
`--object-flush-ms` 50 ms here), without the floor, transactions, fetch-session and security
sections (cluster mode refuses transactions; the others measure the single node's edge).

A JSON document goes to stdout, progress and a human table to stderr. Everything lives in a
temporary directory next to the repository (or under `--dir`), removed at the end.

What is measured (docs/PERFORMANCE.md, section "Broker"):

1. Disk limits on the data filesystem, measured as benchmarks/engine.py does: sequential write
   MB/s of 1 MiB pwrites with one fdatasync / an fdatasync every 4 MiB / every 1 MiB, and
   pwrite(4 KiB)+fdatasync latency.
2. A broker child process (default engine settings: durability class fsync, acks=all waits for
   the WAL fdatasync). For 100-byte and 1 KiB records, on a topic created by Metadata
   auto-create:
   * produce: one confluent-kafka producer, acks=all, linger.ms=5, no compression; records/s
     and payload MB/s from the first produce() until every delivery report is in (flush);
   * consume: one consumer, partitions assigned from the beginning, over the same records;
   * latency: a producer (acks=all, linger.ms=1, as issue 12 asks) rate-limited to half the
     measured produce rate for 60 s, long enough to include segment seals; latency is
     librdkafka's own per-message latency (Message.latency(): produce() call to delivery
     report), so it includes linger.ms; p50, p99 and max are reported.
   * the floor: the produce and latency runs again against a topic of durability `ephemeral`
     (no WAL write, no fdatasync): what this client, the request path and the shared cores
     cost on their own (`--skip-floor` leaves it out).
   Broker CPU (utime+stime from /proc/<pid>/stat over wall time; 100 % = one core) and the
   benchmark process's own CPU (librdkafka threads included) are reported for every phase —
   client and broker share the machine's cores.
3. Fetch sessions (KIP-227), benchmarks/fetch_sessions.py: a consumer of 1,000 partitions driven
   with raw Fetch requests, with and without a session: request and response bytes per poll,
   polls/s and broker CPU, idle and under a trickle of writes (`--only-fetch-sessions` runs just
   this against the broker; `--skip-fetch-sessions` leaves it out).
4. Transactions (benchmarks/txn_bench.py): 100 B records produced plain, idempotent and with a
   transactional.id committing every 100 ms, in the same run; the transactional topic consumed
   with isolation.level read_uncommitted and read_committed (and by raw Fetch at isolation
   levels 0 and 1). `--skip-transactions` leaves it out; `--only machine,transactions,fetch-sessions`
   runs issue 15's benchmark alone (sections: machine, sizes, transactions, fetch-sessions, profile).
5. Security (benchmarks/security_bench.py, issue 16): produce and consume of 100 B records with
   1 MB batches through PLAINTEXT and SASL_SSL/SCRAM-SHA-512 on a broker of its own, in the same
   run, and SCRAM-SHA-512 authentications per second. `--skip-security` leaves it out;
   `--only machine,security` runs it alone.
6. Optionally py-spy samples the broker during another 100-byte produce run (broker_profile.py);
   the top functions (self and total samples) are in the JSON and the table.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import confluent_kafka  # noqa: E402

from benchkit import emit, load_benchmark  # noqa: E402
from disk_limits import device_write_bytes  # noqa: E402

from brokerkit import Broker  # noqa: E402

engine_bench = load_benchmark("engine")
fetch_sessions_bench = load_benchmark("fetch_sessions")
txn_bench = load_benchmark("txn_bench")
security_bench = load_benchmark("security_bench")
client = load_benchmark("broker_client")
# The measuring side lives in broker_client.py; its names stay reachable here, where the
# transactions, fetch-session and security sections look for them (`bench.<name>`).
CpuMeter = client.CpuMeter
scrape, request_stats = client.scrape, client.request_stats
producer_config, payloads = client.producer_config, client.payloads
produce_throughput, consume_throughput = client.produce_throughput, client.consume_throughput
raw_fetch_throughput, produce_latency = client.raw_fetch_throughput, client.produce_latency
create_floor_topic = client.create_floor_topic
profile_produce = load_benchmark("broker_profile").profile_produce
log, pct, LATENCY_LINGER_MS = client.log, client.pct, client.LATENCY_LINGER_MS


# Targets (docs/PERFORMANCE.md, "Broker").
TARGET_PRODUCE_100B_RPS = 500_000
#: issue 12: 1 KiB records in ~1 MB batches reach half the raw disk MB/s of the same run
TARGET_PRODUCE_1K_RAW_FRACTION = 0.50
TARGET_CONSUME_RPS = 1_000_000
#: issue 12: produce p99 at half load by record size (larger sizes use the last bound), and max
TARGET_P99_MS = {100: 5.0, 1024: 10.0}
TARGET_MAX_MS = 50.0

# What --only can name: the disk limits, the per-record-size runs (produce, consume, raw fetch,
# half load), the transactions section (benchmarks/txn_bench.py), fetch sessions
# (benchmarks/fetch_sessions.py), SASL_SSL against PLAINTEXT (benchmarks/security_bench.py) and the py-spy profile — in the order they run.
SECTIONS = ("machine", "sizes", "transactions", "fetch-sessions", "security", "profile")


# ==== driver ====================================================================================


def run_size(
    broker: Broker,
    pid: int,
    metrics_url: str,
    size: int,
    count: int,
    latency_s: float,
    latency_rate: float | None = None,
    data_dir: str | None = None,
    floor: bool = True,
) -> dict[str, Any]:
    topic = f"bench-{size}b"
    log(f"produce: {count:,} x {size} B, acks=all, linger.ms=5 ...")
    m0 = scrape(metrics_url)
    prod = produce_throughput(broker.bootstrap, topic, size, count, pid)
    m1 = scrape(metrics_url)
    prod["broker_produce_requests"] = request_stats(m0, m1, "Produce")
    log(
        f"  {prod['records_per_s']:,.0f} records/s, {prod['mb_per_s']:.1f} MB/s, broker CPU {prod['broker_cpu_pct']:.0f} %"
    )
    total = count + 1  # the warm-up record
    partitions = broker_partitions(broker)
    log(f"consume: {total:,} x {size} B from the beginning ...")
    cons = consume_throughput(broker.bootstrap, topic, partitions, total, pid)
    m2 = scrape(metrics_url)
    cons["broker_fetch_requests"] = request_stats(m1, m2, "Fetch")
    log(
        f"  {cons['records_per_s']:,.0f} records/s, {cons['mb_per_s']:.1f} MB/s, broker CPU {cons['broker_cpu_pct']:.0f} %"
    )
    log("raw fetch: the same records, counted from batch headers ...")
    raw = raw_fetch_throughput(broker.bootstrap, topic, partitions, total, pid)
    log(
        f"  {raw['records_per_s']:,.0f} records/s, {raw['mb_per_s']:.1f} MB/s, broker CPU {raw['broker_cpu_pct']:.0f} %"
    )
    m2 = scrape(metrics_url)
    rate = latency_rate or prod["records_per_s"] / 2
    how = "as asked" if latency_rate else "half of max"
    log(f"latency: {rate:,.0f} records/s ({how}), linger.ms={LATENCY_LINGER_MS}, {latency_s:.0f} s ...")
    dev0 = device_write_bytes(data_dir) if data_dir else -1
    lat = produce_latency(broker.bootstrap, f"{topic}-lat", size, rate, latency_s, pid)
    if dev0 >= 0 and data_dir:
        # the data device's own counter (every process's writes: read it on a quiet machine)
        lat["device_write_mb"] = (device_write_bytes(data_dir) - dev0) / 1e6
        lat["payload_mb"] = lat["achieved_rate"] * latency_s * size / 1e6
    m3 = scrape(metrics_url)
    lat["broker_produce_requests"] = request_stats(m2, m3, "Produce")
    for family in ("spare_rolls", "recycled_rolls"):
        lat[f"wal_{family}"] = int(m3.get(("wal", family), 0) - m2.get(("wal", family), 0))
    log(
        f"  p50 {lat['p50_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms, max {lat['max_ms']:.1f} ms, "
        f"achieved {lat['achieved_rate']:,.0f}/s; "
        f"broker Produce {lat['broker_produce_requests']}"
    )
    if floor:
        log(f"floor: produce and latency again, topic durability ephemeral (no WAL), {count:,} x {size} B ...")
        create_floor_topic(broker.bootstrap, f"{topic}-floor", partitions)
        prod["floor"] = produce_throughput(broker.bootstrap, f"{topic}-floor", size, count, pid)
        lat["floor"] = produce_latency(broker.bootstrap, f"{topic}-floor", size, rate, latency_s, pid)
        log(
            f"  {prod['floor']['mb_per_s']:.1f} MB/s at broker CPU {prod['floor']['broker_cpu_pct']:.0f} %; half load "
            f"p50 {lat['floor']['p50_ms']:.2f} ms, p99 {lat['floor']['p99_ms']:.2f} ms, max {lat['floor']['max_ms']:.1f} ms"
        )
    return {
        "record_bytes": size,
        "partitions": partitions,
        "produce": prod,
        "consume": cons,
        "raw_fetch": raw,
        "latency": lat,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def broker_pid(broker: Broker) -> int:
    """The broker's process id (a single-node Broker or a clusterkit ClusterBroker)."""
    pid = broker.pid if not isinstance(broker, Broker) else (broker.proc.pid if broker.proc else None)
    assert pid is not None
    return int(pid)


def broker_partitions(broker: Broker) -> int:
    for i, arg in enumerate(broker.extra_args):
        if arg == "--default-partitions":
            return int(broker.extra_args[i + 1])
    return 1


def machine_limits(directory: str, quick: bool) -> dict[str, Any]:
    limits: dict[str, Any] = engine_bench.machine_limits(directory, quick)
    raw = max(
        limits["raw_write_one_fdatasync"]["mb_per_s"], limits["raw_write_fdatasync_every_4MiB"]["mb_per_s"]
    )
    limits["raw_mb_per_s"] = raw
    return limits


def p99_target(size: int) -> float:
    """The p99 bound for `size`-byte records: the largest listed size not above it."""
    fits = [s for s in TARGET_P99_MS if s <= size]
    return TARGET_P99_MS[max(fits)] if fits else min(TARGET_P99_MS.values())


def targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    by_size = {r["record_bytes"]: r for r in doc["runs"]}
    out: list[dict[str, Any]] = []

    def add(name: str, value: float, goal: float, unit: str, ok: bool, note: str = "") -> None:
        out.append({"target": name, "value": value, "goal": goal, "unit": unit, "pass": ok, "note": note})

    if 100 in by_size:
        v = by_size[100]["produce"]["records_per_s"]
        add(
            "produce 100 B records/s (acks=all, fsync)",
            v,
            TARGET_PRODUCE_100B_RPS,
            "records/s",
            v >= TARGET_PRODUCE_100B_RPS,
        )
        c = by_size[100]["consume"]
        v = c["records_per_s"]
        add(
            "consume 100 B records/s (confluent-kafka consumer)",
            v,
            TARGET_CONSUME_RPS,
            "records/s",
            v >= TARGET_CONSUME_RPS,
            f"from the first record: {c['steady_records_per_s']:,.0f}/s; "
            f"broker alone (raw fetch): {by_size[100]['raw_fetch']['records_per_s']:,.0f}/s",
        )
    if 1024 in by_size and doc.get("machine"):
        raw = doc["machine"]["raw_mb_per_s"]
        v = by_size[1024]["produce"]["mb_per_s"]
        raw1 = doc["machine"]["raw_write_fdatasync_every_1MiB"]["mb_per_s"]
        add(
            "produce 1 KiB MB/s vs raw disk MB/s",
            v / raw,
            TARGET_PRODUCE_1K_RAW_FRACTION,
            "fraction",
            v / raw >= TARGET_PRODUCE_1K_RAW_FRACTION,
            f"{v:.0f} of {raw:.0f} MB/s; {100 * v / raw1:.0f} % of the fdatasync-every-1MiB rate ({raw1:.0f} MB/s)"
            + (
                f"; floor (durability ephemeral, no WAL): {floor['mb_per_s']:.0f} MB/s = {100 * floor['mb_per_s'] / raw:.0f} %"
                if (floor := by_size[1024]["produce"].get("floor"))
                else ""
            ),
        )
    for size, run in sorted(by_size.items()):
        floor = run["latency"].get("floor")
        for q, goal in (("p99", p99_target(size)), ("max", TARGET_MAX_MS)):
            v = run["latency"][f"{q}_ms"]
            note = f"floor (durability ephemeral, no WAL): {floor[f'{q}_ms']:.2f} ms" if floor else ""
            add(f"produce {q} latency at half load, {size} B", v, goal, "ms", v <= goal, note)
    if doc.get("transactions"):
        txn_bench.targets(doc["transactions"], add)
    if doc.get("security"):
        security_bench.targets(doc["security"], add)
    return out


def fmt_table(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    m = doc.get("machine")
    if m:
        one, four, every1 = (
            m[k]
            for k in (
                "raw_write_one_fdatasync",
                "raw_write_fdatasync_every_4MiB",
                "raw_write_fdatasync_every_1MiB",
            )
        )
        lat = m["fdatasync_4KiB"]
        lines += [
            "disk limits",
            f"  sequential write, one fdatasync      {one['mb_per_s']:8.0f} MB/s  (runs {', '.join(f'{x:.0f}' for x in one['runs_mb_per_s'])})",
            f"  sequential write, fdatasync / 4 MiB  {four['mb_per_s']:8.0f} MB/s  (runs {', '.join(f'{x:.0f}' for x in four['runs_mb_per_s'])})",
            f"  sequential write, fdatasync / 1 MiB  {every1['mb_per_s']:8.0f} MB/s  (runs {', '.join(f'{x:.0f}' for x in every1['runs_mb_per_s'])})",
            f"  4 KiB pwrite+fdatasync               p50 {lat['p50_ms']:.2f} ms  p99 {lat['p99_ms']:.2f} ms",
            "",
        ]
    header = (
        f"{'phase':<28}{'records/s':>12}{'MB/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"{'broker CPU':>12}{'client CPU':>12}"
    )
    if doc["runs"]:
        lines += [header, "-" * len(header)]
    for run in doc["runs"]:
        size = run["record_bytes"]
        p, c, lat = run["produce"], run["consume"], run["latency"]
        lines.append(
            f"{f'produce {size} B':<28}{p['records_per_s']:>12,.0f}{p['mb_per_s']:>9.1f}{'':>9}{'':>9}{'':>9}"
            f"{p['broker_cpu_pct']:>11.0f}%{p['client_cpu_pct']:>11.0f}%"
        )
        lines.append(
            f"{f'consume {size} B':<28}{c['records_per_s']:>12,.0f}{c['mb_per_s']:>9.1f}{'':>9}{'':>9}{'':>9}"
            f"{c['broker_cpu_pct']:>11.0f}%{c['client_cpu_pct']:>11.0f}%"
        )
        r = run["raw_fetch"]
        lines.append(
            f"{f'raw fetch {size} B':<28}{r['records_per_s']:>12,.0f}{r['mb_per_s']:>9.1f}{'':>9}{'':>9}{'':>9}"
            f"{r['broker_cpu_pct']:>11.0f}%{r['client_cpu_pct']:>11.0f}%"
        )
        lines.append(
            f"{f'half load {size} B':<28}{lat['achieved_rate']:>12,.0f}{lat['achieved_rate'] * size / 1e6:>9.1f}"
            f"{lat['p50_ms']:>9.2f}{lat['p99_ms']:>9.2f}{lat['max_ms']:>9.1f}"
            f"{lat['broker_cpu_pct']:>11.0f}%{lat['client_cpu_pct']:>11.0f}%"
        )
        pf, fl = p.get("floor"), lat.get("floor")
        if pf and fl:
            lines.append(
                f"{'  produce, floor (no WAL)':<28}{pf['records_per_s']:>12,.0f}{pf['mb_per_s']:>9.1f}{'':>27}"
                f"{pf['broker_cpu_pct']:>11.0f}%{pf['client_cpu_pct']:>11.0f}%"
            )
            lines.append(
                f"{'  half load, floor (no WAL)':<28}{fl['achieved_rate']:>12,.0f}{fl['achieved_rate'] * size / 1e6:>9.1f}"
                f"{fl['p50_ms']:>9.2f}{fl['p99_ms']:>9.2f}{fl['max_ms']:>9.1f}"
                f"{fl['broker_cpu_pct']:>11.0f}%{fl['client_cpu_pct']:>11.0f}%"
            )
        for what, stats in (
            ("produce", p.get("broker_produce_requests")),
            ("consume", c.get("broker_fetch_requests")),
            ("half load", lat.get("broker_produce_requests")),
        ):
            if stats and stats.get("requests"):
                lines.append(
                    f"    broker side, {what} {size} B: {stats['requests']:,} requests, mean {stats['mean_ms']:.2f} ms, "
                    f"p50 {stats['p50']}, p99 {stats['p99']}"
                )
        if lat.get("device_write_mb"):
            lines.append(
                f"    device writes during half load {size} B: {lat['device_write_mb']:,.0f} MB for "
                f"{lat['payload_mb']:,.0f} MB of payload ({lat['device_write_mb'] / lat['payload_mb']:.2f}x); "
                f"WAL rolls into a ready file {lat.get('wal_spare_rolls', 0)}, of them recycled "
                f"{lat.get('wal_recycled_rolls', 0)}"
            )
    if doc.get("transactions"):
        lines += ["", *txn_bench.table(doc["transactions"])]
    if doc.get("security"):
        lines += ["", *security_bench.table(doc["security"])]
    lines.append("")
    for t in doc["targets"]:
        value = f"{100 * t['value']:.0f} %" if t["unit"] == "fraction" else f"{t['value']:,.2f} {t['unit']}"
        goal = f"{100 * t['goal']:.0f} %" if t["unit"] == "fraction" else f"{t['goal']:,} {t['unit']}"
        cmp = "<=" if t["unit"] == "ms" else ">="
        lines.append(
            f"  {'PASS' if t['pass'] else 'FAIL'}  {t['target']}: {value} (target {cmp} {goal}) {t['note']}"
        )
    prof = doc.get("profile") or {}
    if prof.get("top_self"):
        lines += [
            "",
            f"py-spy, broker during {prof.get('record_bytes', 100)} B produce ({prof['samples']} samples, "
            "all threads, idle excluded), top self:",
        ]
        lines += [f"  {share:5.1f} %  {name}" for name, _c, share in prof["top_self"][:15]]
        lines += ["top total (inclusive):"]
        lines += [f"  {share:5.1f} %  {name}" for name, _c, share in prof["top_total"][:15]]
    elif prof.get("error"):
        lines += ["", f"py-spy: {prof['error']}"]
    if doc.get("fetch_sessions"):
        lines += ["", *fetch_sessions_bench.table(doc["fetch_sessions"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run, < 60 s")
    ap.add_argument("--dir", help="parent directory for data (default: next to the repository)")
    ap.add_argument("--json-out", help="also write the JSON here")
    ap.add_argument(
        "--partitions", type=int, default=1, help="partitions of the benchmark topics (default 1)"
    )
    ap.add_argument("--sizes", default="100,1024", help="record sizes in bytes, comma-separated")
    ap.add_argument(
        "--records", type=int, help="records per produce run (default: 3M for 100 B, scaled by size)"
    )
    ap.add_argument("--latency-seconds", type=float, help="length of each half-load run")
    ap.add_argument(
        "--latency-rate",
        action="append",
        default=[],
        metavar="SIZE=RATE",
        help="records/s of the latency run for that record size instead of half the measured maximum "
        "(repeatable; e.g. 100=447000): runs on different days then compare",
    )
    ap.add_argument("--profile-seconds", type=int, help="py-spy duration (0: no profile)")
    ap.add_argument("--profile-size", type=int, default=100, help="record size of the profiled produce run")
    ap.add_argument("--skip-machine", action="store_true", help="do not measure the disk")
    ap.add_argument(
        "--skip-floor", action="store_true", help="no produce and half-load runs against a topic without a WAL"
    )
    ap.add_argument("--skip-fetch-sessions", action="store_true", help="leave out the fetch-session section")
    ap.add_argument("--only-fetch-sessions", action="store_true", help="run the fetch-session section only")
    ap.add_argument("--skip-transactions", action="store_true", help="leave out the transactions section")
    ap.add_argument("--skip-security", action="store_true", help="leave out the security (SASL_SSL) section")
    ap.add_argument(
        "--only",
        help=f"run only these sections, comma-separated, of: {', '.join(SECTIONS)} "
        "(e.g. machine,transactions,fetch-sessions)",
    )
    ap.add_argument(
        "--broker-arg", action="append", default=[], help="extra `loglake serve` argument (repeatable)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the data and broker logs (their folder is printed)")
    ap.add_argument(
        "--mode", choices=("single", "cluster"), default="single",
        help="a single-node broker (default), or one cluster-mode broker over etcd and moto's S3",
    )
    args = ap.parse_args(argv)
    quick = args.quick
    if args.mode == "cluster":  # what a cluster broker refuses or what measures the single node's edge
        args.skip_floor = args.skip_transactions = args.skip_fetch_sessions = args.skip_security = True
        if args.profile_seconds is None:
            args.profile_seconds = 0
    sizes = [int(s) for s in args.sizes.split(",") if s]
    latency_s = args.latency_seconds if args.latency_seconds is not None else (3.0 if quick else 60.0)
    latency_rates = {int(k): float(v) for k, v in (r.split("=", 1) for r in args.latency_rate)}
    profile_s = args.profile_seconds if args.profile_seconds is not None else (0 if quick else 10)
    if args.only_fetch_sessions:
        args.only = ",".join(filter(None, [args.only, "fetch-sessions"]))
    if args.only:
        only = {s.strip() for s in args.only.split(",") if s.strip()}
        if only - set(SECTIONS):
            ap.error(f"--only: unknown section(s) {', '.join(sorted(only - set(SECTIONS)))}; known: {', '.join(SECTIONS)}")
        if "sizes" not in only:
            sizes = []
        if "profile" not in only:
            profile_s = 0
        args.skip_machine |= "machine" not in only
        args.skip_fetch_sessions |= "fetch-sessions" not in only
        args.skip_transactions |= "transactions" not in only
        args.skip_security |= "security" not in only

    parent = args.dir or str(ROOT.parent)
    work = Path(tempfile.mkdtemp(prefix="loglake-broker-bench-", dir=parent))
    doc: dict[str, Any] = {
        "benchmark": "broker",
        "quick": quick,
        "python": platform.python_version(),
        "cores": os.cpu_count(),
        "client": f"confluent-kafka {confluent_kafka.__version__} / librdkafka {confluent_kafka.libversion()[0]}",
        "mode": args.mode,
        "runs": [],
        "load_average_before": os.getloadavg(),
    }
    broker: Broker | None = None
    cluster = None
    try:
        if not args.skip_machine:
            doc["machine"] = machine_limits(str(work), quick)
        metrics_port = free_port()
        broker_args = [
            "--default-partitions",
            str(args.partitions),
            "--metrics-listen",
            f"127.0.0.1:{metrics_port}",
            *args.broker_arg,
        ]
        if args.mode == "cluster":
            import clusterkit

            cluster = clusterkit.Cluster(work / "cluster", brokers=0, broker_args=[*broker_args, "--object-flush-ms", "50"])
            cluster.start()
            broker = cluster.add_broker(1)  # type: ignore[assignment]
            broker.extra_args = broker_args  # type: ignore[union-attr]
            durability = "object (cluster mode: flush object PUT + etcd commit, --object-flush-ms 50)"
        else:
            broker = Broker(work / "data", broker_args).start()
            durability = "fsync (engine default)"
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        pid = broker_pid(broker)
        doc["broker"] = {"pid": pid, "args": broker_args, "durability": durability}
        for size in sizes:
            base = args.records or (600_000 if quick else 3_000_000)
            count = base if size <= 100 else max(base // 3, int(base * 100 / size))
            rate = latency_rates.get(size)
            data = str(work / "data") if cluster is None else None
            floor = not args.skip_floor
            doc["runs"].append(run_size(broker, pid, metrics_url, size, count, latency_s, rate, data, floor))
        if not args.skip_transactions:
            doc["transactions"] = txn_bench.measure(
                sys.modules[__name__], broker.bootstrap, pid, metrics_url, quick=quick, count=args.records
            )
        if not args.skip_fetch_sessions:
            doc["fetch_sessions"] = fetch_sessions_bench.measure(broker.bootstrap, pid, quick=quick, metrics_url=metrics_url)
        if not args.skip_security:
            doc["security"] = security_bench.measure(sys.modules[__name__], work, quick=quick, count=args.records)
        if profile_s:
            size = args.profile_size
            log(f"profile: py-spy on the broker for {profile_s} s during {size} B produce ...")
            doc["profile"] = profile_produce(
                broker.bootstrap,
                "bench-profile",
                pid,
                profile_s,
                work / "broker-prof.txt",
                max(20_000, 50_000_000 // size),
                size,
            )
            if "raw_file" in doc["profile"]:
                keep = Path(tempfile.gettempdir()) / "broker-prof.txt"
                shutil.copyfile(doc["profile"]["raw_file"], keep)
                doc["profile"]["raw_file"] = str(keep)
        doc["broker"]["exit_code"] = broker.stop()
        doc["broker"]["log_warnings"] = [
            line for line in broker.log_text().splitlines() if " WARNING " in line or " ERROR " in line
        ][:20]
        doc["load_average_after"] = os.getloadavg()
        doc["targets"] = targets(doc)
    finally:
        if cluster is not None:
            cluster.stop()  # its broker too
        elif isinstance(broker, Broker) and broker.proc is not None and broker.proc.poll() is None:
            broker.stop(signal.SIGKILL)
        if args.keep:
            log(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    emit(doc, args.json_out, fmt_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
