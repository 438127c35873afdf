"""The object store seam: a narrow, backend-neutral interface for sealed segment objects.

Callers never know which backend they hold (a local folder, process memory, S3 later).
Objects are immutable once published: `put` makes a whole object visible atomically, there is
no append and no partial overwrite.

Keys are '/'-separated relative paths made of non-empty parts. `.` and `..` parts, a leading
'/', backslashes, NUL bytes and a last part ending in `.tmp` (reserved for in-flight uploads of
`LocalStore`) are rejected with `InvalidObjectKeyError`, by every backend alike.
"""

from __future__ import annotations

import abc
import builtins
from collections.abc import Sequence
from typing import NamedTuple

from loglake.errors import LoglakeError
from loglake.kafka_errors import ErrorCode

BytesLike = bytes | bytearray | memoryview

#: Suffix of in-flight uploads in stores that publish by rename; never part of a valid key.
TEMP_SUFFIX = ".tmp"
SEGMENT_SUFFIX = ".seg"
#: Width of the zero-padded base offset in segment keys, so keys sort in offset order.
OFFSET_DIGITS = 20


class ObjectNotFoundError(LoglakeError):
    """The object does not exist (never written, or deleted)."""

    kafka_code = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, key: str, store_url: str = "") -> None:
        where = f" in {store_url}" if store_url else ""
        super().__init__(f"object {key!r} not found{where}")
        self.key = key


class InvalidObjectKeyError(LoglakeError, ValueError):
    """An object key breaks the key rules (see the module docstring). Also a ValueError."""

    kafka_code = ErrorCode.UNKNOWN_SERVER_ERROR


def check_key(key: str) -> str:
    """Return `key` if it is a valid object key, else raise InvalidObjectKeyError."""
    if not isinstance(key, str) or not key:
        raise InvalidObjectKeyError(f"object key must be a non-empty string, got {key!r}")
    if "\\" in key or "\x00" in key:
        raise InvalidObjectKeyError(f"object key {key!r} contains a backslash or NUL")
    if key.startswith("/"):
        raise InvalidObjectKeyError(f"object key {key!r} is absolute")
    parts = key.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise InvalidObjectKeyError(f"object key {key!r} has an empty, '.' or '..' part")
    if parts[-1].endswith(TEMP_SUFFIX):
        raise InvalidObjectKeyError(f"object key {key!r} ends with the reserved suffix {TEMP_SUFFIX!r}")
    return key


def check_prefix(prefix: str) -> str:
    """Validate a list prefix: like a key, but may be empty, end with '/' or end mid-part."""
    if not isinstance(prefix, str):
        raise InvalidObjectKeyError(f"prefix must be a string, got {prefix!r}")
    if not prefix:
        return prefix
    if "\\" in prefix or "\x00" in prefix or prefix.startswith("/"):
        raise InvalidObjectKeyError(f"prefix {prefix!r} is absolute or contains a backslash or NUL")
    parts = prefix.split("/")
    for part in parts[:-1]:
        if part in ("", ".", ".."):
            raise InvalidObjectKeyError(f"prefix {prefix!r} has an empty, '.' or '..' part")
    if parts[-1] in (".", ".."):
        raise InvalidObjectKeyError(f"prefix {prefix!r} ends with a '.' or '..' part")
    return prefix


def check_range(start: int, length: int) -> None:
    if start < 0 or length < 0:
        raise ValueError(f"invalid byte range start={start} length={length}")


