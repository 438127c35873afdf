"""Prometheus metrics and the health endpoints (`--metrics-listen HOST:PORT`).

Counters are plain ints updated on the event loop; engine-side numbers (WAL fsyncs, offsets,
memory pool, consumer lag) are read when /metrics is scraped. The HTTP side is a minimal
GET-only HTTP/1.1 responder on asyncio: /metrics, /healthz (process up), /readyz (recovery done
and accepting connections).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: Latency histogram bucket upper bounds, seconds.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Largest HTTP request head the metrics endpoint reads.
HTTP_HEAD_BYTES_MAX = 8192


class Metrics:
    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = defaultdict(int)  # (api, error) -> count
        self.latency_counts: dict[str, list[int]] = {}
        self.latency_sum: dict[str, float] = defaultdict(float)
        self.bytes_in = 0
        self.bytes_out = 0
        self.connections_open = 0
        self.connections_total = 0
        self.connections_rejected = 0
        self.protocol_errors: dict[str, int] = defaultdict(int)
        self.ready = False

    def observe(self, api: str, seconds: float, error: int = 0) -> None:
        self.requests[(api, error)] += 1
        counts = self.latency_counts.get(api)
        if counts is None:
            counts = self.latency_counts[api] = [0] * (len(LATENCY_BUCKETS_S) + 1)
        for i, bound in enumerate(LATENCY_BUCKETS_S):
            if seconds <= bound:
                counts[i] += 1
                break
        else:
            counts[-1] += 1
        self.latency_sum[api] += seconds

    def render(self, engine: Any, coordinator: Any) -> str:
        out: list[str] = []

        def line(name: str, value: float, labels: dict[str, Any] | None = None) -> None:
            if labels:
                body = ",".join(f'{k}="{v}"' for k, v in labels.items())
                out.append(f"{name}{{{body}}} {value}")
            else:
                out.append(f"{name} {value}")

        out.append("# TYPE loglake_requests_total counter")
        for (api, error), n in sorted(self.requests.items()):
            line("loglake_requests_total", n, {"api": api, "error": error})
        out.append("# TYPE loglake_request_seconds histogram")
        for api, counts in sorted(self.latency_counts.items()):
            cumulative = 0
            for bound, n in zip((*LATENCY_BUCKETS_S, float("inf")), counts, strict=True):
                cumulative += n
                line("loglake_request_seconds_bucket", cumulative, {"api": api, "le": "+Inf" if bound == float("inf") else bound})
            line("loglake_request_seconds_sum", round(self.latency_sum[api], 6), {"api": api})
            line("loglake_request_seconds_count", cumulative, {"api": api})
        out.append("# TYPE loglake_bytes_in_total counter")
        line("loglake_bytes_in_total", self.bytes_in)
        out.append("# TYPE loglake_bytes_out_total counter")
        line("loglake_bytes_out_total", self.bytes_out)
        line("loglake_connections_open", self.connections_open)
        line("loglake_connections_total", self.connections_total)
        line("loglake_connections_rejected_total", self.connections_rejected)
        for kind, n in sorted(self.protocol_errors.items()):
            line("loglake_protocol_errors_total", n, {"kind": kind})
        pool = engine.memory_pool
        line("loglake_memory_pool_used_bytes", pool.used_bytes)
        line("loglake_memory_pool_budget_bytes", pool.budget_bytes)
        line("loglake_memory_pool_waits_total", pool.waits)
        out.append("# TYPE loglake_wal_fsync_seconds_total counter")
        for i, shard in enumerate(engine.shards):
            labels = {"shard": i}
            line("loglake_wal_fsyncs_total", shard.fsyncs, labels)
            line("loglake_wal_fsync_seconds_total", round(shard.fsync_seconds_total, 6), labels)
            line("loglake_wal_groups_total", shard.groups_written, labels)
            line("loglake_wal_frames_total", shard.frames_written, labels)
        cold = getattr(engine, "cold_reader", None)
        if cold is not None:
            out.append("# TYPE loglake_cold_range_gets_total counter")
            line("loglake_cold_range_gets_total", cold.gets)
            line("loglake_cold_range_cache_hits_total", cold.ranges.hits)
            line("loglake_cold_range_cache_misses_total", cold.ranges.misses)
            line("loglake_cold_range_cache_bytes", cold.ranges.size_bytes)
        high_watermarks: dict[tuple[str, int], int] = {}
        for topic in engine.topics():
            for p in range(topic.partitions):
                info = engine.partition_info(topic.name, p)
                labels = {"topic": topic.name, "partition": p}
                high_watermarks[(topic.name, p)] = info.high_watermark
                line("loglake_partition_high_watermark", info.high_watermark, labels)
                line("loglake_partition_log_start_offset", info.log_start_offset, labels)
                line("loglake_partition_segments", info.segments, labels)
                line("loglake_partition_unsealed_bytes", info.unsealed_bytes, labels)
                if topic.config.compacted:
                    line("loglake_partition_dirty_ratio", round(info.dirty_ratio, 6), labels)
        try:
            cleaner = engine.cleaner
        except Exception:  # closed meanwhile, or an engine without one
            cleaner = None
        if cleaner is not None:
            stats = cleaner.stats
            for name, value in (
                ("loglake_cleaner_bytes_read_total", stats.bytes_read),
                ("loglake_cleaner_bytes_written_total", stats.bytes_written),
                ("loglake_cleaner_records_read_total", stats.records_in),
                ("loglake_cleaner_records_kept_total", stats.records_out),
                ("loglake_cleaner_tombstones_dropped_total", stats.tombstones_dropped),
                ("loglake_cleaner_compactions_total", stats.passes),
                ("loglake_cleaner_merges_total", stats.merges),
                ("loglake_cleaner_segments_replaced_total", stats.segments_replaced),
                ("loglake_cleaner_errors_total", stats.errors),
                ("loglake_cleaner_aborted_total", stats.aborted),
            ):
                out.append(f"# TYPE {name} counter")
                line(name, value)
            line("loglake_cleaner_last_run_timestamp_seconds", stats.last_run_ms / 1000)
            partitions = list(cleaner.partition_stats.items())
            out.append("# TYPE loglake_cleaner_partition_last_compaction_timestamp_seconds gauge")
            for (topic_name, p), pstats in partitions:
                if "last_run_ms" in pstats:
                    labels = {"topic": topic_name, "partition": p}
                    line("loglake_cleaner_partition_last_compaction_timestamp_seconds", pstats["last_run_ms"] / 1000, labels)
            out.append("# TYPE loglake_cleaner_partition_errors_total counter")
            for (topic_name, p), pstats in partitions:
                if pstats.get("errors"):
                    line("loglake_cleaner_partition_errors_total", pstats["errors"], {"topic": topic_name, "partition": p})
        if coordinator is not None and hasattr(coordinator, "fetch_offsets"):
            groups: list[Any] = coordinator.list_groups()
            for entry in groups:
                group_id = entry[0]
                _err, offsets = coordinator.fetch_offsets(group_id, None)
                for topic, partition, offset, *_rest in offsets:
                    hw = high_watermarks.get((topic, partition))
                    if hw is not None and offset >= 0:
                        line(
                            "loglake_consumer_group_lag",
                            max(0, hw - offset),
                            {"group": group_id, "topic": topic, "partition": partition},
                        )
        line("loglake_ready", 1 if self.ready else 0)
        return "\n".join(out) + "\n"


async def serve_metrics(
    host: str, port: int, render: Callable[[], str], ready: Callable[[], bool]
) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
            if len(head) > HTTP_HEAD_BYTES_MAX:
                raise ValueError("request head too large")
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = request_line.split()
            path = parts[1] if len(parts) >= 2 else "/"
            if parts and parts[0] != "GET":
                status, body, ctype = "405 Method Not Allowed", "only GET\n", "text/plain"
            elif path.startswith("/metrics"):
                status, body, ctype = "200 OK", render(), "text/plain; version=0.0.4"
            elif path.startswith("/healthz"):
                status, body, ctype = "200 OK", "ok\n", "text/plain"
            elif path.startswith("/readyz"):
                ok = ready()
                status = "200 OK" if ok else "503 Service Unavailable"
                body, ctype = ("ready\n" if ok else "recovering\n"), "text/plain"
            else:
                status, body, ctype = "404 Not Found", "not found\n", "text/plain"
            data = body.encode()
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + data
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError, ConnectionError):
            pass
        except Exception:
            log.exception("metrics endpoint failed")
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port, limit=HTTP_HEAD_BYTES_MAX)
