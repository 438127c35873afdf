"""`MemoryStore`: a dict-backed object store for tests, with call counting and fault injection."""

from __future__ import annotations

import builtins
import collections
import threading
from collections.abc import Sequence

from loglake.store.base import (
    BytesLike,
    ObjectNotFoundError,
    ObjectStore,
    check_key,
    check_prefix,
    check_range,
)


class MemoryStore(ObjectStore):
    """Objects in a dict. Thread-safe.

    `calls` counts every public call by operation name ("put", "put_if_absent", "get", "get_range", "head",
    "list", "delete"), so tests can assert how many requests a reader makes.
    `fail(op, error, times)` makes the next `times` calls of `op` raise `error` (before doing
    anything), to test retry paths.
    """

    def __init__(self, name: str = "default") -> None:
        self.name = name
        self.url = f"memory://{name}"
        self.calls: collections.Counter[str] = collections.Counter()
        self._objects: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._faults: dict[str, builtins.list[tuple[BaseException, int]]] = {}

    def __repr__(self) -> str:
        return f"MemoryStore({self.name!r})"

    def fail(self, op: str, error: BaseException, times: int = 1) -> None:
        with self._lock:
            self._faults.setdefault(op, []).append((error, times))

    def _enter(self, op: str) -> None:
        """Count the call and raise an injected fault; caller holds the lock."""
        self.calls[op] += 1
        queue = self._faults.get(op)
        if queue:
            error, times = queue[0]
            if times <= 1:
                queue.pop(0)
            else:
                queue[0] = (error, times - 1)
            raise error

    def put(self, key: str, parts: Sequence[BytesLike]) -> None:
        check_key(key)
        data = b"".join(parts)  # built before taking the lock: readers never see a partial object
        with self._lock:
            self._enter("put")
            self._objects[key] = data

    def put_if_absent(self, key: str, parts: Sequence[BytesLike]) -> bool:
        check_key(key)
        data = b"".join(parts)
        with self._lock:
            self._enter("put_if_absent")
            if key in self._objects:
                return False
            self._objects[key] = data
            return True

    def get(self, key: str) -> bytes:
        check_key(key)
        with self._lock:
            self._enter("get")
            data = self._objects.get(key)
        if data is None:
            raise ObjectNotFoundError(key, self.url)
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        check_key(key)
        check_range(start, length)
        with self._lock:
            self._enter("get_range")
            data = self._objects.get(key)
        if data is None:
            raise ObjectNotFoundError(key, self.url)
        return data[start : start + length]

    def head(self, key: str) -> int | None:
        check_key(key)
        with self._lock:
            self._enter("head")
            data = self._objects.get(key)
        return None if data is None else len(data)

    def list(self, prefix: str) -> builtins.list[str]:
        check_prefix(prefix)
        with self._lock:
            self._enter("list")
            return sorted(k for k in self._objects if k.startswith(prefix))

    def delete(self, key: str) -> None:
        check_key(key)
        with self._lock:
            self._enter("delete")
            self._objects.pop(key, None)

    # ---- test helpers (not part of ObjectStore) -------------------------------------------

    def raw(self, key: str) -> bytes:
        """The object's bytes without counting a call."""
        with self._lock:
            return self._objects[key]

    def poke(self, key: str, data: bytes) -> None:
        """Replace an object's bytes without counting a call (to simulate bit rot)."""
        with self._lock:
            self._objects[key] = bytes(data)


_registry: dict[str, MemoryStore] = {}
_registry_lock = threading.Lock()


def named_memory_store(name: str) -> MemoryStore:
    """The process-wide MemoryStore called `name` (created on first use)."""
    with _registry_lock:
        store = _registry.get(name)
        if store is None:
            store = _registry[name] = MemoryStore(name)
        return store


def drop_memory_store(name: str) -> None:
    """Forget the named store, so the next `memory://name` starts empty."""
    with _registry_lock:
        _registry.pop(name, None)
