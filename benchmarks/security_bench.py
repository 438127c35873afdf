"""The security section of benchmarks/broker.py (issue 16): what SASL_SSL costs against PLAINTEXT.

A broker of its own with PLAINTEXT, SASL_PLAINTEXT and SASL_SSL listeners (a test CA made with
tests/tlskit.py; one user, alice, with SCRAM-SHA-512 credentials added by `loglake users`):

* produce and consume throughput of 100 B records with 1 MB batches (librdkafka batch.size
  1,000,000, linger.ms 50, acks=all) through PLAINTEXT and SASL_SSL/SCRAM-SHA-512, alternating,
  the better of the runs of each kind kept (all are in "runs"); target: SASL_SSL produce at least
  70 % of PLAINTEXT's (TARGET_SASL_SSL_PRODUCE_FRACTION);
* SCRAM-SHA-512 authentications per second: one client authenticating over and over for a fixed
  time, each on a new connection, over SASL_PLAINTEXT (the mechanism and its two round trips) and
  over SASL_SSL (plus a TLS handshake per connection). The client derives the salted password once
  (saslkit caches it: it is the same every time), so the rate is the broker's, not the client's PBKDF2.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from saslkit import RawClient, ScramClient  # the tests' hand-made Kafka client
from tlskit import make_pki, ssl_args

from brokerkit import Broker

RECORD_BYTES = 100
BATCH_BYTES = 1_000_000
USER, PASSWORD = "alice", "bench-secret"
TARGET_SASL_SSL_PRODUCE_FRACTION = 0.70


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _auth_rate(port: int, ca: Path | None, seconds: float, pid: int, bench: Any) -> dict[str, Any]:
    meter = bench.CpuMeter(pid)
    done = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        c = RawClient(port, ssl_ca=ca)
        try:
            assert c.handshake("SCRAM-SHA-512")[0] == 0
            scram = ScramClient("SCRAM-SHA-512", USER, PASSWORD)
            code, _, first = c.authenticate(scram.first())
            assert code == 0, code
            assert c.authenticate(scram.final(first))[0] == 0
        finally:
            c.close()
        done += 1
    elapsed = time.perf_counter() - started
    return {"authentications": done, "seconds": elapsed, "per_s": done / elapsed, **meter.stop()}


def measure(bench: Any, work: Path, *, quick: bool, count: int | None = None) -> dict[str, Any]:
    count = count or (300_000 if quick else 2_000_000)
    pki = make_pki(work / "pki")
    data = work / "security-data"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "loglake.cli.main",
            "users",
            "add",
            USER,
            "--password-stdin",
            "--data-dir",
            str(data),
        ],
        input=PASSWORD + "\n",
        text=True,
        check=True,
        capture_output=True,
        env=env,
    )
    listeners = [
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "SASL_PLAINTEXT://127.0.0.1:0",
        "--listen",
        "SASL_SSL://127.0.0.1:0",
        # What is measured is the transport (TLS, SASL), not authorization: every principal may do
        # everything (the authorizer still answers each request; with no bindings it allows).
        "--allow-everyone-if-no-acl-found",
    ]
    broker = Broker(data, [*listeners, *ssl_args(pki)]).start()
    assert broker.proc is not None
    pid = broker.proc.pid
    plain, sasl_plain, sasl_ssl = broker.ports
    kinds = {
        "PLAINTEXT": {"bootstrap.servers": f"127.0.0.1:{plain}"},
        "SASL_SSL": {
            "bootstrap.servers": f"127.0.0.1:{sasl_ssl}",
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(pki.ca),
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": USER,
            "sasl.password": PASSWORD,
        },
    }
    batches = {"batch.size": BATCH_BYTES, "linger.ms": 50}
    out: dict[str, Any] = {"record_bytes": RECORD_BYTES, "records": count, "batch_size": BATCH_BYTES}
    produced: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    consumed: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    order = list(kinds) if quick else [*kinds, *reversed(kinds)]
    try:
        for n, kind in enumerate(order):
            conf = kinds[kind]
            topic = f"bench-security-{kind.lower()}-{n}"
            log(
                f"security: {kind} produce, {count:,} x {RECORD_BYTES} B, batch.size {BATCH_BYTES:,}, acks=all ..."
            )
            run = bench.produce_throughput(
                conf["bootstrap.servers"], topic, RECORD_BYTES, count, pid, extra={**conf, **batches}
            )
            produced[kind].append(run)
            log(
                f"  {run['records_per_s']:,.0f} records/s, {run['mb_per_s']:.1f} MB/s, broker CPU {run['broker_cpu_pct']:.0f} %"
            )
            log(f"security: {kind} consume ...")
            run = bench.consume_throughput(conf["bootstrap.servers"], topic, 1, count + 1, pid, extra=conf)
            consumed[kind].append(run)
            log(
                f"  {run['records_per_s']:,.0f} records/s (steady {run['steady_records_per_s']:,.0f}), broker CPU {run['broker_cpu_pct']:.0f} %"
            )
        for kind in kinds:
            out[f"produce_{kind}"] = {
                **max(produced[kind], key=lambda r: r["records_per_s"]),
                "runs": [r["records_per_s"] for r in produced[kind]],
            }
            out[f"consume_{kind}"] = {
                **max(consumed[kind], key=lambda r: r["steady_records_per_s"]),
                "runs": [r["steady_records_per_s"] for r in consumed[kind]],
            }
        seconds = 2.0 if quick else 5.0
        log(
            f"security: SCRAM-SHA-512 authentications for {seconds:.0f} s over SASL_PLAINTEXT, then SASL_SSL ..."
        )
        out["auth_sasl_plaintext"] = _auth_rate(sasl_plain, None, seconds, pid, bench)
        out["auth_sasl_ssl"] = _auth_rate(sasl_ssl, pki.ca, seconds, pid, bench)
        log(
            f"  {out['auth_sasl_plaintext']['per_s']:,.0f}/s over SASL_PLAINTEXT, {out['auth_sasl_ssl']['per_s']:,.0f}/s over SASL_SSL"
        )
        out["produce_sasl_ssl_vs_plaintext"] = (
            out["produce_SASL_SSL"]["records_per_s"] / out["produce_PLAINTEXT"]["records_per_s"]
        )
        out["consume_sasl_ssl_vs_plaintext"] = (
            out["consume_SASL_SSL"]["steady_records_per_s"] / out["consume_PLAINTEXT"]["steady_records_per_s"]
        )
        out["broker_exit_code"] = broker.stop()
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.stop()
    return out


def targets(sec: dict[str, Any], add: Any) -> None:
    v = sec["produce_sasl_ssl_vs_plaintext"]
    add(
        "produce 100 B, 1 MB batches: SASL_SSL vs PLAINTEXT",
        v,
        TARGET_SASL_SSL_PRODUCE_FRACTION,
        "fraction",
        v >= TARGET_SASL_SSL_PRODUCE_FRACTION,
        f"{sec['produce_SASL_SSL']['records_per_s']:,.0f} vs {sec['produce_PLAINTEXT']['records_per_s']:,.0f} records/s",
    )


def table(sec: dict[str, Any]) -> list[str]:
    header = f"{'security, ' + str(sec['record_bytes']) + ' B, 1 MB batches':<36}{'records/s':>12}{'MB/s':>9}{'broker CPU':>12}{'client CPU':>12}"
    lines = [header, "-" * len(header)]
    for what in ("produce", "consume"):
        for kind in ("PLAINTEXT", "SASL_SSL"):
            r = sec[f"{what}_{kind}"]
            rps = r["records_per_s"] if what == "produce" else r["steady_records_per_s"]
            mbps = r["mb_per_s"] if what == "produce" else r["steady_mb_per_s"]
            lines.append(
                f"{what + ', ' + kind:<36}{rps:>12,.0f}{mbps:>9.1f}{r['broker_cpu_pct']:>11.0f}%{r['client_cpu_pct']:>11.0f}%"
            )
    lines.append(
        f"    SASL_SSL / PLAINTEXT: produce {100 * sec['produce_sasl_ssl_vs_plaintext']:.0f} %, "
        f"consume {100 * sec['consume_sasl_ssl_vs_plaintext']:.0f} %"
    )
    for kind, name in (
        ("auth_sasl_plaintext", "SASL_PLAINTEXT"),
        ("auth_sasl_ssl", "SASL_SSL (new TLS session each)"),
    ):
        a = sec[kind]
        lines.append(
            f"    SCRAM-SHA-512 authentications over {name}: {a['per_s']:,.0f}/s, broker CPU {a['broker_cpu_pct']:.0f} %"
        )
    return lines
