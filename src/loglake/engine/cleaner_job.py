"""Cleaner jobs, and the worker process that runs them.

A job is everything one compaction pass or merge needs to build its new segments (steps 1-3 of
loglake.engine.rewrite) without the engine: the segments to read, the rules, the store's URL.
Its result is the new segments (PUT, not yet switched to) and counters; the engine's cleaner
then makes the switch.

Compaction decodes and re-encodes every record, which is CPU-bound Python: on the engine's own
threads it would take the GIL from produce and fetch. So by default jobs run in a worker
process (`python -m loglake.engine.cleaner_worker`, started on first use, one per cleaner thread)
that reopens the stores by URL and talks to the engine over its stdin/stdout: an 8-byte length,
then a pickle, each way. The worker exits when its stdin closes, and stops before any PUT once
its parent is gone (a new engine on the same data directory must not race a stale worker).
When the stores cannot be reopened by URL (a store object or a non-OS filesystem handed to the
engine, as tests do) or `cleaner_process` is off, jobs run on the cleaner's thread.
"""

from __future__ import annotations

import logging
import os
import pickle
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from loglake.engine.compaction import build_key_map, first_pass_ms, record_filter
from loglake.engine.partition import SegmentRef
from loglake.engine.rewrite import READ_CHUNK_BYTES, RateLimiter, RewriteStats, build
from loglake.errors import LoglakeError
from loglake.meta.lifecycle import Tier
from loglake.segment.index import SegmentIndex
from loglake.segment.verify import SegmentReader
from loglake.store.base import ObjectStore

__all__ = ["CompactJob", "JobResult", "MergeJob", "WorkerProcess", "run_job", "tier_chunks"]

log = logging.getLogger(__name__)

_LEN = struct.Struct("<Q")
#: Largest message accepted from a worker or the engine (a result lists at most a thousand
#: segments with their indexes; a job as many refs).
MESSAGE_BYTES_MAX = 1 << 30


@dataclass
class CompactJob:
    store_urls: dict[Tier, str]  # tier -> URL the worker opens ("" when run in the engine)
    key_prefix: str
    run: list[SegmentRef]  # every cleanable sealed segment, oldest first
    dirty: list[SegmentRef]  # the part of `run` at or past the clean end
    start: int  # first offset the key map covers
    bytes_max: int  # key map bound
    clean_marks: list[list[int]]
    delete_retention_ms: int
    now_ms: int
    retain_empty: set[tuple[int, int]]
    log_last_offset: int
    target_bytes: int
    io_bytes_per_s: int
    config_params: dict[str, Any] = field(default_factory=dict)
    chunk_segments: int = 1000
    #: the partition's aborted transactions, [producer id, first offset, marker offset]
    aborted: list[list[int]] = field(default_factory=list)
    #: the outputs' generation (None: one more than each replaced run's first; cluster mode's
    #: leader passes one of its epoch's, loglake.cluster.compact)
    generation: int | None = None


@dataclass
class MergeJob:
    store_urls: dict[Tier, str]
    key_prefix: str
    run: list[SegmentRef]
    target_bytes: int
    io_bytes_per_s: int
    now_ms: int
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class JobResult:
    #: per chunk of the run (each switched on its own): the replaced segments and the new ones
    chunks: list[tuple[list[SegmentRef], list[tuple[SegmentRef, SegmentIndex]]]]
    stats: RewriteStats
    counts: dict[str, int] = field(default_factory=dict)
    map_end: int = -1
    keys_mapped: int = 0


def tier_chunks(run: list[SegmentRef], most: int) -> list[list[SegmentRef]]:
    """`run` cut where the tier changes and every `most` segments (a rewrite is one tier)."""
    chunks: list[list[SegmentRef]] = []
    for seg in run:
        if not chunks or chunks[-1][0].tier != seg.tier or len(chunks[-1]) >= most:
            chunks.append([])
        chunks[-1].append(seg)
    return chunks


