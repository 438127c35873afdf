"""The receive path (loglake.broker.receive): frames land where the socket's bytes were received,
and a produced record batch reaches the engine without a copy (issue 35).

Copies are counted by identity: a frame handed on is a view of the very buffer `get_buffer`
gave the transport to `recv_into`, and the engine's buffer is a view of that same object.
"""

from __future__ import annotations

import asyncio
import mmap
import struct
from collections.abc import Callable

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest

from loglake.broker import overload
from loglake.broker.protocol import FrameTooLargeError, decode_request
from loglake.broker.protocol.produce import ProduceRequestData
from loglake.broker.receive import (
    BLOCK_BYTES,
    FIRST_BLOCK_BYTES,
    OWN_BUFFER_BYTES,
    FrameReceiver,
    unreferenced,
)
from loglake.engine.config import TopicConfig
from loglake.engine.produce import checked_batches
from loglake.records.batch import new_builder

TOPIC = "t"


class _Counter:
    bytes_in = 0


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading


def _receiver(limit: int = 1 << 30) -> tuple[FrameReceiver, _Transport]:
    async def connected(_: FrameReceiver) -> None:
        return None

    held = overload.RequestBytes(limit, 100 * 1024 * 1024).connection()
    rx = FrameReceiver(held, _Counter(), connected)
    t = _Transport()
    rx.connection_made(t)
    rx.max_frame_bytes = 100 * 1024 * 1024
    return rx, t


def _recv(
    rx: FrameReceiver, data: bytes, step: int, handle: Callable[[list[memoryview]], object] | None = None
) -> list[object]:
    """Feed `data` as a socket would, `step` bytes at most per recv_into; the buffers written into.
    `handle` takes the frames complete after each read (else they wait in the receiver)."""
    targets: list[object] = []
    pos = 0
    while pos < len(data):
        buf = rx.get_buffer(-1)
        n = min(len(buf), step, len(data) - pos)
        buf[:n] = data[pos : pos + n]
        targets.append(buf.obj)
        buf.release()
        rx.buffer_updated(n)
        if handle is not None:
            handle(_frames(rx))
        pos += n
    return targets


def _frames(rx: FrameReceiver) -> list[memoryview]:
    out = []
    while rx._frames:
        out.append(rx._frames.popleft())
    return out


def _produce_frame(values: list[bytes], correlation_id: int = 7) -> tuple[bytes, bytes]:
    """A Produce v3 request frame (with its size prefix) of one batch; and that batch."""
    b = new_builder()
    for v in values:
        b.append(0, None, v, [])
    batch = b.build()
    body = struct.pack(">hhi", 0, 3, correlation_id) + struct.pack(">h", 1) + b"c"
    body += struct.pack(">h", -1) + struct.pack(">hi", -1, 30000) + struct.pack(">i", 1)
    body += struct.pack(">h", len(TOPIC)) + TOPIC.encode() + struct.pack(">i", 1)
    body += struct.pack(">ii", 0, len(batch)) + batch
    return struct.pack(">i", len(body)) + body, batch


def _small_request(correlation_id: int) -> bytes:
    body = ApiVersionsRequest[0]().encode()
    head = struct.pack(">hhi", 18, 0, correlation_id) + struct.pack(">h", 1) + b"c"
    return struct.pack(">i", len(head) + len(body)) + head + body


def _run(test: Callable[[], None]) -> None:
    async def main() -> None:
        test()

    asyncio.run(main())


def test_a_large_produce_frame_is_received_into_its_own_buffer_and_reaches_the_engine_uncopied() -> None:
    def test() -> None:
        rx, _ = _receiver()
        frame, batch = _produce_frame([b"v" * 1000] * 400)  # ~400 KB: more than a block
        assert len(frame) > BLOCK_BYTES
        targets = _recv(rx, frame, 64 * 1024)
        (got,) = _frames(rx)
        assert bytes(got) == frame[4:]
        own = got.obj
        assert isinstance(own, bytearray) and len(own) == len(frame) - 4
        # Every read after the first went straight into the frame's buffer: only the first read's
        # bytes (the size prefix's read) were copied, once.
        assert all(t is own for t in targets[1:])
        req = decode_request(got)
        body = req.body
        assert isinstance(body, ProduceRequestData)
        records = body.topic_data[0].partition_data[0].records
        assert records is not None and records.obj is own and bytes(records) == batch
        buf, batches = checked_batches(TOPIC, 0, TopicConfig.parse({}), records)
        assert isinstance(buf, memoryview) and buf.obj is own and len(batches) == 1  # taken over, not copied

    _run(test)


def test_a_read_only_frame_is_copied_once_by_the_engine() -> None:
    frame, batch = _produce_frame([b"x"])
    req = decode_request(frame[4:])
    assert isinstance(req.body, ProduceRequestData)
    records = req.body.topic_data[0].partition_data[0].records
    assert records is not None and records.readonly
    buf, _ = checked_batches(TOPIC, 0, TopicConfig.parse({}), records)
    assert isinstance(buf, bytearray) and bytes(buf) == batch


