"""The metadata's copy in the object stores: immutable checkpoints and log pieces.

Objects, under ``<prefix>/loglake-<cluster_id>/meta/``::

    checkpoint-<first seq not in it, 20 digits>.bin   a local checkpoint file, byte for byte
    log-<first seq 20 digits>-<last seq 20 digits>.bin  records first..last as WAL frames

Nothing is ever rewritten: a change costs one small PUT per publish interval (`interval_ms`,
changes batched), never a copy of the whole state. When more than `pieces_max` pieces follow
the newest published checkpoint, one merged piece replaces them, so a reader needs at most
1 LIST + 1 checkpoint GET + `pieces_max` + 1 piece GETs. Each local checkpoint is uploaded as
soon as it exists, and pieces and checkpoints older than the previous checkpoint are deleted.

Readers (`read_remote_state`: the Spark source, `loglake verify --cold-store`, disaster recovery)
take the newest checkpoint that verifies and apply the pieces' records after it in order; a
version-1 ``meta.json`` (the previous release's full copy) is still read when no ``meta/``
objects exist.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from loglake.errors import CorruptionError, LoglakeError
from loglake.meta.checkpoint import decode_checkpoint
from loglake.meta.log import LocalMetaStore, checkpoint_name
from loglake.meta.records import RecordKind, decode_record
from loglake.meta.state import MetaState
from loglake.meta.state_v1 import state_from_snapshot
from loglake.store.base import ObjectStore, cluster_prefix
from loglake.wal.frame import FrameError, decode_frame, encode_frame

__all__ = [
    "META_PUBLISH_INTERVAL_MS_DEFAULT",
    "META_PUBLISH_PIECES_MAX",
    "MetaPublisher",
    "RemoteMeta",
    "read_remote_state",
]

log = logging.getLogger(__name__)

#: Backoff of maintenance-driven publishes after a failure: doubling from the first to the last.
PUBLISH_RETRY_S_MIN = 0.1
PUBLISH_RETRY_S_MAX = 30.0

#: Longest a durable change waits before it is copied to the stores.
META_PUBLISH_INTERVAL_MS_DEFAULT = 1000
#: Pieces after the newest published checkpoint before they are merged into one.
META_PUBLISH_PIECES_MAX = 16
META_DIR = "meta/"
LEGACY_META_OBJECT = "meta.json"
_PIECE_RE = re.compile(r"^log-(\d{20})-(\d{20})\.bin$")
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d{20})\.bin$")
_NO_TOPIC = bytes(16)

#: Record kinds that alone do not make a publish due (engine/acked.py writes one a second while
#: producing: the bucket's copy needs them only to stay contiguous)...
LAZY_KINDS = frozenset({RecordKind.ACKED})
#: ...until this many of them wait.
LAZY_RECORDS_MAX = 1000


def meta_prefix(cluster_id: str, prefix: str = "") -> str:
    return cluster_prefix(cluster_id, prefix) + META_DIR


def piece_name(first: int, last: int) -> str:
    return f"log-{first:020d}-{last:020d}.bin"


def encode_piece(records: list[tuple[int, bytes]]) -> bytes:
    out = bytearray()
    first = records[0][0]
    for seq, raw in records:
        for part in encode_frame(seq, first, _NO_TOPIC, 0, seq, seq + 1, raw):
            out += part
    return bytes(out)


def decode_piece(data: bytes, key: str) -> list[tuple[int, bytes]]:
    buf = memoryview(data)
    pos = 0
    out: list[tuple[int, bytes]] = []
    while pos < len(data):
        try:
            frame = decode_frame(buf, pos)
        except FrameError as exc:
            raise CorruptionError(key, exc.position, f"metadata log piece: {exc.reason}") from None
        if frame is None:
            raise CorruptionError(key, pos, "metadata log piece ends early")
        out.append((frame.base_offset, bytes(frame.payload)))
        pos += frame.size
    return out


class MetaPublisher:
    """Copies the local metadata log and checkpoints into object stores (best effort, retried)."""

    def __init__(
        self,
        meta: LocalMetaStore,
        stores: list[ObjectStore],
        *,
        interval_ms: int = META_PUBLISH_INTERVAL_MS_DEFAULT,
        pieces_max: int = META_PUBLISH_PIECES_MAX,
        clock: Any = time.monotonic,
    ) -> None:
        self.meta = meta
        self.stores = stores
        self.interval_s = interval_ms / 1000.0
        self.pieces_max = pieces_max
        self._clock = clock
        self._mu = threading.Lock()  # pending records (filled by the watcher under the store's lock)
        self._publish_lock = threading.Lock()
        self._pending: list[tuple[int, bytes]] = []
        #: pending records other than ``acked`` (those are local bookkeeping: alone they wait for
        #: the next real change, or until LAZY_RECORDS_MAX of them, instead of costing a PUT each)
        self._significant = 0
        #: records after the newest published checkpoint, for merging pieces
        self._since_checkpoint: list[tuple[int, bytes]] = []
        self._pieces: list[tuple[int, int]] = []  # published after the newest published checkpoint
        self._published_checkpoints: list[int] = []
        self._last_publish = clock()
        self._failures = 0  # failed publishes in a row
        self._retry_at = 0.0  # no maintenance-driven publish before this (backoff after failures)
        self.puts = 0
        meta.watch(self._on_record)

    def _on_record(self, seq: int, kind: RecordKind, _body: dict[str, Any], raw: bytes) -> None:
        with self._mu:
            self._pending.append((seq, raw))
            if kind not in LAZY_KINDS:
                self._significant += 1

    def _prefix(self) -> str:
        return meta_prefix(self.meta.state.cluster_id)

    def start(self, replayed: list[tuple[int, bytes]]) -> None:
        """After open: upload the newest local checkpoint if missing, and the records after it."""
        with self._mu:
            self._pending[:0] = replayed
            self._significant += len(replayed)
        if not self.stores:
            return
        mprefix = self._prefix()
        try:
            names = [k[len(mprefix) :] for k in self.stores[0].list(mprefix)]
        except LoglakeError as exc:
            log.warning("listing published metadata in %s failed: %s", self.stores[0].url, exc)
            return
        for name in names:
            if m := _CHECKPOINT_RE.match(name):
                self._published_checkpoints.append(int(m.group(1)) - 1)
            elif m := _PIECE_RE.match(name):
                self._pieces.append((int(m.group(1)), int(m.group(2))))
        self._published_checkpoints.sort()
        self._pieces.sort()

    def checkpoint_pending(self) -> bool:
        """A local checkpoint newer than the newest one in the stores (and not backing off after a
        failed publish)."""
        if self._clock() < self._retry_at:
            return False
        local = self.meta.checkpoints
        return bool(local) and (not self._published_checkpoints or self._published_checkpoints[-1] < local[-1])

    def due(self) -> bool:
        worth = self._significant > 0 or len(self._pending) >= LAZY_RECORDS_MAX
        now = self._clock()
        return worth and now - self._last_publish >= self.interval_s and now >= self._retry_at

    def publish(self) -> bool:
        """Upload what changed; False when a store failed (retried on the next call)."""
        with self._publish_lock:
            self._last_publish = self._clock()
            try:
                self._upload_checkpoints()
                with self._mu:
                    records, self._pending = self._pending, []
                    significant, self._significant = self._significant, 0
                if not records:
                    return True
                self.meta.sync()  # only durable records leave this machine
                try:
                    self._upload_piece(records)
                except BaseException:
                    with self._mu:
                        self._pending[:0] = records
                        self._significant += significant
                    raise
            except LoglakeError as exc:
                # A store failing (an S3 5xx storm) is retried with backoff, logged when it starts;
                # the metadata is durable locally meanwhile, only its copy in the bucket lags.
                self._failures += 1
                delay = min(PUBLISH_RETRY_S_MIN * 2 ** (self._failures - 1), PUBLISH_RETRY_S_MAX)
                self._retry_at = self._clock() + delay
                if self._failures == 1:
                    log.warning("publishing metadata to the stores failed, will retry with backoff: %s", exc)
                else:
                    log.debug("publishing metadata failed again (%d), next try in %.1fs: %s", self._failures, delay, exc)
                return False
            if self._failures:
                log.warning("publishing metadata to the stores works again (after %d failed tries)", self._failures)
                self._failures = 0
                self._retry_at = 0.0
            return True

    def _put(self, key: str, data: bytes) -> None:
        for store in self.stores:
            store.put(key, [data])
            self.puts += 1

    def _delete(self, key: str) -> None:
        for store in self.stores:
            try:
                store.delete(key)
            except LoglakeError as exc:
                log.info("could not delete old metadata object %s from %s: %s", key, store.url, exc)

    def _upload_checkpoints(self) -> None:
        local = self.meta.checkpoints
        if not local or (self._published_checkpoints and self._published_checkpoints[-1] >= local[-1]):
            return
        seq = local[-1]
        self._put(self._prefix() + checkpoint_name(seq), self.meta.checkpoint_bytes_of(seq))
        if not self._published_checkpoints:
            # The previous release's full copy would only mislead readers from here on.
            self._delete(cluster_prefix(self.meta.state.cluster_id) + LEGACY_META_OBJECT)
        self._published_checkpoints.append(seq)
        self._since_checkpoint = [r for r in self._since_checkpoint if r[0] > seq]
        # Keep the previous checkpoint and everything after it; older objects go.
        keep_from = self._published_checkpoints[-2] if len(self._published_checkpoints) > 1 else seq
        for old in self._published_checkpoints[:-2]:
            self._delete(self._prefix() + checkpoint_name(old))
        self._published_checkpoints = self._published_checkpoints[-2:]
        for first, last in list(self._pieces):
            if last <= keep_from:
                self._delete(self._prefix() + piece_name(first, last))
                self._pieces.remove((first, last))

    def _upload_piece(self, records: list[tuple[int, bytes]]) -> None:
        newest_ck = self._published_checkpoints[-1] if self._published_checkpoints else -1
        self._since_checkpoint.extend(r for r in records if r[0] > newest_ck)
        after = [p for p in self._pieces if p[1] > newest_ck]
        if len(after) >= self.pieces_max and self._since_checkpoint:
            merged = self._since_checkpoint
            key = piece_name(merged[0][0], merged[-1][0])
            self._put(self._prefix() + key, encode_piece(merged))
            for first, last in after:
                if (first, last) != (merged[0][0], merged[-1][0]):
                    self._delete(self._prefix() + piece_name(first, last))
                    self._pieces.remove((first, last))
            self._pieces.append((merged[0][0], merged[-1][0]))
            return
        self._put(self._prefix() + piece_name(records[0][0], records[-1][0]), encode_piece(records))
        self._pieces.append((records[0][0], records[-1][0]))


# ---- reading ----------------------------------------------------------------------------------


def decode_legacy(data: bytes, key: str) -> dict[str, Any]:
    """The previous release's full copy (``meta.json``, format "loglake-meta" version 1)."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptionError(key, 0, f"published metadata is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != "loglake-meta":
        raise CorruptionError(key, 0, "not a loglake published-metadata object")
    if doc.get("version") != 1:
        raise CorruptionError(key, 0, f"published metadata version {doc.get('version')} is not supported (want 1)")
    doc.setdefault("version", 1)
    return doc


