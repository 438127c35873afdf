"""The measuring side of benchmarks/broker.py: CPU accounting of the broker and of this process,
the broker's own request latency from its /metrics, and the confluent-kafka (and raw Fetch)
clients that produce, consume and time records against a running broker. Loaded by broker.py
(`load_benchmark("broker_client")`) and used through it by the transactions, fetch-session and
security sections."""

from __future__ import annotations

import os
import random
import resource
import socket
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition  # noqa: E402

from benchkit import load_benchmark  # noqa: E402

pct = load_benchmark("engine").pct

MiB = 1024 * 1024
CLK_TCK = os.sysconf("SC_CLK_TCK")
#: linger.ms of the half-load latency producer (issue 12); the throughput runs keep 5 ms
LATENCY_LINGER_MS = 1


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ==== CPU accounting ============================================================================


def proc_cpu_times(pid: int) -> tuple[float, float]:
    """(utime, stime) seconds of a process (all threads) from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may contain spaces
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK  # fields 14 and 15 of the whole line


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all threads) from /proc/<pid>/stat."""
    return sum(proc_cpu_times(pid))


def self_cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class CpuMeter:
    def __init__(self, broker_pid: int) -> None:
        self.pid = broker_pid
        self.t0 = time.perf_counter()
        self.b0 = proc_cpu_seconds(broker_pid)
        self.c0 = self_cpu_seconds()

    def stop(self) -> dict[str, float]:
        wall = time.perf_counter() - self.t0
        return {
            "broker_cpu_pct": 100.0 * (proc_cpu_seconds(self.pid) - self.b0) / wall,
            "client_cpu_pct": 100.0 * (self_cpu_seconds() - self.c0) / wall,
        }


# ==== broker-side request latency (/metrics) ======================================================


def scrape(metrics_url: str) -> dict[tuple[str, str], float]:
    """{(api, le): cumulative count} of loglake_request_seconds_bucket, plus (api, "sum"); and
    ("wal", "spare_rolls") / ("wal", "recycled_rolls"), summed over the WAL shards."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        for family in ("spare_rolls", "recycled_rolls"):
            if line.startswith(f"loglake_wal_{family}_total{{"):
                out[("wal", family)] = out.get(("wal", family), 0.0) + float(line.rpartition(" ")[2])
        if line.startswith(("loglake_request_seconds_bucket{", "loglake_request_seconds_sum{")):
            labels, _, value = line.rpartition(" ")
            fields = dict(kv.split("=", 1) for kv in labels[labels.index("{") + 1 : -1].split(","))
            api = fields["api"].strip('"')
            le = fields.get("le", '"sum"').strip('"')
            out[(api, le)] = float(value)
    return out


def request_stats(
    before: dict[tuple[str, str], float], after: dict[tuple[str, str], float], api: str
) -> dict[str, Any]:
    """Requests of `api` handled between two scrapes: count, mean and bucket bounds of p50/p99
    (time from decoding the request to its response being ready, not the socket write)."""
    bounds = [*sorted({le for a, le in after if a == api and le not in ("sum", "+Inf")}, key=float), "+Inf"]
    counts = [after.get((api, le), 0.0) - before.get((api, le), 0.0) for le in bounds]
    total = counts[-1] if counts else 0.0
    if not total:
        return {"requests": 0}
    seconds = after.get((api, "sum"), 0.0) - before.get((api, "sum"), 0.0)

    def quantile(q: float) -> str:
        for le, c in zip(bounds, counts, strict=True):
            if c >= q * total:
                return "> 10 s" if le == "+Inf" else f"<= {float(le) * 1e3:g} ms"
        return "?"

    return {
        "requests": int(total),
        "mean_ms": 1e3 * seconds / total,
        "p50": quantile(0.5),
        "p99": quantile(0.99),
    }


# ==== the client side ===========================================================================


def producer_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "none",
        "queue.buffering.max.messages": 2_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "message.timeout.ms": 120_000,
        "log_level": 3,
        **extra,
    }


def payloads(size: int, distinct: int = 1024) -> list[bytes]:
    rng = random.Random(size)
    return [rng.randbytes(size) for _ in range(distinct)]


def produce_throughput(
    bootstrap: str, topic: str, size: int, count: int, broker_pid: int, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Records/s and MB/s until every delivery report is in. Delivery reports are requested for
    errors only (a Python callback per record would cost the client more than the broker).
    `extra`: producer settings on top (the transactions section's idempotent run)."""
    errors: list[str] = []

    def on_error(err: Any, msg: Any) -> None:
        errors.append(str(err))

    producer = Producer(
        producer_config(bootstrap, **{"delivery.report.only.error": True, "on_delivery": on_error, **(extra or {})})
    )
    # Warm up: metadata, connection, producer id, topic creation.
    producer.produce(topic, b"warm-up")
    assert producer.flush(30) == 0
    values = payloads(size)
    nvalues = len(values)
    produce = producer.produce
    poll = producer.poll
    meter = CpuMeter(broker_pid)
    started = time.perf_counter()
    i = 0
    while i < count:
        try:
            produce(topic, values[i % nvalues])
            i += 1
        except BufferError:
            poll(0.001)
    sent = time.perf_counter()
    left = producer.flush(120)
    elapsed = time.perf_counter() - started
    cpu = meter.stop()
    if left or errors:
        raise RuntimeError(f"produce failed: {left} undelivered, errors {errors[:3]}")
    return {
        "records": count,
        "record_bytes": size,
        "seconds": elapsed,
        "enqueue_seconds": sent - started,
        "records_per_s": count / elapsed,
        "mb_per_s": count * size / elapsed / 1e6,
        **cpu,
    }


