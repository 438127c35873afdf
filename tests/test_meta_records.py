"""The metadata records (`loglake.meta.records`): one table of kinds with their codes, typed bodies.

`RecordKind` is the one owner of the kinds and the codes they are written as: the codes are
those of every release before it (the position in the old `RECORD_KINDS` tuple, plus one) and
those docs/FORMAT.md prints, and no other module of `src/` spells a code or names a kind where a
record is written or matched (an AST scan, as tests/test_kafka_errors.py does for error codes).

The typed records write exactly the bytes the previous release wrote: `HISTORY` below is what it
encoded for a history touching every kind (its bodies built by its own writers: the broker's
fact stores, `MetaGroupLog`, the coordinator's `Txn.body`; the others as its engine and cluster
code built them), and `*_SHA256` are the checkpoints of the state that history (and `OLD`, bodies
of older releases still) left. The typed records must encode to those bytes, through a metadata
store too, and the bytes must still decode and apply to the same state.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import re
from pathlib import Path

import pytest

import loglake
from loglake.broker.txn import Txn
from loglake.errors import MetaRecordRejectedError
from loglake.fs import OsFileSystem
from loglake.meta.checkpoint import capture, encode_checkpoint
from loglake.meta.cluster import PlogSegment
from loglake.meta.lifecycle import Tier
from loglake.meta.log import LocalMetaStore
from loglake.meta.quotas import entity_key
from loglake.meta.records import (
    RECORD_TYPES,
    Acked,
    Acls,
    BrokerConfig,
    ClientQuota,
    Cluster,
    GroupConfig,
    GroupDeleted,
    GroupState,
    LeaderEpoch,
    LogStart,
    MetaRecord,
    OffsetCommit,
    OffsetExpire,
    PartitionsAdded,
    PlogCommit,
    PlogCompacted,
    PlogLeader,
    PlogMerged,
    PlogStart,
    PlogSwept,
    ProducerIds,
    RawRecord,
    RecordKind,
    SchemaConfig,
    SchemaDeleted,
    SchemaMode,
    SchemaVersion,
    ScramCredentialSet,
    SegmentPublished,
    SegmentRewritten,
    SegmentTier,
    ShareState,
    TopicConfigSet,
    TopicCreated,
    TopicDeleted,
    TxnRecord,
    decode_record,
    encode_record,
)
from loglake.meta.scram import credential_body
from loglake.meta.segments import SegmentRef
from loglake.meta.state import MetaState
from loglake.meta.txn_states import TxnState
from loglake.scram import ScramCredential

SRC = Path(loglake.__file__).parent
OWNER = SRC / "meta" / "records.py"
FORMAT_MD = Path(__file__).resolve().parents[1] / "docs" / "FORMAT.md"

#: The kinds in the order the releases before `RecordKind` listed them (state.RECORD_KINDS, then
#: cluster.PLOG_KINDS); each one's code was its position plus one.
TODAY_ORDER = (
    "cluster",
    "topic_created",
    "topic_deleted",
    "topic_config",
    "partitions_added",
    "segment_published",
    "segment_tier",
    "log_start",
    "producer_ids",
    "offset_commit",
    "offset_expire",
    "group_deleted",
    "group_state",
    "segment_rewritten",
    "broker_config",
    "group_config",
    "leader_epoch",
    "txn",
    "acked",
    "acls",
    "scram_credential",
    "client_quota",
    "plog_leader",
    "plog_commit",
    "plog_merged",
    "plog_swept",
    "plog_start",
    "schema_version",
    "schema_deleted",
    "schema_config",
    "schema_mode",
    "share_state",
    "plog_compacted",
)

# ---- the bytes the previous release wrote ---------------------------------------------------------

HISTORY = [
    b'\x01\x01{"cluster_id":"c-1"}',
    b'\x01\x02{"name":"orders","id":"0123456789abcdef0123456789abcdef","partitions":3,"config":{"cleanup.policy":"compact"},"created_ms":1700000000000}',
    b'\x01\x04{"id":"0123456789abcdef0123456789abcdef","config":{"retention.ms":"1000"}}',
    b'\x01\x05{"id":"0123456789abcdef0123456789abcdef","total":5}',
    b'\x01\x06{"id":"0123456789abcdef0123456789abcdef","p":1,"seg":[0,9,4096,1700000000003,10,"0000000000000000000000000000000000000000000000000000000000000000","000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",1700000000004,"hot",0,"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"],"producers":[[1000,0,0,10,0]]}',
    b'\x01\x06{"id":"0123456789abcdef0123456789abcdef","p":1,"seg":[10,19,4000,1700000000005,10,"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f","030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122",1700000000006,"hot",0,"030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122"],"producers":[]}',
    b'\x01\x07{"id":"0123456789abcdef0123456789abcdef","p":1,"base":10,"tier":"cold"}',
    b'\x01\x0e{"id":"0123456789abcdef0123456789abcdef","p":1,"replaced":[[0,0],[10,0]],"segs":[[0,19,8192,1700000000005,12,"0000000000000000000000000000000000000000000000000000000000000000","0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20",1700000000007,"hot",1,"030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122"]],"clean":{"end":20,"ms":1700000000008,"tomb_ms":-1}}',
    b'\x01\x08{"id":"0123456789abcdef0123456789abcdef","p":1,"offset":5}',
    b'\x01\t{"next":1001,"expect":1000}',
    b'\x01\x11{"id":"0123456789abcdef0123456789abcdef","p":1,"epoch":2,"start":10,"reason":"unclean stop of a durability=none topic"}',
    b'\x01\n{"g":"gr\xc3\xbcppe","rows":[["orders",0,5,-1,"",1700000000009],["orders",1,7,2,"m",1700000000010]]}',
    b'\x01\x0b{"g":"gr\xc3\xbcppe","tps":[["orders",0]]}',
    b'\x01\r{"g":"gr\xc3\xbcppe","state":{"version":1,"members":[]}}',
    b'\x01\r{"g":"gr\xc3\xbcppe","state":null}',
    b'\x01\n{"g":"other","rows":[["orders",2,1,-1,"",1700000000011]]}',
    b'\x01\x0c{"g":"other"}',
    b'\x01\x0f{"scope":"","configs":{"log.retention.ms":"1000"}}',
    b'\x01\x10{"g":"gr\xc3\xbcppe","configs":{"consumer.session.timeout.ms":"50000"}}',
    b'\x01\x12{"tid":"tx-1","pid":2000,"epoch":3,"state":"complete_abort","timeout_ms":60000,"start_ms":1700000000012,"last_ms":1700000000013,"parts":[["0123456789abcdef0123456789abcdef",1,7]],"names":["orders"],"groups":["gr\xc3\xbcppe"],"offsets":{"gr\xc3\xbcppe":[["orders",1,8,2,null]]},"markers":[["0123456789abcdef0123456789abcdef",1,11]]}',
    b'\x01\x12{"tid":"tx-2","pid":2001,"epoch":0,"state":"ongoing","timeout_ms":60000,"start_ms":1700000000014,"last_ms":1700000000015,"parts":[["0123456789abcdef0123456789abcdef",0,3]],"names":["orders"],"groups":[],"offsets":{}}',
    b'\x01\x13{"parts":[["0123456789abcdef0123456789abcdef",0,10],["0123456789abcdef0123456789abcdef",1,20]]}',
    b'\x01\x14{"created":[[2,"orders",3,"User:alice","*",3,3]],"deleted":[[2,"old",3,"User:bob","*",2,3]]}',
    b'\x01\x15{"user":"alice","mechanism":"SCRAM-SHA-256","cred":{"salt":"c2FsdA==","iterations":4096,"stored_key":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=","server_key":"ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8="}}',
    b'\x01\x15{"user":"alice","mechanism":"SCRAM-SHA-512","cred":null}',
    b'\x01\x16{"entity":[["client-id",null],["user","alice"]],"values":{"producer_byte_rate":1024.0,"request_percentage":12.5}}',
    b'\x01\x16{"entity":[["client-id","app"]],"values":{"consumer_byte_rate":2048.0}}',
    b'\x01\x16{"entity":[["client-id","app"]],"values":null}',
    b'\x01\x17{"id":"0123456789abcdef0123456789abcdef","p":0,"epoch":4,"leader":2}',
    b'\x01\x17{"id":"0123456789abcdef0123456789abcdef","p":1,"epoch":4,"leader":2}',
    b'\x01\x18{"key":"flush/0001","ranges":[["0123456789abcdef0123456789abcdef",0,4,0,9,64,1000,10,1700000000016,3735928559,2],["0123456789abcdef0123456789abcdef",1,4,0,9,1064,900,10,1700000000017,12345,1]]}',
    b'\x01\x18{"key":"flush/0002","ranges":[["0123456789abcdef0123456789abcdef",1,4,10,29,64,2000,20,1700000000018,777,3]]}',
    b'\x01\x19{"id":"0123456789abcdef0123456789abcdef","p":1,"epoch":4,"ms":1700000000019,"n":2,"seg":["seg/0001",0,29,5000,4800,99,"abababababababababababababababababababababababababababababababab",30,1700000000018]}',
    b'\x01\x1a{"keys":["flush/0002","orphan/1"]}',
    b'\x01\x1b{"id":"0123456789abcdef0123456789abcdef","p":0,"epoch":4,"ms":1700000000021,"start":10}',
    b'\x01\x1c{"subject":"orders-value","version":1,"id":1,"type":"AVRO","schema":"\\"string\\"","refs":[]}',
    b'\x01\x1c{"subject":"other-value","version":1,"id":1,"type":"AVRO","schema":"\\"string\\"","refs":[]}',
    b'\x01\x1c{"subject":"orders-value","version":2,"id":2,"type":"JSON","schema":"{}","refs":[["other.json","other-value",1]]}',
    b'\x01\x1d{"subject":"other-value","versions":[1],"permanent":false}',
    b'\x01\x1e{"subject":"","config":{"compatibilityLevel":"FULL"}}',
    b'\x01\x1f{"subject":"orders-value","mode":"READONLY"}',
    b'\x01\x20{"g":"sg","id":"0123456789abcdef0123456789abcdef","p":0,"start":3,"end":9,"batches":[[3,4,2,1],[5,5,0,2],[6,8,4,5]]}',
    b'\x01\x20{"g":"sg","id":"0123456789abcdef0123456789abcdef","p":1,"start":0,"end":2,"batches":[[0,1,0,1]]}',
    b'\x01\x20{"g":"sg","id":"0123456789abcdef0123456789abcdef","p":1,"start":null}',
    b'\x01\x20{"g":"sg","id":"0123456789abcdef0123456789abcdef","p":2,"start":-1,"end":-1,"batches":[],"gen":3}',
    b'\x01\x21{"id":"0123456789abcdef0123456789abcdef","p":1,"epoch":4,"ms":1700000000022,"old":["seg/0001"],"segs":[["seg/0001-g4001",0,29,3000,2800,98,"abababababababababababababababababababababababababababababababab",30,1700000000018,4001]],"clean":[30,1700000000022,-1]}',
    b'\x01\x03{"id":"0123456789abcdef0123456789abcdef","ms":1700000000020}',
]
#: sha256 of the checkpoint of the state HISTORY[:-1] left (applied as recovery does), and after
#: its last record (the topic's deletion). Changed on purpose: a `plog_leader` now also enters its
#: epoch in the partition's leader-epoch history (cluster mode's OffsetForLeaderEpoch), and the
#: history gained a `plog_start` and a `plog_compacted`.
#: Changed on purpose again: the history gained the schema registry's records; without them the
#: checkpoint is the bytes it was (`WITHOUT_SCHEMAS_SHA256`: an empty registry writes no key).
#: And again: the history gained `share_state` records (the checkpoint carries "shares").
CHECKPOINT_SHA256 = "0816aafa1134d56b2ada83957491753436afc1a1687ffa2ea7090f7acaa8f8a4"
CHECKPOINT_AFTER_DELETE_SHA256 = "d240dfeb44ec0f9b35d046bb870b32f1dfd12a4f39fc5f776cd18651b63f5d39"
WITHOUT_SCHEMAS_SHA256 = "700b90359000f774c879e7b620899a4880ba2b2c7794574b25cd477bf83ca996"

#: Bodies older releases wrote, which no typed record writes any more: 0.1.0's topic_deleted
#: without `ms` and producer_ids without `expect`, a seg of 9 fields (before rewrites), a txn
#: without `names`.
OLD = [
    b'\x01\x01{"cluster_id":"c-0"}',
    b'\x01\x02{"name":"t","id":"0123456789abcdef0123456789abcdef","partitions":1,"config":{},"created_ms":1}',
    b'\x01\x06{"id":"0123456789abcdef0123456789abcdef","p":0,"seg":[0,9,4096,1700000000003,10,"0000000000000000000000000000000000000000000000000000000000000000","000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",1700000000004,"hot"],"producers":[[1000,0,0,10,0]]}',
    b'\x01\t{"next":1005}',
    b'\x01\x12{"tid":"tx","pid":1000,"epoch":0,"state":"ongoing","timeout_ms":60000,"start_ms":1,"last_ms":2,"parts":[["0123456789abcdef0123456789abcdef",0,10]],"groups":[],"offsets":{}}',
    b'\x01\x02{"name":"u","id":"fedcba9876543210fedcba9876543210","partitions":2,"config":{},"created_ms":2}',
    b'\x01\x03{"id":"fedcba9876543210fedcba9876543210"}',
]
OLD_CHECKPOINT_SHA256 = "334763ef410aa88269af5b5d44a6b6fdd6e0a0fc37f9d4299b72e4c28c6e6e3a"

# ---- the same history as typed records --------------------------------------------------------------

TID = "0123456789abcdef0123456789abcdef"
SEG_A = SegmentRef(0, 9, "k", 4096, 1700000000003, 10, bytes(32), bytes(range(32)), 1700000000004, Tier.HOT)
SEG_B = SegmentRef(
    10, 19, "k", 4000, 1700000000005, 10, bytes(range(32)), bytes(range(3, 35)), 1700000000006, Tier.HOT
)
SEG_NEW = SegmentRef(
    0, 19, "k", 8192, 1700000000005, 12, bytes(32), bytes(range(1, 33)), 1700000000007, Tier.HOT, None, 1,
    bytes(range(3, 35)),
)  # fmt: skip
CRED = credential_body(ScramCredential("SCRAM-SHA-256", b"salt", 4096, bytes(range(32)), bytes(range(32, 64))))
G = "grüppe"


def _txn_abort() -> TxnRecord:
    return TxnRecord(
        "tx-1", 2000, 3, TxnState.COMPLETE_ABORT, 60000, 1700000000012, 1700000000013,
        [(TID, 1, 7)], [G], {G: [("orders", 1, 8, 2, None)]}, names=["orders"], markers=[(TID, 1, 11)],
    )  # fmt: skip


SAMPLES: list[MetaRecord] = [
    Cluster("c-1"),
    TopicCreated("orders", TID, 3, {"cleanup.policy": "compact"}, 1700000000000),
    TopicConfigSet(TID, {"retention.ms": "1000"}),
    PartitionsAdded(TID, 5),
    SegmentPublished(TID, 1, SEG_A, [[1000, 0, 0, 10, 0]]),
    SegmentPublished(TID, 1, SEG_B, []),
    SegmentTier(TID, 1, 10, Tier.COLD),
    SegmentRewritten(TID, 1, [SEG_A, SEG_B], [SEG_NEW], {"end": 20, "ms": 1700000000008, "tomb_ms": -1}),
    LogStart(TID, 1, 5),
    ProducerIds(1001, 1000),
    LeaderEpoch(TID, 1, 2, 10, "unclean stop of a durability=none topic"),
    OffsetCommit(G, [("orders", 0, 5, -1, "", 1700000000009), ("orders", 1, 7, 2, "m", 1700000000010)]),
    OffsetExpire(G, [("orders", 0)]),
    GroupState(G, {"version": 1, "members": []}),
    GroupState(G, None),
    OffsetCommit("other", [("orders", 2, 1, -1, "", 1700000000011)]),
    GroupDeleted("other"),
    BrokerConfig("", {"log.retention.ms": "1000"}),
    GroupConfig(G, {"consumer.session.timeout.ms": "50000"}),
    _txn_abort(),
    TxnRecord(
        "tx-2", 2001, 0, TxnState.ONGOING, 60000, 1700000000014, 1700000000015, [(TID, 0, 3)], [], {}, ["orders"]
    ),
    Acked([(TID, 0, 10), (TID, 1, 20)]),
    Acls([[2, "orders", 3, "User:alice", "*", 3, 3]], [[2, "old", 3, "User:bob", "*", 2, 3]]),
    ScramCredentialSet("alice", "SCRAM-SHA-256", CRED),
    ScramCredentialSet("alice", "SCRAM-SHA-512", None),
    ClientQuota(
        entity_key([["user", "alice"], ["client-id", None]]), {"producer_byte_rate": 1024.0, "request_percentage": 12.5}
    ),
    ClientQuota(entity_key([["client-id", "app"]]), {"consumer_byte_rate": 2048.0}),
    ClientQuota(entity_key([["client-id", "app"]]), None),
    PlogLeader(TID, 0, 4, 2),
    PlogLeader(TID, 1, 4, 2),
    PlogCommit(
        "flush/0001",
        [
            (TID, 0, 4, 0, 9, 64, 1000, 10, 1700000000016, 3735928559, 2),
            (TID, 1, 4, 0, 9, 1064, 900, 10, 1700000000017, 12345, 1),
        ],
    ),
    PlogCommit("flush/0002", [(TID, 1, 4, 10, 29, 64, 2000, 20, 1700000000018, 777, 3)]),
    PlogMerged(
        TID, 1, 4, 1700000000019, 2, PlogSegment("seg/0001", 0, 29, 5000, 4800, 99, "ab" * 32, 30, 1700000000018)
    ),
    PlogSwept(["flush/0002", "orphan/1"]),
    PlogStart(TID, 0, 4, 1700000000021, 10),
    SchemaVersion("orders-value", 1, 1, "AVRO", '"string"', []),
    SchemaVersion("other-value", 1, 1, "AVRO", '"string"', []),
    SchemaVersion("orders-value", 2, 2, "JSON", "{}", [("other.json", "other-value", 1)]),
    SchemaDeleted("other-value", [1], False),
    SchemaConfig("", {"compatibilityLevel": "FULL"}),
    SchemaMode("orders-value", "READONLY"),
    ShareState("sg", TID, 0, 3, 9, [(3, 4, 2, 1), (5, 5, 0, 2), (6, 8, 4, 5)]),
    ShareState("sg", TID, 1, 0, 2, [(0, 1, 0, 1)]),
    ShareState("sg", TID, 1, None),
    ShareState("sg", TID, 2, -1, -1, [], 3),
    PlogCompacted(
        TID, 1, 4, 1700000000022, ["seg/0001"],
        [PlogSegment("seg/0001-g4001", 0, 29, 3000, 2800, 98, "ab" * 32, 30, 1700000000018, 4001)],
        (30, 1700000000022, -1),
    ),
    TopicDeleted(TID, 1700000000020),
]


def _checkpoint_sha(state: MetaState) -> str:
    return hashlib.sha256(b"".join(bytes(x) for x in encode_checkpoint(capture(state)))).hexdigest()


def _replay(raws: list[bytes]) -> MetaState:
    """As recovery applies a log: decode, apply (producers too), note the seq."""
    state = MetaState()
    state.replaying = True
    for seq, raw in enumerate(raws):
        kind, body = decode_record(raw, where="test", position=seq)
        state.apply(kind, body)
        state.seq = seq
    return state


# ---- the table --------------------------------------------------------------------------------------


def test_codes_are_the_ones_every_release_wrote() -> None:
    assert {k.value: k.code for k in RecordKind} == {name: i + 1 for i, name in enumerate(TODAY_ORDER)}
    assert [k.value for k in RecordKind] == list(TODAY_ORDER)  # new kinds append; none moves


def format_md_kinds() -> dict[str, int]:
    """kind -> code as the "Records" table of docs/FORMAT.md prints them."""
    text = FORMAT_MD.read_text()
    section = text[text.index("### Records") :]
    section = section[: section.index("\n### ", 1)]
    return {m[1]: int(m[2]) for m in re.finditer(r"^\| `([a-z_]+)` \| (\d+) \|", section, re.MULTILINE)}


def test_codes_are_the_ones_docs_format_md_prints() -> None:
    assert format_md_kinds() == {k.value: k.code for k in RecordKind}


def test_every_kind_has_one_typed_record_that_knows_it() -> None:
    assert set(RECORD_TYPES) == set(RecordKind)
    assert len(set(RECORD_TYPES.values())) == len(RecordKind)
    for kind, cls in RECORD_TYPES.items():
        assert cls.kind is kind
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert "kind" not in {f.name for f in dataclasses.fields(cls)}  # the class's, not a field


def test_a_kind_is_its_name_and_an_unknown_one_is_refused() -> None:
    assert RecordKind.TOPIC_CREATED == "topic_created" and f"{RecordKind.PLOG_SWEPT}" == "plog_swept"
    with pytest.raises(ValueError, match="unknown metadata record kind"):
        encode_record("no_such_kind", {})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown metadata record kind"):
        MetaState().apply("no_such_kind", {})  # type: ignore[arg-type]


# ---- bytes -----------------------------------------------------------------------------------------


def test_the_samples_cover_every_kind() -> None:
    assert {r.kind for r in SAMPLES} == set(RecordKind)
    assert len(SAMPLES) == len(HISTORY)


@pytest.mark.parametrize("index", range(len(HISTORY)), ids=lambda i: f"{i}-{SAMPLES[i].kind}")
def test_a_typed_record_writes_the_bytes_of_the_previous_release(index: int) -> None:
    record = SAMPLES[index]
    assert encode_record(record.kind, record.body()) == HISTORY[index]
    kind, body = decode_record(HISTORY[index], where="test", position=index)
    assert kind is record.kind and body == record.body()  # lists where the record holds tuples, as JSON reads


def test_a_body_is_a_new_object_each_time() -> None:
    """The store applies the body to its state: the state must not share the record's lists."""
    record = OffsetCommit("g", [("t", 0, 1, -1, "", 1)])
    first = record.body()
    first["rows"][0][2] = 99
    assert record.body()["rows"][0][2] == 1


