"""Disk limits of the machine a benchmark runs on, measured in the same run as the benchmark:
sequential write bandwidth to a preallocated file (1 MiB pwrites; one fdatasync at the end, or one
every 4 MiB / 1 MiB), the latency of a 4 KiB pwrite + fdatasync, what a thread round trip
(a Future resolved by another thread) costs in time and CPU, and the most a group commit written
in Python can gain from 8 threads over 1 here (`group_commit_ceiling`). Every benchmark that names a
target beside a disk limit (engine, broker, compaction, metadata) takes them from here, with the
percentile and logging helpers they share."""

from __future__ import annotations

import os
import platform
import random
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

MiB = 1024 * 1024


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def device_write_bytes(path: str) -> int:
    """Bytes the block device holding `path` has written since boot (its sectors-written counter,
    every process's writes), or -1 where it cannot be read. Not /proc/self/io's write_bytes: on
    this kernel that charges ~256 KB to every fdatasync that follows a write, whatever the write's
    size (docs/PERFORMANCE.md, "Recycled WAL files"), so it overstates fsync-heavy runs many times."""
    try:
        dev = os.stat(path).st_dev
        with open(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat") as f:
            return int(f.read().split()[6]) * 512
    except (OSError, IndexError, ValueError):
        return -1


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100.0 * (len(s) - 1))))]


