"""Idempotent producers' state after a leader change in cluster mode (loglake.cluster.producers):
rebuilt from the committed tail's batch headers, it answers a retry of a committed batch with
its original offsets and accepts the producer's next sequence; the tail read stays bounded."""

from __future__ import annotations

import pytest

from loglake.cluster.producers import REBUILD_BYTES_MAX, rebuild_producers, tail_start
from loglake.errors import OutOfOrderSequenceError
from loglake.meta.cluster import Plog, PlogRange, PlogSegment
from loglake.records.batch import build_batch, set_offset_and_epoch, split_batches


def committed_log(batches: list[tuple[int, int, int]]) -> tuple[Plog, bytes]:
    """A partition whose log is these (producer id, first sequence, records) batches, as one range."""
    out = bytearray()
    offset = 0
    for pid, seq, count in batches:
        raw = bytearray(
            build_batch(
                [(1000, None, b"v", [])] * count, producer_id=pid, producer_epoch=0, base_sequence=seq
            )
        )
        ((pos, h),) = split_batches(raw)
        set_offset_and_epoch(raw, pos, offset, h.batch_length, 1)
        out += raw
        offset += count
    rng = PlogRange("flush/1/s/1.lfo", 0, offset - 1, 0, len(out), offset, 1000, 0, len(batches))
    return Plog(epoch=1, leader=1, end=offset, ranges=[rng]), bytes(out)


def reader(data: bytes):  # type: ignore[no-untyped-def]
    """read(offset, max_bytes) over `data`: the batches from the one holding `offset`."""
    batches = split_batches(bytearray(data))

    def read(offset: int, max_bytes: int) -> bytes:
        chunks = [bytes(data[pos : pos + h.size]) for pos, h in batches if h.last_offset >= offset]
        return b"".join(chunks[:2])  # a little at a time, as a bounded read would

    return read


def test_a_retried_batch_gets_its_offsets_and_the_next_sequence_goes_on() -> None:
    plog, data = committed_log([(7, 0, 3), (8, 0, 2), (7, 3, 4), (7, 7, 1)])
    states = rebuild_producers(reader(data), plog)
    assert states.check(7, 0, 3, 4) == (5, 8)  # producer 7's second batch, committed at 5..8
    assert states.check(7, 0, 7, 1) == (9, 9)
    assert states.check(7, 0, 8, 5) is None  # its next sequence: accepted
    assert states.check(8, 0, 2, 1) is None
    with pytest.raises(OutOfOrderSequenceError):
        states.check(7, 0, 12, 1)  # a gap
    assert states.check(99, 0, 40, 1) is None  # unknown producer: accepted, as Kafka does


def test_an_empty_partition_has_no_producers() -> None:
    states = rebuild_producers(lambda offset, n: b"", Plog())
    assert len(states) == 0


def test_the_tail_read_is_bounded() -> None:
    ranges = [
        PlogRange(f"k{i}", i * 10, i * 10 + 9, 0, REBUILD_BYTES_MAX // 4, 10, 0, 0, 1) for i in range(20)
    ]
    seg = PlogSegment("s", 0, 9, 100, 90, 0, "", 10, 0)
    plog = Plog(epoch=1, end=200, segments=[], ranges=ranges)
    assert tail_start(plog) == 160  # the newest four ranges make up the bound
    assert tail_start(Plog(end=5)) == 5
    assert tail_start(Plog(end=10, segments=[seg], ranges=[])) == 0
