"""The metadata records: their kinds with the on-disk codes, their typed bodies, their bytes.

Every durable change of metadata is one record: a kind and a small JSON object (its body).
This module is the one owner of both. `RecordKind` lists every kind with the code it is
written as, spelled out (docs/FORMAT.md, "Records", prints the same table; tests/
test_meta_records.py checks the two agree, and that no other module spells a code or writes
a record by its kind's name). A code never changes and is never reused: adding a kind appends
a member with the next code.

Writers build a typed record per kind (`TopicCreated`, `SegmentPublished`, `PlogCommit`, ...):
a frozen dataclass whose `kind` is its class's and whose `body()` is the JSON object written,
key for key and value for value what the releases before these types wrote, so the bytes on
disk did not change. A metadata store takes the record whole (`MetaStore.append(record)`),
encodes `body()` with `encode_record` and applies the same body to its state
(`loglake.meta.state.MetaState.apply`, which, like replay, reads the dict).

`RawRecord` carries a body as given: for tests that craft records older releases wrote (a
`topic_deleted` without `ms`, a `producer_ids` without `expect`) or malformed ones. Production
code writes typed records only.

Layout of an encoded record: version u8 (`RECORD_VERSION`) · kind u8 (its code) · the body as
compact UTF-8 JSON (at most `RECORD_BYTES_MAX`).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from loglake.errors import CorruptionError, MetaRecordRejectedError
from loglake.meta.cluster import PlogSegment
from loglake.meta.lifecycle import Tier
from loglake.meta.quotas import EntityKey
from loglake.meta.segments import SegmentRef
from loglake.meta.txn_states import TxnState, parse_txn_state

__all__ = [
    "RECORD_BYTES_MAX",
    "RECORD_TYPES",
    "RECORD_VERSION",
    "Acked",
    "AckedRow",
    "Acls",
    "BrokerConfig",
    "ClientQuota",
    "Cluster",
    "GroupConfig",
    "GroupDeleted",
    "GroupState",
    "JsonDoc",
    "LeaderEpoch",
    "LogStart",
    "MetaRecord",
    "OffsetCommit",
    "OffsetExpire",
    "OffsetRow",
    "PartitionsAdded",
    "PlogCommit",
    "PlogCommitRow",
    "PlogCompacted",
    "PlogLeader",
    "PlogMerged",
    "PlogStart",
    "PlogSwept",
    "ProducerIds",
    "RawRecord",
    "RecordKind",
    "SchemaConfig",
    "SchemaDeleted",
    "SchemaMode",
    "SchemaVersion",
    "ScramCredentialSet",
    "SegmentPublished",
    "SegmentRewritten",
    "SegmentTier",
    "ShareState",
    "TopicConfigSet",
    "TopicCreated",
    "TopicDeleted",
    "TxnRecord",
    "decode_record",
    "encode_record",
]

#: Version byte in front of every record's JSON body.
RECORD_VERSION = 1
#: Largest record body accepted (a group state with 1,000 members fits easily).
RECORD_BYTES_MAX = 16 * 1024 * 1024


class RecordKind(enum.StrEnum):
    """A record kind: its name (the member's value, as docs/FORMAT.md and logs say it) and the
    code it is written as (`code`). Codes are on disk: never change or reuse one."""

    code: int

    def __new__(cls, name: str, code: int) -> RecordKind:
        member = str.__new__(cls, name)
        member._value_ = name
        member.code = code
        return member

    CLUSTER = "cluster", 1
    TOPIC_CREATED = "topic_created", 2
    TOPIC_DELETED = "topic_deleted", 3
    TOPIC_CONFIG = "topic_config", 4
    PARTITIONS_ADDED = "partitions_added", 5
    SEGMENT_PUBLISHED = "segment_published", 6
    SEGMENT_TIER = "segment_tier", 7
    LOG_START = "log_start", 8
    PRODUCER_IDS = "producer_ids", 9
    OFFSET_COMMIT = "offset_commit", 10
    OFFSET_EXPIRE = "offset_expire", 11
    GROUP_DELETED = "group_deleted", 12
    GROUP_STATE = "group_state", 13
    SEGMENT_REWRITTEN = "segment_rewritten", 14
    BROKER_CONFIG = "broker_config", 15
    GROUP_CONFIG = "group_config", 16
    LEADER_EPOCH = "leader_epoch", 17
    TXN = "txn", 18
    ACKED = "acked", 19
    ACLS = "acls", 20
    SCRAM_CREDENTIAL = "scram_credential", 21
    CLIENT_QUOTA = "client_quota", 22
    PLOG_LEADER = "plog_leader", 23
    PLOG_COMMIT = "plog_commit", 24
    PLOG_MERGED = "plog_merged", 25
    PLOG_SWEPT = "plog_swept", 26
    PLOG_START = "plog_start", 27
    SCHEMA_VERSION = "schema_version", 28
    SCHEMA_DELETED = "schema_deleted", 29
    SCHEMA_CONFIG = "schema_config", 30
    SCHEMA_MODE = "schema_mode", 31
    SHARE_STATE = "share_state", 32
    PLOG_COMPACTED = "plog_compacted", 33


#: code -> kind (index 0 unused): decoding is one index
_BY_CODE: tuple[RecordKind | None, ...] = tuple(
    {k.code: k for k in RecordKind}.get(code) for code in range(max(k.code for k in RecordKind) + 1)
)
assert len({k.code for k in RecordKind}) == len(RecordKind), "two kinds share a code"
assert 0 not in {k.code for k in RecordKind} and max(k.code for k in RecordKind) < 256
#: kind -> code (a plain dict: a kind's name looks its code up too, so a test's raw record may name it)
_CODES: dict[str, int] = {k: k.code for k in RecordKind}


class MetaRecord(Protocol):
    """What a metadata store appends: a kind and the JSON body written for it."""

    @property
    def kind(self) -> RecordKind: ...

    def body(self) -> dict[str, Any]:
        """The record's JSON object (a new dict: the store applies it to its state)."""
        ...


# ---- encoding ------------------------------------------------------------------------------------


def encode_record(kind: RecordKind, body: dict[str, Any]) -> bytes:
    """version u8 · kind u8 · JSON body (UTF-8, compact)."""
    code = _CODES.get(kind)
    if code is None:
        raise ValueError(f"unknown metadata record kind {kind!r}")
    data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(data) > RECORD_BYTES_MAX:
        raise ValueError(
            f"metadata record {kind} is {len(data)} bytes, over the {RECORD_BYTES_MAX}-byte limit"
        )
    return bytes((RECORD_VERSION, code)) + data


def decode_record(raw: bytes | memoryview, *, where: str, position: int) -> tuple[RecordKind, dict[str, Any]]:
    if len(raw) < 2:
        raise CorruptionError(where, position, "metadata record shorter than its header")
    version, code = raw[0], raw[1]
    if version != RECORD_VERSION:
        raise CorruptionError(where, position, f"metadata record version {version} is not supported (want 1)")
    kind = _BY_CODE[code] if code < len(_BY_CODE) else None
    if kind is None:
        raise CorruptionError(where, position, f"unknown metadata record kind {code}")
    try:
        body = json.loads(bytes(raw[2:]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptionError(where, position, f"metadata record body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise CorruptionError(where, position, "metadata record body is not an object")
    return kind, body


# ---- the typed records -----------------------------------------------------------------------------
# Fields are the body's values in the body's order (optional ones last); `topic_id` is the topic
# id in hex, as written.
# Rows are tuples here and lists in the body (JSON writes both alike; the state reads lists).

#: offset_commit row: topic, partition, offset, leader_epoch, metadata, commit_ts_ms
#: A JSON object stored in a record as its writer gave it (a group's state, a SCRAM credential, a
#: transactional id's body): `json.loads` types every JSON value as Any, so this alias is where
#: that third-party typing shows; readers check the shapes they use.
JsonDoc = dict[str, Any]

OffsetRow = tuple[str, int, int, int, str, int]
#: acked row: topic id hex, partition, acknowledged end
AckedRow = tuple[str, int, int]
#: plog_commit row: topic id hex, partition, epoch, base, last, position, length, record_count,
#: max_ts, crc32c, batch_count (the flush object's index entry)
PlogCommitRow = tuple[str, int, int, int, int, int, int, int, int, int, int]


@dataclass(frozen=True, slots=True)
class RawRecord:
    """A body as given, for tests of records older releases wrote or of malformed ones."""

    kind: RecordKind
    raw: dict[str, Any]

    def body(self) -> dict[str, Any]:
        return self.raw


@dataclass(frozen=True, slots=True)
class Cluster:
    """The cluster id: the first record of a new data directory (restated to compact the log)."""

    kind: ClassVar[RecordKind] = RecordKind.CLUSTER
    cluster_id: str

    def body(self) -> dict[str, Any]:
        return {"cluster_id": self.cluster_id}


@dataclass(frozen=True, slots=True)
class TopicCreated:
    kind: ClassVar[RecordKind] = RecordKind.TOPIC_CREATED
    name: str
    topic_id: str
    partitions: int
    config: Mapping[str, str]  # the topic's overrides
    created_ms: int
    #: how many brokers Metadata reports as each partition's replicas (cluster mode); written as
    #: `rf` only when not 1, so a single node's records are the bytes they always were
    replication_factor: int = 1

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": self.name,
            "id": self.topic_id,
            "partitions": self.partitions,
            "config": dict(self.config),
            "created_ms": self.created_ms,
        }
        if self.replication_factor != 1:
            body["rf"] = self.replication_factor
        return body


@dataclass(frozen=True, slots=True)
class TopicDeleted:
    kind: ClassVar[RecordKind] = RecordKind.TOPIC_DELETED
    topic_id: str
    ms: int  # the deleting broker's clock: starts cluster mode's sweep grace for its objects

    def body(self) -> dict[str, Any]:
        return {"id": self.topic_id, "ms": self.ms}


@dataclass(frozen=True, slots=True)
class TopicConfigSet:
    """A topic's config overrides, replaced whole (kind `topic_config`)."""

    kind: ClassVar[RecordKind] = RecordKind.TOPIC_CONFIG
    topic_id: str
    config: Mapping[str, str]

    def body(self) -> dict[str, Any]:
        return {"id": self.topic_id, "config": dict(self.config)}


@dataclass(frozen=True, slots=True)
class PartitionsAdded:
    kind: ClassVar[RecordKind] = RecordKind.PARTITIONS_ADDED
    topic_id: str
    total: int

    def body(self) -> dict[str, Any]:
        return {"id": self.topic_id, "total": self.total}


@dataclass(frozen=True, slots=True)
class SegmentPublished:
    """A sealed segment joins the chain (one per seal). `producers`: [pid, epoch, first_seq,
    count, base] of its batches."""

    kind: ClassVar[RecordKind] = RecordKind.SEGMENT_PUBLISHED
    topic_id: str
    partition: int
    seg: SegmentRef
    producers: list[list[int]]

    def body(self) -> dict[str, Any]:
        return {
            "id": self.topic_id,
            "p": self.partition,
            "seg": self.seg.to_json(),
            "producers": self.producers,
        }


@dataclass(frozen=True, slots=True)
class SegmentTier:
    kind: ClassVar[RecordKind] = RecordKind.SEGMENT_TIER
    topic_id: str
    partition: int
    base: int
    tier: Tier

    def body(self) -> dict[str, Any]:
        return {"id": self.topic_id, "p": self.partition, "base": self.base, "tier": self.tier}


@dataclass(frozen=True, slots=True)
class LogStart:
    kind: ClassVar[RecordKind] = RecordKind.LOG_START
    topic_id: str
    partition: int
    offset: int

    def body(self) -> dict[str, Any]:
        return {"id": self.topic_id, "p": self.partition, "offset": self.offset}


@dataclass(frozen=True, slots=True)
class ProducerIds:
    """The next producer id to hand out; applies only while `expect` is still the next one."""

    kind: ClassVar[RecordKind] = RecordKind.PRODUCER_IDS
    next_id: int
    expect: int

    def body(self) -> dict[str, Any]:
        return {"next": self.next_id, "expect": self.expect}


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    kind: ClassVar[RecordKind] = RecordKind.OFFSET_COMMIT
    group: str
    rows: Sequence[OffsetRow]

    def body(self) -> dict[str, Any]:
        return {"g": self.group, "rows": [list(r) for r in self.rows]}


@dataclass(frozen=True, slots=True)
class OffsetExpire:
    kind: ClassVar[RecordKind] = RecordKind.OFFSET_EXPIRE
    group: str
    partitions: Sequence[tuple[str, int]]

    def body(self) -> dict[str, Any]:
        return {"g": self.group, "tps": [list(tp) for tp in self.partitions]}


@dataclass(frozen=True, slots=True)
class GroupDeleted:
    kind: ClassVar[RecordKind] = RecordKind.GROUP_DELETED
    group: str

    def body(self) -> dict[str, Any]:
        return {"g": self.group}


@dataclass(frozen=True, slots=True)
class GroupState:
    """A group's persisted membership document (opaque here; None removes it)."""

    kind: ClassVar[RecordKind] = RecordKind.GROUP_STATE
    group: str
    state: dict[str, Any] | None

    def body(self) -> dict[str, Any]:
        return {"g": self.group, "state": self.state}


@dataclass(frozen=True, slots=True)
class SegmentRewritten:
    """A compaction or merge: `replaced` (consecutive, in place) become `segs`. `clean`
    ({end, ms, tomb_ms}, compaction only) is left out of the body when None."""

    kind: ClassVar[RecordKind] = RecordKind.SEGMENT_REWRITTEN
    topic_id: str
    partition: int
    replaced: Sequence[SegmentRef]
    segs: Sequence[SegmentRef]
    clean: Mapping[str, int] | None = None

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.topic_id,
            "p": self.partition,
            "replaced": [[s.base_offset, s.generation] for s in self.replaced],
            "segs": [s.to_json() for s in self.segs],
        }
        if self.clean is not None:
            body["clean"] = dict(self.clean)
        return body


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """The dynamic broker configs of `scope` ("" cluster-wide, else a node id), replaced; {} removes."""

    kind: ClassVar[RecordKind] = RecordKind.BROKER_CONFIG
    scope: str
    configs: Mapping[str, str]

    def body(self) -> dict[str, Any]:
        return {"scope": self.scope, "configs": dict(self.configs)}


@dataclass(frozen=True, slots=True)
class GroupConfig:
    kind: ClassVar[RecordKind] = RecordKind.GROUP_CONFIG
    group: str
    configs: Mapping[str, str]

    def body(self) -> dict[str, Any]:
        return {"g": self.group, "configs": dict(self.configs)}


@dataclass(frozen=True, slots=True)
class LeaderEpoch:
    kind: ClassVar[RecordKind] = RecordKind.LEADER_EPOCH
    topic_id: str
    partition: int
    epoch: int
    start: int
    reason: str  # for people

    def body(self) -> dict[str, Any]:
        return {
            "id": self.topic_id,
            "p": self.partition,
            "epoch": self.epoch,
            "start": self.start,
            "reason": self.reason,
        }


#: txn rows: parts [topic id hex, partition, first offset]; offsets [topic, partition, offset,
#: leader_epoch, metadata]; markers [topic id hex, partition, marker offset]
TxnPartRow = tuple[str, int, int]
TxnOffsetRow = tuple[str, int, int, int, str | None]


@dataclass(frozen=True, slots=True)
class TxnRecord:
    """A transactional id's whole state (loglake.meta.txn). `names` (the topic name of each
    part; absent from records of releases before it) and `markers` (complete_abort) are left
    out of the body when None, as is `attempt` (prepare states: names the transaction's ending)."""

    kind: ClassVar[RecordKind] = RecordKind.TXN
    tid: str
    pid: int
    epoch: int
    state: TxnState
    timeout_ms: int
    start_ms: int
    last_ms: int
    parts: Sequence[TxnPartRow]
    groups: Sequence[str]
    offsets: Mapping[str, Sequence[TxnOffsetRow]]
    names: Sequence[str] | None = None
    markers: Sequence[TxnPartRow] | None = None
    #: names the transaction's ending (prepare states; cluster mode's leaders report markers under it)
    attempt: str | None = None

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "tid": self.tid,
            "pid": self.pid,
            "epoch": self.epoch,
            "state": self.state.value,
            "timeout_ms": self.timeout_ms,
            "start_ms": self.start_ms,
            "last_ms": self.last_ms,
            "parts": [list(r) for r in self.parts],
        }
        if self.names is not None:
            body["names"] = list(self.names)
        body["groups"] = list(self.groups)
        body["offsets"] = {g: [list(r) for r in rows] for g, rows in self.offsets.items()}
        if self.markers is not None:
            body["markers"] = [list(r) for r in self.markers]
        if self.attempt is not None:
            body["attempt"] = self.attempt
        return body

    @classmethod
    def from_body(cls, b: Mapping[str, Any]) -> TxnRecord:
        """The record of a body shaped as `body()` writes it (the transaction coordinator's
        document, loglake.broker.txn.coordinator.Txn.body). Another shape, a state no release
        wrote or a key this record does not know (it would be lost) is refused as the store
        refuses a record that does not apply: MetaRecordRejectedError, nothing logged."""
        try:
            unknown = set(b) - _TXN_KEYS
            if unknown:
                raise ValueError(f"unknown fields {sorted(unknown)}")
            names, markers = b.get("names"), b.get("markers")
            return cls(
                str(b["tid"]),
                int(b["pid"]),
                int(b["epoch"]),
                parse_txn_state(b["state"]),
                int(b["timeout_ms"]),
                int(b["start_ms"]),
                int(b["last_ms"]),
                [(str(t), int(p), int(f)) for t, p, f in b["parts"]],
                [str(g) for g in b["groups"]],
                {
                    str(g): [
                        (str(t), int(p), int(o), int(e), None if m is None else str(m))
                        for t, p, o, e, m in rows
                    ]
                    for g, rows in b["offsets"].items()
                },
                None if names is None else [str(n) for n in names],
                None if markers is None else [(str(t), int(p), int(m)) for t, p, m in markers],
                None if b.get("attempt") is None else str(b["attempt"]),
            )
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise MetaRecordRejectedError(f"metadata record {cls.kind} does not apply: {exc!r}") from None


_TXN_KEYS = frozenset(
    {
        "attempt",
        "tid",
        "pid",
        "epoch",
        "state",
        "timeout_ms",
        "start_ms",
        "last_ms",
        "parts",
        "names",
        "groups",
        "offsets",
        "markers",
    }
)


@dataclass(frozen=True, slots=True)
class Acked:
    """Acknowledged ends raised (at most loglake.meta.acked.ACKED_PARTS_MAX rows a record)."""

    kind: ClassVar[RecordKind] = RecordKind.ACKED
    parts: Sequence[AckedRow]

    def body(self) -> dict[str, Any]:
        return {"parts": [list(r) for r in self.parts]}


@dataclass(frozen=True, slots=True)
class Acls:
    """ACL bindings (JSON rows, loglake.meta.acls.Binding's fields) removed, then added."""

    kind: ClassVar[RecordKind] = RecordKind.ACLS
    created: Sequence[Sequence[object]]
    deleted: Sequence[Sequence[object]]

    def body(self) -> dict[str, Any]:
        return {"created": [list(r) for r in self.created], "deleted": [list(r) for r in self.deleted]}


@dataclass(frozen=True, slots=True)
class ScramCredentialSet:
    """One user's SCRAM credential for one mechanism (loglake.meta.scram.credential_body's
    document), set; None removes it (kind `scram_credential`)."""

    kind: ClassVar[RecordKind] = RecordKind.SCRAM_CREDENTIAL
    user: str
    mechanism: str
    cred: Mapping[str, Any] | None

    def body(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "mechanism": self.mechanism,
            "cred": None if self.cred is None else dict(self.cred),
        }


@dataclass(frozen=True, slots=True)
class ClientQuota:
    """One client quota entity's configs, replaced; None or {} removes the entity."""

    kind: ClassVar[RecordKind] = RecordKind.CLIENT_QUOTA
    entity: EntityKey
    values: Mapping[str, float] | None

    def body(self) -> dict[str, Any]:
        return {
            "entity": [[t, n] for t, n in self.entity],
            "values": dict(self.values) if self.values else None,
        }


@dataclass(frozen=True, slots=True)
class PlogLeader:
    kind: ClassVar[RecordKind] = RecordKind.PLOG_LEADER
    topic_id: str
    partition: int
    epoch: int
    leader: int  # node id

    def body(self) -> dict[str, Any]:
        return {"id": self.topic_id, "p": self.partition, "epoch": self.epoch, "leader": self.leader}


@dataclass(frozen=True, slots=True)
class PlogCommit:
    """Flush-object ranges committed (one per flush chunk)."""

    kind: ClassVar[RecordKind] = RecordKind.PLOG_COMMIT
    key: str  # the flush object
    ranges: Sequence[PlogCommitRow]

    def body(self) -> dict[str, Any]:
        return {"key": self.key, "ranges": [list(r) for r in self.ranges]}


@dataclass(frozen=True, slots=True)
class PlogMerged:
    """The partition's first `n` ranges replaced by a merged segment, under leader epoch `epoch`."""

    kind: ClassVar[RecordKind] = RecordKind.PLOG_MERGED
    topic_id: str
    partition: int
    epoch: int
    ms: int
    n: int
    seg: PlogSegment

    def body(self) -> dict[str, Any]:
        return {
            "id": self.topic_id,
            "p": self.partition,
            "epoch": self.epoch,
            "ms": self.ms,
            "n": self.n,
            "seg": self.seg.row(),
        }


@dataclass(frozen=True, slots=True)
class PlogSwept:
    kind: ClassVar[RecordKind] = RecordKind.PLOG_SWEPT
    keys: Sequence[str]

    def body(self) -> dict[str, Any]:
        return {"keys": list(self.keys)}


@dataclass(frozen=True, slots=True)
class PlogStart:
    """The partition's log start offset raised to `start` (DeleteRecords, retention) by its leader
    at epoch `epoch`; what falls wholly below leaves the partition at `ms` (for the sweep)."""

    kind: ClassVar[RecordKind] = RecordKind.PLOG_START
    topic_id: str
    partition: int
    epoch: int
    ms: int
    start: int

    def body(self) -> dict[str, Any]:
        return {"id": self.topic_id, "p": self.partition, "epoch": self.epoch, "ms": self.ms, "start": self.start}


@dataclass(frozen=True, slots=True)
class SchemaVersion:
    """A schema registered as a subject's next version (loglake.meta.schemas)."""

    kind: ClassVar[RecordKind] = RecordKind.SCHEMA_VERSION
    subject: str
    version: int
    schema_id: int
    schema_type: str
    schema: str
    refs: Sequence[tuple[str, str, int]]

    def body(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "version": self.version,
            "id": self.schema_id,
            "type": self.schema_type,
            "schema": self.schema,
            "refs": [list(r) for r in self.refs],
        }


@dataclass(frozen=True, slots=True)
class SchemaDeleted:
    """A subject's versions soft-deleted, or removed when `permanent`."""

    kind: ClassVar[RecordKind] = RecordKind.SCHEMA_DELETED
    subject: str
    versions: Sequence[int]
    permanent: bool

    def body(self) -> dict[str, Any]:
        return {"subject": self.subject, "versions": list(self.versions), "permanent": self.permanent}


@dataclass(frozen=True, slots=True)
class SchemaConfig:
    """A subject's registry config ("" the global one), replaced; {} removes it."""

    kind: ClassVar[RecordKind] = RecordKind.SCHEMA_CONFIG
    subject: str
    config: Mapping[str, str]

    def body(self) -> dict[str, Any]:
        return {"subject": self.subject, "config": dict(self.config)}


@dataclass(frozen=True, slots=True)
class SchemaMode:
    """A subject's registry mode ("" the global one); None removes it."""

    kind: ClassVar[RecordKind] = RecordKind.SCHEMA_MODE
    subject: str
    mode: str | None

    def body(self) -> dict[str, Any]:
        return {"subject": self.subject, "mode": self.mode}


@dataclass(frozen=True, slots=True)
class ShareState:
    """A share-partition's state (KIP-932), replaced whole: the share-partition start offset
    `start`, the first offset never acquired `end`, and `batches` of `[first, last, state,
    delivery_count]` for offsets in [start, end) (state: loglake.broker.share.states.RecordState's
    value; an offset of the range in no batch was never a record). `start` -1 (with `end` -1):
    uninitialised, the next leader starts it from `share.auto.offset.reset`. `gen` moves when an
    admin alters or deletes the state, so a leader holding it in memory loads it again; written
    only when not 0. `start` None removes it."""

    kind: ClassVar[RecordKind] = RecordKind.SHARE_STATE
    group: str
    topic_id: str
    partition: int
    start: int | None
    end: int = 0
    batches: Sequence[tuple[int, int, int, int]] = ()
    gen: int = 0

    def body(self) -> dict[str, Any]:
        if self.start is None:
            return {"g": self.group, "id": self.topic_id, "p": self.partition, "start": None}
        body: dict[str, Any] = {"g": self.group, "id": self.topic_id, "p": self.partition, "start": self.start,
                                "end": self.end, "batches": [list(b) for b in self.batches]}
        if self.gen:
            body["gen"] = self.gen
        return body


@dataclass(frozen=True, slots=True)
class PlogCompacted:
    """The partition's merged segments `old` (keys, consecutive) replaced by the compacted
    `segs` under leader epoch `epoch`; `clean` is the pass's (clean end, ms, oldest kept
    tombstone's first-pass ms or -1)."""

    kind: ClassVar[RecordKind] = RecordKind.PLOG_COMPACTED
    topic_id: str
    partition: int
    epoch: int
    ms: int
    old: Sequence[str]
    segs: Sequence[PlogSegment]
    clean: tuple[int, int, int]

    def body(self) -> dict[str, Any]:
        return {
            "id": self.topic_id,
            "p": self.partition,
            "epoch": self.epoch,
            "ms": self.ms,
            "old": list(self.old),
            "segs": [s.row() for s in self.segs],
            "clean": list(self.clean),
        }


#: The typed record of every kind.
RECORD_TYPES: dict[RecordKind, type[MetaRecord]] = {
    t.kind: t
    for t in (
        Cluster,
        TopicCreated,
        TopicDeleted,
        TopicConfigSet,
        PartitionsAdded,
        SegmentPublished,
        SegmentTier,
        LogStart,
        ProducerIds,
        OffsetCommit,
        OffsetExpire,
        GroupDeleted,
        GroupState,
        SegmentRewritten,
        BrokerConfig,
        GroupConfig,
        LeaderEpoch,
        TxnRecord,
        Acked,
        Acls,
        ScramCredentialSet,
        ClientQuota,
        PlogLeader,
        PlogCommit,
        PlogMerged,
        PlogSwept,
        PlogStart,
        SchemaVersion,
        SchemaDeleted,
        SchemaConfig,
        SchemaMode,
        ShareState,
        PlogCompacted,
    )
}
assert set(RECORD_TYPES) == set(RecordKind), "a kind without its typed record"