def test_the_previous_release_bytes_decode_and_apply_to_the_same_state() -> None:
    assert _checkpoint_sha(_replay([r for r in HISTORY[:-1] if r[1] < RecordKind.SCHEMA_VERSION.code])) == WITHOUT_SCHEMAS_SHA256
    state = _replay(HISTORY[:-1])
    assert _checkpoint_sha(state) == CHECKPOINT_SHA256
    # one schema under two subjects keeps its id; the soft-deleted version stays until removed
    assert {s: {v: (r.schema_id, r.deleted) for v, r in vs.items()} for s, vs in state.schemas.subjects.items()} == {
        "orders-value": {1: (1, False), 2: (2, False)},
        "other-value": {1: (1, True)},
    }
    assert (state.schemas.next_id, state.schemas.configs, state.schemas.modes) == (
        3, {"": {"compatibilityLevel": "FULL"}}, {"orders-value": "READONLY"}
    )
    pm = state.partition(bytes.fromhex(TID), 1)
    # the plog_leader of epoch 4 (at committed end 0) replaced the history the leader_epoch records made
    assert (pm.log_start, pm.leader_epochs, pm.aborted_txns) == (5, [[4, 0]], [[2000, 7, 11]])
    assert state.plogs.condemned == {"orphan/1": None} and state.groups[G].offsets == {
        ("orders", 1): [7, 2, "m", 1700000000010]
    }
    p0 = state.plogs.parts[(bytes.fromhex(TID), 0)]  # plog_start dropped its one range
    assert (p0.log_start, p0.ranges, state.plogs.free) == (10, [], {"flush/0001": 1700000000021})
    # plog_compacted replaced partition 1's merged segment and noted its pass's clean end
    p1 = state.plogs.parts[(bytes.fromhex(TID), 1)]
    assert [(s.key, s.gen) for s in p1.segments] == [("seg/0001-g4001", 4001)]
    assert (pm.clean_end, state.plogs.dropped) == (30, {"seg/0001": 1700000000022})
    kind, body = decode_record(HISTORY[-1], where="test", position=len(HISTORY) - 1)
    state.apply(kind, body)
    state.seq += 1
    assert _checkpoint_sha(state) == CHECKPOINT_AFTER_DELETE_SHA256 and not state.topics


