"""Prometheus metrics and the health endpoints (`--metrics-listen HOST:PORT`).

The exposition is prometheus-client's, from one `CollectorRegistry` per `Metrics` (never the
library's global default registry, so several brokers in one process, and tests, do not mix):

* request counts and latencies are a prometheus-client `Counter` and `Histogram`
  (`loglake_requests_total{api,error}`, `loglake_request_seconds{api}`); `error` is the Kafka
  error code's name (`NONE`, `UNKNOWN_TOPIC_OR_PARTITION`, ...): the response's top-level error,
  else its first partition-level error that is not NONE (`response_error`);
* everything that is state (connections, bytes, WAL, memory pool, partition offsets, cleaner
  stats, consumer lag) is read when /metrics is scraped, by custom collectors.

Every family has HELP and TYPE, is written in one piece, and label values are escaped by the
library. The `_created` series prometheus-client adds to counters and histograms are left out (they
would be new metric names). The HTTP side answers GET only, one request a connection, on the broker's small HTTP server
(loglake.broker.http):
/metrics, /healthz (process up), /readyz (recovery done and accepting connections; 200 with one
"corrupt: ..." line per corrupt segment found while running — a broker with one bad partition
still serves every other one, so it is not taken out of rotation for it — and a "storage full: ..."
line while produce is refused for lack of space: reads go on and writes resume by themselves,
so that is not a reason to take it out of rotation either; alert on `loglake_storage_full`), an
"engine failed: ..." line once a WAL or metadata-log I/O error stopped writes (reads go on; alert on
`loglake_engine_failed`) and a "read errors: ..." line per segment whose reads failed with an I/O
error in the last minute; 503 "not ready" with one line per reason while the engine's parts say the
broker should get no traffic: a cluster broker that cannot reach etcd or the bucket, which leads
nothing then — `loglake.engine.telemetry`, whose families /metrics adds too).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from loglake.broker.fetch_sessions import FetchSessionCache
from loglake.broker.gcstats import GcStats
from loglake.broker.groups import GroupCoordinator
from loglake.broker.http import HttpLimits, HttpRequest, HttpResponse, HttpServer, serve_http
from loglake.broker.overload import RequestBytes
from loglake.broker.protocol.produce import ProduceResponseData
from loglake.broker.security.sasl import SaslStats
from loglake.engine import Engine
from loglake.engine.cleaner import Cleaner
from loglake.engine.telemetry import HistogramFamily, Telemetry
from loglake.kafka_errors import ErrorCode

#: Latency histogram bucket upper bounds, seconds.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Largest HTTP request head the metrics endpoint reads.
HTTP_HEAD_BYTES_MAX = 8192
#: The text format generate_latest writes (0.0.4: metric names are all legal, so it is that).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: How deep `response_error` looks for error codes (response > topics > partitions).
RESPONSE_ERROR_DEPTH = 3


_ERROR_NAMES: dict[int, str] = {int(member): member.name for member in ErrorCode}


def error_name(code: int) -> str:
    """The Kafka name of an error code (its number as text if loglake does not know it)."""
    return _ERROR_NAMES.get(code) or str(code)


def _children(obj: object) -> Iterator[object]:
    """The list-valued fields of a response object, mapping or dataclass (nested structs)."""
    if isinstance(obj, dict):
        values: Iterable[object] = obj.values()
    else:
        slots = getattr(type(obj), "__slots__", None)  # kafka-python's structs and our dataclasses
        if slots is None:
            return
        values = (getattr(obj, name, None) for name in slots)
    for value in values:
        if isinstance(value, list | tuple):
            yield from value


def response_error(response: object) -> int:
    """The error code a response answers with: its own `error_code` if not NONE, else the first
    nested (topic, partition, ...) error code that is not NONE, else NONE."""
    if isinstance(response, ProduceResponseData):  # the one answered per record batch: no walk
        return response.first_error()
    level = [response]
    for depth in range(1, RESPONSE_ERROR_DEPTH + 1):
        nested: list[object] = []
        for item in level:
            code = item.get("error_code") if isinstance(item, dict) else getattr(item, "error_code", None)
            if isinstance(code, int) and code != 0:
                return code
            if depth < RESPONSE_ERROR_DEPTH:
                nested.extend(_children(item))
        if not nested:
            break
        level = nested
    return 0


class _WithoutCreated:
    """Collects prometheus-client metrics without their `_created` samples."""

    def __init__(self, *metrics: Counter | Histogram) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        for metric in self._metrics:
            for family in metric.collect():
                family.samples = [s for s in family.samples if not s.name.endswith("_created")]
                yield family


def _counter(name: str, doc: str, value: float | None = None, labels: list[str] | None = None) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value, labels=labels)


def _gauge(name: str, doc: str, value: float | None = None, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value, labels=labels)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._requests = Counter(
            "loglake_requests_total", "Kafka requests handled, by API and the Kafka error code they answered with.",
            ["api", "error"], registry=None,
        )
        self._latency = Histogram(
            "loglake_request_seconds", "Time from decoding a request to its response being ready, by API.",
            ["api"], buckets=LATENCY_BUCKETS_S, registry=None,
        )
        self._children: dict[tuple[str, int], tuple[Counter, Histogram]] = {}
        self.bytes_in = 0
        self.bytes_out = 0
        self.connections_open = 0
        self.connections_total = 0
        self.connections_rejected = 0
        #: The server's request-bytes gate (None: not serving), and the RSS budget.
        self.request_bytes: RequestBytes | None = None
        #: () -> the RSS budget in bytes (max_connections is dynamic, so it is computed per scrape).
        self.rss_budget: Callable[[], int] | None = None
        #: () -> bytes of responses in the connections' transports, not yet taken by their sockets.
        self.send_buffered: Callable[[], int] | None = None
        self.produce_throttled = 0
        self.produce_throttle_ms = 0
        self.protocol_errors: dict[str, int] = defaultdict(int)
        #: SASL failures per principal and source, successes per mechanism (loglake.broker.security.sasl).
        self.sasl = SaslStats()
        self.ready = False
        #: The broker's fetch sessions (KIP-227), read at scrape time; set when the context is built.
        self.fetch_sessions: FetchSessionCache | None = None
        #: The collector's pauses when this process is `loglake serve`'s own (else None).
        self.gc: GcStats | None = None
        self._engine: Engine | None = None
        self._coordinator: GroupCoordinator | None = None
        self.registry.register(_WithoutCreated(self._requests, self._latency))
        self.registry.register(_StateCollector(self))

    def observe(self, api: str, seconds: float, error: int = 0) -> None:
        children = self._children.get((api, error))
        if children is None:
            children = self._children[(api, error)] = (
                self._requests.labels(api, error_name(error)),
                self._latency.labels(api),
            )
        children[0].inc()
        children[1].observe(seconds)

    def render(self, engine: Engine | None = None, coordinator: GroupCoordinator | None = None) -> str:
        """The /metrics page; engine-side families only once `engine` is given (after recovery)."""
        self._engine, self._coordinator = engine, coordinator
        try:
            return generate_latest(self.registry).decode()
        finally:
            self._engine = self._coordinator = None


def _overload_families(m: Metrics) -> Iterator[Metric]:
    """Back-pressure and the memory it bounds (loglake.broker.overload, docs/RELIABILITY.md)."""
    from loglake.broker.overload import rss_bytes

    gate = m.request_bytes
    if gate is not None:
        yield _gauge("loglake_request_queue_bytes", "Request bytes read and not yet handled, all connections.", gate.used)
        yield _gauge("loglake_request_queue_bytes_limit", "queued_max_request_bytes.", gate.limit)
        yield _counter(
            "loglake_request_read_pauses_total", "Times a connection waited before reading: queued_max_request_bytes spent.",
            gate.pauses,
        )
        yield _gauge("loglake_request_read_paused_connections", "Connections not read now: queued_max_request_bytes spent.", gate.paused)
        yield _counter(
            "loglake_request_overdraft_leases_total", "Frames finished past queued_max_request_bytes under the one overdraft lease.",
            gate.leases,
        )
    if m.send_buffered is not None:
        yield _gauge(
            "loglake_send_buffer_bytes", "Response bytes handed to connections' transports and not yet sent (per connection at most SEND_CHUNK_BYTES + 64 KiB).",
            m.send_buffered(),
        )
    yield _counter("loglake_produce_throttled_total", "Produce responses with throttle_time_ms above 0.", m.produce_throttled)
    yield _counter("loglake_produce_throttle_ms_total", "Sum of throttle_time_ms of Produce responses.", m.produce_throttle_ms)
    if m.rss_budget is not None:
        yield _gauge("loglake_rss_budget_bytes", "The resident memory the settings bound the process to.", m.rss_budget())
    yield _gauge("loglake_rss_bytes", "The process's resident memory now.", rss_bytes())


class _StateCollector:
    """Everything read at scrape time: the broker's own counters, then the engine's state."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.m
        yield _counter("loglake_bytes_in_total", "Bytes received from Kafka clients.", m.bytes_in)
        yield _counter("loglake_bytes_out_total", "Bytes sent to Kafka clients.", m.bytes_out)
        yield _gauge("loglake_connections_open", "Kafka client connections open now.", m.connections_open)
        yield _counter("loglake_connections_total", "Kafka client connections accepted.", m.connections_total)
        yield _counter(
            "loglake_connections_rejected_total", "Connections closed at once because max_connections were open.",
            m.connections_rejected,
        )
        yield from _overload_families(m)
        errors = _counter(
            "loglake_protocol_errors_total", "Connections closed for a protocol error, by kind.", labels=["kind"]
        )
        for kind, n in sorted(m.protocol_errors.items()):
            errors.add_metric([kind], n)
        yield errors
        yield from m.sasl.families()
        if m.fetch_sessions is not None:
            yield from _fetch_session_families(m.fetch_sessions)
        if m.gc is not None:
            yield from m.gc.families()
        engine = m._engine
        if engine is not None:
            yield from self._engine_families(engine, m._coordinator)
        yield _gauge("loglake_ready", "1 once recovery is done and Kafka clients are accepted, else 0.", 1 if m.ready else 0)

    def _engine_families(self, engine: Engine, coordinator: GroupCoordinator | None) -> Iterator[Metric]:
        pool = engine.memory_pool
        yield _gauge("loglake_memory_pool_used_bytes", "Bytes of unsealed (cluster mode: unflushed) data held in memory.", pool.used_bytes)
        yield _gauge("loglake_memory_pool_budget_bytes", "The memory pool's budget (memory_budget_bytes; cluster mode: the flush buffer's).", pool.budget_bytes)
        yield _counter("loglake_memory_pool_waits_total", "Appends that waited for memory.", pool.waits)
        wal = [
            _counter("loglake_wal_fsyncs_total", "WAL fsyncs, by shard.", labels=["shard"]),
            _counter("loglake_wal_fsync_seconds_total", "Seconds spent in WAL fsyncs, by shard.", labels=["shard"]),
            _counter("loglake_wal_groups_total", "WAL group commits written, by shard.", labels=["shard"]),
            _counter("loglake_wal_frames_total", "WAL frames written, by shard.", labels=["shard"]),
            _counter("loglake_wal_spare_rolls_total", "WAL rolls into a spare file made ahead of need, by shard.", labels=["shard"]),
            _counter(
                "loglake_wal_recycled_rolls_total",
                "Of those, rolls into a recycled (obsolete) WAL file: no zeros written for it, by shard.",
                labels=["shard"],
            ),
        ]
        for i, shard in enumerate(engine.shards):
            counts = (
                shard.fsyncs, shard.fsync_seconds_total, shard.groups_written, shard.frames_written,
                shard.spare_rolls, shard.recycled_rolls,
            )
            for family, value in zip(wal, counts, strict=True):
                family.add_metric([str(i)], value)
        yield from wal
        cold = engine.cold_reader
        if cold is not None:
            yield _counter("loglake_cold_range_gets_total", "Ranged GETs from the cold store.", cold.gets)
            yield _counter("loglake_cold_range_cache_hits_total", "Cold reads served from the range cache.", cold.ranges.hits)
            yield _counter(
                "loglake_cold_range_cache_misses_total", "Cold reads not in the range cache.", cold.ranges.misses
            )
            yield _gauge("loglake_cold_range_cache_bytes", "Bytes held in the cold range cache.", cold.ranges.size_bytes)
        yield from _corruption_families(engine)
        yield from _storage_families(engine)
        yield from _telemetry_families(engine.telemetry)
        labels = ["topic", "partition"]
        hw_family = _gauge("loglake_partition_high_watermark", "Offset of the next record of the partition.", labels=labels)
        start_family = _gauge("loglake_partition_log_start_offset", "First offset still kept.", labels=labels)
        segments_family = _gauge("loglake_partition_segments", "Sealed segments of the partition.", labels=labels)
        unsealed_family = _gauge(
            "loglake_partition_unsealed_bytes", "Bytes appended to the partition and not sealed yet.", labels=labels
        )
        dirty_family = _gauge(
            "loglake_partition_dirty_ratio", "Compacted topics: share of sealed bytes not cleaned yet.", labels=labels
        )
        high_watermarks: dict[tuple[str, int], int] = {}
        for topic in engine.topics():
            for p in range(topic.partitions):
                info = engine.partition_info(topic.name, p)
                values = [topic.name, str(p)]
                high_watermarks[(topic.name, p)] = info.high_watermark
                hw_family.add_metric(values, info.high_watermark)
                start_family.add_metric(values, info.log_start_offset)
                segments_family.add_metric(values, info.segments)
                unsealed_family.add_metric(values, info.unsealed_bytes)
                if topic.config.compacted:
                    dirty_family.add_metric(values, round(info.dirty_ratio, 6))
        yield from (hw_family, start_family, segments_family, unsealed_family, dirty_family)
        try:
            cleaner = engine.cleaner
        except Exception:  # closed meanwhile, or an engine without one
            cleaner = None
        if cleaner is not None:
            yield from self._cleaner_families(cleaner)
        lag = _gauge(
            "loglake_consumer_group_lag", "High watermark minus the group's committed offset.",
            labels=["group", "topic", "partition"],
        )
        if coordinator is not None:
            for entry in coordinator.list_groups():
                group_id = entry[0]
                _err, offsets = coordinator.fetch_offsets(group_id, None)
                for topic_name, partition, offset, *_rest in offsets:
                    hw = high_watermarks.get((topic_name, partition))
                    if hw is not None and offset >= 0:
                        lag.add_metric([group_id, topic_name, str(partition)], max(0, hw - offset))
        yield lag

    def _cleaner_families(self, cleaner: Cleaner) -> Iterator[Metric]:
        stats = cleaner.stats
        for name, doc, value in (
            ("loglake_cleaner_bytes_read_total", "Bytes the log cleaner read.", stats.bytes_read),
            ("loglake_cleaner_bytes_written_total", "Bytes the log cleaner wrote.", stats.bytes_written),
            ("loglake_cleaner_records_read_total", "Records the log cleaner read.", stats.records_in),
            ("loglake_cleaner_records_kept_total", "Records the log cleaner kept.", stats.records_out),
            ("loglake_cleaner_tombstones_dropped_total", "Tombstones the log cleaner dropped.", stats.tombstones_dropped),
            ("loglake_cleaner_compactions_total", "Compaction passes done.", stats.passes),
            ("loglake_cleaner_merges_total", "Segment merges done.", stats.merges),
            ("loglake_cleaner_segments_replaced_total", "Segments replaced by rewritten ones.", stats.segments_replaced),
            ("loglake_cleaner_errors_total", "Cleaning runs that failed.", stats.errors),
            ("loglake_cleaner_aborted_total", "Cleaning runs given up (the partition changed under them).", stats.aborted),
        ):
            yield _counter(name, doc, value)
        yield _gauge(
            "loglake_cleaner_last_run_timestamp_seconds", "When the cleaner last ran (Unix time).", stats.last_run_ms / 1000
        )
        labels = ["topic", "partition"]
        last = _gauge(
            "loglake_cleaner_partition_last_compaction_timestamp_seconds",
            "When the partition was last compacted (Unix time).", labels=labels,
        )
        errors = _counter("loglake_cleaner_partition_errors_total", "Cleaning failures of the partition.", labels=labels)
        for (topic_name, p), pstats in list(cleaner.partition_stats.items()):
            if "last_run_ms" in pstats:
                last.add_metric([topic_name, str(p)], pstats["last_run_ms"] / 1000)
            if pstats.get("errors"):
                errors.add_metric([topic_name, str(p)], pstats["errors"])
        yield last
        yield errors


