"""Filesystem seam: `FileSystem` / `File` and the real `OsFileSystem`."""

from loglake.fs.base import BytesLike, File, FileLock, FileSystem
from loglake.fs.os_fs import OsFileSystem

__all__ = ["BytesLike", "File", "FileLock", "FileSystem", "OsFileSystem"]
