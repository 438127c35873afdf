"""The names the broker gives kafka-python's objects in its signatures.

kafka-python ships no type information, so its schema-generated message classes, the structs
nested in them and its schema fields have no type mypy can check, and neither has any value read
from them. These aliases say which of those a signature holds.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KafkaClass", "KafkaField", "KafkaStruct"]

# Each alias is Any: forced by the untyped third-party library, the broker's only such Any.

#: A request or response object of kafka-python's message classes, or a struct nested in one
#: (``body.topics[0].partitions[0]``): every request body but Produce's.
KafkaStruct = Any
#: One of those classes (``MetadataRequest``; ``MetadataResponse[12]``, bound to a version).
KafkaClass = Any
#: A field of a kafka-python schema (``kafka.protocol.schemas.fields``), or a struct's schema.
KafkaField = Any