def test_small_frames_are_views_of_the_block_and_a_small_produce_gets_one_copy() -> None:
    def test() -> None:
        rx, _ = _receiver()
        produce, batch = _produce_frame([b"one record"], correlation_id=2)
        data = _small_request(1) + produce + _small_request(3)
        targets = _recv(rx, data, len(data))
        first, prod, third = _frames(rx)
        block = targets[0]
        assert first.obj is block and third.obj is block  # framed in place
        assert prod.obj is not block and isinstance(prod.obj, bytearray) and len(prod.obj) == len(produce) - 4
        assert decode_request(first).correlation_id == 1 and decode_request(third).correlation_id == 3
        req = decode_request(prod)
        assert isinstance(req.body, ProduceRequestData)
        records = req.body.topic_data[0].partition_data[0].records
        assert records is not None and records.obj is prod.obj and bytes(records) == batch

    _run(test)


def _handle(frames: list[memoryview]) -> int:
    assert all(decode_request(f).correlation_id == 1 for f in frames)
    return len(frames)


def test_the_block_is_reused_once_its_frames_are_released_and_replaced_while_one_is_held() -> None:
    def test() -> None:
        rx, _ = _receiver()
        one = _small_request(1)
        data = one * (FIRST_BLOCK_BYTES // len(one) + 3)  # past the block's end: a frame spans it
        handled: list[int] = []
        targets = _recv(rx, data, 1000, lambda frames: handled.append(_handle(frames)))  # each frame handled as it comes
        block = targets[0]
        assert isinstance(block, bytearray) and len(block) == FIRST_BLOCK_BYTES
        assert sum(handled) == len(data) // len(one)
        assert targets[-1] is block  # nothing referenced the block when it filled: reused in place
        kept: list[memoryview] = []
        _recv(rx, data, 1000, lambda frames: kept.extend(frames[: 1 - len(kept)]))  # a handler holds the first frame
        held = kept[0]
        assert rx._block is not block  # replaced, not overwritten
        assert bytes(held) == one[4:] and decode_request(held).correlation_id == 1
        assert not unreferenced(block)
        kept.clear()
        del held
        assert unreferenced(block)

    _run(test)


def test_a_connection_starts_with_a_small_block_and_moves_to_a_full_one_once_reads_fill_it() -> None:
    def test() -> None:
        rx, _ = _receiver()
        one = _small_request(1)
        targets = _recv(rx, one * 3, 64)  # a request at a time
        assert len(targets[0]) == FIRST_BLOCK_BYTES  # type: ignore[arg-type]
        _frames(rx)
        data = one * (2 * BLOCK_BYTES // len(one))
        handled = 0
        seen: set[int] = set()
        for pos in range(0, len(data), 64 * 1024):  # a client with more to give than the block takes
            seen.update(len(t) for t in _recv(rx, data[pos : pos + 64 * 1024], 64 * 1024))  # type: ignore[arg-type]
            handled += _handle(_frames(rx))
        assert handled == len(data) // len(one)
        assert rx._block is not None and len(rx._block) == BLOCK_BYTES and BLOCK_BYTES in seen

    _run(test)


def test_a_claimed_size_costs_nothing_until_its_bytes_arrive() -> None:
    def test() -> None:
        rx, _ = _receiver()
        _recv(rx, struct.pack(">i", 100_000_000) + b"\0" * 10, 4096)
        assert isinstance(rx._own, mmap.mmap)  # pages are taken as bytes arrive
        assert rx.frame_left == 100_000_000 - 10 and rx.buffered == 14
        rx2, _ = _receiver()
        _recv(rx2, struct.pack(">i", OWN_BUFFER_BYTES) + b"\0" * 10, 4096)
        assert isinstance(rx2._own, bytearray)

    _run(test)


def test_frames_over_the_limit_stop_the_stream() -> None:
    def test() -> None:
        rx, t = _receiver()
        rx.max_frame_bytes = 1000
        _recv(rx, _small_request(1) + struct.pack(">i", 1001) + b"GET ", 64)
        assert len(_frames(rx)) == 1
        assert isinstance(rx.error, FrameTooLargeError) and rx.error.size == 1001
        assert not t.reading

    _run(test)


def test_reads_are_sized_by_the_request_bytes_allowance_and_pause_when_it_is_spent() -> None:
    def test() -> None:
        rx, t = _receiver(limit=0)  # the bound is spent: only the connection's floor
        first = rx.get_buffer(-1)
        assert len(first) <= overload.CONNECTION_FLOOR_BYTES
        first.release()
        body = MetadataRequest[0](topics=[]).encode()
        _recv(rx, struct.pack(">i", 200_000) + body, 4096)
        buf = rx.get_buffer(-1)
        assert len(buf) == overload.CONNECTION_FLOOR_BYTES - 4 - len(body)
        buf.release()
        _recv(rx, b"\0" * (overload.CONNECTION_FLOOR_BYTES - 4 - len(body)), 1 << 20)
        assert not t.reading  # nothing more may be read until room is made

    _run(test)


def test_pausing_reads_does_not_hold_up_writes() -> None:
    async def main() -> None:
        rx, t = _receiver()
        assert not t.reading  # paused until the connection asks for a frame
        await asyncio.wait_for(rx._drain_helper(), 1.0)  # StreamWriter.drain() of the answers
        rx.pause_writing()
        rx.resume_writing()
        await asyncio.wait_for(rx._drain_helper(), 1.0)

    asyncio.run(main())


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
