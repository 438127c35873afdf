"""The catalog: topics and partitions as the engine sees them, over the metadata store.

Every durable change goes through the metadata store as one record (loglake.meta.state lists
them). The topics map is never changed in place by the caller that made the change: it is
rebuilt from the metadata state whenever a topic record was applied, whoever wrote it. That is
what lets one catalog serve both metadata stores — the local log, which applies a record the
moment it is appended, and the cluster's etcd store, which applies records when they are
committed, in log order, on every broker alike (other brokers create and delete topics too).
A watcher marks the map stale (it runs under the store's lock, so it only sets a flag); the next
lookup rebuilds it. Partition objects are kept across rebuilds (their locks and waiters stay
valid) as long as the topic id is the same.

Conflicting changes are settled by the records themselves: applying a `topic_created` for a
name that exists, or a `producer_ids` whose `expect` is not the current next id, fails, so of
two brokers (or threads) racing, exactly one wins and the other is told (TopicExistsError, or
another round for a producer id), with no separate lock or key in the store.

Lock order: `Partition.lock` → `Catalog.lock` (held only while a rebuild swaps the maps) → the
metadata store's own lock, which is innermost and never calls out. The catalog owns no threads
and does no I/O of its own besides the metadata store's.
"""

from __future__ import annotations

import base64
import logging
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from loglake.engine.config import PARTITIONS_PER_TOPIC_MAX, EngineConfig, TopicConfig, validate_topic_name
from loglake.engine.partition import Partition, SegmentRef
from loglake.engine.types import TopicInfo
from loglake.errors import (
    InvalidPartitionsError,
    MetaRecordRejectedError,
    TopicExistsError,
    UnknownTopicError,
)
from loglake.locks import Rank, ranked_lock
from loglake.meta.lifecycle import Stage, Tier, move, stage_of
from loglake.meta.records import (
    LogStart,
    MetaRecord,
    PartitionsAdded,
    ProducerIds,
    RecordKind,
    SegmentPublished,
    SegmentRewritten,
    SegmentTier,
    TopicConfigSet,
    TopicCreated,
    TopicDeleted,
)
from loglake.meta.state import MetaState, PartitionMeta
from loglake.meta.store import MetaStore

__all__ = ["COMMIT_WAIT_S", "TOPIC_KINDS", "Catalog", "TopicState", "new_cluster_id"]

log = logging.getLogger(__name__)

#: Batches per producer carried in a segment_published record (duplicate detection needs 5).
PRODUCER_BATCHES_PER_SEAL = 5
#: Record kinds after which the topics map is rebuilt.
TOPIC_KINDS = frozenset(
    {RecordKind.TOPIC_CREATED, RecordKind.TOPIC_DELETED, RecordKind.TOPIC_CONFIG, RecordKind.PARTITIONS_ADDED}
)
#: How long a topic change waits for its record to be durable (local) or committed (etcd).
COMMIT_WAIT_S = 60.0
#: Rounds of taking a producer id while other brokers take theirs (each lost round means another
#: broker's record won).
PRODUCER_ID_ATTEMPTS = 100


def new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=").replace("-", "x").replace("_", "y")


class TopicState:
    __slots__ = ("config", "created_ms", "name", "partitions", "replication_factor", "topic_id")

    def __init__(
        self, name: str, topic_id: bytes, config: TopicConfig, created_ms: int, replication_factor: int = 1
    ) -> None:
        self.name = name
        self.topic_id = topic_id
        self.config = config
        self.created_ms = created_ms
        self.replication_factor = replication_factor
        self.partitions: list[Partition] = []

    def info(self) -> TopicInfo:
        return TopicInfo(
            self.name, self.topic_id.hex(), len(self.partitions), self.config, self.created_ms, self.replication_factor
        )


#: What a rebuild reads of one topic under the store's lock.
_TopicRow = tuple[str, bytes, int, dict[str, str], int, int, list[PartitionMeta]]


