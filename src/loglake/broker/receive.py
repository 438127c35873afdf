"""Receiving request frames: an asyncio `BufferedProtocol` that frames where the bytes land.

The transport (TCP, or asyncio's TLS transport after `loglake.broker.security.tls.upgrade`)
`recv_into`s this protocol's buffers (`get_buffer` / `buffer_updated`); nothing is copied out of a
stream buffer. Two kinds of buffer:

* the connection's block, filled front to back: `FIRST_BLOCK_BYTES` at first (most connections
  send small requests one at a time, and many connections stay open), `BLOCK_BYTES` once a read
  has filled all the block offered (`MORE_BYTES` or more). A frame that is complete in it is
  handed on as a memoryview of it. At the block's end the frame in progress (a part of one, less
  than a block) moves to the front of the same block when no frame of it is referenced any more
  (an export check, not a guess), else to a fresh block; a connection's last block goes back to a
  small pool when it closes;
* a bytearray of exactly the frame's size, allocated once the 4-byte size prefix is known, for a
  frame that does not fit in the rest of the block or is `OWN_BUFFER_BYTES` or more: the part
  already received is copied into it (the one copy), the rest is received into it directly.

A Produce frame complete in the block is copied into a bytearray of its own before it is handed
on: the engine keeps the record batches (as views of that frame) until they are sealed, and a
view of the shared block would hold the whole block. Every frame is thereby copied at most once
between the socket and the handler, Produce frames with their own buffer not at all.

Bounds, as the stream read loop had them (`loglake.broker.connection` tells the rules): each
read is sized by the connection's request-bytes allowance (`overload.ConnectionBytes`); when it is
spent, or frames wait that the connection's loop is not taking (its handlers' slots are taken,
a quota mutes it), reading pauses (`transport.pause_reading`) until `next_frame` finds room
again. The frame limit is checked on the size prefix alone. The idle timeout and
`frame_receive_timeout_ms` run on one timer that is re-armed lazily, not one per read.
"""

from __future__ import annotations

import asyncio
import collections
import mmap
import struct
from collections.abc import Awaitable, Callable, Coroutine
from typing import Protocol, cast

from loglake.broker import overload
from loglake.broker.protocol import FRAME_PREFIX_BYTES, ApiKey, FrameTooLargeError
from loglake.broker.protocol.framing import DEFAULT_MAX_FRAME_BYTES

#: Size of a connection's receive block: the most one read takes while frames fit in it.
BLOCK_BYTES = overload.READ_CHUNK_BYTES
#: A frame at least this large gets a buffer of its own as soon as its size is known (received
#: into directly; a Produce frame's records then go to the engine uncopied).
OWN_BUFFER_BYTES = 16 * 1024
#: The largest frame buffer allocated (and zeroed) whole before its bytes arrive; larger frames
#: get an anonymous mapping. Counted in `overload.CONNECTION_BYTES`.
PREALLOCATED_BYTES = overload.PREALLOCATED_FRAME_BYTES
#: A connection's first block: what a client that sends small requests one at a time needs.
FIRST_BLOCK_BYTES = 16 * 1024
#: A read of at least this many bytes that fills all the block offered moves the connection to BLOCK_BYTES blocks.
MORE_BYTES = 4096
#: BLOCK_BYTES blocks kept for connections that need one, so they do not allocate it.
POOL_BLOCKS = 16

_SIZE = struct.Struct(">i")
_API_KEY = struct.Struct(">h")
_PRODUCE = int(ApiKey.PRODUCE)
_pool: list[bytearray] = []


def _take_block(size: int) -> bytearray:
    if size == BLOCK_BYTES:
        try:
            return _pool.pop()  # brokers in threads of one process share the pool
        except IndexError:
            pass
    return bytearray(size)


def unreferenced(block: bytearray) -> bool:
    """Whether no memoryview of `block` is alive: a bytearray with exports cannot change size."""
    try:
        block.append(0)
    except BufferError:
        return False
    del block[-1]
    return True


class BytesIn(Protocol):
    """Where received bytes are counted (`loglake.broker.metrics.Metrics`)."""

    bytes_in: int


class ReceiveTimeout(Exception):
    """Nothing came for the idle timeout, or a frame did not complete within frame_receive_timeout_ms."""

    def __init__(self, frame: bool, seconds: float) -> None:
        super().__init__("frame" if frame else "idle")
        #: True: a frame's rest did not come in time; False: the connection was idle.
        self.frame = frame
        self.seconds = seconds


