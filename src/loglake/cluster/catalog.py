"""Topics of a cluster broker: the single-node `Catalog`, rebuilt from the shared etcd state.

The single-node catalog keeps its own topics map and changes it together with the record it
appends, because its store applies a record the moment it is appended. In cluster mode other
brokers create and delete topics too, and the etcd store applies a record only when it is
committed (in log order, on every broker alike). So here every topic change waits for its
record's commit, and the map is rebuilt from the state whenever a topic record was applied —
whoever wrote it. A watcher marks the map stale (it runs under the store's lock, so it only sets
a flag); the next lookup rebuilds it. Partition objects are kept across rebuilds (their locks
and waiters stay valid) as long as the topic id is the same.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from loglake.engine.catalog import Catalog, TopicState, check_partition_count
from loglake.engine.config import PARTITIONS_PER_TOPIC_MAX, EngineConfig, TopicConfig, validate_topic_name
from loglake.engine.partition import Partition
from loglake.engine.types import TopicInfo
from loglake.errors import (
    InvalidPartitionsError,
    MetaFencedError,
    MetaRecordRejectedError,
    TopicExistsError,
    UnknownTopicError,
)
from loglake.meta.etcd import EtcdMetaStore, Guard
from loglake.meta.state import MetaState

__all__ = ["TOPIC_KINDS", "ClusterCatalog"]

log = logging.getLogger(__name__)

#: Record kinds after which the topics map is rebuilt.
TOPIC_KINDS = frozenset({"topic_created", "topic_deleted", "topic_config", "partitions_added"})
#: etcd key (under the cluster prefix) holding the next producer id; InitProducerId takes ids
#: with a transaction compared on it, so two brokers never hand out the same id.
PRODUCER_ID_KEY = "producer_id/next"
#: Attempts to take a producer id while other brokers take theirs (each lost compare means another
#: broker succeeded).
PRODUCER_ID_ATTEMPTS = 100
#: How long a topic change waits for etcd to commit it.
COMMIT_WAIT_S = 60.0
#: etcd key prefix (under the cluster prefix) of one key per topic name ever created, holding the
#: id of its latest topic: a create is committed only if the key is as it was when the name was
#: seen free, so two brokers creating one name at once (auto-create on Metadata from several
#: brokers, a retried CreateTopics) make one `topic_created` record, and the other gets
#: TOPIC_ALREADY_EXISTS without writing anything.
TOPIC_NAME_KEY = "topic_names/"


class ClusterCatalog(Catalog):
    def __init__(self, meta: EtcdMetaStore, config: EngineConfig, clock: Callable[[], float]) -> None:
        super().__init__(meta, config, clock)
        self.etcd = meta
        self._stale = True
        meta.watch(self._on_record)

    def _on_record(self, seq: int, kind: str, body: dict[str, Any], raw: bytes) -> None:
        if kind in TOPIC_KINDS:
            self._stale = True  # under the store's lock: nothing more here

    def refresh(self, *, force: bool = False) -> None:
        """Rebuild the topics map from the state when a topic record was applied since the last."""
        if not (self._stale or force):
            return
        defaults = self.config.topic_defaults

        def snapshot(state: MetaState) -> list[tuple[str, bytes, int, dict[str, str], int, list[Any]]]:
            return [
                (tm.name, tm.topic_id, tm.partitions, dict(tm.config), tm.created_ms,
                 [state.partition(tm.topic_id, i) for i in range(tm.partitions)])
                for tm in state.topics.values()
            ]  # fmt: skip

        with self.lock:
            self._stale = False  # a record applied from here on marks it stale again
            rows = self.etcd.read(snapshot)
            topics: dict[str, TopicState] = {}
            for name, tid, count, overrides, created_ms, metas in rows:
                old = self.by_id.get(tid)
                topic = (
                    old
                    if old is not None and old.name == name
                    else TopicState(name, tid, TopicConfig.parse(overrides, defaults), created_ms)
                )
                if old is topic and dict(topic.config.overrides) != overrides:
                    topic.config = TopicConfig.parse(overrides, defaults)
                while len(topic.partitions) < count:
                    topic.partitions.append(self._new_partition(topic, metas[len(topic.partitions)]))
                topics[name] = topic
            for topic in self.by_id.values():
                if topics.get(topic.name) is not topic:
                    for p in topic.partitions:
                        with p.lock:
                            p.deleted = True
                        p.wake_all()
            # Swapped, not changed in place: readers without the lock (`name in topics`) see the
            # old map or the new one, never a half-built one.
            self.topics = topics
            self.by_id = {t.topic_id: t for t in topics.values()}

    # ---- lookups see other brokers' changes ---------------------------------------------------

    def topic(self, name: str) -> TopicState:
        self.refresh()
        return super().topic(name)

    def partition(self, name: str, partition: int) -> Partition:
        self.refresh()
        return super().partition(name, partition)

    def partitions(self) -> list[tuple[TopicState, Partition]]:
        self.refresh()
        return super().partitions()

    # ---- topic changes: wait for the commit, then rebuild ----------------------------------------

    def create_topic(
        self, name: str, partitions: int, config: dict[str, str] | None, *, validate_only: bool
    ) -> TopicInfo:
        validate_topic_name(name)
        if not 1 <= partitions <= PARTITIONS_PER_TOPIC_MAX:
            raise InvalidPartitionsError(
                f"partitions must be in [1, {PARTITIONS_PER_TOPIC_MAX}], got {partitions}"
            )
        topic_config = TopicConfig.parse(config, self.config.topic_defaults)
        name_key = TOPIC_NAME_KEY + name
        seen: bytes | None = None
        if not validate_only:
            # The name's key first, then every record committed so far: a create committed by
            # another broker after this read changes the key, so the guard below fails.
            seen, _mod = self.etcd.get_key(name_key)
            self.etcd.sync()
        self.refresh()
        if name in self.topics:
            raise TopicExistsError(f"topic {name!r} already exists")
        topic = TopicState(name, uuid.uuid4().bytes, topic_config, int(self._clock() * 1000))
        if validate_only:
            return topic.info()
        body = {
            "name": name,
            "id": topic.topic_id.hex(),
            "partitions": partitions,
            "config": dict(topic_config.overrides),
            "created_ms": topic.created_ms,
        }
        guard = Guard(name_key, value=seen) if seen is not None else Guard(name_key, mod_revision=0)
        try:
            self.etcd.append_if(
                "topic_created", body, [guard], {name_key: topic.topic_id.hex().encode()}
            ).result(COMMIT_WAIT_S)
        except (MetaFencedError, MetaRecordRejectedError):  # another broker created it first
            log.info(
                "topic %s: created by another broker at the same time; answering TOPIC_ALREADY_EXISTS", name
            )
            raise TopicExistsError(f"topic {name!r} already exists") from None
        self.refresh(force=True)
        log.info("created topic %s (%d partitions, id %s)", name, partitions, topic.topic_id.hex())
        return self.topic(name).info()

    def delete_topic(self, name: str) -> TopicState:
        topic = self.topic(name)
        try:
            # `ms` starts the sweep's grace for the topic's objects (the same on every broker)
            body = {"id": topic.topic_id.hex(), "ms": int(self._clock() * 1000)}
            self.etcd.append("topic_deleted", body).result(COMMIT_WAIT_S)
        except MetaRecordRejectedError:
            raise UnknownTopicError(f"unknown topic {name!r}") from None
        self.refresh(force=True)
        return topic

    def create_partitions(self, name: str, total: int, *, validate_only: bool) -> None:
        topic = self.topic(name)
        check_partition_count(name, len(topic.partitions), total)
        if validate_only:
            return
        try:
            self.etcd.append("partitions_added", {"id": topic.topic_id.hex(), "total": total}).result(
                COMMIT_WAIT_S
            )
        except MetaRecordRejectedError as exc:
            raise InvalidPartitionsError(f"topic {name!r}: {exc}") from None
        self.refresh(force=True)

    def alter_topic_config(self, name: str, overrides: dict[str, str], *, validate_only: bool) -> TopicConfig:
        topic = self.topic(name)
        new = TopicConfig.parse(overrides, self.config.topic_defaults)
        if validate_only:
            return new
        self.etcd.append("topic_config", {"id": topic.topic_id.hex(), "config": dict(new.overrides)}).result(
            COMMIT_WAIT_S
        )
        self.refresh(force=True)
        return new

    def allocate_producer_id(self) -> int:
        """A producer id no other broker hands out: taken with a compare on PRODUCER_ID_KEY."""
        for _ in range(PRODUCER_ID_ATTEMPTS):
            raw, _mod = self.etcd.get_key(PRODUCER_ID_KEY)
            floor = int(self.etcd.read(lambda s: s.next_producer_id))
            pid = max(int(raw) if raw is not None else 0, floor)
            guard = (
                Guard(PRODUCER_ID_KEY, value=raw)
                if raw is not None
                else Guard(PRODUCER_ID_KEY, mod_revision=0)
            )
            try:
                self.etcd.append_if(
                    "producer_ids", {"next": pid + 1}, [guard], {PRODUCER_ID_KEY: str(pid + 1).encode()}
                ).result(COMMIT_WAIT_S)
            except MetaFencedError:
                continue  # another broker took one meanwhile
            return pid
        raise MetaFencedError(f"no producer id after {PRODUCER_ID_ATTEMPTS} attempts (contention)")