@dataclass
class RemoteMeta:
    state: MetaState
    key: str  # the checkpoint (or meta.json) it started from
    gets: int  # objects read
    pieces: int
    legacy: bool


#: Checkpoint objects are immutable: a planner that reads the same one again (every micro-batch of
#: a streaming query) takes it from here. Bounded by bytes; least recently used goes first.
CHECKPOINT_CACHE_BYTES_MAX = 256 * 1024 * 1024
_checkpoint_cache: OrderedDict[tuple[str, str], bytes] = OrderedDict()
_checkpoint_cache_lock = threading.Lock()


def _cached_checkpoint(url: str, key: str) -> bytes | None:
    with _checkpoint_cache_lock:
        data = _checkpoint_cache.get((url, key))
        if data is not None:
            _checkpoint_cache.move_to_end((url, key))
        return data


def _cache_checkpoint(url: str, key: str, data: bytes) -> None:
    if len(data) > CHECKPOINT_CACHE_BYTES_MAX:
        return
    with _checkpoint_cache_lock:
        _checkpoint_cache[(url, key)] = data
        total = sum(len(v) for v in _checkpoint_cache.values())
        while total > CHECKPOINT_CACHE_BYTES_MAX and _checkpoint_cache:
            _k, old = _checkpoint_cache.popitem(last=False)
            total -= len(old)


