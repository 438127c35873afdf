"""What every API handler gets: the engine, the group coordinator, the broker's identity."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from loglake.broker.config import BrokerConfig
from loglake.broker.metrics import Metrics
from loglake.engine import Engine

T = TypeVar("T")


@dataclass
class BrokerContext:
    engine: Engine
    config: BrokerConfig
    advertised_host: str
    advertised_port: int
    metrics: Metrics
    coordinator: Any = None  # loglake.broker.groups.GroupCoordinator, set by the server
    executor: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="loglake-io")
    )

    @property
    def node_id(self) -> int:
        return self.config.node_id

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking engine work (topic admin, waits for memory) off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