def _fetch_session_families(cache: FetchSessionCache) -> Iterator[Metric]:
    """KIP-227 fetch sessions (`loglake.broker.fetch_sessions`): Kafka's NumIncrementalFetchSessions,
    NumIncrementalFetchPartitionsCached and IncrementalFetchSessionEvictionsPerSec, and more."""
    stats = cache.stats
    yield _gauge("loglake_fetch_sessions_open", "Incremental fetch sessions cached now.", len(cache.sessions))
    yield _gauge(
        "loglake_fetch_session_partitions_cached", "Partitions held by all cached fetch sessions.",
        cache.partitions_cached(),
    )
    yield _counter("loglake_fetch_sessions_opened_total", "Fetch sessions opened by full fetches.", stats.created)
    yield _counter(
        "loglake_fetch_sessions_closed_total", "Fetch sessions closed by their client (epoch 0 or -1, or emptied).",
        stats.closed,
    )
    evicted = _counter(
        "loglake_fetch_sessions_evicted_total",
        "Fetch sessions evicted: idle (past the eviction time) or displaced (by a session with more partitions).",
        labels=["reason"],
    )
    for reason, n in sorted(stats.evicted.items()):
        evicted.add_metric([reason], n)
    yield evicted
    yield _counter(
        "loglake_fetch_sessions_unavailable_total",
        "Full fetches that asked for a session and got none (cache full, or too many partitions).", stats.not_created,
    )
    yield _counter(
        "loglake_fetch_incremental_total", "Fetch requests served incrementally from a session.",
        stats.incremental_fetches,
    )
    errors = _counter(
        "loglake_fetch_session_errors_total", "Fetch requests answered with a session error, by Kafka error name.",
        labels=["error"],
    )
    for name, n in sorted(stats.errors.items()):
        errors.add_metric([name], n)
    yield errors