def run_job(
    job: CompactJob | MergeJob, stores: dict[Tier, ObjectStore], limiter: RateLimiter | None = None, alive: Any = None
) -> JobResult:
    """Build a job's new segments (in this process); `stores` maps a tier to its store."""
    limiter = limiter if limiter is not None else RateLimiter(job.io_bytes_per_s)
    if isinstance(job, MergeJob):
        outputs, stats = build(
            stores[job.run[0].tier], job.key_prefix, job.run, None, kind="merge", params=job.params,
            target_bytes=job.target_bytes, now_ms=job.now_ms, limiter=limiter, alive=alive,
        )
        return JobResult([(job.run, outputs)], stats)
    total = RewriteStats()

    def read(seg: SegmentRef) -> Iterator[memoryview]:
        # unchecked here: every mapped segment is rewritten by this pass, and the rewrite
        # verifies it before anything is switched
        for chunk in SegmentReader(stores[seg.tier], seg.key, seg.size, READ_CHUNK_BYTES, check=False).chunks():
            limiter.acquire(len(chunk))
            total.bytes_read += len(chunk)
            yield chunk

    keymap, map_end = build_key_map(read, job.dirty, job.start, job.bytes_max, job.aborted)
    run = [s for s in job.run if s.base_offset < map_end]
    marks = job.clean_marks
    counts: dict[str, int] = {}
    keep = record_filter(
        keymap, map_end, lambda offset: first_pass_ms(marks, offset), job.delete_retention_ms, job.now_ms,
        job.retain_empty, counts, job.log_last_offset, job.aborted,
    )
    params = {**job.config_params, "map_end": map_end, "keys": len(keymap.entries), "now_ms": job.now_ms}
    chunks: list[tuple[list[SegmentRef], list[tuple[SegmentRef, SegmentIndex]]]] = []
    try:
        for chunk in tier_chunks(run, job.chunk_segments):
            outputs, stats = build(
                stores[chunk[0].tier], job.key_prefix, chunk, keep, kind="compact", params=params,
                target_bytes=job.target_bytes, now_ms=job.now_ms, limiter=limiter, alive=alive,
                generation=job.generation,
            )
            chunks.append((chunk, outputs))
            for name in ("bytes_read", "bytes_written", "segments_in", "segments_out", "batches_in", "batches_out"):
                setattr(total, name, getattr(total, name) + getattr(stats, name))
    except BaseException:
        for _chunk, outputs in chunks:
            for ref, _index in outputs:
                try:
                    stores[ref.tier].delete(ref.key)
                except Exception:
                    log.exception("could not delete %s after a failed compaction", ref.key)
        raise
    return JobResult(chunks, total, counts, map_end, len(keymap.entries))


# ---- the worker process -----------------------------------------------------------------------


def _write(out: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(_LEN.pack(len(data)))
    out.write(data)
    out.flush()


def _read(inp: IO[bytes]) -> Any:
    head = inp.read(_LEN.size)
    if len(head) < _LEN.size:
        raise EOFError("the other side closed the pipe")
    (n,) = _LEN.unpack(head)
    if n > MESSAGE_BYTES_MAX:
        raise LoglakeError(f"cleaner worker message of {n} bytes is over the {MESSAGE_BYTES_MAX}-byte limit")
    data = inp.read(n)
    if len(data) < n:
        raise EOFError("the other side closed the pipe mid-message")
    return pickle.loads(data)


class WorkerProcess:
    """One worker process; `call` runs a job in it (one job at a time)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def call(self, job: CompactJob | MergeJob) -> JobResult:
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                proc = self._proc = subprocess.Popen(
                    [sys.executable, "-m", "loglake.engine.cleaner_worker", str(os.getpid())],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
            assert proc.stdin is not None and proc.stdout is not None
            try:
                _write(proc.stdin, job)
                status, payload = _read(proc.stdout)
            except (OSError, EOFError) as exc:
                self._kill()
                raise LoglakeError(f"cleaner worker process failed: {exc}") from None
        if status == "ok":
            return payload  # type: ignore[no-any-return]
        raise payload

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # the worker exits at EOF
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()


def _serve(parent_pid: int) -> None:  # pragma: no cover - runs in the worker process
    from loglake.fs.os_fs import OsFileSystem
    from loglake.store import open_store

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but messages on the pipe
    stores: dict[str, ObjectStore] = {}
    limiters: dict[int, RateLimiter] = {}

    def alive() -> bool:
        return os.getppid() == parent_pid

    while True:
        try:
            job = _read(inp)
        except EOFError:
            return
        try:
            for url in job.store_urls.values():
                if url not in stores:
                    stores[url] = open_store(url, OsFileSystem())
            limiter = limiters.get(job.io_bytes_per_s)
            if limiter is None:
                limiter = limiters[job.io_bytes_per_s] = RateLimiter(job.io_bytes_per_s)
            by_tier = {tier: stores[url] for tier, url in job.store_urls.items()}
            reply: tuple[str, Any] = ("ok", run_job(job, by_tier, limiter, alive))
        except Exception as exc:
            try:
                pickle.dumps(exc)
                reply = ("error", exc)
            except Exception:
                reply = ("error", LoglakeError(f"{type(exc).__name__}: {exc}"))
        try:
            _write(out, reply)
        except BrokenPipeError:
            # The broker is gone (killed): nobody waits for the answer, and the job's outputs
            # are orphans its next start removes. Leave at once: the interpreter's exit would
            # flush the buffered pipe again and print a second traceback.
            os._exit(0)


def worker_main(argv: list[str]) -> None:  # pragma: no cover - the worker process
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s cleaner-worker %(name)s: %(message)s")
    _serve(int(argv[1]))
