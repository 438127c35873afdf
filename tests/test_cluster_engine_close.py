"""A Fetch handled while a cluster broker closes gets a typed, retriable error, not a traceback.

SIGTERM shuts the cluster engine's read pool down while connections may still be answering
Fetches (seen in the random fault schedule as `cannot schedule new futures after shutdown` and a
traceback in the broker's log). The read must be refused as `EngineClosedError`, which the Fetch
handler answers with NOT_LEADER_OR_FOLLOWER so the client refreshes Metadata and goes elsewhere.
"""

from __future__ import annotations

import concurrent.futures

import pytest

from loglake.cluster.shared_log import SharedPartitionLog
from loglake.engine.partition import Partition
from loglake.errors import EngineClosedError
from loglake.kafka_errors import ErrorCode


class _Closing(SharedPartitionLog):
    def __init__(self) -> None:  # only the read pool: shut down, as SIGTERM leaves it
        self._reads = concurrent.futures.ThreadPoolExecutor(1)
        self._reads.shutdown()


def test_a_read_after_the_pool_shut_down_is_refused_with_a_typed_retriable_error() -> None:
    p = Partition("t", bytes.fromhex("ab" * 16), 0, 0, None)  # type: ignore[arg-type]
    with pytest.raises(EngineClosedError) as err:
        _Closing().read_async(p, 0, 1024, file_ranges=False, min_one=True)
    assert err.value.retriable and err.value.kafka_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert "t-0" in str(err.value)
