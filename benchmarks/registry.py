#!/usr/bin/env python3
"""Schema registry lookups per second against a real `loglake serve --schema-registry-listen`
(docs/SCHEMA_REGISTRY.md): through confluent-kafka's SchemaRegistryClient by id and by subject
(its cache answers after the first call: what a serializer's steady state costs), and the same
lookups uncached, each an HTTP request on one kept-alive connection (what a cold client or a
cache miss costs: the broker's HTTP server, a worker thread, a metadata read). Registers
`--schemas` Avro schemas under as many subjects first (their registration rate is reported too).

    .venv/bin/python benchmarks/registry.py                  # 200 schemas, ~15 s
    .venv/bin/python benchmarks/registry.py --schemas 1000

Prints a JSON document: operations per second and milliseconds per operation, by case.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

#: Each timed case runs at least this long.
CASE_S = 2.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed(fn: Callable[[int], object], n: int) -> dict[str, float]:
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < CASE_S:
        fn(count % n)
        count += 1
    seconds = time.perf_counter() - started
    return {"ops_per_s": round(count / seconds), "ms_per_op": round(seconds / count * 1e3, 3)}


def schema(i: int) -> str:
    return json.dumps({"type": "record", "name": f"R{i}", "fields": [{"name": "f", "type": "string"}]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schemas", type=int, default=200)
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [sys.executable, "-m", "loglake.cli.main", "serve", "--data-dir", str(Path(tmp) / "data"),
             "--listen", "127.0.0.1:0", "--schema-registry-listen", f"127.0.0.1:{port}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=os.environ.copy(),
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            while not proc.stdout.readline().startswith("loglake listening on "):
                assert proc.poll() is None, "the broker did not start"
            url = f"http://127.0.0.1:{port}"
            client = SchemaRegistryClient({"url": url})
            started = time.perf_counter()
            ids = [client.register_schema(f"s{i}-value", Schema(schema(i), "AVRO")) for i in range(args.schemas)]
            reg_s = time.perf_counter() - started
            session = requests.Session()
            out: dict[str, Any] = {
                "schemas": args.schemas,
                "register": {"ops_per_s": round(args.schemas / reg_s), "ms_per_op": round(reg_s / args.schemas * 1e3, 3)},
                "by_id_cached": timed(lambda i: client.get_schema(ids[i]), args.schemas),
                "by_subject_cached": timed(lambda i: client.get_latest_version(f"s{i}-value"), args.schemas),
                "by_id_uncached": timed(lambda i: session.get(f"{url}/schemas/ids/{ids[i]}").raise_for_status(), args.schemas),
                "by_subject_uncached": timed(
                    lambda i: session.get(f"{url}/subjects/s{i}-value/versions/latest").raise_for_status(), args.schemas
                ),
            }
        finally:
            proc.terminate()
            proc.wait(30)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
