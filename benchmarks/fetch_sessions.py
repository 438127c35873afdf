#!/usr/bin/env python3
"""Fetch sessions (KIP-227): a consumer of 1,000 partitions, with and without a session.

    .venv/bin/python benchmarks/fetch_sessions.py           # its own broker (~40 s)
    .venv/bin/python benchmarks/fetch_sessions.py --quick   # smoke run

benchmarks/broker.py runs the same measurement against its broker (section "fetch sessions").
A JSON document goes to stdout, a table to stderr.

The consumer is driven with raw Fetch v12 requests (kafka-python's protocol classes on one
socket), so the bytes are exact: request bytes as written, response bytes as read, per poll.
Two workloads, each in both modes (sessionless: session id 0, epoch -1, every partition in every
request, as librdkafka does; session: one full fetch with epoch 0, then incremental fetches that
carry only the partitions whose fetch offset moved):

* idle: nothing is written; max_wait_ms=0, so a poll is the broker's cost of looking at every
  partition and the bytes of saying "nothing new";
* trickle: a producer writes `rate` records/s to random partitions; max_wait_ms=100, min_bytes=1
  (a consumer waiting for data). Every record written is consumed exactly once, checked.

Then a real client that uses sessions: kafka-python's KafkaConsumer (enable_incremental_fetch_sessions
on and off) assigned every partition of an idle topic, fetch_max_wait_ms=100; bytes per Fetch are
the broker's loglake_bytes_in/out_total over its Fetch count (other requests in that window, such as
metadata refreshes, are counted in too).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import socket
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

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from kafka.protocol.consumer import FetchRequest  # noqa: E402
from kafka.protocol.parser import KafkaProtocol  # noqa: E402

from loglake.records.batch import BATCH_HEADER_SIZE, peek_header  # noqa: E402

from brokerkit import Broker  # noqa: E402

PARTITIONS = 1000
PARTITION_MAX_BYTES = 1 << 20
TRICKLE_RATE = 2000
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _broker_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class RawConsumer:
    """One socket; polls `topic`'s partitions from the offsets it holds, with or without a session."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, session: bool) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.proto = KafkaProtocol(client_id="bench-fetch-sessions")
        self.topic, self.session = topic, session
        self.offsets = dict.fromkeys(range(partitions), 0)
        self.session_id, self.epoch = 0, 0 if session else -1
        self.changed: set[int] = set(self.offsets)
        self.records = 0
        self.request_bytes = self.response_bytes = self.polls = 0

    def poll(self, max_wait_ms: int, min_bytes: int) -> None:
        ft = FetchRequest.FetchTopic
        incremental = self.session and self.session_id != 0
        wanted = sorted(self.changed) if incremental else list(self.offsets)
        topics = [ft(topic=self.topic, partitions=[
            ft.FetchPartition(partition=p, fetch_offset=self.offsets[p], partition_max_bytes=PARTITION_MAX_BYTES)
            for p in wanted
        ])] if wanted else []
        req = FetchRequest[12](
            max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=50 << 20, session_id=self.session_id,
            session_epoch=self.epoch, topics=topics, forgotten_topics_data=[],
        )
        self.proto.send_request(req)
        out = self.proto.send_bytes()
        self.sock.sendall(out)
        self.request_bytes += len(out)
        responses: list[Any] = []
        while not responses:
            data = self.sock.recv(1 << 20)
            if not data:
                raise RuntimeError("broker closed the connection")
            self.response_bytes += len(data)
            responses = self.proto.receive_bytes(data)
        resp = responses[0][1]
        if resp.error_code:
            raise RuntimeError(f"fetch error {resp.error_code}")
        self.polls += 1
        self.changed = set()
        for t in resp.responses:
            for part in t.partitions:
                self._take(part)
        if self.session:
            if self.session_id == 0:
                self.session_id = resp.session_id
            self.epoch = self.epoch + 1 if self.session_id else 0

    def _take(self, part: Any) -> None:
        if part.error_code:
            raise RuntimeError(f"partition {part.partition_index}: error {part.error_code}")
        records = bytes(part.records or b"")
        pos = 0
        while pos + BATCH_HEADER_SIZE <= len(records):
            h = peek_header(records, pos)
            if pos + h.size > len(records):
                break
            self.records += h.record_count
            self.offsets[part.partition_index] = h.base_offset + h.record_count
            self.changed.add(part.partition_index)
            pos += h.size

    def close(self) -> None:
        self.sock.close()


