#!/usr/bin/env python3
"""Cluster mode (issue 18): failover time, produce throughput and ack latency in durability class
`object`, and S3 PUTs at 1, 100 and 1,000 partitions — real `loglake serve --cluster` processes
over real etcd and moto's S3 server (tests/clusterkit.py), driven by confluent-kafka.

    .venv/bin/python benchmarks/cluster.py            # full run (~10 min on 2 cores)
    .venv/bin/python benchmarks/cluster.py --quick    # short run (~3 min)

What is measured (docs/PERFORMANCE.md, section "Cluster"):

1. Failover. Three brokers; one idempotent producer (acks=all) sends `--failover-rate` records/s
   to a one-partition topic; its leader is killed with kill -9. Failover time is the last
   acknowledgement before the kill (from the old leader) to the first one after it (from the
   new leader: a killed process answers nothing). The killed broker is restarted with its node
   id and the next kill waits until it is registered again. p50/p99 over `--kills` kills at the
   default lease (3 s), and over `--kills-per-lease` at each of `--leases` to show how it scales.
2. Throughput. One producer (acks=all, linger.ms 5, 100 B, no delivery callback per record) as
   fast as it goes against 1 and against 3 brokers (a 12-partition topic), then a producer paced
   at half that rate for ack latency p50/p99 (librdkafka's per-record latency: produce() to
   delivery report). S3 PUTs through the proxy in front of moto: flush objects (foreground) and
   everything else (background merges) per second. Brokers' CPU summed.
3. Partitions. A fresh cluster of three brokers per row, the same paced load (`--rate`) over a
   topic of 1, 100 or 1,000 partitions: foreground PUTs/s (set by the flush triggers, not the
   partition count), ack latency, and the background PUTs (merged segments) counted apart over
   the run plus one more maintenance round, so the run's data is merged.

The machine is shared and small (2 cores for brokers, etcd, moto and the client): the load
average before and after is in the JSON; moto is not S3 (its PUT latency differs), the PUT counts
are what the design fixes. Prints a JSON document on stdout and a table on stderr.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import confluent_kafka  # noqa: E402
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

import clusterkit  # noqa: E402 - the tests' harness: etcd, moto behind the proxy, brokers
from benchkit import emit, load_benchmark  # noqa: E402

broker_bench = load_benchmark("broker_client")  # the measuring side of broker.py
pct = broker_bench.pct
log = broker_bench.log

TARGET_RECORDS_PER_S = 200_000  # 100 B records through 3 brokers (issue 18)
TARGET_FAILOVER_P99_S = 5.0  # at the default lease
DEFAULT_LEASE_S = 3
#: Environment setting of the brokers' lease TTL (BrokerConfig.cluster_lease_ttl_s).
LEASE_ENV = "LOGLAKE_CLUSTER_LEASE_TTL_S"
#: The brokers' merge-and-sweep round (BrokerConfig.cluster_maintenance_interval_ms, default).
MAINTENANCE_S = 10.0
#: How long one failover may take before the run gives up on it.
FAILOVER_TIMEOUT_S = 60.0


def brokers_cpu(c: clusterkit.Cluster) -> float:
    total = 0.0
    for b in c.brokers:
        if b.pid is not None and b.alive():
            total += broker_bench.proc_cpu_seconds(b.pid)
    return total


def wait_registered(c: clusterkit.Cluster, n: int, timeout_s: float = FAILOVER_TIMEOUT_S) -> None:
    """Until Metadata lists `n` brokers."""
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    deadline = time.monotonic() + timeout_s
    seen = 0
    while time.monotonic() < deadline:
        try:
            seen = len(admin.list_topics(timeout=5).brokers)
        except confluent_kafka.KafkaException:
            seen = 0
        if seen >= n:
            return
        time.sleep(0.2)
    raise RuntimeError(f"only {seen} of {n} brokers registered after {timeout_s} s")


# ==== 1. failover ===============================================================================


class AckClock(threading.Thread):
    """An idempotent producer sending `rate` records/s to partition 0, noting every ack's time."""

    def __init__(self, bootstrap: str, topic: str, rate: float) -> None:
        super().__init__(name="ack-clock", daemon=True)
        self.producer = Producer(
            broker_bench.producer_config(
                bootstrap,
                **{"enable.idempotence": True, "linger.ms": 1, "topic.metadata.refresh.interval.ms": 500},
            )
        )
        self.topic = topic
        self.rate = rate
        self.acks: list[float] = []
        self.errors: list[str] = []
        self.halt = threading.Event()
        self.lock = threading.Lock()

    def _report(self, err: Any, msg: Any) -> None:
        now = time.monotonic()
        if err is None:
            with self.lock:
                self.acks.append(now)
        elif len(self.errors) < 50:
            self.errors.append(str(err))

    def run(self) -> None:
        started = time.monotonic()
        sent = 0
        while not self.halt.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while sent < due:
                try:
                    self.producer.produce(self.topic, b"x" * 100, partition=0, on_delivery=self._report)
                    sent += 1
                except BufferError:
                    break
            self.producer.poll(0.005)
        self.producer.flush(30)

    def acks_around(self, t: float) -> tuple[float | None, float | None]:
        with self.lock:
            before = [a for a in self.acks if a <= t]
            after = [a for a in self.acks if a > t]
        return (before[-1] if before else None), (after[0] if after else None)


