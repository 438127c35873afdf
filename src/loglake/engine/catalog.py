"""The catalog: topics and partitions as the engine sees them, over the metadata store.

Every durable change goes through here as one metadata record (loglake.meta.state lists them):
the record is applied to the metadata state and queued for the log while the caller's lock is
held, and the caller waits for its durability after letting the lock go. So the lock order is
fixed by construction — `Catalog.lock` (topics map) → `Partition.lock` → the metadata store's
own lock, which is innermost and never calls out — and no thread ever waits for a disk while
holding a lock another metadata writer needs.

The catalog owns no threads and does no I/O of its own besides the metadata store's.
"""

from __future__ import annotations

import base64
import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from loglake.engine.config import PARTITIONS_PER_TOPIC_MAX, EngineConfig, TopicConfig, validate_topic_name
from loglake.engine.partition import Partition, SegmentRef
from loglake.engine.types import TopicInfo
from loglake.errors import InvalidPartitionsError, TopicExistsError, UnknownTopicError
from loglake.meta.lifecycle import Stage, Tier, move, stage_of
from loglake.meta.quotas import EntityKey, client_quota_body
from loglake.meta.state import MetaState, PartitionMeta
from loglake.meta.store import MetaStore

__all__ = ["Catalog", "TopicState", "new_cluster_id"]

log = logging.getLogger(__name__)

#: Batches per producer carried in a segment_published record (duplicate detection needs 5).
PRODUCER_BATCHES_PER_SEAL = 5


def new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=").replace("-", "x").replace("_", "y")


class TopicState:
    __slots__ = ("config", "created_ms", "name", "partitions", "topic_id")

    def __init__(self, name: str, topic_id: bytes, config: TopicConfig, created_ms: int) -> None:
        self.name = name
        self.topic_id = topic_id
        self.config = config
        self.created_ms = created_ms
        self.partitions: list[Partition] = []

    def info(self) -> TopicInfo:
        return TopicInfo(self.name, self.topic_id.hex(), len(self.partitions), self.config, self.created_ms)