def _storage_families(engine: Engine) -> Iterator[Metric]:
    """The free-space reserve (loglake.engine.space): full or not, the numbers, refusals."""
    space = engine.space
    yield _gauge(
        "loglake_storage_full", "1 while produce is refused because the data directory's filesystem is below the "
        "free-space reserve (or a WAL write hit ENOSPC and has not been written again yet), else 0.",
        1 if space.full else 0,
    )
    yield _gauge("loglake_storage_free_bytes", "Free bytes on the data directory's filesystem at the last reading (-1: unknown).", space.free_bytes)
    yield _gauge("loglake_storage_total_bytes", "Size of the data directory's filesystem (-1: unknown).", space.total_bytes)
    yield _gauge(
        "loglake_storage_reserve_bytes", "The free-space reserve: max(storage_min_free_bytes, storage_min_free_percent).",
        space.reserve_bytes,
    )
    yield _gauge(
        "loglake_storage_owed_bytes", "What loglake will still write for data it admitted (segments of unsealed data, "
        "WAL and metadata log files ahead), counted against free space before more produce is admitted.",
        space.owed_bytes,
    )
    yield _counter("loglake_storage_produce_refused_total", "Producer appends refused because storage was full.", space.refused)
    yield _counter("loglake_storage_full_events_total", "Times storage went from writable to full.", space.full_events)
    failure = engine.failure
    yield _gauge(
        "loglake_engine_failed", "1 once a WAL or metadata-log write or fsync failed with an I/O error other than "
        "ENOSPC: produce is refused (KAFKA_STORAGE_ERROR) until a restart, reads of durable data go on; else 0.",
        0 if failure is None else 1,
    )
    read_errors = engine.read_errors
    yield _counter(
        "loglake_segment_read_errors_total", "Segment reads that failed with an I/O error (EIO, the cold store "
        "failing after its retries); those readers got CORRUPT_MESSAGE.", read_errors.total,
    )
    yield _gauge("loglake_segments_failing_reads", "Segments whose last read failed within the last minute (listed on /readyz).", len(read_errors.failing()))
    stalls = _counter("loglake_wal_stalls_total", "WAL writes or fsyncs that hit ENOSPC (written again once there was room), by shard.", labels=["shard"])
    for i, shard in enumerate(engine.shards):
        stalls.add_metric([str(i)], shard.stalls)
    yield stalls


