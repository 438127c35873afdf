"""Metadata: checksummed snapshots and the data-directory lock."""

from loglake.meta.lock import LOCK_FILE_NAME, DataDirLock
from loglake.meta.snapshot import MAX_PAYLOAD_BYTES, SnapshotStore

__all__ = ["LOCK_FILE_NAME", "MAX_PAYLOAD_BYTES", "DataDirLock", "SnapshotStore"]