def test_records_of_older_releases_still_decode_and_apply() -> None:
    state = _replay(OLD)
    assert _checkpoint_sha(state) == OLD_CHECKPOINT_SHA256
    assert state.next_producer_id == 1005 and list(state.names) == ["t"]
    pm = state.partition(bytes.fromhex(TID), 0)
    assert pm.segments[0].generation == 0 and pm.txn_open == {1000: 10}


def test_a_store_writes_typed_records_as_the_previous_release_did(tmp_path: Path) -> None:
    store = LocalMetaStore(OsFileSystem(), str(tmp_path / "meta"))
    store.open()
    logged: list[tuple[int, RecordKind, bytes]] = []
    store.watch(lambda seq, kind, _body, raw: logged.append((seq, kind, raw)))
    futures = [store.append(r) for r in SAMPLES]
    assert [f.result(timeout=30) for f in futures] == list(range(len(SAMPLES)))
    assert logged == [(i, r.kind, raw) for i, (r, raw) in enumerate(zip(SAMPLES, HISTORY, strict=True))]
    store.close()
    again = LocalMetaStore(OsFileSystem(), str(tmp_path / "meta"))
    again.open()
    try:
        assert _checkpoint_sha(again.state) == CHECKPOINT_AFTER_DELETE_SHA256
    finally:
        again.close()


