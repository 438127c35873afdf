"""FrameDecoder: whole, byte by byte, trailing bytes, oversized prefixes."""

from __future__ import annotations

import random
import struct
import tracemalloc

import pytest

from loglake.broker.protocol import FrameDecoder, FrameTooLargeError
from loglake.broker.protocol.framing import frame

PAYLOADS = [b"", b"a", b"hello world", bytes(range(256)) * 40]
STREAM = b"".join(frame(p) for p in PAYLOADS)


def test_whole_stream() -> None:
    assert FrameDecoder().feed(STREAM) == PAYLOADS


def test_one_byte_at_a_time() -> None:
    dec = FrameDecoder()
    got: list[bytes] = []
    for i in range(len(STREAM)):
        got += dec.feed(STREAM[i : i + 1])
    assert got == PAYLOADS
    assert dec.buffered == 0


@pytest.mark.parametrize("seed", range(20))
def test_random_splits_and_buffer_types(seed: int) -> None:
    rng = random.Random(seed)
    dec = FrameDecoder()
    got: list[bytes] = []
    i = 0
    while i < len(STREAM):
        j = min(len(STREAM), i + rng.randint(1, 3000))
        piece = STREAM[i:j]
        got += dec.feed(rng.choice([bytes, bytearray, memoryview])(piece))
        i = j
    assert got == PAYLOADS


def test_trailing_partial_frame_is_kept() -> None:
    dec = FrameDecoder()
    tail = frame(b"next request")
    assert dec.feed(STREAM + tail[:7]) == PAYLOADS
    assert dec.buffered == 7
    assert dec.bytes_needed() == len(tail) - 7
    assert dec.feed(tail[7:]) == [b"next request"]
    assert dec.buffered == 0 and dec.bytes_needed() == 4


def test_frame_at_the_limit() -> None:
    dec = FrameDecoder(max_frame_bytes=10)
    assert dec.feed(frame(b"x" * 10)) == [b"x" * 10]
    with pytest.raises(FrameTooLargeError) as ei:
        dec.feed(frame(b"x" * 11))
    assert (ei.value.size, ei.value.limit) == (11, 10)


def test_oversized_prefix_rejected_without_allocation() -> None:
    tracemalloc.start()
    try:
        dec = FrameDecoder(max_frame_bytes=100 * 1024 * 1024)
        with pytest.raises(FrameTooLargeError):
            dec.feed(struct.pack(">i", 2**31 - 1))  # claims 2 GiB
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_oversized_prefix_byte_by_byte() -> None:
    dec = FrameDecoder(max_frame_bytes=1000)
    prefix = struct.pack(">i", 1001)
    for b in prefix[:3]:
        assert dec.feed(bytes([b])) == []
    with pytest.raises(FrameTooLargeError):
        dec.feed(prefix[3:])


def test_negative_prefix() -> None:
    with pytest.raises(FrameTooLargeError):
        FrameDecoder().feed(struct.pack(">i", -1) + b"junk")


def test_oversized_prefix_after_good_frames_in_one_feed() -> None:
    dec = FrameDecoder(max_frame_bytes=100)
    with pytest.raises(FrameTooLargeError):
        dec.feed(frame(b"ok") + struct.pack(">i", 101))


def test_bad_limit() -> None:
    with pytest.raises(ValueError):
        FrameDecoder(0)
