"""Hostile clients against a real `loglake serve` (issue 31): what a stalled or non-reading client
costs everyone else, measured from outside.

* **stalled half-frames**: N connections each send the 4-byte size prefix of a 100,000,000-byte
  request and the first STALL_SENT_BYTES of it, then nothing. Meanwhile a probe sends ApiVersions
  every PROBE_INTERVAL_S on a connection opened before the attack and on a fresh one each time;
  the figures are those round trips (a probe unanswered within PROBE_TIMEOUT_S counts as that long
  and as a timeout), and how many stalled connections the broker closed by the end.
* **produce flood**: FLOOD_PRODUCERS idempotent producers send one 100 B record per request
  (linger.ms 0) as fast as they can; a probe's ApiVersions round trips meanwhile.
* **unread fetches**: DATA_BYTES of 1 KiB records over 4 partitions (unsealed: the memory budget
  holds them), then N connections each send one Fetch for all of it and never read the answer;
  the broker's VmRSS is sampled from /proc before and for UNREAD_HOLD_S after.

    python benchmarks/hostile.py [--quick] [--connections N] [--json out.json]

Prints a table on stderr and JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from kafka.protocol.metadata import ApiVersionsRequest  # noqa: E402

from hostilekit import (  # noqa: E402
    CLAIMED_FRAME_BYTES,
    FLOOD_PRODUCERS,
    MIB,
    PARTITIONS,
    PROBE_TIMEOUT_S,
    STALL_SENT_BYTES,
    Flood,
    fetch_everything,
    latencies,
    probe,
    produce,
    rss_bytes,
)
from test_broker_malformed import RawClient  # noqa: E402

from brokerkit import Broker  # noqa: E402

PROBE_INTERVAL_S = 0.1
UNREAD_HOLD_S = 10.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def stalled_half_frames(work: Path, connections: int, seconds: float) -> dict[str, Any]:
    with_broker = Broker(work / "stall-data").start()
    try:
        bootstrap = with_broker.bootstrap
        persistent = RawClient(bootstrap)
        persistent.request(ApiVersionsRequest[0]())
        stalled = []
        for _ in range(connections):
            s = socket.create_connection(("127.0.0.1", with_broker.port))
            s.sendall(struct.pack(">i", CLAIMED_FRAME_BYTES) + b"\0" * STALL_SENT_BYTES)
            stalled.append(s)
        old: list[float] = []
        new: list[float] = []
        timeouts = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for conn, out in ((persistent, old), (None, new)):
                took, ok = probe(bootstrap, conn)
                out.append(took)
                if not ok:
                    timeouts += 1
                    if conn is persistent:  # its stream is out of step now: a new one
                        persistent.close()
                        persistent = RawClient(bootstrap, timeout=PROBE_TIMEOUT_S)
            time.sleep(PROBE_INTERVAL_S)
        closed = 0
        for s in stalled:
            s.setblocking(False)
            try:
                closed += s.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
            s.close()
        persistent.close()
        return {
            "connections": connections,
            "seconds": seconds,
            "probes": len(old) + len(new),
            "timeouts": timeouts,
            "existing_connection": latencies(old),
            "new_connection": latencies(new),
            "all": latencies(old + new),
            "stalled_closed_by_broker": closed,
        }
    finally:
        with_broker.stop()


def unread_fetches(work: Path, connections: int, data_bytes: int) -> dict[str, Any]:
    b = Broker(work / "fetch-data", ["--default-partitions", str(PARTITIONS)]).start()
    try:
        assert b.proc is not None
        pid = b.proc.pid
        produce(b.bootstrap, "big", data_bytes)
        time.sleep(1.0)
        before = rss_bytes(pid)
        request = fetch_everything("big", data_bytes)
        clients = []
        for _ in range(connections):
            c = RawClient(b.bootstrap)
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and never read
            c.send(request)
            clients.append(c)
        peak = before
        samples = []
        deadline = time.monotonic() + UNREAD_HOLD_S
        while time.monotonic() < deadline:
            rss = rss_bytes(pid)
            samples.append(rss)
            peak = max(peak, rss)
            time.sleep(0.25)
        # the broker still answers others meanwhile
        took, ok = probe(b.bootstrap, None)
        # the answers were real: the first client's response is as large as the data (its size
        # prefix says so; reading all of it through a 4 KiB receive window would take minutes)
        size = 0
        first = clients[0]
        first.sock.settimeout(10)
        try:
            head = b""
            while len(head) < 4:
                piece = first.sock.recv(4 - len(head))
                if not piece:
                    raise ConnectionError("closed")
                head += piece
            size = struct.unpack(">i", head)[0]
        except (OSError, ConnectionError) as exc:
            log(f"reading the first client's response: {exc}")
        for c in clients:
            c.close()
        return {
            "connections": connections,
            "data_bytes": data_bytes,
            "rss_before_mib": before / MIB,
            "rss_peak_mib": peak / MIB,
            "rss_growth_mib": (peak - before) / MIB,
            "rss_end_mib": samples[-1] / MIB,
            "response_bytes": size,
            "probe_ms": took * 1000,
            "probe_answered": ok,
        }
    finally:
        b.stop()


def produce_flood(work: Path, seconds: float) -> dict[str, Any]:
    """ApiVersions round trips while FLOOD_PRODUCERS producers send one-record requests (linger 0)."""
    b = Broker(work / "flood-data", ["--default-partitions", str(PARTITIONS)]).start()
    try:
        flood = Flood(b.bootstrap, "flood")
        time.sleep(2.0)  # the flood is on
        took: list[float] = []
        timeouts = 0
        with RawClient(b.bootstrap, timeout=PROBE_TIMEOUT_S) as persistent:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                t0, ok = probe(b.bootstrap, persistent)
                took.append(t0)
                timeouts += not ok
                time.sleep(PROBE_INTERVAL_S)
        sent = flood.stop()
        return {"producers": FLOOD_PRODUCERS, "records_sent": sent, "probes": len(took), "timeouts": timeouts, **latencies(took)}
    finally:
        b.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer seconds and less data")
    ap.add_argument("--connections", type=int, default=100)
    ap.add_argument("--json", help="also write the JSON here")
    ap.add_argument("--only", choices=["stall", "fetch", "flood"], help="one scenario")
    args = ap.parse_args()
    out: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="loglake-hostile-") as tmp:
        work = Path(tmp)
        if args.only in (None, "stall"):
            log(f"stalled half-frames: {args.connections} connections")
            out["stalled_half_frames"] = stalled_half_frames(work, args.connections, 5.0 if args.quick else 20.0)
        if args.only in (None, "fetch"):
            data = 40 * MIB if args.quick else 160 * MIB
            log(f"unread fetches: {args.connections} connections, {data // MIB} MiB")
            out["unread_fetches"] = unread_fetches(work, args.connections, data)
        if args.only in (None, "flood"):
            log(f"produce flood: {FLOOD_PRODUCERS} producers, one record per request")
            out["produce_flood"] = produce_flood(work, 5.0 if args.quick else 20.0)
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    rows = []
    if "stalled_half_frames" in out:
        s = out["stalled_half_frames"]
        a = s["all"]
        rows.append(
            f"stalled half-frames x{s['connections']}: ApiVersions p50 {a['p50_ms']:.1f} ms, "
            f"p99 {a['p99_ms']:.1f} ms, max {a['max_ms']:.1f} ms, {s['timeouts']}/{s['probes']} timed out; "
            f"{s['stalled_closed_by_broker']} stalled connections closed by the broker"
        )
    if "unread_fetches" in out:
        u = out["unread_fetches"]
        rows.append(
            f"unread fetches x{u['connections']} of {u['data_bytes'] // MIB} MiB: RSS {u['rss_before_mib']:.0f} -> "
            f"peak {u['rss_peak_mib']:.0f} MiB (+{u['rss_growth_mib']:.0f}); a probe meanwhile "
            f"{'answered' if u['probe_answered'] else 'NOT answered'} in {u['probe_ms']:.0f} ms; "
            f"each response {u['response_bytes'] / MIB:.1f} MiB"
        )
    if "produce_flood" in out:
        f = out["produce_flood"]
        rows.append(
            f"produce flood x{f['producers']} ({f['records_sent']} records): ApiVersions p50 {f['p50_ms']:.1f} ms, "
            f"p99 {f['p99_ms']:.1f} ms, max {f['max_ms']:.1f} ms, {f['timeouts']}/{f['probes']} timed out"
        )
    log("\n".join(rows))


if __name__ == "__main__":
    main()
