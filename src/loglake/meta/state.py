"""The metadata state and the change records that move it.

Theory of operation
-------------------
Every durable change of metadata is one record `(kind, body)`: a `RecordKind` and a small JSON
object, written by a typed record (both in loglake.meta.records, which also owns the kinds' codes
and the encoding). `MetaState.apply` is the one function that moves the state; the metadata
store calls it when a record is appended (live) and when the log is replayed after a checkpoint
(recovery), so a checkpoint plus the records after it always equals the state before a crash.

Records and what they change (bodies; `id` is a topic id in hex, `p` a partition):

=================  ========================================================================
kind               body → effect
=================  ========================================================================
cluster            {cluster_id} → the cluster id (first record of a new data directory)
topic_created      {name, id, partitions, config, created_ms, rf?} → a topic and its partitions;
                   `rf` its replication factor (absent: 1)
topic_deleted      {id} → the topic, its partitions and its committed offsets are gone
topic_config       {id, config} → the topic's config overrides, replaced
partitions_added   {id, total} → new empty partitions up to `total`
segment_published  {id, p, seg, producers} → a sealed segment joins the chain; sealed_end and
                   chain hash move to it. `producers` = [[pid, epoch, first_seq, count, base],...]
                   of the batches in it (idempotent-producer state, applied on replay only:
                   live, the engine recorded them at append)
segment_tier       {id, p, base, tier} → the segment's authoritative copy moved (relocation)
log_start          {id, p, offset} → log start offset raised; whole segments below it dropped
segment_rewritten  {id, p, replaced: [[base, generation], ...], segs: [seg, ...], clean}
                   → a compaction or merge: the listed consecutive segments are replaced by
                   `segs` (covering the same offsets); `clean` ({end, ms, tomb_ms},
                   compaction only) moves the partition's cleaned end, notes when the cleaner
                   passed it and when it first passed the oldest tombstone it kept
producer_ids       {next, expect} → the next producer id to hand out; with `expect` (the id the
                   writer takes) it applies only while that is still the next one
offset_commit      {g, rows: [[topic, partition, offset, leader_epoch, metadata, ts], ...]}
offset_expire      {g, tps: [[topic, partition], ...]}
group_deleted      {g} → the group's offsets and state
group_state        {g, state} → the group's persisted membership (opaque to the engine; null
                   removes it)
broker_config      {scope, configs} → the dynamic broker configs of `scope` ("" cluster-wide
                   default, else a node id), replaced; {} removes the scope
group_config       {g, configs} → the group's dynamic configs (Kafka's GROUP resource),
                   replaced; {} removes them
leader_epoch       {id, p, epoch, start, reason} → a new leader epoch of the partition starting
                   at offset `start` (its log end when the epoch began); history entries whose
                   start is >= `start` are dropped first (those offsets were truncated)
txn                {tid, pid, epoch, state, parts, ...} → a transactional id's state, replaced,
                   and its partitions' open/aborted transactions (loglake.meta.txn)
acked              {parts: [[id, p, end], ...]} → acknowledged ends raised (loglake.meta.acked)
acls               {created: [binding, ...], deleted: [binding, ...]} → ACL bindings removed,
                   then added (loglake.meta.acls)
scram_credential   {user, mechanism, cred} → the user's SCRAM credential for that mechanism
                   set, or removed when `cred` is null (loglake.meta.scram)
client_quota       {entity: [[type, name], ...], values} → one user / client-id quota entity's
                   configs, replaced; null values remove it (loglake.meta.quotas)
plog_*             cluster partitions: leader epochs, committed flush ranges, merged segments,
                   swept flush objects, raised log start offsets, compacted segments
                   (loglake.meta.cluster); a `plog_leader` also enters its epoch in the
                   partition's leader-epoch history, starting at the committed end; a
                   `plog_compacted` also notes its pass's clean end and marks (`note_clean`)
schema_*           the schema registry: a subject's next version (`schema_version`), versions
                   soft/hard deleted, a subject's or the global config and mode
                   (loglake.meta.schemas)
=================  ========================================================================

Unknown kinds are refused (a newer release's log is not silently half-applied).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loglake.meta.acked import apply_acked
from loglake.meta.acls import apply_acls
from loglake.meta.cluster import (
    PlogTable,
    apply_plog_commit,
    apply_plog_compacted,
    apply_plog_leader,
    apply_plog_merged,
    apply_plog_start,
    apply_plog_swept,
    drop_topic,
)
from loglake.meta.lifecycle import Tier
from loglake.meta.producers import ProducerStates
from loglake.meta.quotas import EntityKey, apply_client_quota
from loglake.meta.records import RecordKind
from loglake.meta.schemas import (
    SchemaTable,
    apply_schema_config,
    apply_schema_deleted,
    apply_schema_mode,
    apply_schema_version,
)
from loglake.meta.scram import apply_scram
from loglake.meta.segments import SegmentRef, SegmentTable
from loglake.meta.txn import (
    apply_txn,
    trim_aborted,
)
from loglake.segment.format import ZERO_HASH
from loglake.store.base import partition_prefix

__all__ = [
    "LEADER_EPOCHS_MAX",
    "GroupMeta",
    "MetaState",
    "PartitionMeta",
    "TopicMeta",
]

#: Most clean marks (tombstone timing) a partition keeps; older ones merge conservatively.
PASS_MARKS_MAX = 64
#: Most leader-epoch history entries a partition keeps; past this the oldest are dropped (an
#: OffsetForLeaderEpoch for an epoch older than every kept one is answered as Kafka answers an
#: epoch older than its cache: with the oldest kept entry's start offset). Epochs move at unclean
#: recoveries and operator-accepted losses, and in cluster mode at leadership changes (an epoch
#: that wrote nothing is replaced by the next, so the history grows only with epochs that wrote).
LEADER_EPOCHS_MAX = 1000
#: Most partitions a topic may have (the engine refuses more); a record or checkpoint claiming more
#: is corrupt, and is refused before one partition of it is built.
PARTITIONS_PER_TOPIC_MAX = 10_000
#: Largest replication factor a record or checkpoint may carry (Kafka's is a 16-bit field).
REPLICATION_FACTOR_MAX = 32_767
#: What reading a JSON document of the wrong shape raises (a list where an object belongs, a
#: short row, a number out of int64 range): callers turn these into CorruptionError.
DOC_SHAPE_ERRORS = (KeyError, ValueError, TypeError, AttributeError, IndexError, struct.error)
# ---- state -----------------------------------------------------------------------------------


@dataclass(eq=False)
class TopicMeta:
    name: str
    topic_id: bytes
    partitions: int
    config: dict[str, str]
    created_ms: int
    #: the replication factor it was created with (cluster mode: brokers reported per partition)
    replication_factor: int = 1


@dataclass(eq=False)
class PartitionMeta:
    topic_id: bytes
    index: int
    segments: SegmentTable
    log_start: int = 0
    sealed_end: int = 0
    chain_hash: bytes = ZERO_HASH
    producers: ProducerStates = field(default_factory=ProducerStates)
    #: compaction: offsets below this were cleaned (the dirty part starts here)
    clean_end: int = 0
    #: compaction: [[end, ms], ...] ascending — offsets below `end` were first passed by the
    #: cleaner at `ms` (tombstones there go delete.retention.ms after it); at most PASS_MARKS_MAX
    clean_marks: list[list[int]] = field(default_factory=list)
    #: compaction: when the cleaner first passed the oldest tombstone it kept (-1: none kept)
    tombstone_ms: int = -1
    #: leader-epoch history: [[epoch, start_offset], ...], epochs and starts ascending; empty
    #: means epoch 0 from offset 0 (every partition before its first bump). At most LEADER_EPOCHS_MAX.
    leader_epochs: list[list[int]] = field(default_factory=list)
    #: the current leader epoch (the last history entry's; kept as a field: Produce reads it)
    leader_epoch: int = 0
    #: transactions: producer id -> first offset of its open transaction here (loglake.meta.txn)
    txn_open: dict[int, int] = field(default_factory=dict)
    #: transactions aborted here: [[producer id, first offset, abort marker offset], ...] ascending
    aborted_txns: list[list[int]] = field(default_factory=list)
    #: every offset below this was acknowledged durably (loglake.meta.acked); 0 = none recorded
    acked_end: int = 0

    def note_leader_epoch(self, epoch: int, start: int) -> None:
        """A new epoch from `start` on: entries at or past `start` are gone (truncated offsets)."""
        if epoch <= self.leader_epoch:
            raise ValueError(f"leader epoch {epoch} is not above the current {self.leader_epoch}")
        history = self.leader_epochs or [[0, 0]]
        history = [e for e in history if e[1] < start]
        history.append([epoch, start])
        if len(history) > LEADER_EPOCHS_MAX:
            del history[: len(history) - LEADER_EPOCHS_MAX]
        self.leader_epochs = history
        self.leader_epoch = epoch

    def epoch_history(self) -> list[list[int]]:
        """The history with the implicit first entry: [[0, 0]] before any bump."""
        return self.leader_epochs or [[0, 0]]

    def note_clean(self, end: int, ms: int) -> None:
        if end > self.clean_end:
            self.clean_end = end
            self.clean_marks.append([end, ms])
        self.clean_marks = [m for m in self.clean_marks if m[0] > self.log_start]
        while len(self.clean_marks) > PASS_MARKS_MAX:
            # merge the two oldest neighbours; the later time keeps tombstones longer, never shorter
            a, b = self.clean_marks[0], self.clean_marks[1]
            self.clean_marks[0:2] = [[b[0], max(a[1], b[1])]]


@dataclass(eq=False)
class GroupMeta:
    #: (topic, partition) -> [offset, leader_epoch, metadata, commit_ts_ms]
    offsets: dict[tuple[str, int], list[Any]] = field(default_factory=dict)
    state: dict[str, Any] | None = None


class MetaState:
    """Topics, partitions and their segment chains, producer ids, consumer groups."""

    def __init__(self, cluster_id: str = "") -> None:
        self.cluster_id = cluster_id
        self.seq = -1  # seq of the last record applied (-1: none)
        self.topics: dict[bytes, TopicMeta] = {}
        self.names: dict[str, bytes] = {}
        self.partitions: dict[tuple[bytes, int], PartitionMeta] = {}
        self.next_producer_id = 1000
        self.groups: dict[str, GroupMeta] = {}
        #: dynamic broker configs: scope ("" = cluster-wide default, else a node id) -> name -> value
        self.broker_configs: dict[str, dict[str, str]] = {}
        #: dynamic group configs: group id -> name -> value (independent of the group's offsets)
        self.group_configs: dict[str, dict[str, str]] = {}
        #: transactional id -> its last `txn` record body (loglake.meta.txn)
        self.txns: dict[str, dict[str, Any]] = {}
        #: ACL bindings, in the order they were created (loglake.meta.acls)
        self.acls: dict[tuple[int, str, int, str, str, int, int], None] = {}
        #: user -> SCRAM mechanism -> credential doc (loglake.meta.scram)
        self.scram: dict[str, dict[str, dict[str, Any]]] = {}
        #: client quota entity -> quota key -> value (loglake.meta.quotas)
        self.client_quotas: dict[EntityKey, dict[str, float]] = {}
        #: cluster partitions of durability class `object` (loglake.meta.cluster)
        self.plogs = PlogTable()
        #: the schema registry: schemas, subjects' versions, configs, modes (loglake.meta.schemas)
        self.schemas = SchemaTable()
        #: share-partition states (KIP-932): (group, topic id hex, partition) -> `share_state` body
        #: without its key ({"start", "end", "batches"}); loglake.broker.share.store reads them
        self.shares: dict[tuple[str, str, int], dict[str, Any]] = {}
        #: True while a log is replayed (recovery): records the engine applied live are applied too
        self.replaying = False

    # ---- reading ---------------------------------------------------------------------------

    def topic_by_name(self, name: str) -> TopicMeta | None:
        tid = self.names.get(name)
        return self.topics.get(tid) if tid is not None else None

    def partition(self, topic_id: bytes, index: int) -> PartitionMeta:
        return self.partitions[(topic_id, index)]

    def segment_count(self) -> int:
        return sum(len(pm.segments) for pm in self.partitions.values())

    def _new_partition(self, topic: TopicMeta, index: int) -> PartitionMeta:
        prefix = partition_prefix(self.cluster_id, topic.name, topic.topic_id.hex(), index)
        pm = PartitionMeta(topic.topic_id, index, SegmentTable(prefix))
        self.partitions[(topic.topic_id, index)] = pm
        return pm

    # ---- applying records --------------------------------------------------------------------

    def apply(self, kind: RecordKind, body: dict[str, Any]) -> None:
        """Move the state by one record. Raises KeyError/ValueError/TypeError on a record that
        does not fit the state (the store turns that into a CorruptionError on replay)."""
        handler = _APPLY.get(kind)
        if handler is None:
            raise ValueError(f"unknown metadata record kind {kind!r}")
        try:
            handler(self, body)
        except (AttributeError, IndexError, OverflowError, struct.error) as exc:  # a field of the wrong JSON type, length or size
            raise ValueError(f"{kind} record does not fit: {exc!r}") from None

    def _cluster(self, b: dict[str, Any]) -> None:
        self.cluster_id = str(b["cluster_id"])

    def _topic_created(self, b: dict[str, Any]) -> None:
        tid = bytes.fromhex(b["id"])
        name = str(b["name"])
        if name in self.names:
            raise ValueError(f"topic {name!r} created twice")
        topic = TopicMeta(name, tid, _partition_count(b["partitions"]), {str(k): str(v) for k, v in b["config"].items()}, int(b["created_ms"]), _replication_factor(b.get("rf", 1)))
        self.topics[tid] = topic
        self.names[name] = tid
        for i in range(topic.partitions):
            self._new_partition(topic, i)

    def _topic_deleted(self, b: dict[str, Any]) -> None:
        tid = bytes.fromhex(b["id"])
        topic = self.topics.pop(tid)
        self.names.pop(topic.name, None)
        for i in range(topic.partitions):
            self.partitions.pop((tid, i), None)
        drop_topic(self.plogs, tid, int(b.get("ms", 0)))  # cluster mode: its objects go to the sweep
        for key in [k for k in self.shares if k[1] == b["id"]]:  # share-partitions go with their topic
            del self.shares[key]
        for group in self.groups.values():  # Kafka expires offsets of deleted topics too
            for tp in [tp for tp in group.offsets if tp[0] == topic.name]:
                del group.offsets[tp]

    def _topic_config(self, b: dict[str, Any]) -> None:
        self.topics[bytes.fromhex(b["id"])].config = {str(k): str(v) for k, v in b["config"].items()}

    def _partitions_added(self, b: dict[str, Any]) -> None:
        topic = self.topics[bytes.fromhex(b["id"])]
        total = _partition_count(b["total"])
        for i in range(topic.partitions, total):
            self._new_partition(topic, i)
        topic.partitions = max(topic.partitions, total)

    def _segment_published(self, b: dict[str, Any]) -> None:
        pm = self.partitions[(bytes.fromhex(b["id"]), int(b["p"]))]
        ref = SegmentRef.from_json(pm.segments.key_for(int(b["seg"][0])), b["seg"])
        pm.segments.append(ref)
        pm.sealed_end = max(pm.sealed_end, ref.end_offset)
        pm.chain_hash = ref.link_hash
        if self.replaying:
            for pid, epoch, first_seq, count, base in b.get("producers", ()):
                pm.producers.record(int(pid), int(epoch), int(first_seq), int(count), int(base))

    def _segment_tier(self, b: dict[str, Any]) -> None:
        pm = self.partitions.get((bytes.fromhex(b["id"]), int(b["p"])))
        if pm is not None:  # a segment dropped by retention meanwhile has nothing to move
            pm.segments.set_tier(int(b["base"]), Tier(str(b["tier"])))

    def _log_start(self, b: dict[str, Any]) -> None:
        pm = self.partitions[(bytes.fromhex(b["id"]), int(b["p"]))]
        offset = int(b["offset"])
        if offset > pm.log_start:
            pm.log_start = offset
            pm.segments.drop_below(offset)
            history = pm.leader_epochs  # epochs wholly below the log start are never asked for
            while len(history) > 1 and history[1][1] <= offset:
                del history[0]
            trim_aborted(pm, offset)

    def _segment_rewritten(self, b: dict[str, Any]) -> None:
        pm = self.partitions[(bytes.fromhex(b["id"]), int(b["p"]))]
        replaced = [(int(base), int(gen)) for base, gen in b["replaced"]]
        table = pm.segments
        start = table.find_base(replaced[0][0])
        if start is None:
            raise ValueError(f"rewrite of a segment at {replaced[0][0]} that the table does not hold")
        for i, (base, gen) in enumerate(replaced):
            j = start + i
            if j >= len(table) or table.base_at(j) != base or table.generation_at(j) != gen:
                raise ValueError(f"rewrite names segment {base} generation {gen}, which is not in place")
        refs = [SegmentRef.from_json(table.key_for(int(seg[0]), int(seg[9])), seg) for seg in b["segs"]]
        table.replace(start, start + len(replaced), refs)
        clean = b.get("clean")
        if clean:
            pm.note_clean(int(clean["end"]), int(clean["ms"]))
            pm.tombstone_ms = int(clean.get("tomb_ms", -1))

    def _producer_ids(self, b: dict[str, Any]) -> None:
        expect = b.get("expect")
        if expect is not None and int(expect) != self.next_producer_id:
            # another writer took that id first (cluster mode: brokers race for ids)
            raise ValueError(f"producer id {expect} was taken; the next one is {self.next_producer_id}")
        self.next_producer_id = max(self.next_producer_id, int(b["next"]))

    def _offset_commit(self, b: dict[str, Any]) -> None:
        group = self.groups.setdefault(str(b["g"]), GroupMeta())
        for topic, partition, offset, epoch, metadata, ts in b["rows"]:
            group.offsets[(str(topic), int(partition))] = [int(offset), int(epoch), str(metadata), int(ts)]

    def _offset_expire(self, b: dict[str, Any]) -> None:
        group = self.groups.get(str(b["g"]))
        if group is None:
            return
        for topic, partition in b["tps"]:
            group.offsets.pop((str(topic), int(partition)), None)
        if not group.offsets and group.state is None:
            del self.groups[str(b["g"])]

    def _plog_leader(self, b: dict[str, Any]) -> None:
        """A cluster partition's new leader epoch (loglake.meta.cluster); it also enters the
        partition's epoch history, starting at the committed end as this record applies: every
        commit is guarded by its epoch, so nothing of an older epoch lands after this and the new
        leader's first range starts exactly there."""
        apply_plog_leader(self, b)
        tp = (bytes.fromhex(str(b["id"])), int(b["p"]))
        pm = self.partitions.get(tp)
        epoch = int(b["epoch"])
        if pm is not None and epoch > pm.leader_epoch:
            pm.note_leader_epoch(epoch, self.plogs.parts[tp].end)

    def _plog_compacted(self, b: dict[str, Any]) -> None:
        """A cluster partition's compaction: the segment switch (loglake.meta.cluster), then the
        pass's clean end and marks, kept where a single node keeps them (`PartitionMeta`)."""
        end, ms, tomb_ms = (int(x) for x in b["clean"])  # read first: a bad record changes nothing
        apply_plog_compacted(self, b)
        pm = self.partitions.get((bytes.fromhex(str(b["id"])), int(b["p"])))
        if pm is not None:
            pm.note_clean(end, ms)
            pm.tombstone_ms = tomb_ms

    def _plog_start(self, b: dict[str, Any]) -> None:
        """A cluster partition's new log start (loglake.meta.cluster); aborted-transaction entries
        whose marker is below it go, as a single node's log start record drops them."""
        apply_plog_start(self, b)
        pm = self.partitions.get((bytes.fromhex(str(b["id"])), int(b["p"])))
        if pm is not None:
            trim_aborted(pm, int(b["start"]))

    def _leader_epoch(self, b: dict[str, Any]) -> None:
        pm = self.partitions[(bytes.fromhex(b["id"]), int(b["p"]))]
        pm.note_leader_epoch(int(b["epoch"]), int(b["start"]))

    def _group_deleted(self, b: dict[str, Any]) -> None:
        self.groups.pop(str(b["g"]), None)

    def _group_state(self, b: dict[str, Any]) -> None:
        state = b.get("state")
        if state is None:
            group = self.groups.get(str(b["g"]))
            if group is not None:
                group.state = None
                if not group.offsets:
                    del self.groups[str(b["g"])]
            return
        if not isinstance(state, dict):
            raise ValueError("group state is not an object")
        self.groups.setdefault(str(b["g"]), GroupMeta()).state = state

    def _broker_config(self, b: dict[str, Any]) -> None:
        _replace_configs(self.broker_configs, str(b["scope"]), b["configs"])

    def _group_config(self, b: dict[str, Any]) -> None:
        _replace_configs(self.group_configs, str(b["g"]), b["configs"])

    def _share_state(self, b: dict[str, Any]) -> None:
        key = (str(b["g"]), str(b["id"]), int(b["p"]))
        if b.get("start") is None:
            self.shares.pop(key, None)
            return
        self.shares[key] = share_doc(b)


