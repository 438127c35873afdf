"""Where sealed segments live: the hot store, the optional cold store and its reader."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

from loglake.engine.cold import ColdReader
from loglake.engine.partition import SegmentRef
from loglake.errors import StorageError
from loglake.meta.lifecycle import Tier
from loglake.segment.format import read_tail
from loglake.segment.index import SegmentIndex
from loglake.store.base import ObjectStore

__all__ = ["IndexCache", "Stores"]

log = logging.getLogger(__name__)


@dataclass
class Stores:
    hot: ObjectStore
    cold: ObjectStore | None = None
    cold_reader: ColdReader | None = None

    def store_for(self, seg: SegmentRef) -> ObjectStore:
        """The store holding `seg`'s authoritative copy."""
        if seg.tier == Tier.COLD:
            if self.cold is None:
                raise StorageError("read", seg.key, "segment is in the cold tier but no cold store is configured")
            return self.cold
        return self.hot

    def delete_segment(self, key: str, tier: Tier = Tier.HOT) -> None:
        store = self.cold if tier == Tier.COLD and self.cold is not None else self.hot
        try:
            store.delete(key)
        except Exception:
            log.exception("could not delete segment object %s from %s; recovery removes orphans", key, store.url)


class IndexCache:
    """Parsed segment indexes (hot ones here; cold ones in the cold reader's footer cache), LRU."""

    def __init__(self, stores: Stores, entries_max: int) -> None:
        self.stores = stores
        self.entries_max = entries_max
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, SegmentIndex] = OrderedDict()

    def put(self, key: str, index: SegmentIndex) -> None:
        with self._lock:
            self._entries[key] = index
            while len(self._entries) > self.entries_max:
                self._entries.popitem(last=False)

    def get(self, seg: SegmentRef) -> SegmentIndex:
        if seg.index is not None:
            return seg.index
        cold = self.stores.cold_reader
        if seg.tier == Tier.COLD and cold is not None:
            return cold.footer(seg.key, seg.size)[1]
        with self._lock:
            cached = self._entries.get(seg.key)
            if cached is not None:
                self._entries.move_to_end(seg.key)
                return cached
        _trailer, index = read_tail(self.stores.store_for(seg), seg.key, seg.size)
        self.put(seg.key, index)
        return index

    def cached(self, seg: SegmentRef) -> SegmentIndex | None:
        """A hot segment's index when it is in memory (no I/O), else None."""
        if seg.index is not None:
            return seg.index
        with self._lock:
            return self._entries.get(seg.key)

    def forget(self, key: str) -> None:
        with self._lock:
            self._entries.pop(key, None)
        if self.stores.cold_reader is not None:
            self.stores.cold_reader.forget(key)