def _per_poll(c: RawConsumer, seconds: float, cpu: float) -> dict[str, Any]:
    return {
        "polls": c.polls,
        "polls_per_s": c.polls / seconds,
        "request_bytes_per_poll": c.request_bytes / c.polls,
        "response_bytes_per_poll": c.response_bytes / c.polls,
        "records": c.records,
        "broker_cpu_pct": 100.0 * cpu / seconds,
    }


def _idle(bootstrap: str, topic: str, partitions: int, session: bool, seconds: float, pid: int) -> dict[str, Any]:
    c = RawConsumer(bootstrap, topic, partitions, session)
    c.poll(0, 0)  # the first (full) fetch is left out of the figures
    c.request_bytes = c.response_bytes = c.polls = 0
    cpu0, t0 = _broker_cpu(pid), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        c.poll(0, 0)
    elapsed = time.perf_counter() - t0
    out = _per_poll(c, elapsed, _broker_cpu(pid) - cpu0)
    c.close()
    return out


def _trickle(bootstrap: str, topic: str, partitions: int, session: bool, seconds: float, rate: int, pid: int) -> dict[str, Any]:
    """`rate` records/s into random partitions for `seconds`, consumed as they come."""
    c = RawConsumer(bootstrap, topic, partitions, session)
    while True:  # catch up with whatever earlier runs wrote
        before = c.records
        c.poll(0, 0)
        if c.records == before:
            break
    c.request_bytes = c.response_bytes = c.polls = c.records = 0
    written = [0]
    done = threading.Event()

    def write() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        rng = random.Random(7)
        start = time.perf_counter()
        while not done.is_set():
            due = int((time.perf_counter() - start) * rate)
            while written[0] < due:
                p.produce(topic, value=b"x" * 100, partition=rng.randrange(partitions))
                written[0] += 1
            p.poll(0)
            time.sleep(0.005)
        p.flush(30)

    writer = threading.Thread(target=write, daemon=True)
    cpu0, t0 = _broker_cpu(pid), time.perf_counter()
    writer.start()
    while time.perf_counter() - t0 < seconds:
        c.poll(100, 1)
    done.set()
    writer.join(30)
    elapsed = time.perf_counter() - t0
    cpu = _broker_cpu(pid) - cpu0
    deadline = time.monotonic() + 30
    while c.records < written[0] and time.monotonic() < deadline:
        c.poll(100, 1)
    if c.records != written[0]:
        raise RuntimeError(f"trickle: consumed {c.records} of {written[0]} records")
    out = _per_poll(c, elapsed, cpu)
    out["records_written"] = written[0]
    c.close()
    return out


def _broker_counters(metrics_url: str) -> dict[str, float]:
    """Bytes in/out and Fetch requests handled, from the broker's /metrics."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    out = {"in": 0.0, "out": 0.0, "fetches": 0.0}
    for line in text.splitlines():
        if line.startswith("loglake_bytes_in_total "):
            out["in"] = float(line.split()[-1])
        elif line.startswith("loglake_bytes_out_total "):
            out["out"] = float(line.split()[-1])
        elif line.startswith('loglake_requests_total{api="Fetch"'):
            out["fetches"] += float(line.split()[-1])
    return out


def _kafka_python_idle(bootstrap: str, metrics_url: str, topic: str, partitions: int, sessions: bool,
                       seconds: float) -> dict[str, Any]:
    """kafka-python's KafkaConsumer (which uses sessions unless told not to) assigned every
    partition at its end, polling an idle topic; bytes per Fetch as the broker counted them."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=100,
                             enable_incremental_fetch_sessions=sessions)
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        consumer.seek_to_end()
        warm = time.perf_counter() + 2
        while time.perf_counter() < warm:
            consumer.poll(timeout_ms=100)
        before, t0 = _broker_counters(metrics_url), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            consumer.poll(timeout_ms=100)
        after, elapsed = _broker_counters(metrics_url), time.perf_counter() - t0
    finally:
        consumer.close()
    fetches = max(after["fetches"] - before["fetches"], 1.0)
    return {
        "fetches": int(fetches),
        "fetches_per_s": fetches / elapsed,
        "request_bytes_per_fetch": (after["in"] - before["in"]) / fetches,
        "response_bytes_per_fetch": (after["out"] - before["out"]) / fetches,
    }