def share_doc(b: dict[str, Any]) -> dict[str, Any]:
    """A share-partition state as kept: its offsets checked for type (ValueError/TypeError if not ints)."""
    start, end, gen = int(b["start"]), int(b["end"]), int(b.get("gen", 0))
    batches = [[int(f), int(last), int(st), int(n)] for f, last, st, n in b.get("batches") or []]
    if not (0 <= start <= end or start == end == -1):
        raise ValueError(f"share state start {start} end {end}")
    doc: dict[str, Any] = {"start": start, "end": end, "batches": batches}
    if gen:
        doc["gen"] = gen
    return doc


def _replace_configs(table: dict[str, dict[str, str]], key: str, configs: Any) -> None:
    if not isinstance(configs, dict):
        raise ValueError("configs is not an object")
    if configs:
        table[key] = {str(k): str(v) for k, v in configs.items()}
    else:
        table.pop(key, None)


_APPLY: dict[str, Callable[[MetaState, dict[str, Any]], None]] = {
    RecordKind.CLUSTER: MetaState._cluster,
    RecordKind.TOPIC_CREATED: MetaState._topic_created,
    RecordKind.TOPIC_DELETED: MetaState._topic_deleted,
    RecordKind.TOPIC_CONFIG: MetaState._topic_config,
    RecordKind.PARTITIONS_ADDED: MetaState._partitions_added,
    RecordKind.SEGMENT_PUBLISHED: MetaState._segment_published,
    RecordKind.SEGMENT_TIER: MetaState._segment_tier,
    RecordKind.LOG_START: MetaState._log_start,
    RecordKind.PRODUCER_IDS: MetaState._producer_ids,
    RecordKind.OFFSET_COMMIT: MetaState._offset_commit,
    RecordKind.OFFSET_EXPIRE: MetaState._offset_expire,
    RecordKind.GROUP_DELETED: MetaState._group_deleted,
    RecordKind.GROUP_STATE: MetaState._group_state,
    RecordKind.SEGMENT_REWRITTEN: MetaState._segment_rewritten,
    RecordKind.BROKER_CONFIG: MetaState._broker_config,
    RecordKind.GROUP_CONFIG: MetaState._group_config,
    RecordKind.LEADER_EPOCH: MetaState._leader_epoch,
    RecordKind.TXN: apply_txn,
    RecordKind.ACKED: apply_acked,
    RecordKind.ACLS: apply_acls,
    RecordKind.SCRAM_CREDENTIAL: apply_scram,
    RecordKind.CLIENT_QUOTA: apply_client_quota,
    RecordKind.PLOG_LEADER: MetaState._plog_leader,
    RecordKind.PLOG_COMMIT: apply_plog_commit,
    RecordKind.PLOG_MERGED: apply_plog_merged,
    RecordKind.PLOG_SWEPT: apply_plog_swept,
    RecordKind.PLOG_START: MetaState._plog_start,
    RecordKind.SCHEMA_VERSION: apply_schema_version,
    RecordKind.SCHEMA_DELETED: apply_schema_deleted,
    RecordKind.SCHEMA_CONFIG: apply_schema_config,
    RecordKind.SCHEMA_MODE: apply_schema_mode,
    RecordKind.SHARE_STATE: MetaState._share_state,
    RecordKind.PLOG_COMPACTED: MetaState._plog_compacted,
}
assert set(_APPLY) == set(RecordKind)


def _replication_factor(value: Any) -> int:
    n = int(value)
    if not 1 <= n <= REPLICATION_FACTOR_MAX:
        raise ValueError(f"replication factor {n} outside 1..{REPLICATION_FACTOR_MAX}")
    return n


def _partition_count(value: Any) -> int:
    n = int(value)
    if not 0 <= n <= PARTITIONS_PER_TOPIC_MAX:
        raise ValueError(f"partition count {n} outside 0..{PARTITIONS_PER_TOPIC_MAX}")
    return n
