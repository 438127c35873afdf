#!/usr/bin/env python3
"""loglake wire-protocol codec benchmark: µs per operation, ours vs kafka-python's generic codec.

    .venv/bin/python benchmarks/protocol.py            # JSON on stdout, table on stderr
    .venv/bin/python benchmarks/protocol.py --table    # the table on stdout instead of JSON
    .venv/bin/python benchmarks/protocol.py --quick    # shorter timing windows

Cases (each timed as the median of several windows of repeated calls, one thread):

- produce-decode 1x1MiB / 100x10KiB: `decode_request` of a Produce v9 request frame (records
  stay memoryview slices of the frame) vs kafka-python's `ProduceRequest.decode` (copies records).
- fetch-encode 100x10KiB: `encode_fetch_response` v12 with records as bytes chunks or as file
  ranges (spliced, never copied) vs kafka-python encoding the same response (records copied), and
  our buffers joined into one bytes (what a server without writev/sendfile would do).
- metadata 100 topics: decode a Metadata v12 request naming 100 topics, encode the response for
  100 topics x 1 partition, and both.
- framing: FrameDecoder splitting a 1 MiB frame fed in 64 KiB reads.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.parser import KafkaProtocol
from kafka.protocol.producer import ProduceRequest

from loglake.broker.protocol import (
    FetchPartition,
    FetchResponseData,
    FetchTopic,
    FileSlice,
    FrameDecoder,
    decode_request,
    encode_fetch_response,
    encode_response,
    join,
    make_response,
)


def _client_frame(request: Any) -> bytes:
    proto = KafkaProtocol(client_id="bench")
    proto.send_request(request, correlation_id=1)
    return bytes(proto.send_bytes())


def _produce_frame(partitions: int, size: int) -> bytes:
    T = ProduceRequest.TopicProduceData
    parts = [T.PartitionProduceData(index=i, records=bytes([i % 256]) * size) for i in range(partitions)]
    req = ProduceRequest[9](acks=-1, timeout_ms=30000, topic_data=[T(name="bench", partition_data=parts)])
    return _client_frame(req)[4:]


def _timeit(fn: Callable[[], object], window: float, repeats: int) -> float:
    """Median µs per call over `repeats` windows of about `window` seconds."""
    fn()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= window / 4:
            break
        n *= 2
    per_window = max(1, int(n * window / max(dt, 1e-9)))
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(per_window):
            fn()
        samples.append((time.perf_counter() - t0) / per_window * 1e6)
    return statistics.median(samples)


def run(window: float, repeats: int) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []

    def case(name: str, fn: Callable[[], object], note: str = "") -> None:
        us = _timeit(fn, window, repeats)
        results.append({"case": name, "us_per_op": round(us, 2), "note": note})
        print(f"  {name:<44} {us:>10.1f} µs", file=sys.stderr)

    # Produce decode
    for partitions, size, label in ((1, 1 << 20, "1x1MiB"), (100, 10 << 10, "100x10KiB")):
        frame = _produce_frame(partitions, size)
        hdr_len = 2 + 2 + 4 + 2 + len("bench") + 1  # v9 header: key, ver, corr, client id, tags
        body = frame[hdr_len:]
        case(f"produce-decode {label} (loglake)", lambda f=frame: decode_request(f), "records: memoryview slices")
        case(
            f"produce-decode {label} (kafka-python)",
            lambda b=body: ProduceRequest.decode(b, version=9),
            "records copied to bytes",
        )

    # Fetch encode
    chunk = b"\x01" * (10 << 10)
    resp_bytes = FetchResponseData(
        responses=[
            FetchTopic(
                topic="bench",
                partitions=[FetchPartition(i, 0, 1000, 1000, 0, None, -1, [chunk]) for i in range(100)],
            )
        ]
    )
    resp_files = FetchResponseData(
        responses=[
            FetchTopic(
                topic="bench",
                partitions=[
                    FetchPartition(i, 0, 1000, 1000, 0, None, -1, [FileSlice("/seg", i * 10240, 10240)])
                    for i in range(100)
                ],
            )
        ]
    )
    case("fetch-encode 100x10KiB bytes (loglake)", lambda: encode_fetch_response(1, 12, resp_bytes), "201 buffers")
    case("fetch-encode 100x10KiB file ranges (loglake)", lambda: encode_fetch_response(1, 12, resp_files), "sendfile")
    case(
        "fetch-encode 100x10KiB + join (loglake)",
        lambda: join(encode_fetch_response(1, 12, resp_bytes)),
        "one contiguous bytes",
    )
    T = FetchResponse.FetchableTopicResponse
    kp_resp = FetchResponse[12](
        responses=[
            T(
                topic="bench",
                partitions=[
                    T.PartitionData(partition_index=i, high_watermark=1000, last_stable_offset=1000, records=chunk)
                    for i in range(100)
                ],
            )
        ]
    )
    case("fetch-encode 100x10KiB (kafka-python)", lambda: kp_resp.encode(version=12), "records copied")

    # Metadata
    mreq = MetadataRequest[12](
        topics=[MetadataRequest.MetadataRequestTopic(name=f"topic-{i}") for i in range(100)],
        allow_auto_topic_creation=False,
    )
    mframe = _client_frame(mreq)[4:]
    decoded = decode_request(mframe)
    mfields = {
        "brokers": [{"node_id": 1, "host": "localhost", "port": 9092}],
        "cluster_id": "lake",
        "controller_id": 1,
        "topics": [
            {
                "name": f"topic-{i}",
                "partitions": [{"partition_index": 0, "leader_id": 1, "replica_nodes": [1], "isr_nodes": [1]}],
            }
            for i in range(100)
        ],
    }
    mresp = make_response(3, 12, mfields)
    case("metadata-decode 100 topics", lambda: decode_request(mframe))
    case("metadata-encode 100 topics (built object)", lambda: encode_response(decoded, mresp))
    case("metadata-make+encode 100 topics (from dicts)", lambda: encode_response(decoded, mfields))
    case(
        "metadata-decode+make+encode 100 topics",
        lambda: encode_response(decode_request(mframe), mfields),
    )

    # Framing
    payload = b"\x00" * (1 << 20)
    big_frame = (len(payload)).to_bytes(4, "big") + payload
    reads = [big_frame[i : i + 65536] for i in range(0, len(big_frame), 65536)]

    def framing() -> None:
        dec = FrameDecoder()
        for r in reads:
            dec.feed(r)

    case("framing 1MiB frame in 64KiB reads", framing)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--table", action="store_true", help="table on stdout instead of JSON")
    args = ap.parse_args()
    window, repeats = (0.05, 3) if args.quick else (0.3, 5)
    print("protocol codec benchmark (µs per op, median):", file=sys.stderr)
    results = run(window, repeats)
    doc = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "results": results,
    }
    if args.table:
        print(f"{'case':<46} {'µs/op':>10}  note")
        for r in results:
            print(f"{r['case']:<46} {r['us_per_op']:>10.1f}  {r['note']}")
    else:
        print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