def failover(work: Path, lease_s: int, kills: int, rate: float) -> dict[str, Any]:
    log(f"failover: lease {lease_s} s, {kills} kills of partition 0's leader ...")
    times: list[float] = []
    with clusterkit.running_cluster(
        work / f"failover-{lease_s}", brokers=3, broker_env={LEASE_ENV: str(lease_s)}
    ) as c:
        c.create_topic("fo", 1)
        clock = AckClock(c.bootstrap, "fo", rate)
        clock.start()
        try:
            for i in range(kills):
                while len(clock.acks) < 20:
                    time.sleep(0.05)
                time.sleep(1.0)  # steady acks from the current leader
                victim = c.by_node(c.leaders("fo")[0])
                killed_at = time.monotonic()
                victim.kill()
                deadline = killed_at + FAILOVER_TIMEOUT_S
                last, first = clock.acks_around(killed_at)
                while first is None and time.monotonic() < deadline:
                    time.sleep(0.02)
                    last, first = clock.acks_around(killed_at)
                if last is None or first is None:
                    raise RuntimeError(
                        f"kill {i}: no ack after {FAILOVER_TIMEOUT_S} s; errors {clock.errors[:3]}"
                    )
                times.append(first - last)
                log(f"  kill {i + 1}/{kills}: node {victim.node_id}, failover {first - last:.2f} s")
                victim.restart()
                wait_registered(c, 3)
        finally:
            clock.halt.set()
            clock.join(60)
    return {
        "lease_s": lease_s,
        "kills": len(times),
        "p50_s": round(pct(times, 50), 2),
        "p99_s": round(pct(times, 99), 2),
        "max_s": round(max(times), 2),
        "min_s": round(min(times), 2),
        "records_per_s": rate,
        "times_s": [round(t, 3) for t in times],
    }


# ==== 2. throughput, 3. partitions =================================================================