def test_a_raw_record_logs_an_old_body_as_given(tmp_path: Path) -> None:
    store = LocalMetaStore(OsFileSystem(), str(tmp_path / "meta"))
    store.open()
    logged: list[bytes] = []
    store.watch(lambda _seq, _kind, _body, raw: logged.append(raw))
    for seq, raw in enumerate(OLD):
        kind, body = decode_record(raw, where="test", position=seq)
        store.append(RawRecord(kind, body)).result(timeout=30)
    assert logged == OLD
    store.close()
    again = LocalMetaStore(OsFileSystem(), str(tmp_path / "meta"))
    again.open()
    try:
        assert _checkpoint_sha(again.state) == OLD_CHECKPOINT_SHA256
    finally:
        again.close()


def test_the_txn_record_of_a_coordinator_body_writes_that_body() -> None:
    """`TxnIdStore.record` is given `Txn.body()` (the broker's document); its record must log it
    unchanged, or refuse (as a record that does not apply) a field it would drop."""
    txn = Txn("tx-1", 2000, 3, 60000, TxnState.COMPLETE_ABORT, 1700000000012, 1700000000013)
    txn.parts[("orders", 1)] = (TID, 7)
    txn.groups.append(G)
    txn.offsets[G] = {("orders", 1): [8, 2, None]}
    body = txn.body([[TID, 1, 11]])
    assert TxnRecord.from_body(body) == _txn_abort()
    assert encode_record(RecordKind.TXN, body) == HISTORY[19]
    old = json.loads(OLD[4][2:])  # before `names`
    assert TxnRecord.from_body(old).body() == old
    with pytest.raises(MetaRecordRejectedError, match="unknown fields"):
        TxnRecord.from_body(body | {"new_field": 1})
    with pytest.raises(MetaRecordRejectedError, match="unknown transaction state 'committing'"):
        TxnRecord.from_body(body | {"state": "committing"})


