"""Metadata: the change records and state, the local metadata log with checkpoints, its copy in
the object stores, and the data-directory lock."""

from loglake.meta.lock import LOCK_FILE_NAME, DataDirLock
from loglake.meta.log import LocalMetaStore
from loglake.meta.segments import SegmentRef, SegmentTable
from loglake.meta.snapshot import MAX_PAYLOAD_BYTES, SnapshotStore
from loglake.meta.state import MetaState
from loglake.meta.store import MetaStore

__all__ = [
    "LOCK_FILE_NAME",
    "MAX_PAYLOAD_BYTES",
    "DataDirLock",
    "LocalMetaStore",
    "MetaState",
    "MetaStore",
    "SegmentRef",
    "SegmentTable",
    "SnapshotStore",
]
