"""Sending a Fetch response's file ranges (hot segment data) on a client connection.

On PLAINTEXT the kernel copies the range from the page cache to the socket (`loop.sendfile`);
TLS has to encrypt in user space, so there the range is read in `BUFFERED_SEND_BYTES` chunks off
the event loop and written (docs/SECURITY.md, "What TLS costs"). An I/O error reading the
segment (not the socket) is reported to the engine, which makes the next fetch of that segment
an error instead of a silent reconnect loop; the response is cut, so the connection goes.
"""

from __future__ import annotations

import asyncio
import errno
import os
from typing import Any

#: Bytes read from a file per write when sendfile cannot be used (TLS, or an event loop without it).
BUFFERED_SEND_BYTES = 1024 * 1024
#: Whether the running event loop implements `loop.sendfile` (uvloop does not); learnt on first use.
_sendfile_works = [True]


async def send_file_range(conn: Any, buf: Any) -> None:
    """Write `buf` (a FileRange: path, position, length) to the connection, after what is queued."""
    await conn.writer.drain()
    try:
        if conn.security.listener.tls or not _sendfile_works[0]:
            await _buffered(conn, buf)
        else:
            try:
                with open(buf.path, "rb") as fh:
                    await asyncio.get_running_loop().sendfile(conn.writer.transport, fh, buf.position, buf.length)
            except NotImplementedError:
                # uvloop has no loop.sendfile (it raises before sending a byte): copy through
                # user space from now on, as on TLS.
                _sendfile_works[0] = False
                await _buffered(conn, buf)
    except OSError as exc:
        engine = conn.server.engine
        if exc.errno == errno.EIO and engine is not None:
            engine.report_file_range_failure(buf.path, exc)
        raise


async def _buffered(conn: Any, buf: Any) -> None:
    """A file range through TLS: no sendfile (the kernel cannot encrypt), so read it in chunks
    off the event loop and write them."""
    loop = asyncio.get_running_loop()
    executor = conn.ctx.executor
    fd = await loop.run_in_executor(executor, os.open, buf.path, os.O_RDONLY)
    try:
        position, left = buf.position, buf.length
        while left > 0:
            chunk = await loop.run_in_executor(
                executor, os.pread, fd, min(left, BUFFERED_SEND_BYTES), position
            )
            if not chunk:
                raise OSError(f"{buf.path}: ended {left} bytes before the range")
            conn._write(chunk)
            await conn.writer.drain()
            position += len(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