def throughput(work: Path, brokers: int, count: int, latency_s: float) -> dict[str, Any]:
    log(f"throughput: {brokers} broker(s), {count:,} records of 100 B ...")
    with clusterkit.running_cluster(work / f"tp-{brokers}", brokers=brokers) as c:
        assert c.proxy is not None
        topic = "tp"
        c.create_topic(topic, 12)
        c.proxy.clear()
        cpu0, t0 = brokers_cpu(c), time.monotonic()
        tp = broker_bench.produce_throughput(c.bootstrap, topic, 100, count, c.brokers[0].pid)
        wall = time.monotonic() - t0
        puts = c.put_counts()
        cpu = brokers_cpu(c) - cpu0
        rate = tp["records_per_s"]
        c.proxy.clear()
        lat = broker_bench.produce_latency(c.bootstrap, topic, 100, rate / 2, latency_s, c.brokers[0].pid)
        lat_puts = c.put_counts()
    return {
        "brokers": brokers,
        "records": count,
        "records_per_s": round(rate),
        "mb_per_s": round(tp["mb_per_s"], 1),
        "flush_puts_per_s": round(puts["flush"] / wall, 2),
        "flush_puts_per_s_per_broker": round(puts["flush"] / wall / brokers, 2),
        "other_puts_per_s": round(puts["other"] / wall, 2),
        "brokers_cpu_pct": round(100 * cpu / wall),
        "client_cpu_pct": round(tp["client_cpu_pct"]),
        "latency_rate": round(rate / 2),
        "ack_p50_ms": round(lat["p50_ms"], 1),
        "ack_p99_ms": round(lat["p99_ms"], 1),
        "latency_flush_puts_per_s": round(lat_puts["flush"] / latency_s, 2),
    }


def partitions_row(work: Path, n: int, rate: float, seconds: float) -> dict[str, Any]:
    """A fresh 3-broker cluster per row, so no other topic's merges are counted in it."""
    log(f"partitions: {n:,} partitions, {rate:,.0f} records/s for {seconds} s ...")
    with clusterkit.running_cluster(work / f"parts-{n}", brokers=3) as c:
        assert c.proxy is not None
        topic = f"parts-{n}"
        t0 = time.monotonic()
        c.create_topic(topic, n, timeout_s=300)
        created = time.monotonic() - t0
        c.proxy.clear()
        t0 = time.monotonic()
        lat = broker_bench.produce_latency(c.bootstrap, topic, 100, rate, seconds, c.brokers[0].pid)
        wall = time.monotonic() - t0
        puts = c.put_counts()
        # The background merge runs every maintenance interval: wait one more round so the run's
        # data is merged, and count its PUTs over the whole time.
        time.sleep(MAINTENANCE_S + 2.0)
        after = c.put_counts()
        other_keys = [s.path for s in c.proxy.requests("PUT") if clusterkit.FLUSH_KEY_PART not in s.path]
    return {
        "partitions": n,
        "create_s": round(created, 1),
        "records_per_s": round(lat["achieved_rate"]),
        "flush_puts_per_s": round(puts["flush"] / wall, 2),
        "flush_puts_per_s_per_broker": round(puts["flush"] / wall / 3, 2),
        "background_puts": after["other"],
        "background_seconds": round(wall + MAINTENANCE_S + 2.0, 1),
        "background_put_keys_sample": other_keys[:3],
        "ack_p50_ms": round(lat["p50_ms"], 1),
        "ack_p99_ms": round(lat["p99_ms"], 1),
    }


# ==== report =======================================================================================


def targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    three = [r for r in doc.get("throughput", []) if r["brokers"] == 3]
    if three:
        got = three[0]["records_per_s"]
        out.append(
            {
                "target": "≥ 200k records/s of 100 B through 3 brokers",
                "measured": got,
                "met": got >= TARGET_RECORDS_PER_S,
            }
        )
    default = [r for r in doc.get("failover", []) if r["lease_s"] == DEFAULT_LEASE_S]
    if default:
        got = default[0]["p99_s"]
        out.append(
            {
                "target": "failover p99 ≤ 5 s at the default lease",
                "measured": got,
                "met": got <= TARGET_FAILOVER_P99_S,
            }
        )
    return out