def raw_sequential_write(directory: str, total: int, chunk: int = MiB, sync_every: int | None = None) -> dict[str, Any]:
    """MB/s of `total` bytes in `chunk` pwrites into a preallocated file, fdatasync at the end
    (and every `sync_every` bytes if given). Preallocation as the WAL does it (posix_fallocate)."""
    path = os.path.join(directory, f"raw-{sync_every or 0}.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.posix_fallocate(fd, 0, total)
        os.fsync(fd)
        buf = random.randbytes(chunk)
        syncs = 0
        started = time.perf_counter()
        for i in range(total // chunk):
            os.pwrite(fd, buf, i * chunk)
            if sync_every and ((i + 1) * chunk) % sync_every == 0:
                os.fdatasync(fd)
                syncs += 1
        os.fdatasync(fd)
        syncs += 1
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        os.unlink(path)
    return {
        "bytes": total,
        "chunk_bytes": chunk,
        "fdatasync_every_bytes": sync_every,
        "fdatasyncs": syncs,
        "seconds": elapsed,
        "mb_per_s": total / elapsed / 1e6,
    }


def fdatasync_latency(directory: str, samples: int, size: int = 4096) -> dict[str, Any]:
    """Latency of pwrite(4 KiB) + fdatasync, sequential positions in a preallocated file."""
    path = os.path.join(directory, "fsync-lat.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.posix_fallocate(fd, 0, samples * size)
        os.fsync(fd)
        buf = random.randbytes(size)
        lat: list[float] = []
        for i in range(samples):
            t0 = time.perf_counter()
            os.pwrite(fd, buf, i * size)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    return {
        "samples": samples,
        "write_bytes": size,
        "p50_ms": pct(lat, 50) * 1e3,
        "p99_ms": pct(lat, 99) * 1e3,
        "max_ms": max(lat) * 1e3,
        "mean_ms": statistics.fmean(lat) * 1e3,
        "fsyncs_per_s_serial": 1.0 / statistics.fmean(lat),
    }


def thread_handoff(rounds: int) -> dict[str, Any]:
    """What one durable append costs in thread switches alone: a Future handed to another Python
    thread through a Condition, resolved there and waited for here, `rounds` times. Wall time
    and this process's CPU (user, system) per round trip."""
    queue: deque[Future[int] | None] = deque()
    ready = threading.Condition()

    def resolver() -> None:
        while True:
            with ready:
                while not queue:
                    ready.wait()
                fut = queue.popleft()
            if fut is None:
                return
            fut.set_result(1)

    thread = threading.Thread(target=resolver, name="handoff", daemon=True)
    thread.start()
    cpu0 = os.times()
    started = time.perf_counter()
    for _ in range(rounds):
        fut: Future[int] = Future()
        with ready:
            queue.append(fut)
            ready.notify()
        fut.result()
    elapsed = time.perf_counter() - started
    cpu1 = os.times()
    with ready:
        queue.append(None)
        ready.notify()
    thread.join()
    return {
        "rounds": rounds,
        "us_per_round_trip": elapsed / rounds * 1e6,
        "cpu_user_us": (cpu1.user - cpu0.user) / rounds * 1e6,
        "cpu_system_us": (cpu1.system - cpu0.system) / rounds * 1e6,
    }


class _BareWriter:
    """The least a group commit can do in Python: producers queue a 100-byte record and wait on
    a lock of their own; one writer thread takes everything queued, writes it with one pwrite,
    fdatasyncs and releases the producers' locks. No framing, no checksums, no futures."""

    def __init__(self, fd: int, file_bytes: int) -> None:
        self.fd = fd
        self.file_bytes = file_bytes
        self.pos = 0
        self.cond = threading.Condition(threading.Lock())
        self.queue: deque[tuple[bytes, Any]] = deque()
        self.stopping = False
        self.groups = 0
        self.frames = 0
        self.thread = threading.Thread(target=self._run, name="bare-wal", daemon=True)
        self.thread.start()

    def submit(self, record: bytes) -> None:
        done = threading.Lock()
        done.acquire()
        with self.cond:
            self.queue.append((record, done))
            if len(self.queue) == 1:
                self.cond.notify()
        done.acquire()  # released by the writer once the record is durable

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.stopping:
                    self.cond.wait()
                if self.stopping:
                    return
                group = list(self.queue)
                self.queue.clear()
            data = b"".join(record for record, _ in group)
            if self.pos + len(data) > self.file_bytes:
                self.pos = 0
            os.pwrite(self.fd, data, self.pos)
            self.pos += len(data)
            os.fdatasync(self.fd)
            self.groups += 1
            self.frames += len(group)
            for _, done in group:
                done.release()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.thread.join()


def _bare_group_commit(directory: str, threads: int, writers: int, seconds: float) -> dict[str, Any]:
    """Records/s of `threads` producers appending one 100-byte record each and waiting for it,
    over `writers` bare writers (producer i uses writer i % writers, as partitions map to WAL
    shards), each on its own zero-written file (written blocks, as the WAL's spare files)."""
    file_bytes = 16 * MiB
    fds: list[int] = []
    paths = [os.path.join(directory, f"group-commit-{w}.bin") for w in range(writers)]
    bare: list[_BareWriter] = []
    try:
        for path in paths:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            fds.append(fd)
            os.pwrite(fd, bytes(file_bytes), 0)
            os.fsync(fd)
        bare = [_BareWriter(fd, file_bytes) for fd in fds]
        counts = [0] * threads
        record = b"r" * 100
        deadline = time.monotonic() + seconds

        def producer(i: int) -> None:
            writer = bare[i % writers]
            n = 0
            while time.monotonic() < deadline:
                writer.submit(record)
                n += 1
            counts[i] = n

        cpu0 = os.times()
        started = time.perf_counter()
        workers = [threading.Thread(target=producer, args=(i,), name=f"bare-{i}") for i in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        elapsed = time.perf_counter() - started
        cpu1 = os.times()
    finally:
        for writer in bare:
            writer.stop()
        for fd in fds:
            os.close(fd)
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)
    groups = sum(w.groups for w in bare)
    return {
        "records_per_s": sum(counts) / elapsed,
        "frames_per_group": sum(w.frames for w in bare) / max(1, groups),
        "cpu_cores": ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / elapsed,
    }


def group_commit_ceiling(directory: str, writers: int, seconds: float = 2.0, runs: int = 3) -> dict[str, Any]:
    """The most 8 Python threads appending one record each can gain over 1 thread on this machine
    and interpreter, whatever the WAL does: `_BareWriter` with `writers` writers (the engine's WAL
    shards), 1 thread then 8, `runs` times. Each release of a waiting producer is a futex wake
    and a GIL hand-off, serialised behind the writer; their latency, not the disk, sets it."""
    ratios: list[float] = []
    one: list[float] = []
    eight: list[float] = []
    frames: list[float] = []
    for _ in range(runs):
        single = _bare_group_commit(directory, 1, writers, seconds)
        many = _bare_group_commit(directory, 8, writers, seconds)
        one.append(single["records_per_s"])
        eight.append(many["records_per_s"])
        frames.append(many["frames_per_group"])
        ratios.append(many["records_per_s"] / single["records_per_s"])
    return {
        "writers": writers,
        "seconds_per_run": seconds,
        "ratio": statistics.median(ratios),
        "runs_ratio": ratios,
        "one_thread_records_per_s": statistics.median(one),
        "eight_threads_records_per_s": statistics.median(eight),
        "eight_threads_frames_per_group": statistics.median(frames),
    }


def repeated(runs: int, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run a raw measurement `runs` times (this VM's disk is noisy); report the median and all runs."""
    results = [fn() for _ in range(runs)]
    speeds = [r["mb_per_s"] for r in results]
    return {
        **results[0],
        "mb_per_s": statistics.median(speeds),
        "mb_per_s_min": min(speeds),
        "mb_per_s_max": max(speeds),
        "runs_mb_per_s": speeds,
        "seconds": statistics.median(r["seconds"] for r in results),
    }


def machine_limits(directory: str, quick: bool) -> dict[str, Any]:
    total = (64 if quick else 256) * MiB
    runs = 1 if quick else 3
    log(f"machine: raw sequential write {total // MiB} MiB (one fdatasync) x{runs} ...")
    one = repeated(runs, lambda: raw_sequential_write(directory, total))
    log(f"machine: raw sequential write {total // MiB} MiB (fdatasync every 4 MiB) x{runs} ...")
    every4 = repeated(runs, lambda: raw_sequential_write(directory, total, sync_every=4 * MiB))
    log(f"machine: raw sequential write {total // MiB} MiB (fdatasync every 1 MiB) x{runs} ...")
    every1 = repeated(runs, lambda: raw_sequential_write(directory, total, sync_every=MiB))
    samples = 100 if quick else 300
    log(f"machine: fdatasync latency, {samples} x 4 KiB ...")
    lat = fdatasync_latency(directory, samples)
    log("machine: thread round trip (a Future resolved by another thread) ...")
    handoff = thread_handoff(5_000 if quick else 20_000)
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count() or 1
    return {
        "cores": os.cpu_count(),
        "cores_usable": affinity,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "raw_write_one_fdatasync": one,
        "raw_write_fdatasync_every_4MiB": every4,
        # What one acks=all producer sending 1 MiB batches can get at most: a write + fdatasync per MiB.
        "raw_write_fdatasync_every_1MiB": every1,
        "fdatasync_4KiB": lat,
        "thread_round_trip": handoff,
    }
