"""Password guessing against `loglake serve` (issue 31): how many failed logins a broker checks
per second for an attacker on one address with 8 connections in parallel.

A broker process of its own with a SASL_PLAINTEXT listener and one user, carol, with a
SCRAM-SHA-512 credential of 8192 iterations (`loglake users add --iterations 8192`). Eight
threads, all from 127.0.0.2, each log in over and over as carol with PLAIN and a wrong password
(a new connection each time, closed as soon as the answer is read) for `--seconds`. Reported:

* answered/s: logins answered SASL_AUTHENTICATION_FAILED per second;
* checked/s: of those, the ones whose password the broker derived and compared (the guesses):
  /metrics' failures minus the throttle's refusals (a broker without the throttle refuses none);
* whether carol's right password, sent last from 127.0.0.2 and from 127.0.0.1, logs in.

`--src DIR` serves another source tree (a checkout of main, to compare), by PYTHONPATH.

    .venv/bin/python benchmarks/sasl_guessing.py                         # ~30 s
    .venv/bin/python benchmarks/sasl_guessing.py --src /path/to/main/src --seconds 20
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from saslkit import RawClient, users  # noqa: E402 - the tests' hand-made Kafka client

from brokerkit import Broker  # noqa: E402

USER, PASSWORD, ITERATIONS = "carol", "carol-secret", 8192
THREADS = 8
ATTACKER, OTHER = "127.0.0.2", "127.0.0.1"
SASL_AUTHENTICATION_FAILED = 58


def plain(port: int, password: str, source: str) -> int:
    c = RawClient(port, source=source)
    try:
        assert c.handshake("PLAIN")[0] == 0
        return c.authenticate(b"\0" + USER.encode() + b"\0" + password.encode())[0]
    finally:
        c.close()


def metric_sum(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def measure(work: Path, seconds: float, src: Path) -> dict[str, object]:
    data = work / "data"
    users("add", USER, "--password-stdin", "--iterations", str(ITERATIONS), data_dir=data, password=PASSWORD)
    metrics = free_port()
    env = {"PYTHONPATH": str(src)}
    broker = Broker(data, ["--listen", "SASL_PLAINTEXT://127.0.0.1:0", "--metrics-listen", f"127.0.0.1:{metrics}"], env)
    broker.start()
    try:
        port = broker.ports[0]
        answered = [0] * THREADS
        stop = time.monotonic() + seconds

        def guess(i: int) -> None:
            n = 0
            while time.monotonic() < stop:
                assert plain(port, f"guess-{i}-{n}", ATTACKER) == SASL_AUTHENTICATION_FAILED
                n += 1
            answered[i] = n

        started = time.monotonic()
        threads = [threading.Thread(target=guess, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read().decode()
        failures = metric_sum(text, "loglake_sasl_authentication_failures_total")
        refused = metric_sum(text, "loglake_sasl_login_throttled_total")
        right_from_attacker = plain(port, PASSWORD, ATTACKER) == 0
        right_from_other = plain(port, PASSWORD, OTHER) == 0
    finally:
        broker.stop()
    return {
        "src": str(src),
        "threads": THREADS,
        "seconds": round(elapsed, 1),
        "answered": sum(answered),
        "answered_per_s": round(sum(answered) / elapsed, 1),
        "checked": int(failures - refused),
        "checked_per_s": round((failures - refused) / elapsed, 2),
        "right_password_from_attacker_logs_in": right_from_attacker,
        "right_password_from_other_address_logs_in": right_from_other,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the source tree the broker runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sasl-guessing-", dir=os.environ.get("TMPDIR")) as work:
        print(json.dumps(measure(Path(work), args.seconds, args.src.resolve()), indent=2))


if __name__ == "__main__":
    main()
