"""`LocalStore`: objects as plain files under a root folder, through the FileSystem seam.

`put` publishes crash-atomically: a temp file of its own, `<path>.<start ms>-<random>.tmp`, is
written and datasynced, renamed over `<path>`, and the directory is fsynced; so are the
directories above it the first time this store writes under them, so an acknowledged object never
hangs on a directory entry another process has not made durable yet. A crash leaves either no
object (maybe a stale `.tmp` file, which `list` ignores, `delete_stale_temps` removes when no
put runs, and `delete_abandoned_uploads` removes by its age while others write) or the whole
object.

Several processes may share one root, as cluster mode's brokers on one host share a folder
(docs/CLUSTER.md, "One host, every core"): they are given what an S3 bucket gives them.
Concurrent `put`s of one key each publish a whole object and the last rename wins (S3's
last-writer-wins PutObject); `put_if_absent` of one key by several writers publishes exactly
one of them (link(2) refuses an existing name, as S3's `If-None-Match: *` refuses an existing
key); a reader sees an object whole or not at all.
"""

from __future__ import annotations

import builtins
import errno
import os
import secrets
import threading
import time
from collections.abc import Sequence

from loglake.errors import StorageError
from loglake.fs.base import File, FileSystem
from loglake.store.base import (
    TEMP_SUFFIX,
    BytesLike,
    ObjectNotFoundError,
    ObjectStore,
    check_key,
    check_prefix,
    check_range,
)

#: errnos worth retrying later; everything else (ENOSPC, EIO, EROFS, EACCES, ...) is not.
_RETRIABLE_ERRNOS = frozenset({errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ETIMEDOUT, errno.ENOLCK})


def _storage_error(op: str, key: str, exc: OSError) -> StorageError:
    return StorageError(op, key, exc, retriable=exc.errno in _RETRIABLE_ERRNOS)


def _temp_started_ms(name: str) -> int | None:
    """The start time in a temp file name `<name>.<ms>-<hex>.tmp`, else None."""
    stamp = name[: -len(TEMP_SUFFIX)].rpartition(".")[2]
    ms, dash, token = stamp.partition("-")
    return int(ms) if dash and ms.isdigit() and ms.isascii() and token.isalnum() else None