def _telemetry_families(telemetry: Telemetry) -> Iterator[Metric]:
    """What the engine's parts add (cluster mode: leadership, flush and commit latency, health)."""
    for family in telemetry.families():
        if isinstance(family, HistogramFamily):
            buckets = [("+Inf" if bound == float("inf") else repr(bound), n) for bound, n in family.buckets]
            yield HistogramMetricFamily(family.name, family.doc, buckets=buckets, sum_value=family.total)
            continue
        make = _gauge if family.kind == "gauge" else _counter
        out = make(family.name, family.doc, labels=list(family.labels))
        for labels, value in family.samples:
            out.add_metric(list(labels), value)
        yield out


def _corruption_families(engine: Engine) -> Iterator[Metric]:
    corruption = engine.corruption
    found = _counter("loglake_corruptions_found_total", "Corrupt sealed segments found, by who found them.", labels=["source"])
    for source, n in sorted(corruption.found_total.items()):
        found.add_metric([source], n)
    yield found
    yield _counter(
        "loglake_corrupt_reads_total", "Fetches refused with CORRUPT_MESSAGE (their first batch was corrupt).",
        corruption.reads_refused,
    )
    marked = _gauge(
        "loglake_partition_corrupt_segments", "Corrupt segments of the partition not repaired yet (listed on /readyz).",
        labels=["topic", "partition"],
    )
    counts: dict[tuple[str, int], int] = defaultdict(int)
    for mark in corruption.marks():
        counts[(mark.topic, mark.partition)] += 1
    for (topic, partition), n in sorted(counts.items()):
        marked.add_metric([topic, str(partition)], n)
    yield marked
    scrubber = engine.scrubber
    if scrubber is not None:
        stats = scrubber.stats
        for name, doc, value in (
            ("loglake_scrub_bytes_total", "Bytes of sealed segments the scrubber read.", stats.bytes_scrubbed),
            ("loglake_scrub_segments_verified_total", "Segments the scrubber verified whole.", stats.segments_verified),
            ("loglake_scrub_corruptions_total", "Corrupt segments (or chain breaks) the scrubber found.", stats.corruptions_found),
            ("loglake_scrub_repairs_total", "Hot segments the scrubber replaced by a verified cold copy.", stats.repairs),
            ("loglake_scrub_passes_total", "Scrub passes completed.", stats.passes),
        ):
            yield _counter(name, doc, value)


