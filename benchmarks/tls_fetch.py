#!/usr/bin/env python3
"""What TLS costs Fetch: one `loglake serve` with a PLAINTEXT and an SSL listener, one topic
written once, then read from the beginning by a confluent-kafka consumer through each listener in
turn (PLAINTEXT, SSL, PLAINTEXT, SSL, ...). PLAINTEXT sends record data with sendfile; SSL reads
it into memory and encrypts it (docs/SECURITY.md, "What TLS costs").

    .venv/bin/python benchmarks/tls_fetch.py             # 200 MB of 1 KiB records, 3 rounds
    .venv/bin/python benchmarks/tls_fetch.py --mb 400 --record-bytes 16384

Prints a JSON document: MB/s and broker CPU (utime+stime over wall time, 100 = one core) per
listener and round, and the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from tlskit import make_pki  # noqa: E402 - the tests' certificate generator


def broker_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def consume(conf: dict[str, Any], topic: str, count: int, pid: int) -> dict[str, float]:
    c = Consumer({**conf, "group.id": uuid.uuid4().hex, "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10485760})
    c.assign([TopicPartition(topic, 0, 0)])
    got = size = 0
    cpu0, t0 = broker_cpu(pid), time.perf_counter()
    while got < count:
        for m in c.consume(10_000, 1.0):
            if not m.error():
                got += 1
                size += len(m.value())
    wall = time.perf_counter() - t0
    cpu = broker_cpu(pid) - cpu0
    c.close()
    return {"mb_per_s": size / wall / 1e6, "seconds": wall, "broker_cpu_percent": 100 * cpu / wall}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--record-bytes", type=int, default=1024)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        pki = make_pki(Path(tmp) / "pki")
        port_file = Path(tmp) / "ports"
        cmd = [
            sys.executable, "-m", "loglake.cli.main", "--log-level", "WARNING", "serve", "--data-dir", f"{tmp}/data",
            "--listen", "127.0.0.1:0", "--listen", "SSL://127.0.0.1:0", "--port-file", str(port_file),
            "--ssl-cert", str(pki.server.cert), "--ssl-key", str(pki.server.key),
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        try:
            while not port_file.exists():
                time.sleep(0.1)
            plain, tls = (int(p) for p in port_file.read_text().split())
            record = args.record_bytes
            count = args.mb * 1_000_000 // record
            topic = "tls-bench"
            p = Producer({"bootstrap.servers": f"127.0.0.1:{plain}", "linger.ms": 5, "batch.size": 1_000_000, "acks": 1})
            value = os.urandom(record)
            for _ in range(count):
                while True:
                    try:
                        p.produce(topic, value)
                        break
                    except BufferError:
                        p.poll(0.05)
            p.flush()
            confs = {
                "PLAINTEXT": {"bootstrap.servers": f"127.0.0.1:{plain}"},
                "SSL": {"bootstrap.servers": f"127.0.0.1:{tls}", "security.protocol": "SSL", "ssl.ca.location": str(pki.ca)},
            }
            runs: dict[str, list[dict[str, float]]] = {"PLAINTEXT": [], "SSL": []}
            for _ in range(args.rounds):
                for name, conf in confs.items():
                    runs[name].append(consume(conf, topic, count, proc.pid))
                    print(name, runs[name][-1], file=sys.stderr)
            medians = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}
            out = {
                "records": count, "record_bytes": record, "runs": runs, "median": medians,
                "ssl_vs_plaintext": medians["SSL"]["mb_per_s"] / medians["PLAINTEXT"]["mb_per_s"],
                "cpus": os.cpu_count(),
            }
            print(json.dumps(out, indent=2))
        finally:
            proc.terminate()
            proc.wait(60)


if __name__ == "__main__":
    main()