class FrameReceiver(asyncio.BufferedProtocol):
    """One client socket's protocol: frames in, and (for `asyncio.StreamWriter`) flow control out.

    Not an `asyncio.Protocol` (asyncio's FlowControlMixin is one): uvloop reads into a protocol
    through get_buffer only when it is not, so the write flow control is its own here.

    Reading starts paused: the connection's loop resumes it once it asks for a frame (after the
    TLS handshake, on an SSL listener)."""

    def __init__(
        self,
        held: overload.ConnectionBytes,
        counter: BytesIn,
        on_connected: Callable[[FrameReceiver], Coroutine[object, object, None]],
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._write_paused = False
        self._drain_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._connection_lost = False
        #: The transport now (`upgrade` replaces it with the TLS one).
        self.transport: asyncio.Transport | None = None
        #: Request bytes read and not yet answered (the connection releases them as it answers).
        self.held = held
        self.counter = counter
        #: Frames over this (as their prefix says) close the connection; SASL lowers it until authenticated.
        self.max_frame_bytes = DEFAULT_MAX_FRAME_BYTES
        #: (idle seconds, frame seconds) now: both settings are dynamic.
        self.timeouts: Callable[[], tuple[float, float]] = lambda: (3600.0, 3600.0)
        #: Set once the TLS handshake starts: an EOF then closes (asyncio's TLS transport must not be kept open).
        self.over_tls = False
        #: loop.time() of the frame in progress's first byte (the broker's own waits pushed out of it).
        self.frame_started = 0.0
        #: The frame limit was exceeded: the stream cannot be framed any more.
        self.error: FrameTooLargeError | None = None
        self._on_connected = on_connected
        self._task: asyncio.Task[None] | None = None
        self._block: bytearray | None = None
        self._view: memoryview | None = None
        self._start = 0  # the frame in progress's first byte (its size prefix) in the block
        self._end = 0  # bytes received into the block
        self._own: bytearray | mmap.mmap | None = None  # the frame in progress, when it has its own buffer
        self._got = 0  # bytes of it received
        self._offered = 0  # bytes of the block the last get_buffer offered
        self._busy = False  # a read filled all it was offered: BLOCK_BYTES blocks from now on
        self._frames: collections.deque[memoryview] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._read_paused = False
        self._eof = False
        self._timeout: ReceiveTimeout | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._idle_since = 0.0

    # -- asyncio's side ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Any event loop's TCP transport (uvloop's are not asyncio.Transport subclasses).
        self.transport = cast(asyncio.Transport, transport)
        self._pause()
        self._task = self._loop.create_task(self._on_connected(self))

    def connection_lost(self, exc: Exception | None) -> None:
        self._connection_lost = True
        for waiter in self._drain_waiters:  # writers waiting in drain()
            if not waiter.done():
                if exc is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(exc)
        self._eof = True
        self._wake()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        block = self._block
        if self._view is not None:
            self._view.release()
            self._view = None
        self._block = None
        if block is not None and len(block) == BLOCK_BYTES and len(_pool) < POOL_BLOCKS and unreferenced(block):
            _pool.append(block)

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        # Over TCP the write side stays open for the answers still on their way.
        return not self.over_tls

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _drain_helper(self) -> None:
        """What `asyncio.StreamWriter.drain` awaits: the transport's write buffer below its high-water mark."""
        if self._connection_lost:
            raise ConnectionResetError("Connection lost")
        if not self._write_paused:
            return
        waiter = self._loop.create_future()
        self._drain_waiters.append(waiter)
        try:
            await waiter
        finally:
            self._drain_waiters.remove(waiter)

    def get_buffer(self, sizehint: int) -> memoryview:
        # At least one byte: reading may have been resumed by someone else (loop.sendfile resumes
        # what it paused), and an empty buffer is a fatal error to the transport.
        room = max(self.held.allowance(self.frame_left), 1)
        own = self._own
        if own is not None:
            got = self._got
            return memoryview(own)[got : got + room]
        view = self._view
        if view is None or self._end == len(view):
            view = self._renew()
        end = self._end
        buf = view[end : end + room]
        self._offered = len(buf)
        return buf

    def buffer_updated(self, nbytes: int) -> None:
        now = self._loop.time()
        self._idle_since = now
        self.counter.bytes_in += nbytes
        self.held.add(nbytes)
        was_partial = self._own is not None or self._start < self._end
        done = False
        own = self._own
        if own is not None:
            self._got += nbytes
            if self._got == len(own):
                self._own = None
                self._frames.append(memoryview(own))
                done = True
        else:
            self._end += nbytes
            if nbytes == self._offered and nbytes >= MORE_BYTES:
                self._busy = True  # the client had more to give than the block took
            done = self._frame_block()
        if done:
            self.held.frame_done()
        if (done or not was_partial) and (self._own is not None or self._start < self._end):
            self.frame_started = now  # a frame began in this read
            if self._timer is not None and self._waiter is not None:
                self._arm_timer()
        if self.error is not None or self.held.allowance(self.frame_left) <= 0:
            self._pause()
            self._wake()
        elif self._frames:
            if self._waiter is not None:
                self._wake()
            else:  # the connection's loop is waiting on something else: read no further meanwhile
                self._pause()

    # -- framing -------------------------------------------------------------------------------

    def _frame_block(self) -> bool:
        """Hand on the frames complete in the block; give the one in progress its own buffer when
        it needs one. Whether a frame completed."""
        view = self._view
        assert view is not None
        start, end = self._start, self._end
        limit = self.max_frame_bytes
        frames = self._frames
        done = False
        while end - start >= FRAME_PREFIX_BYTES:
            size = _SIZE.unpack_from(view, start)[0]
            if size < 0 or size > limit:
                self.error = FrameTooLargeError(size, limit)
                self._start = self._end = end
                return done
            body = start + FRAME_PREFIX_BYTES
            if end - body >= size:
                frame = view[body : body + size]
                if size >= 2 and _API_KEY.unpack_from(frame)[0] == _PRODUCE:
                    frame = memoryview(bytearray(frame))  # the engine keeps it: not a view of the block
                frames.append(frame)
                start = body + size
                done = True
                continue
            if size >= OWN_BUFFER_BYTES or body + size > len(view):
                own: bytearray | mmap.mmap = bytearray(size) if size <= PREALLOCATED_BYTES else mmap.mmap(-1, size)
                have = end - body
                own[:have] = view[body:end]
                self._own, self._got = own, have
                start = end
            break
        self._start = start
        return done

    def _renew(self) -> memoryview:
        """The block is full: keep the frame in progress's bytes at the front of this block (no
        frame of it referenced) or of another."""
        block, view = self._block, self._view
        size = BLOCK_BYTES if self._busy else FIRST_BLOCK_BYTES
        if block is None or view is None:
            block = _take_block(size)
            self._start = self._end = 0
        else:
            start, end = self._start, self._end
            partial = bytes(view[start:end]) if start < end else b""
            view.release()
            if len(block) != size or not unreferenced(block):
                block = _take_block(size)
            block[: len(partial)] = partial
            self._start, self._end = 0, len(partial)
        self._block = block
        self._view = view = memoryview(block)
        return view

    @property
    def frame_left(self) -> int:
        """Bytes the frame in progress still misses (0 between frames)."""
        own = self._own
        if own is not None:
            return len(own) - self._got
        have = self._end - self._start
        if have <= 0:
            return 0
        if have < FRAME_PREFIX_BYTES:
            return FRAME_PREFIX_BYTES - have
        assert self._view is not None
        size: int = _SIZE.unpack_from(self._view, self._start)[0]
        return FRAME_PREFIX_BYTES + size - have

    @property
    def buffered(self) -> int:
        """Bytes held of the frame in progress (with its size prefix)."""
        if self._own is not None:
            return FRAME_PREFIX_BYTES + self._got
        return self._end - self._start

    # -- the connection's side -----------------------------------------------------------------

    async def next_frame(self, before_read: Callable[[], Awaitable[None]]) -> memoryview | None:
        """The next frame; None once the client has closed. Raises `FrameTooLargeError` or
        `ReceiveTimeout`. `before_read` is awaited before reading resumes (a quota's mute)."""
        while True:
            frames = self._frames
            if frames:
                return frames.popleft()
            if self.error is not None:
                raise self.error
            if self._timeout is not None:
                raise self._timeout
            if self._eof:
                return None
            frame_left = self.frame_left
            waited = self._loop.time()
            await self.held.room(frame_left)
            await before_read()
            if frame_left:  # the broker's own waits do not count against the client
                self.frame_started += self._loop.time() - waited
            if self._frames or self._eof or self.error is not None:
                continue
            self._resume()
            self._idle_since = self._loop.time()
            self._waiter = self._loop.create_future()
            self._arm_timer()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _deadline(self) -> tuple[float, bool]:
        idle_s, frame_s = self.timeouts()
        idle = self._idle_since + idle_s
        if self._own is not None or self._start < self._end:
            frame = self.frame_started + frame_s
            if frame <= idle:
                return frame, True
        return idle, False

    def _arm_timer(self) -> None:
        deadline, _ = self._deadline()
        timer = self._timer
        if timer is not None:
            if timer.when() <= deadline:
                return  # it fires early and re-arms
            timer.cancel()
        self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._waiter is None:
            return  # the loop is not waiting for bytes: its next wait arms the timer again
        deadline, frame = self._deadline()
        if self._loop.time() < deadline:
            self._timer = self._loop.call_at(deadline, self._on_timer)
            return
        idle_s, frame_s = self.timeouts()
        self._timeout = ReceiveTimeout(frame, frame_s if frame else idle_s)
        self._pause()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _pause(self) -> None:
        transport = self.transport
        if transport is not None and (not self._read_paused or transport.is_reading()):
            # The transport's own state too: loop.sendfile resumes reading it paused itself.
            self._read_paused = True
            transport.pause_reading()

    def _resume(self) -> None:
        transport = self.transport
        if self._read_paused and transport is not None:
            self._read_paused = False
            transport.resume_reading()

    def upgraded(self, transport: asyncio.BaseTransport) -> None:
        """The TLS transport replaced the TCP one: reading is paused until the connection asks."""
        self.transport = cast(asyncio.Transport, transport)
        self._read_paused = False
        self._pause()


__all__ = ["BLOCK_BYTES", "FIRST_BLOCK_BYTES", "MORE_BYTES", "OWN_BUFFER_BYTES", "PREALLOCATED_BYTES", "FrameReceiver", "ReceiveTimeout", "unreferenced"]