def fmt_table(doc: dict[str, Any]) -> str:
    lines = [f"load average before {doc['load_average_before']}, after {doc.get('load_average_after')}", ""]
    if doc.get("failover"):
        lines += ["| lease | kills | failover p50 | p99 | max |", "|---:|---:|---:|---:|---:|"]
        for r in doc["failover"]:
            lines.append(
                f"| {r['lease_s']} s | {r['kills']} | {r['p50_s']} s | {r['p99_s']} s | {r['max_s']} s |"
            )
        lines.append("")
    if doc.get("throughput"):
        lines += [
            "| brokers | records/s (100 B) | MB/s | flush PUTs/s (per broker) | other PUTs/s | brokers' CPU | ack p50 / p99 at half rate |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in doc["throughput"]:
            lines.append(
                f"| {r['brokers']} | {r['records_per_s']:,} | {r['mb_per_s']} | {r['flush_puts_per_s']} "
                f"({r['flush_puts_per_s_per_broker']}) | {r['other_puts_per_s']} | {r['brokers_cpu_pct']} % | "
                f"{r['ack_p50_ms']} / {r['ack_p99_ms']} ms |"
            )
        lines.append("")
    if doc.get("partitions"):
        lines += [
            "| partitions | records/s | flush PUTs/s (per broker) | background PUTs (run + one merge round) | ack p50 / p99 |",
            "|---:|---:|---:|---:|---:|",
        ]
        for r in doc["partitions"]:
            lines.append(
                f"| {r['partitions']:,} | {r['records_per_s']:,} | {r['flush_puts_per_s']} "
                f"({r['flush_puts_per_s_per_broker']}) | {r['background_puts']:,} in {r['background_seconds']} s | "
                f"{r['ack_p50_ms']} / {r['ack_p99_ms']} ms |"
            )
        lines.append("")
    for t in doc.get("targets", []):
        lines.append(f"target {t['target']}: measured {t['measured']} -> {'met' if t['met'] else 'NOT met'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short run (~3 min)")
    ap.add_argument("--dir", help="parent directory for data (default: next to the repository)")
    ap.add_argument("--json-out", help="also write the JSON here")
    ap.add_argument("--kills", type=int, help="kills at the default lease (default 20; --quick 5)")
    ap.add_argument(
        "--leases", default="2,5", help="other lease TTLs to show the scaling at (s, comma-separated)"
    )
    ap.add_argument("--kills-per-lease", type=int, help="kills at each other lease (default 5; --quick 2)")
    ap.add_argument("--failover-rate", type=float, default=500.0, help="records/s during the kills")
    ap.add_argument("--records", type=int, help="records per throughput run (default 1M; --quick 200k)")
    ap.add_argument("--partitions", default="1,100,1000", help="partition counts of section 3")
    ap.add_argument("--rate", type=float, default=20_000.0, help="paced records/s of section 3")
    ap.add_argument("--seconds", type=float, help="length of each paced run (default 20; --quick 5)")
    ap.add_argument("--only", help="sections to run, comma-separated, of: failover, throughput, partitions")
    args = ap.parse_args(argv)
    quick = args.quick
    kills = args.kills if args.kills is not None else (5 if quick else 20)
    per_lease = args.kills_per_lease if args.kills_per_lease is not None else (2 if quick else 5)
    records = args.records or (200_000 if quick else 1_000_000)
    seconds = args.seconds or (5.0 if quick else 20.0)
    only = {s.strip() for s in (args.only or "failover,throughput,partitions").split(",") if s.strip()}

    work = Path(tempfile.mkdtemp(prefix="loglake-cluster-bench-", dir=args.dir or str(ROOT.parent)))
    doc: dict[str, Any] = {
        "benchmark": "cluster",
        "quick": quick,
        "python": platform.python_version(),
        "cores": os.cpu_count(),
        "client": f"confluent-kafka {confluent_kafka.__version__} / librdkafka {confluent_kafka.libversion()[0]}",
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        if "failover" in only:
            doc["failover"] = [failover(work, DEFAULT_LEASE_S, kills, args.failover_rate)]
            for lease in (int(x) for x in args.leases.split(",") if x):
                doc["failover"].append(failover(work, lease, per_lease, args.failover_rate))
        if "throughput" in only:
            doc["throughput"] = [throughput(work, n, records, seconds) for n in (1, 3)]
        if "partitions" in only:
            doc["partitions"] = [
                partitions_row(work, int(n), args.rate, seconds) for n in args.partitions.split(",") if n
            ]
        doc["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        doc["targets"] = targets(doc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    emit(doc, args.json_out, fmt_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
