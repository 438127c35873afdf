"""A Fetch handled while a cluster broker closes gets a typed, retriable error, not a traceback.

SIGTERM shuts the cluster engine's read pool down while connections may still be answering
Fetches (seen in the random fault schedule as `cannot schedule new futures after shutdown` and a
traceback in the broker's log). The read must be refused as `EngineClosedError`, which the Fetch
handler answers with NOT_LEADER_OR_FOLLOWER so the client refreshes Metadata and goes elsewhere.
"""

from __future__ import annotations

import concurrent.futures

import pytest

from loglake.cluster.engine_read import ClusterReadsMixin
from loglake.errors import EngineClosedError
from loglake.kafka_errors import ErrorCode


class _Closing(ClusterReadsMixin):
    def __init__(self) -> None:
        self._reads = concurrent.futures.ThreadPoolExecutor(1)
        self._reads.shutdown()

    def _tid(self, topic: str, partition: int) -> str:
        return "ab" * 16


def test_a_read_after_the_pool_shut_down_is_refused_with_a_typed_retriable_error() -> None:
    with pytest.raises(EngineClosedError) as err:
        _Closing().read_async("t", 0, 0, 1024)
    assert err.value.retriable and err.value.kafka_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert "t-0" in str(err.value)