def find_clusters(store: ObjectStore, prefix: str = "") -> list[str]:
    """Cluster ids with metadata under `prefix` (new or version-1 form)."""
    base = prefix.strip("/") + "/" if prefix.strip("/") else ""
    ids: set[str] = set()
    for key in store.list(base + "loglake-"):
        rest = key[len(base) :]
        head, _, tail = rest.partition("/")
        if tail == LEGACY_META_OBJECT or tail.startswith(META_DIR):
            ids.add(head[len("loglake-") :])
    return sorted(ids)


def read_remote_state(store: ObjectStore, prefix: str = "", cluster_id: str | None = None) -> RemoteMeta:
    """The newest metadata of the one cluster under `prefix` in `store`."""
    if cluster_id is None:
        ids = find_clusters(store, prefix)
        if not ids:
            raise CorruptionError(store.url, 0, f"no loglake metadata (loglake-*/meta/) under prefix {prefix!r}")
        if len(ids) > 1:
            raise CorruptionError(store.url, 0, f"several clusters under prefix {prefix!r}: {', '.join(ids)}")
        cluster_id = ids[0]
    mprefix = meta_prefix(cluster_id, prefix)
    checkpoints: list[int] = []
    pieces: list[tuple[int, int]] = []
    for key in store.list(mprefix):
        name = key[len(mprefix) :]
        if m := _CHECKPOINT_RE.match(name):
            checkpoints.append(int(m.group(1)) - 1)
        elif m := _PIECE_RE.match(name):
            pieces.append((int(m.group(1)), int(m.group(2))))
    gets = 0
    state: MetaState | None = None
    start_key = ""
    for seq in sorted(checkpoints, reverse=True):
        key = mprefix + checkpoint_name(seq)
        data = _cached_checkpoint(store.url, key)
        if data is None:
            gets += 1
            data = store.get(key)
            _cache_checkpoint(store.url, key, data)
        try:
            state = decode_checkpoint(data, path=key)
        except CorruptionError as exc:
            log.error("metadata checkpoint %s in %s is damaged (%s); trying an older one", key, store.url, exc.detail)
            continue
        start_key = key
        break
    if state is None:
        if pieces and min(p[0] for p in pieces) == 0:
            state = MetaState(cluster_id)
            start_key = "(log from record 0)"
        else:
            legacy = cluster_prefix(cluster_id, prefix) + LEGACY_META_OBJECT
            if store.head(legacy) is None:
                raise CorruptionError(store.url, 0, f"no readable metadata checkpoint under {mprefix}")
            doc = decode_legacy(store.get(legacy), legacy)
            return RemoteMeta(state_from_snapshot(doc), legacy, 1, 0, True)
    expected = state.seq + 1
    used = 0
    state.replaying = True
    for first, last in sorted(pieces, key=lambda p: (p[0], -p[1])):
        if last < expected:
            continue
        if first > expected:
            raise CorruptionError(store.url, 0, f"metadata records {expected}..{first - 1} are missing under {mprefix}")
        key = mprefix + piece_name(first, last)
        gets += 1
        used += 1
        for seq, raw in decode_piece(store.get(key), key):
            if seq != expected:
                if seq < expected:
                    continue
                raise CorruptionError(key, 0, f"metadata piece jumps from record {expected} to {seq}")
            kind, body = decode_record(raw, where=key, position=seq)
            state.apply(kind, body)
            state.seq = seq
            expected = seq + 1
    state.replaying = False
    return RemoteMeta(state, start_key, gets, used, False)