def consume_throughput(
    bootstrap: str, topic: str, partitions: int, count: int, broker_pid: int, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`extra`: consumer settings on top (the transactions section's isolation.level)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-unused",  # required by the client; partitions are assigned, nothing committed
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            # librdkafka pauses fetching for fetch.queue.backoff.ms (1 s) whenever its local queue
            # holds queued.min.messages (100,000): raise both limits so the broker is what we measure.
            "queued.min.messages": 2_000_000,
            "queued.max.messages.kbytes": 512 * 1024,
            "fetch.queue.backoff.ms": 5,
            "fetch.max.bytes": 64 * MiB,
            "max.partition.fetch.bytes": 4 * MiB,
            "log_level": 3,
            **(extra or {}),
        }
    )
    meter = CpuMeter(broker_pid)
    started = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    got = 0
    nbytes = 0
    first = 0.0
    deadline = started + 300
    while got < count and time.perf_counter() < deadline:
        for msg in consumer.consume(100_000, 1.0):
            if msg.error() is None:
                got += 1
                nbytes += len(msg)
            elif msg.error().code() != KafkaError._PARTITION_EOF:
                raise RuntimeError(f"consume error: {msg.error()}")
        if got and not first:
            first = time.perf_counter()
    elapsed = time.perf_counter() - started
    cpu = meter.stop()
    consumer.close()
    if got < count:
        raise RuntimeError(f"consumed {got} of {count}")
    # librdkafka waits ~0.5 s before its first offset query for a freshly assigned partition
    # ("no current leader" timer): "steady" counts from the first batch handed to Python.
    steady = time.perf_counter() - first if first else elapsed
    return {
        "records": got,
        "seconds": elapsed,
        "first_record_after_s": first - started if first else None,
        "records_per_s": got / elapsed,
        "mb_per_s": nbytes / elapsed / 1e6,
        "steady_records_per_s": got / steady,
        "steady_mb_per_s": nbytes / steady / 1e6,
        **cpu,
    }


def raw_fetch_throughput(
    bootstrap: str, topic: str, partitions: int, count: int, broker_pid: int, isolation_level: int = 0
) -> dict[str, Any]:
    """The broker's side of consuming without a client library's per-record work: Fetch v12
    requests over one socket (kafka-python's protocol codec), records counted from the batch
    headers (record_count; control batches skipped), nothing decoded. Partition by partition,
    4 MiB per fetch, up to the high watermark (isolation_level 1: the last stable offset)."""
    from kafka.protocol.consumer import FetchRequest
    from kafka.protocol.parser import KafkaProtocol

    from loglake.records.batch import BATCH_HEADER_SIZE, peek_header

    F = FetchRequest.FetchTopic
    host, port = bootstrap.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    proto = KafkaProtocol(client_id="bench-raw-fetch")
    meter = CpuMeter(broker_pid)
    started = time.perf_counter()
    got = 0
    nbytes = 0
    requests = 0
    for partition in range(partitions):
        offset = 0
        while True:
            req = FetchRequest[12](
                max_wait_ms=0,
                min_bytes=1,
                max_bytes=64 * MiB,
                isolation_level=isolation_level,
                topics=[
                    F(
                        topic=topic,
                        partitions=[
                            F.FetchPartition(
                                partition=partition, fetch_offset=offset, partition_max_bytes=4 * MiB
                            )
                        ],
                    )
                ],
            )
            proto.send_request(req)
            sock.sendall(proto.send_bytes())
            responses: list[Any] = []
            while not responses:
                data = sock.recv(8 * MiB)
                if not data:
                    raise RuntimeError("broker closed the raw fetch connection")
                responses = proto.receive_bytes(data)
            requests += 1
            part = responses[0][1].responses[0].partitions[0]
            records = part.records or b""
            pos = 0
            while pos + BATCH_HEADER_SIZE <= len(records):
                h = peek_header(records, pos)
                if pos + h.size > len(records):
                    break  # a partial batch at the end of the response
                if not h.is_control:
                    got += h.record_count
                nbytes += h.size
                offset = h.base_offset + h.record_count
                pos += h.size
            if offset >= (part.last_stable_offset if isolation_level else part.high_watermark):
                break
    elapsed = time.perf_counter() - started
    cpu = meter.stop()
    sock.close()
    if got < count:
        raise RuntimeError(f"raw fetch got {got} of {count}")
    return {
        "records": got,
        "requests": requests,
        "seconds": elapsed,
        "records_per_s": got / elapsed,
        "mb_per_s": nbytes / elapsed / 1e6,
        **cpu,
    }


