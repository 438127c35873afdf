"""Metadata checkpoints: the whole `MetaState` after record `seq`, in one file (docs/FORMAT.md).

`capture` copies the state under the store's lock, `encode_checkpoint` writes the copy outside
it, and `decode_checkpoint` rebuilds a state (version 1 and 2 files) that the records after
`seq` then move on. The per-feature parts of the JSON (transactions, ACLs, SCRAM credentials,
quotas, cluster partitions) are written and read by the modules that own those records.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import crc32c

from loglake.errors import CorruptionError
from loglake.meta.acls import acls_doc, load_acls
from loglake.meta.cluster import load_plogs, plogs_doc
from loglake.meta.producers import ProducerStates
from loglake.meta.quotas import client_quotas_doc, load_client_quotas
from loglake.meta.schemas import load_schemas, schemas_doc
from loglake.meta.scram import load_scram, scram_doc
from loglake.meta.segments import ENTRY_SIZE, ENTRY_V1, SegmentTable
from loglake.meta.state import (
    DOC_SHAPE_ERRORS,
    GroupMeta,
    MetaState,
    TopicMeta,
    _partition_count,
    _replace_configs,
    _replication_factor,
    share_doc,
)
from loglake.meta.txn import load_partition_txns, load_txns, partition_txn_doc, txns_doc

__all__ = [
    "CHECKPOINT_VERSION",
    "CheckpointImage",
    "capture",
    "decode_checkpoint",
    "encode_checkpoint",
]

# ---- checkpoints -----------------------------------------------------------------------------
#
# A checkpoint is the whole state after record `seq`, in one file (docs/FORMAT.md):
#
#     0   4  magic "LLCK"
#     4   2  version (2; 1 had 113-byte segment entries, read and widened)
#     6   2  flags (0)
#     8   8  seq            i64  last record applied (-1: none)
#     16  4  json length    u32
#     20  8  tables length  u64  bytes of packed segment entries
#     28  4  CRC-32C of bytes 0..28, the JSON and the tables
#     32  .  JSON: cluster id, topics, partitions (with offsets into the tables), groups,
#              dynamic broker and group configs, client quotas (optional: older checkpoints lack them)
#     .   .  tables: every partition's packed segment entries (meta/segments.py), back to back

CHECKPOINT_MAGIC = b"LLCK"
CHECKPOINT_VERSION = 2
#: Checkpoint versions read: 1 (segment entries without generation and link hash) and 2.
CHECKPOINT_VERSIONS_READ = (1, 2)
_CK_HEADER = struct.Struct("<4sHHqIQI")
_CK_COVERED = _CK_HEADER.size - 4
#: Largest JSON part accepted on read, so a corrupt length never allocates.
CHECKPOINT_JSON_BYTES_MAX = 1 << 30
CHECKPOINT_TABLE_BYTES_MAX = 1 << 36


@dataclass
class CheckpointImage:
    """The state copied (under the store's lock) for writing outside it."""

    seq: int
    doc: dict[str, Any]
    tables: list[bytes]


def capture(state: MetaState) -> CheckpointImage:
    """Copy what a checkpoint needs; cheap enough to run under the metadata lock."""
    partitions = []
    tables: list[bytes] = []
    pos = 0
    for (tid, index), pm in state.partitions.items():
        raw = pm.segments.raw()
        partitions.append(
            {
                "id": tid.hex(),
                "p": index,
                "log_start": pm.log_start,
                "sealed_end": pm.sealed_end,
                "chain": pm.chain_hash.hex(),
                "producers": pm.producers.to_json(below=pm.sealed_end),
                "table": [pos, len(raw)],
                "clean_end": pm.clean_end,
                "clean_marks": [list(m) for m in pm.clean_marks],
                "tombstone_ms": pm.tombstone_ms,
                "leader_epochs": [list(e) for e in pm.leader_epochs],
                **partition_txn_doc(pm),
                "acked_end": pm.acked_end,
            }
        )
        tables.append(raw)
        pos += len(raw)
    doc = {
        "cluster_id": state.cluster_id,
        "next_producer_id": state.next_producer_id,
        "topics": [
            {"name": t.name, "id": t.topic_id.hex(), "partitions": t.partitions, "config": dict(t.config), "created_ms": t.created_ms,
             **({"rf": t.replication_factor} if t.replication_factor != 1 else {})}  # absent: 1 (older checkpoints too)
            for t in state.topics.values()
        ],
        "partitions": partitions,
        "groups": {
            g: {"offsets": [[t, p, *row] for (t, p), row in gm.offsets.items()], "state": gm.state}
            for g, gm in state.groups.items()
        },
        "broker_configs": {scope: dict(c) for scope, c in state.broker_configs.items()},
        "group_configs": {g: dict(c) for g, c in state.group_configs.items()},
        "txns": txns_doc(state),
        "acls": acls_doc(state),
        "scram": scram_doc(state),
        "client_quotas": client_quotas_doc(state),
        "plogs": plogs_doc(state),
    }
    schemas = schemas_doc(state)
    if schemas is not None:  # absent while the registry is empty: those checkpoints keep their bytes
        doc["schemas"] = schemas
    if state.shares:  # written only when there are some: checkpoints without share groups keep their bytes
        doc["shares"] = [[g, tid, p, sdoc] for (g, tid, p), sdoc in state.shares.items()]
    return CheckpointImage(state.seq, doc, tables)


def encode_checkpoint(image: CheckpointImage) -> list[bytes]:
    body = json.dumps(image.doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    tables_len = sum(len(t) for t in image.tables)
    covered = _CK_HEADER.pack(CHECKPOINT_MAGIC, CHECKPOINT_VERSION, 0, image.seq, len(body), tables_len, 0)[:_CK_COVERED]
    crc = crc32c.crc32c(body, crc32c.crc32c(covered))
    for t in image.tables:
        crc = crc32c.crc32c(t, crc)
    return [covered + struct.pack("<I", crc), body, *image.tables]


def decode_checkpoint(data: bytes, *, path: str) -> MetaState:
    """Parse and verify a checkpoint; CorruptionError names `path` and the bad byte."""
    if len(data) < _CK_HEADER.size:
        raise CorruptionError(path, len(data), f"checkpoint is {len(data)} bytes, shorter than its header")
    magic, version, flags, seq, json_len, tables_len, crc = _CK_HEADER.unpack_from(data, 0)
    if magic != CHECKPOINT_MAGIC:
        raise CorruptionError(path, 0, f"bad checkpoint magic {magic!r}")
    if json_len > CHECKPOINT_JSON_BYTES_MAX or tables_len > CHECKPOINT_TABLE_BYTES_MAX:
        raise CorruptionError(path, 16, "implausible checkpoint lengths")
    if len(data) != _CK_HEADER.size + json_len + tables_len:
        raise CorruptionError(path, len(data), f"checkpoint is {len(data)} bytes, header says {_CK_HEADER.size + json_len + tables_len}")
    actual = crc32c.crc32c(memoryview(data)[_CK_HEADER.size :], crc32c.crc32c(memoryview(data)[:_CK_COVERED]))
    if actual != crc:
        raise CorruptionError(path, 28, f"checkpoint CRC-32C mismatch (stored {crc:#010x}, computed {actual:#010x})")
    if version not in CHECKPOINT_VERSIONS_READ or flags != 0:
        raise CorruptionError(path, 4, f"checkpoint version {version} flags {flags} not supported (want 1 or 2, 0)")
    try:
        doc = json.loads(data[_CK_HEADER.size : _CK_HEADER.size + json_len].decode("utf-8"))
        tables = memoryview(data)[_CK_HEADER.size + json_len :]
        return _state_from_doc(doc, seq, tables, version)
    except DOC_SHAPE_ERRORS as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CorruptionError(path, _CK_HEADER.size, f"checkpoint content does not parse: {exc!r}") from None


def _state_from_doc(doc: dict[str, Any], seq: int, tables: memoryview, version: int = CHECKPOINT_VERSION) -> MetaState:
    state = MetaState(str(doc["cluster_id"]))
    state.seq = seq
    state.next_producer_id = int(doc["next_producer_id"])
    for t in doc["topics"]:
        topic = TopicMeta(
            str(t["name"]), bytes.fromhex(t["id"]), _partition_count(t["partitions"]), dict(t["config"]),
            int(t["created_ms"]), _replication_factor(t.get("rf", 1)),
        )
        state.topics[topic.topic_id] = topic
        state.names[topic.name] = topic.topic_id
    for raw in doc["partitions"]:
        tid = bytes.fromhex(raw["id"])
        topic = state.topics[tid]
        pm = state._new_partition(topic, int(raw["p"]))
        start, length = raw["table"]
        entry_size = ENTRY_SIZE if version >= 2 else ENTRY_V1.size
        if length % entry_size or start + length > len(tables):
            raise ValueError(f"segment table of {topic.name}-{raw['p']} out of bounds")
        if version >= 2:
            pm.segments = SegmentTable(pm.segments.key_prefix, tables[start : start + length])
        else:
            pm.segments = SegmentTable.from_v1(pm.segments.key_prefix, tables[start : start + length])
        pm.clean_end = int(raw.get("clean_end", 0))
        pm.clean_marks = [[int(e), int(ms)] for e, ms in raw.get("clean_marks", [])]
        pm.tombstone_ms = int(raw.get("tombstone_ms", -1))
        # absent in checkpoints written before leader epochs: epoch 0 from offset 0
        pm.leader_epochs = [[int(e), int(s)] for e, s in raw.get("leader_epochs", [])]
        pm.leader_epoch = pm.leader_epochs[-1][0] if pm.leader_epochs else 0
        pm.log_start = int(raw["log_start"])
        pm.sealed_end = int(raw["sealed_end"])
        pm.chain_hash = bytes.fromhex(raw["chain"])
        pm.producers = ProducerStates.from_json(raw["producers"])
        load_partition_txns(pm, raw)  # absent before transactions: none open, none aborted
        pm.acked_end = int(raw.get("acked_end", 0))  # absent before acked records: none
    for g, gdoc in doc["groups"].items():
        gm = GroupMeta()
        for topic_name, p, offset, epoch, metadata, ts in gdoc["offsets"]:
            gm.offsets[(str(topic_name), int(p))] = [int(offset), int(epoch), str(metadata), int(ts)]
        gm.state = gdoc.get("state")
        state.groups[str(g)] = gm
    # added later: absent from older checkpoints
    for scope, configs in (doc.get("broker_configs") or {}).items():
        _replace_configs(state.broker_configs, str(scope), configs)
    for g, configs in (doc.get("group_configs") or {}).items():
        _replace_configs(state.group_configs, str(g), configs)
    load_txns(state, doc)
    load_acls(state, doc)
    load_scram(state, doc)
    load_client_quotas(state, doc)
    load_plogs(state, doc)
    load_schemas(state, doc)
    for g, tid, p, sdoc in doc.get("shares") or []:  # absent before share groups
        state.shares[(str(g), str(tid), int(p))] = share_doc(sdoc)
    return state
