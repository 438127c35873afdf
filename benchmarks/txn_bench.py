"""The transactions section of benchmarks/broker.py (issue 15), against broker.py's running broker.

broker.py imports this module and calls `measure()`, `targets()` and `table()`; the client
helpers it passes in (`bench`: broker.py as a module) are broker.py's own, so the transactional
and plain phases run the same producer/consumer code with one setting changed:

* produce: 100 B records, the plain producer of broker.py's produce phase (acks=all,
  linger.ms=5), then the same with `enable.idempotence` (what a transactional producer implies:
  at most 5 requests in flight), then the same with a `transactional.id`: begin_transaction,
  produce() for 100 ms, commit_transaction (which waits for every delivery report and the EndTxn
  answer), begin again... The clock runs from the first produce() until the last commit returns.
  All three in the same run, each on a fresh topic with the same record count, in the order
  plain, idempotent, transactional and (full run) back again; the better run of each kind counts.
  commit_transaction's time is split into its flush and the EndTxn round trip.
* consume: the topic written by the transactional producer (so every record is in a committed
  transaction and there is a COMMIT marker every ~100 ms), read from the beginning with
  `isolation.level=read_uncommitted` and `read_committed`, alternating (U C C U in a full run)
  and the better run of each kept. Then the broker's side alone: raw Fetch v12 requests at
  isolation level 0 and 1 (broker.py's raw fetch), where the broker computes the last stable
  offset and the aborted transactions of every range it serves.

The third part of the issue, a consumer of 1,000 partitions with and without a fetch session, is
benchmarks/fetch_sessions.py's `measure()`, which broker.py already runs as its "fetch-sessions"
section into the same JSON and table.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from confluent_kafka import Producer

TARGET_TXN_PRODUCE_FRACTION = 0.70
TARGET_READ_COMMITTED_FRACTION = 0.90
COMMIT_INTERVAL_S = 0.100
RECORD_BYTES = 100


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def txn_produce_throughput(
    bench: Any, bootstrap: str, topic: str, size: int, count: int, broker_pid: int, interval_s: float
) -> dict[str, Any]:
    """broker.py's produce_throughput with a transactional.id: a transaction is open for
    `interval_s` of produce() calls, then committed; records/s until the last commit returns."""
    errors: list[str] = []

    def on_error(err: Any, msg: Any) -> None:
        errors.append(str(err))

    producer = Producer(
        bench.producer_config(
            bootstrap,
            **{
                "transactional.id": f"bench-txn-{os.getpid()}-{time.time_ns()}",
                "message.timeout.ms": 60_000,  # librdkafka: at most transaction.timeout.ms (60 s)
                "delivery.report.only.error": True,
                "on_delivery": on_error,
            },
        )
    )
    producer.init_transactions(60)
    # Warm up as produce_throughput does, in a transaction: metadata, connection, producer id,
    # topic creation, AddPartitionsToTxn.
    producer.begin_transaction()
    producer.produce(topic, b"warm-up")
    producer.commit_transaction(60)
    values = bench.payloads(size)
    nvalues = len(values)
    produce = producer.produce
    poll = producer.poll
    clock = time.perf_counter
    commit_s: list[float] = []  # commit_transaction, of which flush_s waiting for delivery reports
    flush_s: list[float] = []
    txn_records: list[int] = []

    def commit() -> None:
        t0 = clock()
        producer.flush(120)  # what commit_transaction does first; timed apart from EndTxn
        t1 = clock()
        producer.commit_transaction(120)
        flush_s.append(t1 - t0)
        commit_s.append(clock() - t0)

    meter = bench.CpuMeter(broker_pid)
    started = clock()
    producer.begin_transaction()
    due = started + interval_s
    i = in_txn = 0
    while i < count:
        try:
            produce(topic, values[i % nvalues])
            i += 1
            in_txn += 1
        except BufferError:
            poll(0.001)
        if not i & 255 and clock() >= due:
            commit()
            txn_records.append(in_txn)
            in_txn = 0
            producer.begin_transaction()
            due = clock() + interval_s
    commit()
    txn_records.append(in_txn)
    elapsed = clock() - started
    cpu = meter.stop()
    if errors:
        raise RuntimeError(f"transactional produce failed: errors {errors[:3]}")
    ms = [x * 1e3 for x in commit_s]
    end_ms = [(c - f) * 1e3 for c, f in zip(commit_s, flush_s, strict=True)]
    return {
        "records": count,
        "record_bytes": size,
        "seconds": elapsed,
        "records_per_s": count / elapsed,
        "mb_per_s": count * size / elapsed / 1e6,
        "commit_interval_ms": interval_s * 1e3,
        "transactions": len(commit_s),
        "records_per_transaction_mean": count / len(commit_s),
        "commit_seconds_total": sum(commit_s),
        "commit_ms_p50": bench.pct(ms, 50),
        "commit_ms_p99": bench.pct(ms, 99),
        "commit_ms_max": max(ms),
        "flush_seconds_total": sum(flush_s),
        "end_txn_ms_p50": bench.pct(end_ms, 50),
        "end_txn_ms_p99": bench.pct(end_ms, 99),
        **cpu,
    }


def _steady(run: dict[str, Any]) -> float:
    return float(run["steady_records_per_s"])


def _rps(run: dict[str, Any]) -> float:
    return float(run["records_per_s"])


def _mirrored(kinds: list[str], quick: bool) -> list[str]:
    """A B C, then C B A in a full run: drift of a shared machine hits every kind alike."""
    return kinds if quick else kinds + kinds[::-1]


def _keep_best(runs: dict[str, list[dict[str, Any]]], key: Any, out: dict[str, Any], prefix: str) -> None:
    for kind, done in runs.items():
        out[f"{prefix}_{kind}"] = {**max(done, key=key), "runs": [key(r) for r in done]}


def measure(bench: Any, bootstrap: str, pid: int, metrics_url: str, *, quick: bool, count: int | None = None) -> dict[str, Any]:
    """The transactions section against a running broker; topics are auto-created with the
    broker's --default-partitions (1 in broker.py's default run). Each phase runs once per kind in
    quick mode, twice in mirrored order otherwise; the better run of each kind is kept (all in
    "runs")."""
    size = RECORD_BYTES
    count = count or (600_000 if quick else 3_000_000)
    stamp = f"{os.getpid()}-{int(time.time())}"
    out: dict[str, Any] = {"record_bytes": size, "records": count, "commit_interval_ms": COMMIT_INTERVAL_S * 1e3}

    produced: dict[str, list[dict[str, Any]]] = {"plain": [], "idempotent": [], "transactional": []}
    txn_topic = ""
    for n, kind in enumerate(_mirrored(list(produced), quick)):
        topic = f"bench-txn-{kind}-{stamp}-{n}"
        log(f"transactions: {kind} produce, {count:,} x {size} B, acks=all, linger.ms=5 ...")
        m0 = bench.scrape(metrics_url)
        if kind == "transactional":
            run = txn_produce_throughput(bench, bootstrap, topic, size, count, pid, COMMIT_INTERVAL_S)
            txn_topic = txn_topic or topic  # the first transactional topic is consumed below
        else:
            extra = {"enable.idempotence": True} if kind == "idempotent" else None
            run = bench.produce_throughput(bootstrap, topic, size, count, pid, extra=extra)
        m1 = bench.scrape(metrics_url)
        for api in ("Produce", "EndTxn", "AddPartitionsToTxn"):
            run[f"broker_{api}_requests"] = bench.request_stats(m0, m1, api)
        produced[kind].append(run)
        more = (
            f", {run['transactions']} transactions, commit_transaction p50 {run['commit_ms_p50']:.1f} ms "
            f"p99 {run['commit_ms_p99']:.1f} ms"
            if kind == "transactional"
            else ""
        )
        log(f"  {run['records_per_s']:,.0f} records/s{more}, broker CPU {run['broker_cpu_pct']:.0f} %")
    _keep_best(produced, _rps, out, "produce")

    total = count + 1  # the warm-up record
    consumed: dict[str, list[dict[str, Any]]] = {"read_uncommitted": [], "read_committed": []}
    for isolation in _mirrored(list(consumed), quick):
        log(f"transactions: consume {total:,} transactional records, {isolation} ...")
        m0 = bench.scrape(metrics_url)
        run = bench.consume_throughput(bootstrap, txn_topic, 1, total, pid, extra={"isolation.level": isolation})
        run["broker_fetch_requests"] = bench.request_stats(m0, bench.scrape(metrics_url), "Fetch")
        consumed[isolation].append(run)
        log(f"  {run['records_per_s']:,.0f} records/s (steady {_steady(run):,.0f}), broker CPU {run['broker_cpu_pct']:.0f} %")
    _keep_best(consumed, _steady, out, "consume")

    raw: dict[str, list[dict[str, Any]]] = {"read_uncommitted": [], "read_committed": []}
    for isolation in _mirrored(list(raw), False):  # cheap: always twice
        level = int(isolation == "read_committed")
        log(f"transactions: raw fetch, isolation level {level} ({isolation}) ...")
        run = bench.raw_fetch_throughput(bootstrap, txn_topic, 1, total, pid, isolation_level=level)
        raw[isolation].append(run)
        log(f"  {run['records_per_s']:,.0f} records/s, broker CPU {run['broker_cpu_pct']:.0f} %")
    _keep_best(raw, _rps, out, "raw_fetch")
    return out


def targets(tx: dict[str, Any], add: Any) -> None:
    """The section's rows of broker.py's targets(): add(name, value, goal, unit, ok, note)."""
    plain, idem, txn = tx["produce_plain"], tx["produce_idempotent"], tx["produce_transactional"]
    v = txn["records_per_s"] / plain["records_per_s"]
    add(
        f"transactional produce vs plain, {tx['record_bytes']} B, commit every {tx['commit_interval_ms']:.0f} ms",
        v,
        TARGET_TXN_PRODUCE_FRACTION,
        "fraction",
        v >= TARGET_TXN_PRODUCE_FRACTION,
        f"{txn['records_per_s']:,.0f} vs {plain['records_per_s']:,.0f} records/s; idempotent alone "
        f"{idem['records_per_s']:,.0f}/s ({100 * idem['records_per_s'] / plain['records_per_s']:.0f} %); "
        f"{txn['transactions']} commits, {100 * txn['commit_seconds_total'] / txn['seconds']:.0f} % of the time in "
        f"commit_transaction ({100 * (txn['commit_seconds_total'] - txn['flush_seconds_total']) / txn['seconds']:.0f} % in EndTxn)",
    )
    rc, ru = tx["consume_read_committed"], tx["consume_read_uncommitted"]
    v = _steady(rc) / _steady(ru)
    raw_rc, raw_ru = tx["raw_fetch_read_committed"], tx["raw_fetch_read_uncommitted"]
    add(
        "read_committed vs read_uncommitted consume, same transactional data",
        v,
        TARGET_READ_COMMITTED_FRACTION,
        "fraction",
        v >= TARGET_READ_COMMITTED_FRACTION,
        f"steady {_steady(rc):,.0f} vs {_steady(ru):,.0f} records/s (from assign: {rc['records_per_s']:,.0f} vs "
        f"{ru['records_per_s']:,.0f}); broker alone (raw fetch) {raw_rc['records_per_s']:,.0f} vs "
        f"{raw_ru['records_per_s']:,.0f} ({100 * raw_rc['records_per_s'] / raw_ru['records_per_s']:.0f} %)",
    )


def table(tx: dict[str, Any]) -> list[str]:
    header = f"{'transactions, ' + str(tx['record_bytes']) + ' B':<36}{'records/s':>12}{'MB/s':>9}{'broker CPU':>12}{'client CPU':>12}"
    lines = [header, "-" * len(header)]
    rows = [
        ("produce, plain", tx["produce_plain"]),
        ("produce, idempotent", tx["produce_idempotent"]),
        ("produce, transactional", tx["produce_transactional"]),
        ("consume, read_uncommitted", tx["consume_read_uncommitted"]),
        ("consume, read_committed", tx["consume_read_committed"]),
        ("raw fetch, read_uncommitted", tx["raw_fetch_read_uncommitted"]),
        ("raw fetch, read_committed", tx["raw_fetch_read_committed"]),
    ]
    for name, r in rows:
        lines.append(
            f"{name:<36}{r['records_per_s']:>12,.0f}{r['mb_per_s']:>9.1f}{r['broker_cpu_pct']:>11.0f}%{r['client_cpu_pct']:>11.0f}%"
        )
    t = tx["produce_transactional"]
    lines.append(
        f"    {t['transactions']} transactions of ~{t['records_per_transaction_mean']:,.0f} records; commit_transaction "
        f"p50 {t['commit_ms_p50']:.1f} ms, p99 {t['commit_ms_p99']:.1f} ms, max {t['commit_ms_max']:.1f} ms"
    )
    lines.append(
        f"    of the run's {t['seconds']:.2f} s: {t['flush_seconds_total']:.2f} s waiting for delivery reports (flush), "
        f"{t['commit_seconds_total'] - t['flush_seconds_total']:.2f} s in EndTxn (p50 {t['end_txn_ms_p50']:.1f} ms, "
        f"p99 {t['end_txn_ms_p99']:.1f} ms)"
    )
    for what in ("EndTxn", "Produce"):
        stats = t.get(f"broker_{what}_requests")
        if stats and stats.get("requests"):
            lines.append(
                f"    broker side, transactional run, {what}: {stats['requests']:,} requests, "
                f"mean {stats['mean_ms']:.2f} ms, p50 {stats['p50']}, p99 {stats['p99']}"
            )
    for kind in ("plain", "idempotent", "transactional"):
        runs = tx[f"produce_{kind}"]["runs"]
        lines.append(f"    produce {kind}: runs {', '.join(f'{x:,.0f}' for x in runs)} records/s")
    for iso in ("read_uncommitted", "read_committed"):
        c = tx[f"consume_{iso}"]
        lines.append(
            f"    consume {iso}: steady {c['steady_records_per_s']:,.0f}/s "
            f"(runs {', '.join(f'{x:,.0f}' for x in c['runs'])})"
        )
    return lines
