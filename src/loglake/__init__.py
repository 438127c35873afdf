"""loglake: a Kafka-compatible, durable, append-only event log in Python.

`loglake.open(path)` embeds the engine; `loglake serve` runs it as a Kafka broker.
"""

from loglake.engine.types import RecoveryReport, TopicInfo
from loglake.errors import LoglakeError
from loglake.log import ConsumerRecord, Log, RecordMetadata, TopicDescription, open

__version__ = "0.1.0"

__all__ = [
    "ConsumerRecord",
    "Log",
    "LoglakeError",
    "RecordMetadata",
    "RecoveryReport",
    "TopicDescription",
    "TopicInfo",
    "__version__",
    "open",
]
