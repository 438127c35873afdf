"""The broker's thread pool for blocking work, and the one way the event loop hands work to it.

Engine admin calls wait for a durable metadata record, a lookup by timestamp may read segments,
SASL derives keys, the users inbox reads files: none of that may run on the event loop. `OffLoop`
owns the pool (built before the `BrokerContext`, which carries it as `ctx.off_loop`); the server
shuts it down last.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar, TypeVarTuple

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

#: Threads of the pool: blocking calls the broker has in flight at once.
IO_THREADS = 8


class OffLoop:
    """`await off_loop(fn, *args)`: `fn(*args)` on the broker's I/O threads."""

    def __init__(self, threads: int = IO_THREADS) -> None:
        self.executor = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="loglake-io")

    async def __call__(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def shutdown(self) -> None:
        """Stop taking work; what runs finishes on its own (shutdown does not wait for it)."""
        self.executor.shutdown(wait=False)
