"""Object stores for sealed segments: `ObjectStore` and its backends, and `open_store(url)`."""

from __future__ import annotations

import importlib
import os
import re
import threading
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

from loglake.errors import ConfigError
from loglake.extras import MissingExtraError, missing_extra
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
from loglake.store.s3_url import parse_s3_url

__all__ = [
    "STORE_URL_FORMS",
    "InvalidObjectKeyError",
    "LocalStore",
    "MemoryStore",
    "ObjectNotFoundError",
    "ObjectStore",
    "SegmentKey",
    "accepted_store_urls",
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


#: The store URLs a user may give (--cold-store and the like), in the order errors and help
#: texts list them: the one list of them (the S3 backend registers "s3" on first use). A string
#: without "scheme:" is a plain directory path. Schemes registered otherwise (the tests'
#: in-process "memory://name") are served but not advertised.
STORE_URL_FORMS: dict[str, str] = {
    "file": "file:///abs/path",
    "s3": "s3://bucket[/prefix][?option=value&...]",
}

#: "scheme:" at the start of a string: it is meant as a URL, never as a directory path.
_SCHEME_PREFIX = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def accepted_store_urls() -> str:
    """The accepted store URLs, as errors and help texts name them."""
    return ", ".join(STORE_URL_FORMS.values()) + " or a plain directory path"


def _check_url(url: str) -> str:
    """The scheme of `url` (lower case), or "" for a plain path; a ConfigError for a string that
    looks like a URL but is not a well-formed one (`s3:/bucket`, `file:/tmp/x`): such a string
    would otherwise name a local directory called `s3:`."""
    if not url:
        raise ConfigError("store URL is empty")
    scheme, sep, _ = url.partition("://")
    if sep:
        scheme = scheme.lower()
        if scheme not in STORE_URL_FORMS and scheme not in _schemes:
            raise ConfigError(f"store URL {url!r}: unknown scheme {scheme + '://'!r}; expected {accepted_store_urls()}")
        return scheme
    found = _SCHEME_PREFIX.match(url)
    if found is None:
        return ""
    scheme = found.group(1).lower()
    path = url[found.end() :].lstrip("/")
    meant = f"{scheme}://{'/' if scheme == 'file' else ''}{path}"
    guess = f" (did you mean {meant!r}?)" if scheme in STORE_URL_FORMS else ""
    raise ConfigError(f"store URL {url!r} is not a well-formed URL{guess}: expected {accepted_store_urls()}")


def open_store(url: str, fs: FileSystem) -> ObjectStore:
    """The store at `url`: "file:///abs/path" or a plain path -> LocalStore, "memory://name" ->
    the process-wide MemoryStore of that name, "s3://bucket/prefix?..." -> S3Store; other schemes
    when registered (register_scheme). Anything else (an unknown scheme, `s3:/bucket`) is a
    ConfigError naming the accepted forms (STORE_URL_FORMS)."""
    scheme = _check_url(url)
    if not scheme:
        return LocalStore(os.path.abspath(url), fs)
    if scheme == "s3" and "s3" not in _schemes:
        parse_s3_url(url)  # a malformed s3 URL is told as such, whether or not boto3 is installed
        try:  # the S3 backend registers itself on import; boto3 is only needed for it
            importlib.import_module("loglake.store.s3").register()
        except ImportError as exc:
            raise (missing_extra(exc, f"store URL {url!r}") or MissingExtraError(f"store URL {url!r}", "boto3")) from None
    with _schemes_lock:
        factory = _schemes.get(scheme)
    if factory is None:  # pragma: no cover - every STORE_URL_FORMS scheme is registered above
        raise ConfigError(f"store URL {url!r}: unknown scheme {scheme!r}; expected {accepted_store_urls()}")
    return factory(url, fs)
