"""What the hostile-client test (tests/test_hostile_clients.py) and benchmark
(benchmarks/hostile.py) share: the attacks' sizes, a producer of unsealed data, the Fetch that
asks for all of it, and the broker's RSS read from outside."""

from __future__ import annotations

from kafka.protocol.consumer import FetchRequest

MIB = 1024 * 1024
#: What a stalled connection's size prefix claims, and what of it it sends before it stops.
CLAIMED_FRAME_BYTES = 100_000_000
STALL_SENT_BYTES = 64 * 1024
PARTITIONS = 4
RECORD_BYTES = 1024


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
