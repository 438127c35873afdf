"""The data directory's layout: one place that names every path in it (docs/FORMAT.md).

    <data-dir>/
      .loglake.lock          the data-directory lock (meta/lock.py)
      meta/                  the metadata log and checkpoints (meta/log.py)
      wal/shard-NN/          WAL files (wal/)
      segments/              the hot segment store (a folder store; segment keys below it)
"""

from __future__ import annotations

import posixpath

from loglake.meta.lock import LOCK_FILE_NAME

__all__ = ["LOCK_FILE_NAME", "META_DIR", "SEGMENTS_DIR", "WAL_DIR", "meta_dir", "segments_dir", "wal_dir"]

META_DIR = "meta"
WAL_DIR = "wal"
SEGMENTS_DIR = "segments"


def meta_dir(data_dir: str) -> str:
    return posixpath.join(data_dir, META_DIR)


def wal_dir(data_dir: str) -> str:
    return posixpath.join(data_dir, WAL_DIR)


def segments_dir(data_dir: str) -> str:
    return posixpath.join(data_dir, SEGMENTS_DIR)
