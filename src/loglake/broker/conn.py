"""What a handler may use of the connection its request came in on: the `Conn` protocol.

`loglake.broker.connection.Connection` implements it. It is defined apart from that module, below
the handlers: connection.py imports the handler registry, so the handlers (and the security seam
they call, loglake.broker.security) name a connection by this protocol.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from loglake.broker.security.sasl import SaslSession
from loglake.broker.security.tls import SecurityContext
from loglake.logsafe import RateLimitedLog

__all__ = ["Conn"]


class Conn(Protocol):
    #: Set once the connection is closing: a long poll answers at once.
    closing: bool
    #: Seconds to wait after the next response is written, then close (a refused SASL exchange).
    close_after_write: float | None
    #: Nothing is read or handled before this (time.monotonic): a quota's throttle (KIP-219).
    muted_until: float

    @property
    def peer(self) -> str:
        """The peer's address, ``host:port``."""

    @property
    def peer_host(self) -> str:
        """The peer without its port: what rate-limited warnings are keyed by."""

    @property
    def security(self) -> SecurityContext:
        """Listener, advertised endpoint and principal of the connection (ACLs and quotas key on it)."""

    @property
    def append_lock(self) -> asyncio.Lock:
        """Held while a Produce hands its batches to the engine: appends in arrival order."""

    @property
    def sasl(self) -> SaslSession | None:
        """The SASL state on a SASL listener, else None."""

    @property
    def limited(self) -> RateLimitedLog:
        """The broker's rate-limited log for what a client can repeat at will."""
