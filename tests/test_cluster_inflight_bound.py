"""The in-flight map of a cluster partition's idempotent batches is bounded, and a batch past the
bound is refused, never taken untracked.

A retry of an idempotent batch that arrives while the original is in flight waits for it: the
original's failure is the retry's too. A batch appended without its key in the map would be
answered at once when its retry came — acknowledged before the original was durable, and lost if
that flush then failed. So past INFLIGHT_PER_PARTITION_MAX the append is refused before any
offset is assigned (REQUEST_TIMED_OUT, retriable), and the producer's retry appends it.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from loglake.cluster.shared_log import INFLIGHT_PER_PARTITION_MAX, SharedPartitionLog
from loglake.engine.partition import Partition
from loglake.errors import BackPressureTimeoutError
from loglake.kafka_errors import ErrorCode
from loglake.meta.producers import ProducerStates

TID = bytes.fromhex("ab" * 16)
TP = (TID.hex(), 0)


@dataclass(frozen=True)
class Head:
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int = 1
    last_offset_delta: int = 0
    is_control: bool = False


class _Plog:
    """Assigns offsets; every append stays in flight (its future is never settled here)."""

    def __init__(self) -> None:
        self.end = 0
        self.appends: list[Future[Any]] = []

    def append_assigned(self, tid: str, partition: int, buf: bytes, stamp: int) -> tuple[int, Future[Any]]:
        base, self.end = self.end, self.end + 1
        fut: Future[Any] = Future()
        self.appends.append(fut)
        return base, fut


class _Leading(SharedPartitionLog):
    def __init__(self, plog: _Plog) -> None:  # only what an append reads: it leads the partition
        self._plog = plog  # type: ignore[assignment]
        self.settings = SimpleNamespace(node_id=1)  # type: ignore[assignment]
        self._ready_lock = threading.Lock()
        self._ready = {TP}
        self._producers = {TP: ProducerStates()}
        self._inflight = {TP: {}}

    def leads(self, topic_id: str, partition: int) -> bool:
        return True

    def _log_start(self, topic_id: str, partition: int) -> int:
        return 0


def _append(log: _Leading, p: Partition, head: Head) -> Future[Any]:
    config = SimpleNamespace(log_append_time=False)
    return log.append(p, config, b"batch", [(0, head)])  # type: ignore[arg-type, list-item]


def test_past_the_bound_an_idempotent_batch_is_refused_and_its_retry_appends_it() -> None:
    plog = _Plog()
    log = _Leading(plog)
    p = Partition("t", TID, 0, 0, None)  # type: ignore[arg-type]
    inflight = log._inflight[TP]
    for i in range(INFLIGHT_PER_PARTITION_MAX - 1):  # other producers' batches, all in flight
        inflight[(1000 + i, 0, 0)] = Future()
    _append(log, p, Head(7, 0, 0))  # the last room
    assert len(inflight) == INFLIGHT_PER_PARTITION_MAX

    with pytest.raises(BackPressureTimeoutError) as err:
        _append(log, p, Head(7, 0, 1))
    assert err.value.retriable and err.value.kafka_code == ErrorCode.REQUEST_TIMED_OUT
    assert "t-0" in str(err.value) and "INFLIGHT_PER_PARTITION_MAX" in str(err.value)
    assert plog.end == 1  # no offset was assigned to the refused batch

    # The retry, once there is room, is a new append (not a duplicate), and tracked.
    del inflight[(1000, 0, 0)]
    retry = _append(log, p, Head(7, 0, 1))
    assert plog.end == 2 and inflight[(7, 0, 1)] is plog.appends[-1]
    # A retry of it while it is in flight waits for the original instead of being answered.
    again = _append(log, p, Head(7, 0, 1))
    assert not again.done() and not retry.done()


def test_batches_without_a_producer_id_are_not_bounded_by_the_map() -> None:
    plog = _Plog()
    log = _Leading(plog)
    p = Partition("t", TID, 0, 0, None)  # type: ignore[arg-type]
    for i in range(INFLIGHT_PER_PARTITION_MAX):
        log._inflight[TP][(1000 + i, 0, 0)] = Future()
    _append(log, p, Head(-1, -1, -1))
    assert plog.end == 1