def measure(bootstrap: str, pid: int, *, quick: bool = False, partitions: int = PARTITIONS,
            metrics_url: str | None = None) -> dict[str, Any]:
    """Both workloads in both modes against a running broker; creates its own topic. With
    `metrics_url`, also kafka-python's consumer with and without sessions on the idle topic."""
    topic = f"bench-fetch-sessions-{os.getpid()}-{int(time.time())}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)
    seconds = 3.0 if quick else 10.0
    out: dict[str, Any] = {"partitions": partitions, "fetch_version": 12, "seconds_per_run": seconds,
                           "trickle_rate": TRICKLE_RATE}
    for workload in ("idle", "trickle"):
        for mode, session in (("sessionless", False), ("session", True)):
            _log(f"fetch sessions: {workload}, {mode}, {partitions} partitions, {seconds:.0f} s ...")
            if workload == "idle":
                out[f"{workload}_{mode}"] = _idle(bootstrap, topic, partitions, session, seconds, pid)
            else:
                out[f"{workload}_{mode}"] = _trickle(bootstrap, topic, partitions, session, seconds, TRICKLE_RATE, pid)
    if metrics_url:
        idle_topic = f"{topic}-idle"
        admin.create_topics([NewTopic(idle_topic, partitions, 1)])[idle_topic].result(60)
        for mode, session in (("sessionless", False), ("session", True)):
            _log(f"fetch sessions: kafka-python consumer, {mode}, idle, {seconds:.0f} s ...")
            out[f"kafka_python_{mode}"] = _kafka_python_idle(bootstrap, metrics_url, idle_topic, partitions, session, seconds)
    return out


def table(doc: dict[str, Any]) -> list[str]:
    header = f"{'fetch sessions, ' + str(doc['partitions']) + ' partitions':<36}{'polls/s':>9}{'req B/poll':>12}{'resp B/poll':>13}{'broker CPU':>12}"
    lines = [header, "-" * len(header)]
    for workload in ("idle", "trickle"):
        for mode in ("sessionless", "session"):
            r = doc.get(f"{workload}_{mode}")
            if r:
                lines.append(
                    f"{f'{workload}, {mode}':<36}{r['polls_per_s']:>9,.0f}{r['request_bytes_per_poll']:>12,.0f}"
                    f"{r['response_bytes_per_poll']:>13,.0f}{r['broker_cpu_pct']:>11.0f}%"
                )
    for mode in ("sessionless", "session"):
        r = doc.get(f"kafka_python_{mode}")
        if r:
            lines.append(
                f"{f'kafka-python idle, {mode}':<36}{r['fetches_per_s']:>9,.0f}{r['request_bytes_per_fetch']:>12,.0f}"
                f"{r['response_bytes_per_fetch']:>13,.0f}{'':>12}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--partitions", type=int, default=PARTITIONS)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="loglake-fsess-bench-", dir=str(ROOT.parent)))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        metrics_port = probe.getsockname()[1]
    broker = Broker(work / "data", ["--metrics-listen", f"127.0.0.1:{metrics_port}"]).start()
    try:
        assert broker.proc is not None
        doc = {"benchmark": "fetch_sessions", "python": platform.python_version(), "cores": os.cpu_count(),
               **measure(broker.bootstrap, broker.proc.pid, quick=args.quick, partitions=args.partitions,
                         metrics_url=f"http://127.0.0.1:{metrics_port}/metrics")}
    finally:
        broker.stop()
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(doc, indent=2))
    _log("\n".join(table(doc)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
