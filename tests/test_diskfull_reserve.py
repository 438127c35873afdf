"""The free-space reserve holds against loglake's own writes (issue 31, item 5).

A real `loglake serve` on a 256 MiB tmpfs of its own, 16 MiB WAL files, a 32 MiB (and a 64 MiB)
reserve, and one confluent-kafka producer at full speed until produce is refused for good. Free
space is sampled from outside (os.statvfs of the mount, every millisecond or so) the whole time:
it must never fall under the reserve — WAL rolls and seals of what was admitted were counted
before it was admitted (loglake.engine.space) — and no WAL write, seal or maintenance tick may
meet the filesystem's real ENOSPC.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fskit import mounted_tmpfs

from brokerkit import Broker

MIB = 1024 * 1024
FS_MIB = 256
TOPIC = "fill"
PARTITIONS = 4
VALUE = 8 * 1024
#: Produce stops once every request has been refused for this long (the disk is full for good).
REFUSED_FOR_S = 4.0
RUN_S_MAX = 120.0


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    target = tmp_path / "fs"
    target.mkdir()
    with mounted_tmpfs(target, f"size={FS_MIB}m", "a 256 MiB filesystem of its own") as mounted:
        yield mounted


class FreeSampler:
    """The least free space of a filesystem, read with statvfs on a thread of its own."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.least = self.free()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def _run(self) -> None:
        while not self._stop.is_set():
            self.least = min(self.least, self.free())
            self.samples += 1
            time.sleep(0.0005)

    def __enter__(self) -> FreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def fill(bootstrap: str) -> tuple[int, int]:
    """Produce at full speed until every delivery has been refused for REFUSED_FOR_S; returns
    (records acknowledged, KAFKA_STORAGE_ERROR refusals)."""
    from confluent_kafka import KafkaError, Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "retries": 0,
            "message.timeout.ms": 30_000,
            "queue.buffering.max.kbytes": 64 * 1024,
        }
    )
    counts = {"acked": 0, "refused": 0, "other": 0}
    last_ack = [time.monotonic()]
    others: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is None:
            counts["acked"] += 1
            last_ack[0] = time.monotonic()
        elif err.code() == KafkaError.KAFKA_STORAGE_ERROR:  # type: ignore[attr-defined]
            counts["refused"] += 1
        else:
            counts["other"] += 1
            others.append(str(err))

    value = os.urandom(VALUE)  # random: nothing compresses it away
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < RUN_S_MAX:
        if counts["refused"] and time.monotonic() - last_ack[0] > REFUSED_FOR_S:
            break
        try:
            producer.produce(TOPIC, value, partition=i % PARTITIONS, on_delivery=delivered)
            i += 1
        except BufferError:
            producer.poll(0.01)
        if i % 64 == 0:
            producer.poll(0)
    producer.flush(60)
    assert not others, others[:5]
    return counts["acked"], counts["refused"]


@pytest.mark.parametrize("reserve_mib", [32, 64])
def test_free_space_never_falls_under_the_reserve(tmpfs: Path, reserve_mib: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    reserve = reserve_mib * MIB
    env = {
        "LOGLAKE_ENGINE__WAL_SHARDS": "2",
        "LOGLAKE_ENGINE__WAL_FILE_BYTES": str(16 * MIB),
        "LOGLAKE_STORAGE_MIN_FREE_BYTES": str(reserve),
        "LOGLAKE_STORAGE_MIN_FREE_PERCENT": "0",
    }
    broker = Broker(tmpfs / "data", env=env)
    with FreeSampler(tmpfs) as sampler:
        broker.start()
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            admin.create_topics([NewTopic(TOPIC, PARTITIONS)])[TOPIC].result(30)
            acked, refused = fill(broker.bootstrap)
            least_producing = sampler.least
        finally:
            exit_code = broker.stop()  # a clean stop seals what it can: still inside the sampling
    log_text = broker.log_text()
    least = sampler.least
    print(
        f"reserve {reserve_mib} MiB: least free {least_producing / MIB:.1f} MiB while producing, "
        f"{least / MIB:.1f} MiB with the stop, over {sampler.samples} samples; "
        f"{acked} records of {VALUE} B acknowledged ({acked * VALUE / MIB:.0f} MiB), {refused} refused; "
        f"exit code {exit_code}"
    )
    assert refused, "produce was never refused: the run did not reach the reserve"
    assert exit_code == 0 and "Traceback" not in log_text, log_text[-6000:]
    # The reserve was not a way to refuse everything: most of the room above it was used.
    assert acked * VALUE >= (FS_MIB * MIB - reserve) // 3, (acked, refused)
    # no WAL stall, failed seal or failed maintenance tick: nothing of loglake's met ENOSPC
    assert "No space left on device" not in log_text, log_text[-6000:]
    assert least >= reserve, f"free space fell to {least / MIB:.1f} MiB, under the {reserve_mib} MiB reserve"