class ObjectStore(abc.ABC):
    """An immutable-object store. Implementations are thread-safe."""

    url: str

    @abc.abstractmethod
    def put(self, key: str, parts: Sequence[BytesLike]) -> None:
        """Publish `parts` (concatenated) as object `key`, atomically: readers see the whole
        object or none of it (an existing object is replaced whole). Durable on return."""

    def put_if_absent(self, key: str, parts: Sequence[BytesLike]) -> bool:
        """Publish `parts` as object `key` only if no object `key` exists: True when this call
        published it, False when one was there (this call then wrote nothing). Atomic, durable
        on return. Of several writers racing for one key, exactly one gets True in the backends
        that override this (the local folder, memory); the default is a HEAD then a `put`, which
        two writers can both pass."""
        if self.head(key) is not None:
            return False
        self.put(key, parts)
        return True

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The whole object. Missing: ObjectNotFoundError."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """`length` bytes from `start`; fewer only at the end of the object (b"" when `start`
        is at or past the end). Missing: ObjectNotFoundError."""

    @abc.abstractmethod
    def head(self, key: str) -> int | None:
        """Object size in bytes, or None when it does not exist."""

    @abc.abstractmethod
    def list(self, prefix: str) -> builtins.list[str]:
        """Keys that start with `prefix` (plain string prefix), sorted."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; no error when it does not exist."""

    def local_path(self, key: str) -> str | None:
        """A filesystem path holding the object as a plain file (for sendfile), else None."""
        return None

    def delete_abandoned_uploads(self, prefix: str, started_before_ms: int) -> int:
        """Remove what writers under `prefix` left of uploads they started before
        `started_before_ms` (wall clock) and never finished — they crashed — and return how
        many. The default has nothing to remove: an S3 PUT that never completed leaves no object
        (incomplete multipart uploads are a bucket lifecycle rule's to expire)."""
        check_prefix(prefix)
        return 0

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        """The last `length` bytes (all of it if shorter) and the object size.

        Backends that can do it in one request (S3 suffix ranges, a local fstat+pread)
        override this; the default is head + get_range.
        """
        if length < 0:
            raise ValueError(f"invalid tail length {length}")
        size = self.head(key)
        if size is None:
            raise ObjectNotFoundError(key, self.url)
        start = max(0, size - length)
        return self.get_range(key, start, size - start), size

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (connections, pools). The default has none."""

    def __enter__(self) -> ObjectStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- segment keys ------------------------------------------------------------------------------


class SegmentKey(NamedTuple):
    topic: str
    topic_id: str
    partition: int
    base_offset: int
    #: 0 for a segment as sealed; n > 0 for the n-th rewrite (compaction, merging) at this base
    generation: int = 0


#: Separates the base offset from a rewrite generation in a segment file name.
GENERATION_MARK = "-g"


def _check_name(what: str, value: str, *, allow_dash: bool = True) -> None:
    if not value or "/" in value or "\\" in value or "\x00" in value or value in (".", ".."):
        raise InvalidObjectKeyError(f"{what} {value!r} cannot be used in an object key")
    if not allow_dash and "-" in value:
        raise InvalidObjectKeyError(f"{what} {value!r} must not contain '-' (use e.g. uuid.hex)")


def _join_prefix(prefix: str, rest: str) -> str:
    prefix = prefix.strip("/")
    if prefix:
        check_prefix(prefix + "/")
        return f"{prefix}/{rest}"
    return rest


def cluster_prefix(cluster_id: str, prefix: str = "") -> str:
    """`<prefix>/loglake-<cluster_id>/`: every object of one cluster."""
    _check_name("cluster id", cluster_id)
    return _join_prefix(prefix, f"loglake-{cluster_id}/")


def topic_prefix(cluster_id: str, topic: str, topic_id: str, prefix: str = "") -> str:
    """`<prefix>/loglake-<cluster_id>/<topic>-<topic_id>/`: every segment of one topic."""
    _check_name("topic", topic)
    _check_name("topic id", topic_id, allow_dash=False)
    return cluster_prefix(cluster_id, prefix) + f"{topic}-{topic_id}/"


def partition_prefix(cluster_id: str, topic: str, topic_id: str, partition: int, prefix: str = "") -> str:
    """`<prefix>/loglake-<cluster_id>/<topic>-<topic_id>/<partition>/`, ends with '/'."""
    if partition < 0:
        raise InvalidObjectKeyError(f"partition {partition} is negative")
    return topic_prefix(cluster_id, topic, topic_id, prefix) + f"{partition}/"


def segment_key(
    cluster_id: str, topic: str, topic_id: str, partition: int, base_offset: int, prefix: str = "", generation: int = 0
) -> str:
    """`<prefix>/loglake-<cluster_id>/<topic>-<topic_id>/<partition>/<base offset, 20 digits>.seg`.

    A rewritten segment (generation n > 0) is `<base offset>-g<n>.seg`, so the new object never
    overwrites the one it replaces. No leading '/' when `prefix` is empty. `topic_id` must not
    contain '-' (the last '-' of the topic directory separates it from the topic name, which
    may contain '-').
    """
    if base_offset < 0:
        raise InvalidObjectKeyError(f"base offset {base_offset} is negative")
    return partition_prefix(cluster_id, topic, topic_id, partition, prefix) + segment_file_name(base_offset, generation)


def segment_file_name(base_offset: int, generation: int = 0) -> str:
    if generation < 0:
        raise InvalidObjectKeyError(f"segment generation {generation} is negative")
    gen = f"{GENERATION_MARK}{generation}" if generation else ""
    return f"{base_offset:0{OFFSET_DIGITS}d}{gen}{SEGMENT_SUFFIX}"


def parse_segment_key(key: str) -> SegmentKey:
    """Inverse of `segment_key` (the prefix and cluster id are not returned)."""
    parts = key.split("/")
    if len(parts) < 4:
        raise InvalidObjectKeyError(f"{key!r} is not a segment key")
    cluster_dir, topic_dir, partition_s, name = parts[-4:]
    if not cluster_dir.startswith("loglake-") or len(cluster_dir) <= len("loglake-"):
        raise InvalidObjectKeyError(f"{key!r} is not a segment key (no loglake-<cluster> part)")
    topic, dash, topic_id = topic_dir.rpartition("-")
    if not dash or not topic or not topic_id:
        raise InvalidObjectKeyError(f"{key!r} is not a segment key (bad <topic>-<topic_id> part)")
    if not partition_s.isdigit() or not partition_s.isascii() or str(int(partition_s)) != partition_s:
        raise InvalidObjectKeyError(f"{key!r} is not a segment key (bad partition {partition_s!r})")
    stem = name[: -len(SEGMENT_SUFFIX)] if name.endswith(SEGMENT_SUFFIX) else ""
    stem, mark, gen_s = stem.partition(GENERATION_MARK)
    generation = int(gen_s) if mark and gen_s.isdigit() and gen_s.isascii() and str(int(gen_s)) == gen_s else 0
    if len(stem) != OFFSET_DIGITS or not stem.isdigit() or not stem.isascii() or (mark and generation <= 0):
        raise InvalidObjectKeyError(f"{key!r} is not a segment key (bad file name {name!r})")
    return SegmentKey(topic, topic_id, int(partition_s), int(stem), generation)
