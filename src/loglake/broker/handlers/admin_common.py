"""What the admin handlers share: the Kafka error codes they answer with beyond `errors.py`
(re-exported from `loglake.kafka_errors`), a typed early-exit error, and a helper that runs
(blocking) engine admin calls off the loop."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Hashable
from typing import ParamSpec, TypeVar

from loglake.broker.context import BrokerContext
from loglake.broker.handlers.errors import UNKNOWN_SERVER_ERROR, error_code
from loglake.errors import LoglakeError
from loglake.kafka_errors import ErrorCode

log = logging.getLogger("loglake.broker.admin")

T = TypeVar("T")
P = ParamSpec("P")
H = TypeVar("H", bound=Hashable)

TOPIC_ALREADY_EXISTS: int = ErrorCode.TOPIC_ALREADY_EXISTS
INVALID_PARTITIONS: int = ErrorCode.INVALID_PARTITIONS
INVALID_REPLICATION_FACTOR: int = ErrorCode.INVALID_REPLICATION_FACTOR
INVALID_REPLICA_ASSIGNMENT: int = ErrorCode.INVALID_REPLICA_ASSIGNMENT
INVALID_CONFIG: int = ErrorCode.INVALID_CONFIG
MISMATCHED_ENDPOINT_TYPE: int = ErrorCode.MISMATCHED_ENDPOINT_TYPE

#: ConfigResource types (org.apache.kafka.common.config.ConfigResource.Type).
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
RESOURCE_BROKER_LOGGER = 8
RESOURCE_GROUP = 32


class AdminError(Exception):
    """A request-level problem found before asking the engine: answered as (code, message)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def failure(exc: Exception, what: str) -> tuple[int, str]:
    """(error code, message) for an exception raised by validation or the engine.

    Unexpected exceptions (bugs) are logged with their traceback and answered with
    UNKNOWN_SERVER_ERROR for this one topic or resource; the rest of the request goes on.
    """
    if isinstance(exc, AdminError):
        return exc.code, exc.message
    if isinstance(exc, LoglakeError):
        return error_code(exc), str(exc)
    log.exception("%s failed", what)
    return UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}"


async def engine_call(ctx: BrokerContext, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a blocking engine call (topic admin waits for a durable metadata record) on the executor."""
    return await ctx.off_loop(functools.partial(fn, *args, **kwargs))


class _LoopLock:
    """One asyncio.Lock per running event loop (tests may run several loops in one process)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None

    def get(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._loop is not loop:
            self._loop, self._lock = loop, asyncio.Lock()
        return self._lock


#: Serializes read-modify-write of topic configs (IncrementalAlterConfigs merges on the current set).
CONFIG_ALTER_LOCK = _LoopLock()


def duplicates(names: list[H]) -> set[H]:
    seen: set[H] = set()
    dup: set[H] = set()
    for name in names:
        (dup if name in seen else seen).add(name)
    return dup