class Catalog:
    def __init__(self, meta: MetaStore, config: EngineConfig, clock: Callable[[], float]) -> None:
        self.meta = meta
        self.config = config
        self._clock = clock
        self.lock = ranked_lock(Rank.CATALOG, "Catalog.lock")  # serialises rebuilds of the maps
        #: the maps, swapped whole by a rebuild: readers without the lock see the old or the new one
        self.topics: dict[str, TopicState] = {}
        self.by_id: dict[bytes, TopicState] = {}
        self._stale = True
        meta.watch(self._on_record)

    def _on_record(self, seq: int, kind: RecordKind, body: dict[str, Any], raw: bytes) -> None:
        if kind in TOPIC_KINDS:
            self._stale = True  # under the store's lock: nothing more here

    # ---- building from the metadata state ------------------------------------------------------

    @property
    def state(self) -> MetaState:
        return self.meta.state

    @property
    def cluster_id(self) -> str:
        return self.meta.state.cluster_id

    def load(self) -> None:
        """Build topics and partitions from the (recovered) metadata state."""
        self.refresh(force=True)

    def refresh(self, *, force: bool = False) -> None:
        """Rebuild the topics map from the state if a topic record was applied since the last."""
        if not (self._stale or force):
            return

        def snapshot(state: MetaState) -> list[_TopicRow]:
            return [
                (tm.name, tm.topic_id, tm.partitions, dict(tm.config), tm.created_ms, tm.replication_factor,
                 [state.partition(tm.topic_id, i) for i in range(tm.partitions)])
                for tm in state.topics.values()
            ]  # fmt: skip

        with self.lock:
            self._stale = False  # a record applied from here on marks it stale again
            rows: list[_TopicRow] = self.meta.read(snapshot)
            defaults = self.config.topic_defaults
            topics: dict[str, TopicState] = {}
            for name, tid, count, overrides, created_ms, rf, metas in rows:
                old = self.by_id.get(tid)
                if old is not None and old.name == name:
                    topic = old
                    if dict(topic.config.overrides) != overrides:
                        topic.config = TopicConfig.parse(overrides, defaults)
                else:
                    topic = TopicState(name, tid, TopicConfig.parse(overrides, defaults), created_ms, rf)
                for p, pm in zip(topic.partitions, metas, strict=False):
                    if p.meta is not pm:  # the store adopted another state (a checkpoint reload)
                        p.meta = pm
                while len(topic.partitions) < count:
                    topic.partitions.append(self._new_partition(topic, metas[len(topic.partitions)]))
                topics[name] = topic
            gone = [t for t in self.by_id.values() if topics.get(t.name) is not t]
            self.topics = topics
            self.by_id = {t.topic_id: t for t in topics.values()}
        for topic in gone:
            for p in topic.partitions:
                # No partition lock needed: an append that checked `deleted` before this is
                # freed with the rest by the topic's deleter, which takes the lock after it.
                p.deleted = True
                p.wake_all()

    def _new_partition(self, topic: TopicState, pm: PartitionMeta) -> Partition:
        shard = (int.from_bytes(topic.topic_id[:4], "little") + pm.index) % self.config.wal_shards
        return Partition(topic.name, topic.topic_id, pm.index, shard, pm)

    # ---- lookups (each sees every change applied so far) ---------------------------------------

    def topic(self, name: str) -> TopicState:
        self.refresh()
        topic = self.topics.get(name)
        if topic is None:
            raise UnknownTopicError(f"unknown topic {name!r}")
        return topic

    def partition(self, name: str, partition: int) -> Partition:
        topic = self.topic(name)
        if not 0 <= partition < len(topic.partitions):
            raise UnknownTopicError(f"topic {name!r} has no partition {partition}")
        return topic.partitions[partition]

    def partitions(self) -> list[tuple[TopicState, Partition]]:
        self.refresh()
        return [(t, p) for t in list(self.topics.values()) for p in t.partitions]

    def has_topic(self, name: str) -> bool:
        self.refresh()
        return name in self.topics

    def topic_by_id(self, topic_id: bytes) -> TopicState | None:
        self.refresh()
        return self.by_id.get(topic_id)

    def all_topics(self) -> list[TopicState]:
        self.refresh()
        return sorted(self.topics.values(), key=lambda t: t.name)

    # ---- topic changes (durable on return) ------------------------------------------------------

    def create_topic(
        self, name: str, partitions: int, config: dict[str, str] | None, *, validate_only: bool, replication_factor: int = 1
    ) -> TopicInfo:
        """`replication_factor` is remembered as given (the broker checked it against the live
        brokers: the cluster view's business, not the catalog's)."""
        validate_topic_name(name)
        if not 1 <= partitions <= PARTITIONS_PER_TOPIC_MAX:
            raise InvalidPartitionsError(f"partitions must be in [1, {PARTITIONS_PER_TOPIC_MAX}], got {partitions}")
        topic_config = TopicConfig.parse(config, self.config.topic_defaults)
        if not validate_only:
            self.meta.sync()  # every change committed so far is applied here (other brokers' too)
        if self.has_topic(name):
            raise TopicExistsError(f"topic {name!r} already exists")
        topic_id = uuid.uuid4().bytes
        created_ms = int(self._clock() * 1000)
        if validate_only:
            return TopicInfo(name, topic_id.hex(), partitions, topic_config, created_ms, replication_factor)
        try:
            self._commit(
                TopicCreated(name, topic_id.hex(), partitions, topic_config.overrides, created_ms, replication_factor)
            )
        except MetaRecordRejectedError:  # created meanwhile (another broker, another thread)
            log.info("topic %s: created by another writer at the same time; answering TOPIC_ALREADY_EXISTS", name)
            raise TopicExistsError(f"topic {name!r} already exists") from None
        log.info("created topic %s (%d partitions, id %s)", name, partitions, topic_id.hex())
        return self.topic(name).info()

    def delete_topic(self, name: str) -> TopicState:
        """Forget the topic durably; the caller frees its buffers and objects afterwards."""
        topic = self.topic(name)
        try:
            # `ms` starts cluster mode's sweep grace for the topic's objects (the same on every broker)
            self._commit(TopicDeleted(topic.topic_id.hex(), int(self._clock() * 1000)))
        except MetaRecordRejectedError:  # deleted meanwhile
            raise UnknownTopicError(f"unknown topic {name!r}") from None
        return topic

    def create_partitions(self, name: str, total: int, *, validate_only: bool) -> None:
        topic = self.topic(name)
        check_partition_count(name, len(topic.partitions), total)
        if validate_only:
            return
        try:
            self._commit(PartitionsAdded(topic.topic_id.hex(), total))
        except MetaRecordRejectedError as exc:
            raise InvalidPartitionsError(f"topic {name!r}: {exc}") from None

    def alter_topic_config(self, name: str, overrides: dict[str, str], *, validate_only: bool) -> TopicConfig:
        topic = self.topic(name)
        new = TopicConfig.parse(overrides, self.config.topic_defaults)
        if validate_only:
            return new
        try:
            self._commit(TopicConfigSet(topic.topic_id.hex(), new.overrides))
        except MetaRecordRejectedError:
            raise UnknownTopicError(f"unknown topic {name!r}") from None
        return new

    def _commit(self, record: MetaRecord) -> None:
        """Append a topic record, wait until it is durable (or committed), rebuild the map."""
        try:
            self.meta.append(record).result(COMMIT_WAIT_S)
        finally:
            self.refresh(force=True)

    def set_topic_defaults(self, defaults: dict[str, str]) -> None:
        """New topic config defaults (a dynamic broker config changed): every topic's effective
        config is parsed again over them. Validated by the caller (EngineConfig.check_topic_defaults)."""
        self.refresh()
        with self.lock:
            self.config.topic_defaults = dict(defaults)
            for topic in self.topics.values():
                topic.config = TopicConfig.parse(topic.config.overrides, self.config.topic_defaults)

    def allocate_producer_id(self) -> int:
        """A producer id no other writer hands out: the `producer_ids` record names the id it
        expects to be next, and does not apply when another record took it first."""
        for _ in range(PRODUCER_ID_ATTEMPTS):
            pid = int(self.meta.read(lambda s: s.next_producer_id))
            try:
                self.meta.append(ProducerIds(pid + 1, pid)).result(COMMIT_WAIT_S)
            except MetaRecordRejectedError:
                continue  # another broker (or thread) took it: look again
            return pid
        raise MetaRecordRejectedError(f"no producer id after {PRODUCER_ID_ATTEMPTS} attempts (contention)")

    # ---- partition changes (caller holds p.lock; waits for the future after releasing it) -------

    def record_seal(self, p: Partition, ref: SegmentRef, producers: list[list[int]]) -> Future[int]:
        move(Stage.SEALED, ref.tier, ref.key)
        return self.meta.append(SegmentPublished(p.topic_id.hex(), p.index, ref, producers))

    def record_tier(self, p: Partition, base_offset: int, tier: Tier) -> Future[int]:
        """Relocation's authoritative switch of the segment at `base_offset`, recorded hot: the
        relocator holds it RELOCATING (loglake.meta.lifecycle)."""
        i = p.segments.find_base(base_offset)
        now = Stage.DELETED if i is None else stage_of(p.segments[i].tier)
        move(Stage.RELOCATING if now is Stage.HOT else now, tier, p.segments.key_for(base_offset))
        return self.meta.append(SegmentTier(p.topic_id.hex(), p.index, base_offset, tier))

    def record_rewrite(
        self, p: Partition, replaced: list[SegmentRef], segs: list[SegmentRef], clean: dict[str, int] | None
    ) -> Future[int] | None:
        """Swap a run of segments for their rewrite; None (nothing recorded) when the run is no
        longer in place as it was read (retention, relocation or a topic delete got there first)."""
        table = p.segments
        start = table.find_base(replaced[0].base_offset)
        if p.deleted or start is None or start + len(replaced) > len(table):
            return None
        for i, seg in enumerate(replaced):
            now = table[start + i]
            if (now.base_offset, now.generation, now.tier) != (seg.base_offset, seg.generation, seg.tier):
                return None
        for seg in replaced:
            move(seg.tier, Stage.REPLACED, seg.key)
        for seg in segs:
            move(Stage.SEALED, seg.tier, seg.key)
        return self.meta.append(SegmentRewritten(p.topic_id.hex(), p.index, replaced, segs, clean))

    def record_log_start(self, p: Partition, offset: int) -> Future[int]:
        """Raise the log start offset; whole segments ending at or below it leave the chain."""
        for seg in p.segments:
            if seg.end_offset > offset:
                break
            move(seg.tier, Stage.DELETED, seg.key)
        return self.meta.append(LogStart(p.topic_id.hex(), p.index, offset))


def producer_entries(batches: list[tuple[int, int, int, int, int]]) -> list[list[int]]:
    """The newest PRODUCER_BATCHES_PER_SEAL batches per producer id, oldest first."""
    per: dict[int, list[tuple[int, int, int, int, int]]] = {}
    for b in batches:
        per.setdefault(b[0], []).append(b)
    return [list(b) for items in per.values() for b in items[-PRODUCER_BATCHES_PER_SEAL:]]


def check_partition_count(name: str, current: int, total: int) -> None:
    """CreatePartitions' rule: the new count must exceed the current one and stay in bounds."""
    if total <= current:
        raise InvalidPartitionsError(
            f"topic {name!r} has {current} partitions; the new count must be larger, got {total}"
        )
    if total > PARTITIONS_PER_TOPIC_MAX:
        raise InvalidPartitionsError(f"at most {PARTITIONS_PER_TOPIC_MAX} partitions per topic")