class LocalStore(ObjectStore):
    def __init__(self, root: str, fs: FileSystem) -> None:
        self.root = os.path.abspath(root)
        self.url = "file://" + self.root
        self._fs = fs
        #: directories whose chain of entries up to the root this store has fsynced itself
        self._synced_dirs: set[str] = set()
        self._synced_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LocalStore({self.root!r})"

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *check_key(key).split("/"))

    # ---- writes ---------------------------------------------------------------------------

    def put(self, key: str, parts: Sequence[BytesLike]) -> None:
        self._publish("put", key, parts, replace=True)

    def put_if_absent(self, key: str, parts: Sequence[BytesLike]) -> bool:
        return self._publish("put_if_absent", key, parts, replace=False)

    def _publish(self, op: str, key: str, parts: Sequence[BytesLike], *, replace: bool) -> bool:
        path = self._path(key)
        # a temp name of its own: two writers of one key (two brokers on one folder) never
        # write into, remove or rename each other's temp file; its start time tells a crashed
        # writer's leftover from an upload under way (delete_abandoned_uploads)
        tmp = f"{path}.{int(time.time() * 1000)}-{secrets.token_hex(8)}{TEMP_SUFFIX}"
        try:
            self._make_dir(os.path.dirname(path))
            self._fs.write_file_atomic(path, parts, tmp=tmp, replace=replace)
        except FileExistsError:
            if replace:
                raise
            self._discard_temp(tmp)
            return False
        except OSError as exc:
            self._discard_temp(tmp)
            with self._synced_lock:  # made again next time, should the folder have gone
                self._synced_dirs.discard(os.path.dirname(path))
            raise _storage_error(op, key, exc) from exc
        return True

    def _make_dir(self, directory: str) -> None:
        """Create `directory` and make its entry and every one above it (up to the root)
        durable, once per store: makedirs fsyncs what it created, but a directory another
        process created a moment ago may not be durable yet."""
        if directory in self._synced_dirs:
            return
        self._fs.makedirs(directory)
        d = directory
        while d != self.root and d.startswith(self.root):
            self._fs.fsync_dir(os.path.dirname(d))
            d = os.path.dirname(d)
        with self._synced_lock:
            self._synced_dirs.add(directory)

    def _discard_temp(self, tmp: str) -> None:
        try:
            if self._fs.exists(tmp):
                self._fs.unlink(tmp)
        except OSError:
            pass  # best effort; delete_stale_temps cleans up later

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            self._fs.unlink(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise _storage_error("delete", key, exc) from exc
        try:
            self._fs.fsync_dir(os.path.dirname(path))
        except OSError as exc:
            raise _storage_error("delete", key, exc) from exc

    def delete_stale_temps(self, prefix: str = "") -> int:
        """Remove leftover `*.tmp` files of interrupted puts under `prefix`; returns how many.

        Only safe while no `put` is running on this root (it would remove its temp file).
        """
        removed = 0
        try:
            for path in self._walk(prefix, temps=True):
                self._fs.unlink(path)
                self._fs.fsync_dir(os.path.dirname(path))
                removed += 1
        except OSError as exc:
            raise _storage_error("delete_stale_temps", prefix, exc) from exc
        return removed

    def delete_abandoned_uploads(self, prefix: str, started_before_ms: int) -> int:
        """Remove temp files under `prefix` whose put started before `started_before_ms` (the
        time is in their name): a writer killed mid-put leaves one, as a crashed S3 upload
        leaves parts. Safe while other processes write under the root, given a bound longer than
        any put takes. Temp files without a start time (`<key>.tmp`, as older versions named them)
        are left to `delete_stale_temps`."""
        removed = 0
        try:
            for path in self._walk(prefix, temps=True):
                started = _temp_started_ms(os.path.basename(path))
                if started is None or started >= started_before_ms:
                    continue
                try:
                    self._fs.unlink(path)
                except FileNotFoundError:
                    continue  # another broker's sweep removed it first
                self._fs.fsync_dir(os.path.dirname(path))
                removed += 1
        except OSError as exc:
            raise _storage_error("delete_abandoned_uploads", prefix, exc) from exc
        return removed

    # ---- reads ----------------------------------------------------------------------------

    def _open(self, op: str, key: str) -> File:
        path = self._path(key)
        try:
            if self._fs.is_dir(path):
                raise ObjectNotFoundError(key, self.url)
            return self._fs.open(path)
        except FileNotFoundError:
            raise ObjectNotFoundError(key, self.url) from None
        except OSError as exc:
            raise _storage_error(op, key, exc) from exc

    def get(self, key: str) -> bytes:
        with self._open("get", key) as f:
            try:
                return f.pread(0, f.size())
            except OSError as exc:
                raise _storage_error("get", key, exc) from exc

    def get_range(self, key: str, start: int, length: int) -> bytes:
        check_range(start, length)
        with self._open("get_range", key) as f:
            try:
                return f.pread(start, length)
            except OSError as exc:
                raise _storage_error("get_range", key, exc) from exc

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        check_range(0, length)
        with self._open("get_tail", key) as f:
            try:
                size = f.size()
                start = max(0, size - length)
                return f.pread(start, size - start), size
            except OSError as exc:
                raise _storage_error("get_tail", key, exc) from exc

    def head(self, key: str) -> int | None:
        path = self._path(key)
        try:
            if self._fs.is_dir(path):
                return None
            return self._fs.file_size(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _storage_error("head", key, exc) from exc

    def list(self, prefix: str) -> builtins.list[str]:
        check_prefix(prefix)
        try:
            keys = [
                os.path.relpath(path, self.root).replace(os.sep, "/")
                for path in self._walk(prefix, temps=False)
            ]
        except OSError as exc:
            raise _storage_error("list", prefix, exc) from exc
        keys.sort()
        return keys

    def _walk(self, prefix: str, *, temps: bool) -> builtins.list[str]:
        """Paths of files under root whose key starts with `prefix`: objects, or only temps."""
        check_prefix(prefix)
        base, _, _ = prefix.rpartition("/")
        start_dir = os.path.join(self.root, *base.split("/")) if base else self.root
        out: builtins.list[str] = []
        stack = [(start_dir, base + "/" if base else "")]
        while stack:
            directory, key_prefix = stack.pop()
            try:
                names = self._fs.listdir(directory)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for name in names:
                key = key_prefix + name
                path = os.path.join(directory, name)
                if self._fs.is_dir(path):
                    sub = key + "/"
                    if sub.startswith(prefix) or prefix.startswith(sub):
                        stack.append((path, sub))
                elif key.startswith(prefix) and name.endswith(TEMP_SUFFIX) == temps:
                    out.append(path)
        return out

    def local_path(self, key: str) -> str | None:
        """The object's file path (not checked for existence: opening it tells)."""
        return self._path(key)
