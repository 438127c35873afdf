"""Splitting a byte stream into Kafka request frames (sans-IO).

A Kafka frame is a big-endian int32 size followed by that many bytes. `FrameDecoder` buffers at
most one partial frame: the size is validated from the 4 prefix bytes alone, so a client claiming
2 GiB is rejected before a single byte of that is allocated or buffered.
"""

from __future__ import annotations

from struct import Struct

from loglake.broker.protocol.errors import FrameTooLargeError

_SIZE = Struct(">i")
#: Bytes of the size prefix before every request and response.
FRAME_PREFIX_BYTES = _SIZE.size

#: Kafka's socket.request.max.bytes default.
DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024


class FrameDecoder:
    """Feed it received bytes; get back complete request frames without their size prefix.

    After `FrameTooLargeError` the stream is unusable (the frame boundary is lost): close the
    connection. Memory held is bounded by 4 + `max_frame_bytes` (one partial frame); it grows
    with the bytes actually received, never with the size a prefix claims.
    """

    __slots__ = ("_have", "_need", "_parts", "_prefix", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if not 0 < max_frame_bytes <= 0x7FFFFFFF:
            raise ValueError(f"max_frame_bytes must be in 1..2**31-1, got {max_frame_bytes}")
        self.max_frame_bytes = max_frame_bytes
        self._prefix = b""  # bytes of a size prefix not yet complete (< 4)
        self._need = -1  # size of the frame being received; -1 while no prefix
        self._parts: list[bytes] = []  # received pieces of that frame, joined once complete
        self._have = 0

    @property
    def buffered(self) -> int:
        """Bytes held of the frame (and prefix) not yet complete."""
        return len(self._prefix) + self._have + (FRAME_PREFIX_BYTES if self._need >= 0 else 0)

    def bytes_needed(self) -> int:
        """Bytes still missing to complete the frame in progress (at least 1)."""
        if self._need < 0:
            return FRAME_PREFIX_BYTES - len(self._prefix)
        return self._need - self._have

    def _start(self, size: int) -> None:
        if size < 0 or size > self.max_frame_bytes:
            self._parts = []
            self._have = 0
            self._need = -1
            raise FrameTooLargeError(size, self.max_frame_bytes)
        self._need = size

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        frames: list[bytes] = []
        mv = data if isinstance(data, bytes) else memoryview(data).cast("B")
        n = len(mv)
        i = 0
        while i < n:
            if self._need < 0:
                if self._prefix or n - i < 4:
                    take = min(4 - len(self._prefix), n - i)
                    self._prefix += bytes(mv[i : i + take])
                    i += take
                    if len(self._prefix) < 4:
                        break
                    size = _SIZE.unpack(self._prefix)[0]
                    self._prefix = b""
                else:
                    size = _SIZE.unpack_from(mv, i)[0]
                    i += 4
                self._start(size)
                # Fast path: the whole frame is in this input: one copy, no list.
                if n - i >= size:
                    frames.append(bytes(mv[i : i + size]))
                    i += size
                    self._need = -1
                continue
            take = min(self._need - self._have, n - i)
            self._parts.append(bytes(mv[i : i + take]))
            self._have += take
            i += take
            if self._have == self._need:
                parts = self._parts
                frames.append(parts[0] if len(parts) == 1 else b"".join(parts))
                self._parts = []
                self._have = 0
                self._need = -1
        return frames


def frame(payload: bytes | bytearray) -> bytes:
    """The payload with its size prefix (tests and tools)."""
    return _SIZE.pack(len(payload)) + bytes(payload)


__all__ = ["DEFAULT_MAX_FRAME_BYTES", "FrameDecoder", "frame"]
