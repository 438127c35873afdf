"""The cleaner: compaction and segment merging, on their own threads, at a bounded rate.

Every `cleaner_backoff_ms` (or when asked) the cleaner visits each partition:

* topics with `compact` in cleanup.policy get a compaction pass when one is due
  (loglake.engine.compaction);
* any partition holding at least `merge_min_segments` adjacent sealed segments of one tier
  that fit together within segment.bytes gets them merged into one (so frequent seals and
  S3-primary topics do not pile up small objects).

Both go through loglake.engine.rewrite (verify inputs, new objects, one metadata switch, delete
the old). All I/O passes one token bucket (`cleaner_io_max_bytes_per_second`, read plus
written). Appends and tail reads never wait for the cleaner: it holds a partition's lock only
for the moment of the switch. A failure is logged once per partition and error, counted, and
retried on the next round.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loglake.engine.catalog import Catalog, TopicState
from loglake.engine.cleaner_job import CompactJob, JobResult, MergeJob, WorkerProcess, run_job
from loglake.engine.compaction import dirty_ratio, plan_clean
from loglake.engine.config import EngineConfig, TopicConfig
from loglake.engine.partition import Partition, SegmentRef
from loglake.engine.rewrite import REWRITE_SEGMENTS_MAX, RateLimiter, RewriteAborted, Rewriter
from loglake.engine.stores import IndexCache, Stores
from loglake.errors import LoglakeError
from loglake.meta.lifecycle import Tier
from loglake.store.base import parse_segment_key, segment_file_name

__all__ = ["Cleaner", "CleanerStats", "plan_merge"]

log = logging.getLogger(__name__)

#: What each replaced segment adds to a merged segment's provenance, at most (the merge keeps
#: its output within segment.bytes).
PROVENANCE_BYTES_PER_SEGMENT = 140
#: Distinct (partition, error) pairs remembered to log each failure once.
ERRORS_REMEMBERED_MAX = 1_000


@dataclass
class CleanerStats:
    """Counters for /metrics and `topics describe` (whole process, since start)."""

    passes: int = 0
    merges: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_in: int = 0
    records_out: int = 0
    tombstones_dropped: int = 0
    segments_replaced: int = 0
    errors: int = 0
    aborted: int = 0
    last_run_ms: int = 0


def plan_merge(
    p: Partition, config: TopicConfig, min_segments: int, sealed_before_ms: int | None = None
) -> list[SegmentRef] | None:
    """The first run of at least `min_segments` adjacent segments of one tier, each sealed
    before `sealed_before_ms`, whose sizes add up to at most segment.bytes (as many as fit);
    None when there is none."""
    if min_segments < 2:
        return None
    with p.lock:
        if len(p.segments) < min_segments:
            return None
        segments = p.segments.slice(0)
    if sealed_before_ms is not None:
        old = next((i for i, s in enumerate(segments) if s.created_ms > sealed_before_ms), len(segments))
        segments = segments[:old]
    i = 0
    while i < len(segments):
        run = [segments[i]]
        total = segments[i].size
        j = i + 1
        while (
            j < len(segments)
            and segments[j].tier == run[0].tier
            and total + segments[j].size + PROVENANCE_BYTES_PER_SEGMENT * (len(run) + 1) <= config.segment_bytes
            and len(run) < REWRITE_SEGMENTS_MAX
        ):
            run.append(segments[j])
            total += segments[j].size
            j += 1
        if len(run) >= min_segments:
            return run
        i = j if j > i + 1 else i + 1
    return None


class Cleaner:
    def __init__(
        self,
        catalog: Catalog,
        stores: Stores,
        indexes: IndexCache,
        clock: Callable[[], float],
        config: EngineConfig,
        store_urls: dict[Tier, str | None] | None = None,
        *,
        before_delete: Callable[[], object] | None = None,
    ) -> None:
        self.catalog = catalog
        self.stores = stores
        self.config = config
        self._clock = clock
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.limiter = RateLimiter(config.cleaner_io_max_bytes_per_second, self._stop)
        self.rewriter = Rewriter(catalog, stores, indexes, before_delete)
        self.stats = CleanerStats()
        #: (topic, partition) -> {"last_run_ms", "dirty_ratio", "errors"} of the last pass
        self.partition_stats: dict[tuple[str, int], dict[str, Any]] = {}
        self._busy: set[int] = set()  # id() of partitions being rewritten
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._logged: set[tuple[str, int, str]] = set()
        self._swept: set[int] = set()  # id() of partitions whose cold leftovers were swept
        #: tier -> URL a worker process can reopen the store by (None: run jobs on our thread)
        self._store_urls = store_urls or {}
        self._idle: list[WorkerProcess] = []  # worker processes not running a job
        self._running: list[WorkerProcess] = []  # and those running one
        self._closing = False

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        for i in range(self.config.cleaner_threads):
            t = threading.Thread(target=self._loop, name=f"loglake-cleaner-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join()
        self._threads = []
        with self._lock:
            self._closing = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.close()

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                worked = self.run_once()
            except Exception:  # one bad round must not end the thread
                log.exception("cleaner round failed; retrying after %d ms", self.config.cleaner_backoff_ms)
                worked = 0
            if not worked:
                self._wake.wait(self.config.cleaner_backoff_ms / 1000.0)
                self._wake.clear()

    # ---- rounds ------------------------------------------------------------------------------

    def run_once(self, *, force: bool = False, topic: str | None = None) -> int:
        """One round over every partition (or one topic's); returns how many rewrites were done.
        `force` compacts whatever is dirty, ignoring the dirty ratio (tests, `loglake compact`)."""
        done = 0
        for t, p in self.catalog.partitions():
            if self._stop.is_set():
                break
            if topic is not None and t.name != topic:
                continue
            if not self._claim(p):
                continue
            try:
                done += self._partition(t, p, force)
            finally:
                self._release(p)
        self.stats.last_run_ms = int(self._clock() * 1000)
        return done

    def _claim(self, p: Partition) -> bool:
        with self._lock:
            if id(p) in self._busy or p.deleted:
                return False
            self._busy.add(id(p))
            return True

    def _release(self, p: Partition) -> None:
        with self._lock:
            self._busy.discard(id(p))

    def _partition(self, t: TopicState, p: Partition, force: bool) -> int:
        config = t.config
        done = 0
        try:
            if id(p) not in self._swept:
                self.sweep_cold(t, p)
                self._swept.add(id(p))
            if config.compacted:
                done += self.compact(t, p, force=force)
            if self.config.merge_min_segments:
                while not self._stop.is_set() and self.merge(t, p):
                    done += 1
        except RewriteAborted as exc:
            self.stats.aborted += 1
            log.debug("rewrite of %s-%d lost a race and was dropped: %s", t.name, p.index, exc)
        except Exception as exc:
            self.stats.errors += 1
            self._note(t.name, p.index, "errors", 1)
            key = (t.name, p.index, type(exc).__name__ + str(exc)[:200])
            if key not in self._logged:
                if len(self._logged) < ERRORS_REMEMBERED_MAX:
                    self._logged.add(key)
                log.error("cleaning %s-%d failed (retried each round; logged once): %s", t.name, p.index, exc)
        return done

    def _note(self, topic: str, partition: int, name: str, value: Any) -> None:
        stats = self.partition_stats.setdefault((topic, partition), {})
        stats[name] = stats.get(name, 0) + value if name == "errors" else value

    # ---- leftovers ----------------------------------------------------------------------------

    def sweep_cold(self, t: TopicState, p: Partition) -> int:
        """Delete cold objects of `p` below its sealed end that no metadata names: what a crash
        left behind in a rewrite (replaced objects after the switch, outputs before it) or a
        retention delete that failed. Recovery does this for the hot store; the bucket is swept
        here, once per partition per start, while the partition is claimed (no rewrite of it
        is in flight; a relocation uploads under a key the metadata already names)."""
        cold = self.stores.cold
        if cold is None:
            return 0
        with p.lock:
            listed = set(p.segments.keys())
            sealed_end = p.sealed_end
            prefix = p.segments.key_prefix
        removed = 0
        for key in cold.list(prefix):
            try:
                parsed = parse_segment_key(key)
            except LoglakeError:
                continue
            if key not in listed and parsed.base_offset < sealed_end:
                cold.delete(key)
                removed += 1
                log.info("removed %s from %s: below the sealed end and named by no metadata (an interrupted rewrite or delete)", key, cold.url)
        return removed

    # ---- compaction ----------------------------------------------------------------------------

    def compact(self, t: TopicState, p: Partition, *, force: bool = False) -> int:
        """One compaction pass of `p` if due (or forced). Returns 1 if it rewrote, else 0."""
        config = t.config
        now_ms = int(self._clock() * 1000)
        plan = plan_clean(p, config, now_ms, force=force)
        self._note(t.name, p.index, "dirty_ratio", dirty_ratio(p))
        if plan is None:
            return 0
        with p.lock:
            last = p.segments.last()
            job = CompactJob(
                store_urls={},
                key_prefix=p.segments.key_prefix,
                run=plan.run,
                dirty=plan.dirty,
                start=max(p.meta.clean_end, p.log_start_offset),
                bytes_max=self.config.cleaner_dedupe_buffer_bytes,
                clean_marks=[list(m) for m in p.meta.clean_marks],
                delete_retention_ms=config.delete_retention_ms,
                now_ms=now_ms,
                retain_empty=p.producers.last_batches(),
                log_last_offset=last.last_offset if last is not None else -1,
                target_bytes=config.segment_bytes,
                io_bytes_per_s=self._io_rate(),
                config_params={
                    "delete_retention_ms": config.delete_retention_ms,
                    "min_compaction_lag_ms": config.min_compaction_lag_ms,
                },
                chunk_segments=REWRITE_SEGMENTS_MAX,
                aborted=[list(a) for a in p.meta.aborted_txns],
            )
        result = self._execute(job)
        counts = result.counts
        clean = {"end": result.map_end, "ms": now_ms, "tomb_ms": counts.get("tomb_ms", -1)}
        self._swap_chunks(p, result, clean)
        self.stats.passes += 1
        self.stats.records_in += counts.get("records_in", 0)
        self.stats.records_out += counts.get("records_out", 0)
        self.stats.tombstones_dropped += counts.get("tombstones_dropped", 0)
        self._note(t.name, p.index, "last_run_ms", now_ms)
        self._note(t.name, p.index, "dirty_ratio", dirty_ratio(p))
        log.info(
            "compacted %s-%d: %d keys mapped up to offset %d, %d of %d records kept, dirty ratio was %.2f",
            t.name, p.index, result.keys_mapped, result.map_end, counts.get("records_out", 0),
            counts.get("records_in", 0), plan.dirty_ratio,
        )
        return 1 if result.chunks else 0

    # ---- merging -------------------------------------------------------------------------------

    def merge(self, t: TopicState, p: Partition) -> bool:
        now_ms = int(self._clock() * 1000)
        run = plan_merge(p, t.config, self.config.merge_min_segments, now_ms - self.config.merge_min_age_ms)
        if run is None:
            return False
        job = MergeJob(
            store_urls={},
            key_prefix=p.segments.key_prefix,
            run=run,
            target_bytes=t.config.segment_bytes,
            io_bytes_per_s=self._io_rate(),
            now_ms=now_ms,
            params={"min_segments": self.config.merge_min_segments},
        )
        result = self._execute(job)
        self._swap_chunks(p, result, None)
        self.stats.merges += 1
        stats = result.stats
        log.info("merged %d segments of %s-%d into %d (%d bytes)", stats.segments_in, t.name, p.index, stats.segments_out, stats.bytes_written)
        return True

    # ---- running jobs ------------------------------------------------------------------------------

    def _io_rate(self) -> int:
        """Each worker's share of the cleaner's I/O bound."""
        return self.config.cleaner_io_max_bytes_per_second // max(1, self.config.cleaner_threads)

    def _execute(self, job: CompactJob | MergeJob) -> JobResult:
        """Run `job` in a worker process when the stores can be reopened there, else here."""
        tiers = {s.tier for s in job.run}
        urls = {tier: self._store_urls.get(tier) for tier in tiers}
        if not self.config.cleaner_process or any(u is None for u in urls.values()):
            stores = {tier: self.stores.cold if tier == Tier.COLD else self.stores.hot for tier in tiers}
            return run_job(job, stores, self.limiter)  # type: ignore[arg-type]
        job.store_urls = {tier: url for tier, url in urls.items() if url is not None}
        with self._lock:
            worker = self._idle.pop() if self._idle else WorkerProcess()
            self._running.append(worker)
        try:
            return worker.call(job)
        except BaseException:
            self._drop_outputs(job)
            raise
        finally:
            with self._lock:
                self._running.remove(worker)
                if self._closing:
                    worker.close()
                else:
                    self._idle.append(worker)

    def _busy_workers(self) -> list[WorkerProcess]:
        """Worker processes running a job now (tests)."""
        with self._lock:
            return list(self._running)

    def _drop_outputs(self, job: CompactJob | MergeJob) -> None:
        """After a failed worker job: delete the objects it may have PUT and not deleted (an
        output's key is `<base>-g<generation + 1>` of one of the run's segments) unless the
        metadata names them."""
        prefix = job.key_prefix
        for seg in job.run:
            key = prefix + segment_file_name(seg.base_offset, seg.generation + 1)
            self.stores.delete_segment(key, seg.tier)

    def _swap_chunks(self, p: Partition, result: JobResult, clean: dict[str, int] | None) -> None:
        """Switch to each chunk's new segments in order; the last chunk carries `clean`. When one
        loses a race, the chunks not switched yet are deleted and RewriteAborted raised."""
        chunks = result.chunks
        for i, (run, outputs) in enumerate(chunks):
            try:
                self.rewriter.swap(p, run, outputs, clean if i == len(chunks) - 1 else None)
            except RewriteAborted:
                for _run, later in chunks[i + 1 :]:
                    for ref, _index in later:
                        self.stores.delete_segment(ref.key, ref.tier)
                raise
            self.stats.segments_replaced += len(run)
        self.stats.bytes_read += result.stats.bytes_read
        self.stats.bytes_written += result.stats.bytes_written

