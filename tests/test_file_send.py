"""Sending a Fetch response's file range when the client has gone.

A client that closes its connection while the broker opens the segment file off the event loop
used to meet asyncio's `RuntimeError("Transport is closing")` from `loop.sendfile`, which the
connection's write loop did not take for a lost connection: a traceback in the broker's log
(seen in CI, test_spark_hybrid). It is a `ConnectionError` now, as every other write to a closed
connection is, and the file is closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import BinaryIO, TypeVar

import pytest

from loglake.broker.file_send import send_file_range
from loglake.engine import Engine
from loglake.engine.types import FileRange

from enginekit import small_config

T = TypeVar("T")


def test_a_connection_closed_while_the_file_opens_is_a_connection_error(tmp_path: Path) -> None:
    engine = Engine(str(tmp_path / "data"), small_config(wal_shards=1), start_background=False)
    engine.open()
    opened: list[BinaryIO] = []
    try:
        engine.create_topic("t", 1)
        engine.append_records("t", 0, [(None, None, b"x" * 100, [])]).result(timeout=30)
        engine.flush()
        chunks = engine.read("t", 0, 0, 1 << 20, file_ranges=True).chunks
        ranges = [c for c in chunks if isinstance(c, FileRange)]
        assert ranges, "a sealed segment is read as a file range"

        async def run() -> None:
            server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)

            async def off_loop(fn: Callable[..., T], *args: object) -> T:
                result = fn(*args)
                opened.append(result)  # type: ignore[arg-type]  # the only call: open_file_range
                writer.transport.close()  # the client goes while the file is opened
                return result

            conn = SimpleNamespace(
                writer=writer,
                security=SimpleNamespace(listener=SimpleNamespace(tls=False)),
                ctx=SimpleNamespace(engine=engine, off_loop=off_loop),
                _write=writer.write,
            )
            try:
                with pytest.raises(ConnectionError):
                    await send_file_range(conn, ranges[0])
            finally:
                server.close()
                await server.wait_closed()

        asyncio.run(run())
        assert opened and all(fh.closed for fh in opened), "the segment file is closed after the failed send"
    finally:
        engine.close()
