"""A real `BrokerContext` for tests that call handlers directly, and a connection to call them on.

`broker_context(engine, data_dir)` builds the context the broker builds at start-up
(`loglake.broker.context.build_context`) over an open engine, without listeners or sockets, and
closes what it started afterwards. `HandlerConn` is what a handler (`loglake.broker.conn.Conn`)
and a SASL session (`loglake.broker.security.sasl.SaslConn`) use of a connection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from loglake.broker.config import BrokerConfig
from loglake.broker.context import BrokerContext, build_context
from loglake.broker.groups import MetaGroupLog, MetaGroupStore
from loglake.broker.listeners import PLAINTEXT, Listener
from loglake.broker.metrics import Metrics
from loglake.broker.off_loop import OffLoop
from loglake.broker.protocol import FrameDecoder
from loglake.broker.security.sasl import SaslSession
from loglake.broker.security.tls import SecurityContext
from loglake.engine import Engine
from loglake.logsafe import RateLimitedLog

T = TypeVar("T")

HOST, PORT = "127.0.0.1", 9092


@contextlib.asynccontextmanager
async def broker_context(engine: Engine, data_dir: str, config: BrokerConfig | None = None) -> AsyncIterator[BrokerContext]:
    """The context of a broker over `engine` (open) advertising HOST:PORT; `data_dir` is a real
    directory (the SASL secret is written there). Its coordinators are closed on the way out."""
    config = config or BrokerConfig(data_dir=data_dir)
    ctx = await build_context(
        config,
        engine,
        Metrics(),
        [(Listener(PLAINTEXT, HOST, PORT), (HOST, PORT))],
        off_loop=OffLoop(2),
        group_stores=lambda _on_lost: MetaGroupStore(MetaGroupLog(engine.meta)),
    )
    try:
        yield ctx
    finally:
        ctx.txn.close()
        ctx.groups.close()
        ctx.off_loop.shutdown()


async def _hop(fn: Callable[..., T], *args: Any) -> T:
    """Off the loop as far as ordering goes (one hop, as the real one to a thread is), on it in fact."""
    await asyncio.sleep(0)
    return fn(*args)


@dataclass
class HandlerConn:
    """A client connection without a socket: what handlers and a SASL session read and set."""

    peer: str = f"{HOST}:40000"
    security: SecurityContext = field(default_factory=lambda: SecurityContext.plaintext(HOST, PORT))
    closing: bool = False
    close_after_write: float | None = None
    muted_until: float = 0.0
    sasl: SaslSession | None = None
    max_frame_bytes: int = 1 << 20
    off_loop: Callable[..., Awaitable[Any]] = _hop
    limited: RateLimitedLog = field(default_factory=lambda: RateLimitedLog(logging.getLogger("ctxkit")))
    protocol_errors: collections.Counter[str] = field(default_factory=collections.Counter)
    append_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    decoder: FrameDecoder = field(default_factory=lambda: FrameDecoder(1 << 20))

    @property
    def peer_host(self) -> str:
        return self.peer.rsplit(":", 1)[0]

    def start_sasl(self) -> SaslSession:
        """Give the connection a SASL session, as a SASL listener does (needs a running loop)."""
        self.sasl = SaslSession(self)
        return self.sasl

    def _close_transport(self) -> None:
        self.closing = True
