"""The storage engine: partitions over a sharded WAL, sealed segments in a store, recovery."""

from loglake.engine.config import TOPIC_CONFIG_NAMES, EngineConfig, TopicConfig, validate_topic_name
from loglake.engine.engine import Engine, open_engine
from loglake.engine.partition import SegmentRef
from loglake.engine.types import (
    AppendResult,
    FileRange,
    PartitionInfo,
    ReadResult,
    RecoveryReport,
    TopicInfo,
)

__all__ = [
    "TOPIC_CONFIG_NAMES",
    "AppendResult",
    "Engine",
    "EngineConfig",
    "FileRange",
    "PartitionInfo",
    "ReadResult",
    "RecoveryReport",
    "SegmentRef",
    "TopicConfig",
    "TopicInfo",
    "open_engine",
    "validate_topic_name",
]
