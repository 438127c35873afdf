#!/usr/bin/env python3
"""Share-group consume throughput (issue 32): `--records` records on a 2-partition topic read by a
share group of 1, 4 and 16 librdkafka share consumers (confluent_kafka.ShareConsumer, implicit
acknowledgement: every record delivered is acknowledged by the next poll), against one classic
consumer group consumer reading the same records, in the same run against one `loglake serve`.

    .venv/bin/python benchmarks/share_groups.py                    # ~1 min
    .venv/bin/python benchmarks/share_groups.py --records 200000 --consumers 1,4,16

Prints a JSON document on stdout and a table on stderr: records/s delivered and, for the share
groups, acknowledgements/s. In implicit mode each poll accepts what the one before returned, so
acknowledgements/s is records/s, and the time runs from the consumers' start (joining included)
to the last record delivered. The consumer group's time includes its join (and the broker's
initial rebalance delay).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from confluent_kafka import Consumer, Producer, ShareConsumer  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from brokerkit import serving_broker  # noqa: E402

PARTITIONS = 2


def _fill(bootstrap: str, topic: str, records: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(timeout=30)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": 1000})
    for i in range(records):
        p.produce(topic, value=b"x" * 100, partition=i % PARTITIONS)
        if i % 10_000 == 0:
            p.poll(0)
    assert p.flush(60) == 0


def _earliest(bootstrap: str, group: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(timeout=30)


def share_run(bootstrap: str, topic: str, records: int, consumers: int, timeout_s: float) -> dict[str, Any]:
    group = f"share-{consumers}"
    _earliest(bootstrap, group)
    counts = [0] * consumers
    stop = threading.Event()

    def consume(i: int) -> None:
        c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
        c.subscribe([topic])
        try:
            while not stop.is_set():
                counts[i] += sum(1 for m in c.poll(0.2) if m.error() is None)
        finally:
            c.close()  # acknowledges what the last poll returned

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(consumers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    while sum(counts) < records and time.monotonic() < deadline:
        time.sleep(0.05)
    elapsed = time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join()
    delivered = sum(counts)
    return {"consumers": consumers, "delivered": delivered, "seconds": round(elapsed, 3),
            "records_per_s": round(delivered / elapsed), "acks_per_s": round(delivered / elapsed),
            "per_consumer": counts}


def consumer_group_run(bootstrap: str, topic: str, records: int, timeout_s: float) -> dict[str, Any]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "classic", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    n = 0
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    while n < records and time.monotonic() < deadline:
        n += sum(1 for m in c.consume(1000, 0.2) if m.error() is None)
    elapsed = time.perf_counter() - t0
    c.close()
    return {"consumers": 1, "delivered": n, "seconds": round(elapsed, 3), "records_per_s": round(n / elapsed)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--consumers", default="1,4,16", help="share group sizes, comma-separated")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="per run")
    args = ap.parse_args()
    out: dict[str, Any] = {"records": args.records, "partitions": PARTITIONS, "share": []}
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp, serving_broker(Path(tmp) / "data") as b:
        _fill(b.bootstrap, "bench", args.records)
        out["consumer_group"] = consumer_group_run(b.bootstrap, "bench", args.records, args.timeout_s)
        for n in (int(x) for x in args.consumers.split(",")):
            out["share"].append(share_run(b.bootstrap, "bench", args.records, n, args.timeout_s))
    print(json.dumps(out, indent=2))
    cg = out["consumer_group"]
    print(f"{'run':<24}{'records/s':>12}{'acks/s':>10}{'seconds':>10}", file=sys.stderr)
    print(f"{'consumer group (1)':<24}{cg['records_per_s']:>12}{'-':>10}{cg['seconds']:>10}", file=sys.stderr)
    for r in out["share"]:
        print(f"{'share group (' + str(r['consumers']) + ')':<24}{r['records_per_s']:>12}{r['acks_per_s']:>10}"
              f"{r['seconds']:>10}", file=sys.stderr)


if __name__ == "__main__":
    main()
