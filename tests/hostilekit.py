"""What the hostile-client test (tests/test_hostile_clients.py) and benchmark
(benchmarks/hostile.py) share: the attacks' sizes, a producer of unsealed data, the Fetch that
asks for all of it, a flood of one-record produce requests, the ApiVersions probe and the
broker's RSS read from outside."""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import ApiVersionsRequest

from test_broker_malformed import RawClient

MIB = 1024 * 1024
#: What a stalled connection's size prefix claims, and what of it it sends before it stops.
CLAIMED_FRAME_BYTES = 100_000_000
STALL_SENT_BYTES = 64 * 1024
PARTITIONS = 4
RECORD_BYTES = 1024
#: The produce flood: idempotent producers each sending one FLOOD_RECORD_BYTES record per request.
FLOOD_PRODUCERS = 4
FLOOD_RECORD_BYTES = 100
#: Records a flood producer may hold unsent (bounds how long its final flush takes).
FLOOD_QUEUED_RECORDS = 20_000
#: A probe unanswered within this long counts as this long, and as a timeout.
PROBE_TIMEOUT_S = 5.0


def rss_bytes(pid: int) -> int:
    """VmRSS of process `pid`, from /proc."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def produce(bootstrap: str, topic: str, total: int) -> None:
    """`total` bytes of RECORD_BYTES records over PARTITIONS partitions, acknowledged."""
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "acks": "all",
            "queue.buffering.max.kbytes": 256 * 1024,
        }
    )
    value = b"v" * RECORD_BYTES
    for i in range(total // RECORD_BYTES):
        while True:
            try:
                p.produce(topic, value, partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0


def fetch_everything(topic: str, total: int) -> FetchRequest:
    """One Fetch (v12) for all of `produce`'s data, from offset 0 of every partition."""
    F = FetchRequest.FetchTopic
    per_partition = total // PARTITIONS + MIB
    return FetchRequest[12](
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=total + PARTITIONS * MIB,
        isolation_level=0,
        topics=[
            F(
                topic=topic,
                partitions=[
                    F.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=per_partition)
                    for p in range(PARTITIONS)
                ],
            )
        ],
    )


def probe(bootstrap: str, persistent: RawClient | None) -> tuple[float, bool]:
    """One ApiVersions round trip on `persistent` (or a fresh connection): (seconds, answered)."""
    started = time.perf_counter()
    try:
        if persistent is not None:
            persistent.sock.settimeout(PROBE_TIMEOUT_S)
            persistent.request(ApiVersionsRequest[0]())
        else:
            with RawClient(bootstrap, timeout=PROBE_TIMEOUT_S) as c:
                c.request(ApiVersionsRequest[0]())
        return time.perf_counter() - started, True
    except (OSError, ConnectionError):
        return PROBE_TIMEOUT_S, False


def latencies(values: list[float]) -> dict[str, float]:
    """p50, p99 and max of `values` (seconds) in milliseconds."""
    ordered = sorted(values)
    return {
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        "max_ms": ordered[-1] * 1000,
    }


def _flood_one(bootstrap: str, topic: str, stop: threading.Event, sent: list[int]) -> None:
    from confluent_kafka import Producer

    p = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all", "enable.idempotence": True,
         "queue.buffering.max.messages": FLOOD_QUEUED_RECORDS}
    )  # fmt: skip
    n = 0
    value = b"x" * FLOOD_RECORD_BYTES
    while not stop.is_set():
        try:
            p.produce(topic, value)
            n += 1
        except BufferError:
            p.poll(0.01)
        p.poll(0)
    p.flush(30)
    sent.append(n)


def flood_main(bootstrap: str, topic: str) -> None:
    """FLOOD_PRODUCERS producers flood `topic` until stdin closes; prints the records sent."""
    stop = threading.Event()
    sent: list[int] = []
    threads = [threading.Thread(target=_flood_one, args=(bootstrap, topic, stop, sent)) for _ in range(FLOOD_PRODUCERS)]
    for t in threads:
        t.start()
    sys.stdin.read()
    stop.set()
    for t in threads:
        t.join(60)
    print(sum(sent), flush=True)


class Flood:
    """The produce flood in a process of its own, so that its Python threads do not share the
    probe's interpreter (a probe waiting for the GIL would measure the client, not the broker)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        tests = str(Path(__file__).resolve().parent)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"import sys; sys.path.insert(0, {tests!r}); import hostilekit; "
             f"hostilekit.flood_main({bootstrap!r}, {topic!r})"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def stop(self) -> int:
        """End the flood; the records its producers sent."""
        out, _ = self.proc.communicate("", timeout=90)
        assert self.proc.returncode == 0, f"the flood exited {self.proc.returncode}"
        return int(out.strip() or 0)