class Catalog:
    def __init__(self, meta: MetaStore, config: EngineConfig, clock: Callable[[], float]) -> None:
        self.meta = meta
        self.config = config
        self._clock = clock
        self.lock = threading.RLock()  # the topics maps
        self.topics: dict[str, TopicState] = {}
        self.by_id: dict[bytes, TopicState] = {}

    # ---- building from the metadata state (recovery) -------------------------------------------

    @property
    def state(self) -> MetaState:
        return self.meta.state

    @property
    def cluster_id(self) -> str:
        return self.meta.state.cluster_id

    def load(self) -> None:
        """Build topics and partitions from the recovered metadata state."""
        state = self.meta.state
        with self.lock:
            self.topics.clear()
            self.by_id.clear()
            for tm in state.topics.values():
                topic = TopicState(tm.name, tm.topic_id, TopicConfig.parse(tm.config, self.config.topic_defaults), tm.created_ms)
                for i in range(tm.partitions):
                    topic.partitions.append(self._new_partition(topic, state.partition(tm.topic_id, i)))
                self.topics[tm.name] = topic
                self.by_id[tm.topic_id] = topic

    def _new_partition(self, topic: TopicState, pm: PartitionMeta) -> Partition:
        shard = (int.from_bytes(topic.topic_id[:4], "little") + pm.index) % self.config.wal_shards
        return Partition(topic.name, topic.topic_id, pm.index, shard, pm)

    # ---- lookups --------------------------------------------------------------------------------

    def topic(self, name: str) -> TopicState:
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
        return [(t, p) for t in list(self.topics.values()) for p in t.partitions]

    # ---- topic changes (durable on return) ------------------------------------------------------

    def create_topic(self, name: str, partitions: int, config: dict[str, str] | None, *, validate_only: bool) -> TopicInfo:
        validate_topic_name(name)
        if not 1 <= partitions <= PARTITIONS_PER_TOPIC_MAX:
            raise InvalidPartitionsError(f"partitions must be in [1, {PARTITIONS_PER_TOPIC_MAX}], got {partitions}")
        topic_config = TopicConfig.parse(config, self.config.topic_defaults)
        with self.lock:
            if name in self.topics:
                raise TopicExistsError(f"topic {name!r} already exists")
            topic = TopicState(name, uuid.uuid4().bytes, topic_config, int(self._clock() * 1000))
            if validate_only:
                return topic.info()
            fut = self.meta.append(
                "topic_created",
                {
                    "name": name,
                    "id": topic.topic_id.hex(),
                    "partitions": partitions,
                    "config": dict(topic_config.overrides),
                    "created_ms": topic.created_ms,
                },
            )
            for i in range(partitions):
                topic.partitions.append(self._new_partition(topic, self.state.partition(topic.topic_id, i)))
            self.topics[name] = topic
            self.by_id[topic.topic_id] = topic
        fut.result()
        log.info("created topic %s (%d partitions, id %s)", name, partitions, topic.topic_id.hex())
        return topic.info()

    def delete_topic(self, name: str) -> TopicState:
        """Forget the topic durably; the caller frees its buffers and objects afterwards."""
        with self.lock:
            topic = self.topic(name)
            del self.topics[name]
            del self.by_id[topic.topic_id]
            for p in topic.partitions:
                with p.lock:
                    p.deleted = True
            fut = self.meta.append("topic_deleted", {"id": topic.topic_id.hex()})
        fut.result()
        return topic

    def create_partitions(self, name: str, total: int, *, validate_only: bool) -> None:
        with self.lock:
            topic = self.topic(name)
            check_partition_count(name, len(topic.partitions), total)
            if validate_only:
                return
            fut = self.meta.append("partitions_added", {"id": topic.topic_id.hex(), "total": total})
            for i in range(len(topic.partitions), total):
                topic.partitions.append(self._new_partition(topic, self.state.partition(topic.topic_id, i)))
        fut.result()

    def alter_topic_config(self, name: str, overrides: dict[str, str], *, validate_only: bool) -> TopicConfig:
        with self.lock:
            topic = self.topic(name)
            new = TopicConfig.parse(overrides, self.config.topic_defaults)
            if validate_only:
                return new
            fut = self.meta.append("topic_config", {"id": topic.topic_id.hex(), "config": dict(new.overrides)})
            topic.config = new
        fut.result()
        return new

    def set_topic_defaults(self, defaults: dict[str, str]) -> None:
        """New topic config defaults (a dynamic broker config changed): every topic's effective
        config is parsed again over them. Validated by the caller (EngineConfig.check_topic_defaults)."""
        with self.lock:
            self.config.topic_defaults = dict(defaults)
            for topic in self.topics.values():
                topic.config = TopicConfig.parse(topic.config.overrides, self.config.topic_defaults)

    def allocate_producer_id(self) -> int:
        with self.lock:
            pid = self.state.next_producer_id
            fut = self.meta.append("producer_ids", {"next": pid + 1})
        fut.result()
        return pid

    # ---- partition changes (caller holds p.lock; waits for the future after releasing it) -------

    def record_seal(self, p: Partition, ref: SegmentRef, producers: list[list[int]]) -> Future[int]:
        move(Stage.SEALED, ref.tier, ref.key)
        return self.meta.append(
            "segment_published",
            {"id": p.topic_id.hex(), "p": p.index, "seg": ref.to_json(), "producers": producers},
        )

    def record_tier(self, p: Partition, base_offset: int, tier: Tier) -> Future[int]:
        """Relocation's authoritative switch of the segment at `base_offset`, recorded hot: the
        relocator holds it RELOCATING (loglake.meta.lifecycle)."""
        i = p.segments.find_base(base_offset)
        now = Stage.DELETED if i is None else stage_of(p.segments[i].tier)
        move(Stage.RELOCATING if now is Stage.HOT else now, tier, p.segments.key_for(base_offset))
        return self.meta.append("segment_tier", {"id": p.topic_id.hex(), "p": p.index, "base": base_offset, "tier": tier})

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
        body: dict[str, Any] = {
            "id": p.topic_id.hex(),
            "p": p.index,
            "replaced": [[s.base_offset, s.generation] for s in replaced],
            "segs": [s.to_json() for s in segs],
        }
        if clean is not None:
            body["clean"] = clean
        return self.meta.append("segment_rewritten", body)

    def record_log_start(self, p: Partition, offset: int) -> Future[int]:
        """Raise the log start offset; whole segments ending at or below it leave the chain."""
        for seg in p.segments:
            if seg.end_offset > offset:
                break
            move(seg.tier, Stage.DELETED, seg.key)
        return self.meta.append("log_start", {"id": p.topic_id.hex(), "p": p.index, "offset": offset})

    # ---- consumer groups (owned by the broker's coordinator; opaque here) ----------------------

    def group_metadata(self) -> dict[str, dict[str, Any]]:
        read = getattr(self.meta, "read", None)

        def copy(state: MetaState) -> dict[str, dict[str, Any]]:
            return {
                g: {"offsets": {tp: list(row) for tp, row in gm.offsets.items()}, "state": gm.state}
                for g, gm in state.groups.items()
            }

        return read(copy) if read is not None else copy(self.state)

    def commit_group_offsets(self, group_id: str, rows: list[tuple[str, int, int, int, str, int]]) -> Future[int]:
        return self.meta.append("offset_commit", {"g": group_id, "rows": [list(r) for r in rows]})

    def expire_group_offsets(self, group_id: str, partitions: list[tuple[str, int]]) -> Future[int]:
        return self.meta.append("offset_expire", {"g": group_id, "tps": [list(tp) for tp in partitions]})

    def delete_group_metadata(self, group_id: str) -> Future[int]:
        return self.meta.append("group_deleted", {"g": group_id})

    def save_group_state(self, group_id: str, state: dict[str, Any] | None) -> Future[int]:
        return self.meta.append("group_state", {"g": group_id, "state": state})


    # ---- dynamic configs (broker and group resources; the broker owns their meaning) ------------

    def dynamic_configs(self, kind: str) -> dict[str, dict[str, str]]:
        """A copy of the dynamic configs of `kind` ("broker": by scope, "group": by group id)."""
        read = getattr(self.meta, "read", None)

        def copy(state: MetaState) -> dict[str, dict[str, str]]:
            table = state.broker_configs if kind == "broker" else state.group_configs
            return {key: dict(configs) for key, configs in table.items()}

        return read(copy) if read is not None else copy(self.state)

    def save_dynamic_configs(self, kind: str, key: str, configs: dict[str, str]) -> Future[int]:
        """Replace the dynamic configs of one broker scope or group ({} removes them)."""
        if kind == "broker":
            return self.meta.append("broker_config", {"scope": key, "configs": dict(configs)})
        return self.meta.append("group_config", {"g": key, "configs": dict(configs)})

    def client_quotas(self) -> dict[EntityKey, dict[str, float]]:
        """A copy of the client quota configs (loglake.meta.quotas)."""
        read = getattr(self.meta, "read", None)

        def copy(state: MetaState) -> dict[EntityKey, dict[str, float]]:
            return {key: dict(values) for key, values in state.client_quotas.items()}

        return read(copy) if read is not None else copy(self.state)

    def save_client_quota(self, key: EntityKey, values: dict[str, float] | None) -> Future[int]:
        """Replace one client quota entity's configs (None or {} removes the entity)."""
        return self.meta.append("client_quota", client_quota_body(key, values))


    # ---- ACL bindings (loglake.meta.acls; the broker's authorizer owns their meaning) ---------

    def acl_bindings(self) -> list[tuple[int, str, int, str, str, int, int]]:
        """The ACL bindings, in creation order."""
        read = getattr(self.meta, "read", None)

        def copy(state: MetaState) -> list[tuple[int, str, int, str, str, int, int]]:
            return list(state.acls)

        return read(copy) if read is not None else copy(self.state)

    def save_acls(self, created: list[list[Any]], deleted: list[list[Any]]) -> Future[int]:
        """Record ACL bindings created and deleted (one `acls` record)."""
        return self.meta.append("acls", {"created": created, "deleted": deleted})


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
