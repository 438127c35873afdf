"""Sending a Fetch response's file ranges (hot segment data) on a client connection.

The engine opens the segment file (`Engine.open_file_range`, off the event loop, with the range's
pages asked for ahead); the broker never opens one by path. On PLAINTEXT the kernel copies the
range from the page cache to the socket (`loop.sendfile`); TLS has to encrypt in user space, so
there the range is read in `BUFFERED_SEND_BYTES` chunks off the event loop and written
(docs/SECURITY.md, "What TLS costs"). An I/O error reading the segment (not the socket) is
reported to the engine, which makes the next fetch of that segment an error instead of a silent
reconnect loop; the response is cut, so the connection goes.
"""

from __future__ import annotations

import asyncio
import errno
import os
from typing import Protocol

from loglake.broker.context import BrokerContext
from loglake.broker.security.tls import SecurityContext
from loglake.engine.types import FileRange

#: Bytes read from a file per write when sendfile cannot be used (TLS, or an event loop without it).
BUFFERED_SEND_BYTES = 1024 * 1024
#: Whether the running event loop implements `loop.sendfile` (uvloop does not); learnt on first use.
_sendfile_works = [True]


class FileSink(Protocol):
    """What sending a file range uses of its connection (`loglake.broker.connection.Connection`)."""

    @property
    def writer(self) -> asyncio.StreamWriter: ...
    @property
    def security(self) -> SecurityContext: ...
    @property
    def ctx(self) -> BrokerContext: ...
    def _write(self, data: bytes | bytearray | memoryview) -> None: ...


async def send_file_range(conn: FileSink, buf: FileRange) -> None:
    """Write `buf` to the connection, after what is queued."""
    await conn.writer.drain()
    loop = asyncio.get_running_loop()
    engine = conn.ctx.engine
    try:
        fh = await conn.ctx.off_loop(engine.open_file_range, buf)
        try:
            if conn.security.listener.tls or not _sendfile_works[0]:
                await _buffered(conn, fh.fileno(), buf)
            else:
                transport = conn.writer.transport
                try:
                    if transport.is_closing():  # closed while the file was opened off the loop
                        raise ConnectionResetError("connection closed")
                    await loop.sendfile(transport, fh, buf.position, buf.length)
                except NotImplementedError:
                    # uvloop has no loop.sendfile (it raises before sending a byte): copy through
                    # user space from now on, as on TLS.
                    _sendfile_works[0] = False
                    await _buffered(conn, fh.fileno(), buf)
                except RuntimeError as exc:  # after NotImplementedError, its subclass
                    # asyncio says a transport closed under sendfile with a RuntimeError
                    # ("Transport is closing"): it is the connection going, as a write would say.
                    if not transport.is_closing():
                        raise
                    raise ConnectionResetError("connection closed") from exc
        finally:
            fh.close()
    except OSError as exc:
        if exc.errno == errno.EIO:
            engine.report_file_range_failure(buf.path, exc)
        raise


async def _buffered(conn: FileSink, fd: int, buf: FileRange) -> None:
    """A file range through TLS: no sendfile (the kernel cannot encrypt), so read it in chunks
    off the event loop and write them."""
    off_loop = conn.ctx.off_loop
    position, left = buf.position, buf.length
    while left > 0:
        chunk = await off_loop(os.pread, fd, min(left, BUFFERED_SEND_BYTES), position)
        if not chunk:
            raise OSError(f"{buf.path}: ended {left} bytes before the range")
        conn._write(chunk)
        await conn.writer.drain()
        position += len(chunk)
        left -= len(chunk)
