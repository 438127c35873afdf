"""Child process for the kill -9 test: produce with durability=fsync, print every ack.

Usage: crash_child.py DATA_DIR CYCLE. Prints "ack PARTITION OFFSET CYCLE SEQ" per acknowledged
record (only after the future resolved, i.e. after the group fdatasync), flushed at once.
"""

from __future__ import annotations

import sys
from concurrent.futures import Future

import loglake

IN_FLIGHT = 32


def value_for(cycle: int, seq: int) -> bytes:
    return (f"c{cycle}-s{seq}-".encode()) * (1 + seq % 40)


def main() -> None:
    data_dir, cycle = sys.argv[1], int(sys.argv[2])
    log = loglake.open(data_dir, wal_shards=2, wal_file_bytes=256 * 1024)
    if "k" not in log.list_topics():
        log.create_topic("k", partitions=3, config={"durability": "fsync", "segment.bytes": "65536"})
    print("ready", flush=True)
    pending: list[tuple[int, Future[loglake.RecordMetadata]]] = []
    seq = 0
    while True:
        key = f"key-{seq % 17}".encode()
        pending.append((seq, log.produce_async("k", value_for(cycle, seq), key=key)))
        seq += 1
        if len(pending) >= IN_FLIGHT:
            done_seq, fut = pending.pop(0)
            md = fut.result()
            sys.stdout.write(f"ack {md.partition} {md.offset} {cycle} {done_seq}\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
