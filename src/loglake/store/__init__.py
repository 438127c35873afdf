"""Object stores for sealed segments: `ObjectStore` and its backends, and `open_store(url)`."""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

from loglake.errors import ConfigError
from loglake.fs.base import FileSystem
from loglake.store.base import (
    InvalidObjectKeyError,
    ObjectNotFoundError,
    ObjectStore,
    SegmentKey,
    check_key,
    cluster_prefix,
    parse_segment_key,
    partition_prefix,
    segment_key,
    topic_prefix,
)
from loglake.store.local import LocalStore
from loglake.store.memory import MemoryStore, drop_memory_store, named_memory_store

__all__ = [
    "InvalidObjectKeyError",
    "LocalStore",
    "MemoryStore",
    "ObjectNotFoundError",
    "ObjectStore",
    "SegmentKey",
    "check_key",
    "cluster_prefix",
    "drop_memory_store",
    "named_memory_store",
    "open_store",
    "parse_segment_key",
    "partition_prefix",
    "register_scheme",
    "segment_key",
    "topic_prefix",
]

StoreFactory = Callable[[str, FileSystem], ObjectStore]

_schemes: dict[str, StoreFactory] = {}
_schemes_lock = threading.Lock()


def register_scheme(scheme: str, factory: StoreFactory) -> None:
    """Let another module (e.g. the S3 backend) serve `<scheme>://...` URLs in open_store."""
    with _schemes_lock:
        _schemes[scheme.lower()] = factory


def _open_file(url: str, fs: FileSystem) -> ObjectStore:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise ConfigError(f"store URL {url!r}: file URLs need an absolute path (file:///abs/path)")
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise ConfigError(f"store URL {url!r}: file URLs need an absolute path (file:///abs/path)")
    return LocalStore(path, fs)


def _open_memory(url: str, fs: FileSystem) -> ObjectStore:
    name = url.split("://", 1)[1]
    if not name or "/" in name:
        raise ConfigError(f"store URL {url!r}: expected memory://<name>")
    return named_memory_store(name)


register_scheme("file", _open_file)
register_scheme("memory", _open_memory)


def open_store(url: str, fs: FileSystem) -> ObjectStore:
    """The store at `url`: "file:///abs/path" or a plain path -> LocalStore, "memory://name" ->
    the process-wide MemoryStore of that name; other schemes when registered (register_scheme)."""
    if not url:
        raise ConfigError("store URL is empty")
    if "://" not in url:
        return LocalStore(os.path.abspath(url), fs)
    scheme = url.split("://", 1)[0].lower()
    if scheme == "s3" and "s3" not in _schemes:
        try:  # the S3 backend registers itself on import; boto3 is only needed for it
            importlib.import_module("loglake.store.s3").register()
        except ImportError as exc:
            raise ConfigError(f"store URL {url!r} needs boto3 ({exc}); install loglake[s3]") from None
    with _schemes_lock:
        factory = _schemes.get(scheme)
        known = sorted(_schemes)
    if factory is None:
        raise ConfigError(
            f"store URL {url!r}: unknown scheme {scheme!r}; supported: "
            + ", ".join(f"{s}://" for s in known)
            + " or a plain directory path"
        )
    return factory(url, fs)