def produce_latency(
    bootstrap: str,
    topic: str,
    size: int,
    rate: float,
    seconds: float,
    broker_pid: int,
    linger_ms: float = LATENCY_LINGER_MS,
    per_second: bool = False,
    tick_s: float = 0.001,
) -> dict[str, Any]:
    """A producer sending `rate` records/s in ticks of `tick_s` (1 ms; shorter, with linger.ms 0,
    for one record per request). Every `sample`-th record carries a
    delivery callback that reads librdkafka's latency for it (produce() to delivery report, as
    seen when poll() serves the report); the others carry none, to keep the client cheap.
    `per_second`: also each second's samples, p99 and max (by the second the record was sent),
    so a stretch of slow acknowledgements shows where it was (benchmarks/cost.py)."""
    latencies: list[float] = []
    sent_at: list[float] = []
    errors: list[str] = []
    sample = max(1, int(rate * seconds / 50_000))
    clock = time.perf_counter

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            latency = msg.latency()
            latencies.append(latency)
            sent_at.append(clock() - latency)

    # No global delivery callback: unsampled records cost no Python call (a systematic failure
    # still shows up in the sampled ones).
    producer = Producer(producer_config(bootstrap, **{"linger.ms": linger_ms}))
    producer.produce(topic, b"warm-up")
    assert producer.flush(30) == 0
    values = payloads(size)
    nvalues = len(values)
    produce = producer.produce
    meter = CpuMeter(broker_pid)
    started_unix = time.time()
    started = time.perf_counter()
    sent = 0
    behind = 0
    while True:
        now = time.perf_counter()
        elapsed = now - started
        if elapsed >= seconds:
            break
        due = int(rate * elapsed)
        if due - sent > rate * 0.05:
            behind += 1  # the client itself fell more than 50 ms behind
        while sent < due:
            if sent % sample:
                produce(topic, values[sent % nvalues])
            else:
                produce(topic, values[sent % nvalues], on_delivery=report)
            sent += 1
        producer.poll(0)
        pause = tick_s - (time.perf_counter() - now)
        if pause > 0:
            time.sleep(pause)
    left = producer.flush(60)
    wall = time.perf_counter() - started
    cpu = meter.stop()
    if left or errors:
        raise RuntimeError(f"latency run failed: {left} undelivered, errors {errors[:3]}")
    ms = [x * 1e3 for x in latencies]
    seconds_of: dict[int, list[float]] = {}
    if per_second:
        for at, x in zip(sent_at, ms, strict=True):
            seconds_of.setdefault(max(0, int(at - started)), []).append(x)
    return {
        **(
            {
                "started_unix": started_unix,
                "per_second": [
                    {"second": s, "samples": len(v), "p99_ms": pct(v, 99), "max_ms": max(v)}
                    for s, v in sorted(seconds_of.items())
                ],
            }
            if per_second
            else {}
        ),
        "target_rate": rate,
        "linger_ms": linger_ms,
        "achieved_rate": sent / seconds,
        "records": sent,
        "record_bytes": size,
        "seconds": wall,
        "p50_ms": pct(ms, 50),
        "p90_ms": pct(ms, 90),
        "p99_ms": pct(ms, 99),
        "p999_ms": pct(ms, 99.9),
        "max_ms": max(ms),
        "samples": len(ms),
        "ticks_behind": behind,
        **cpu,
    }


def create_floor_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """A topic of durability class `ephemeral` (acknowledged without a WAL write or fdatasync):
    produce runs against it measure what this client, the broker's request path and the
    machine's cores cost on their own, the floor under the durable runs' numbers."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics([NewTopic(topic, partitions, 1, config={"durability": "ephemeral"})])
    created[topic].result(30)