# ---- nothing else spells a code or writes a kind by its name ---------------------------------------------

KIND_NAMES = {k.value for k in RecordKind}
#: Calls that take a record kind: a metadata store's append, encoding, applying (and the test-only
#: raw record).
KIND_SINKS = {"encode_record", "apply", "RawRecord"}


def _callee(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _names_kind(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lower().endswith("kind")


def _kind_constants(node: ast.AST) -> list[ast.Constant]:
    return [
        n
        for n in ast.walk(node)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in KIND_NAMES
    ]


def _int_literal(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def record_literals(source: str, filename: str) -> list[str]:
    """`file:line what` for every kind name where a record is written or matched, and every code."""
    found: list[str] = []

    def note(node: ast.AST, what: str) -> None:
        found.append(f"{filename}:{getattr(node, 'lineno', 0)} {what}")

    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Call):
            callee = _callee(node)
            args = [*node.args, *(k.value for k in node.keywords if k.arg == "kind")]
            # a kind's name handed to a writer, or next to a body: `_write(g, "offset_commit", {...})`
            if callee in KIND_SINKS or "append" in callee or any(isinstance(a, ast.Dict) for a in node.args):
                for c in args:
                    if isinstance(c, ast.Constant) and c.value in KIND_NAMES:
                        note(c, f"{callee}({c.value!r})")
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_names_kind(o) for o in operands):
                for c in (c for o in operands for c in _kind_constants(o)):
                    note(c, f"compared {c.value!r}")
            if any(isinstance(o, ast.Attribute) and o.attr == "code" for o in operands) and any(
                _int_literal(o) for o in operands
            ):
                note(node, "code compared with a number")
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else ""
                if name.upper().endswith("KINDS"):
                    for c in _kind_constants(node.value):
                        note(c, f"{name} holds {c.value!r}")
        elif isinstance(node, ast.Dict):  # a table of codes: {"cluster": 1, "topic_created": 2, ...}
            keys = [k.value if isinstance(k, ast.Constant) else None for k in node.keys]
            if len(keys) > 1 and all(k in KIND_NAMES for k in keys) and all(map(_int_literal, node.values)):
                note(node, "a kind -> code table")
        elif isinstance(node, ast.Tuple):  # a kind and its code: ("topic_created", 2)
            elts = node.elts
            if len(elts) == 2 and _kind_constants(elts[0]) == [elts[0]] and _int_literal(elts[1]):
                note(node, "a kind with its code")
        elif isinstance(node, ast.comprehension):  # codes derived from an order: enumerate(RECORD_KINDS)
            it = node.iter
            if isinstance(it, ast.Call) and _callee(it) == "enumerate" and any(
                "KIND" in ast.unparse(a).upper() for a in it.args
            ):
                note(it, "codes from an order")
        elif isinstance(node, ast.Name) and node.id == "RawRecord":
            note(node, "RawRecord")
    return found


def test_no_module_outside_the_table_spells_a_code_or_writes_a_kind_by_name() -> None:
    found: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        if path != OWNER:
            found += record_literals(path.read_text(), str(path.relative_to(SRC)))
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        'meta.append("topic_created", {"name": n})',
        'self.etcd.append_if("plog_leader", body, guards)',
        'self._append("acls", {"created": c})',
        'encode_record("txn", body)',
        'state.apply("offset_commit", body)',
        'meta.append(RawRecord(RecordKind.CLUSTER, {"cluster_id": c}))',
        'self._write(group_id, "offset_commit", {"g": group_id})',
        'if kind == "plog_commit":\n    pass',
        'if record.kind in ("topic_created", "topic_deleted"):\n    pass',
        'TOPIC_KINDS = frozenset({"topic_created", "partitions_added"})',
        '_KIND_CODE = {"cluster": 1, "topic_created": 2}',
        "_KIND_CODE = {k: i + 1 for i, k in enumerate(RECORD_KINDS)}",
        'class Kind(enum.StrEnum):\n    TOPIC_CREATED = "topic_created", 2',
        "if kind.code == 24:\n    pass",
    ],
)
def test_the_scan_sees_a_kind_written_by_name_or_a_spelled_code(source: str) -> None:
    assert record_literals(source, "m.py") != []


def test_the_scan_ignores_other_uses_of_the_same_words() -> None:
    source = (
        '"""A txn record and the acls; offset_commit in prose."""\n'
        'acls = doc.get("acls")\n'
        'row = {"log_start": pm.log_start, "acls": 3}\n'
        "OFFSET_COMMIT = 8\n"
        'pair = ("acls", names)\n'
        'fields = ("leader_epoch", "offset")\n'
        "meta.append(TopicCreated(name, tid, 1, {}, 0))\n"
        "if kind == RecordKind.PLOG_COMMIT or kind in TOPIC_KINDS:\n    pass\n"
        'log.info("cluster %s", cid)\n'
    )
    assert record_literals(source, "m.py") == []