async def serve_metrics(
    host: str,
    port: int,
    render: Callable[[], str],
    ready: Callable[[], bool],
    notes: Callable[[], list[str]] | None = None,
    blockers: Callable[[], list[str]] | None = None,
) -> HttpServer:
    """`notes()`: lines /readyz adds while ready (corrupt partitions); they do not make it 503.
    `blockers()`: reasons the started broker should get no traffic now (cluster mode: etcd or the
    bucket unreachable); any makes /readyz 503 "not ready" with them."""

    async def handle(request: HttpRequest) -> HttpResponse:
        path = request.path
        if request.method != "GET":
            return HttpResponse(405, b"only GET\n")
        if path.startswith("/metrics"):
            return HttpResponse(200, render().encode(), CONTENT_TYPE)
        if path.startswith("/healthz"):
            return HttpResponse(200, b"ok\n")
        if path.startswith("/readyz"):
            started = ready()
            reasons = (blockers() if blockers is not None else []) if started else []
            ok = started and not reasons
            extra = (notes() if notes is not None else []) if ok else reasons
            verdict = "ready" if ok else "not ready" if started else "recovering"
            body = verdict + "\n" + "".join(f"{line}\n" for line in extra)
            return HttpResponse(200 if ok else 503, body.encode())
        return HttpResponse(404, b"not found\n")

    return await serve_http(host, port, handle, HttpLimits(head_bytes=HTTP_HEAD_BYTES_MAX), "metrics")
