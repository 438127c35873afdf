"""loglake: a Kafka-compatible, durable, append-only event log in Python.

`loglake.open(path)` embeds the engine; `loglake serve` runs it as a Kafka broker.

The names below are loaded on first use (PEP 562), so importing a submodule (the `loglake`
command's first lines, loglake.cli) does not first import the whole engine: the command can
take over Ctrl-C before its heavy imports (loglake/cli/early.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Read at import (two stdlib imports): a misspelt LOGLAKE_CANARIES stops `import loglake` at once,
# so a canary run cannot look clean (loglake.canary).
import loglake.canary  # noqa: F401

if TYPE_CHECKING:
    from loglake.engine.types import RecoveryReport, TopicInfo
    from loglake.errors import LoglakeError
    from loglake.log import ConsumerRecord, Log, RecordMetadata, TopicDescription, open

__version__ = "0.1.0"

#: Each public name -> the module that defines it.
_HOME = {
    "ConsumerRecord": "loglake.log",
    "Log": "loglake.log",
    "LoglakeError": "loglake.errors",
    "RecordMetadata": "loglake.log",
    "RecoveryReport": "loglake.engine.types",
    "TopicDescription": "loglake.log",
    "TopicInfo": "loglake.engine.types",
    "open": "loglake.log",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'loglake' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


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
