"""Fuzz targets for what loglake reads back from disk or the bucket: WAL frames, segment objects,
metadata records (decoded and applied as replay does), checkpoints and version-1 snapshots.

Byte-level damage alone mostly stops at the first CRC, so the structured mutations go further:
checkpoints and snapshots get their CRC made right again after the damage, and the JSON inside
metadata records, checkpoints and snapshots is mutated as JSON (a value replaced by another type,
a huge or negative number, a key removed) so that the code *after* the checksum sees it.
"""

from __future__ import annotations

import json
import random
import struct
from typing import Any

import crc32c

from fuzzkit import Target
from loglake.engine.txn import control_batch
from loglake.errors import CorruptionError, CorruptRecordError
from loglake.meta.checkpoint import capture, decode_checkpoint, encode_checkpoint
from loglake.meta.records import RecordKind, decode_record, encode_record
from loglake.meta.snapshot import HEADER as SNAP_HEADER
from loglake.meta.snapshot import decode_snapshot, encode_snapshot
from loglake.meta.state import MetaState
from loglake.meta.state_v1 import state_from_snapshot
from loglake.records.batch import build_batch
from loglake.segment.format import TRAILER_CRC_OFFSET, TRAILER_FIELD_OFFSETS, TRAILER_SIZE, SegmentWriter
from loglake.segment.verify import SegmentReader, verify_segment
from loglake.store.memory import MemoryStore
from loglake.wal.frame import FrameError, decode_frame, encode_frame, find_valid_frame_after

TID = "ab" * 16
_SEG = [0, 4, 100, 5, 5, "00" * 32, "11" * 32, 1, "hot"]
#: Valid metadata records (kind, body) in an order that applies to an empty state.
SEED_RECORDS: list[tuple[str, dict[str, Any]]] = [
    ("cluster", {"cluster_id": "c1"}),
    ("topic_created", {"name": "t", "id": TID, "partitions": 2, "config": {"retention.ms": "1"}, "created_ms": 1}),
    ("segment_published", {"id": TID, "p": 0, "seg": _SEG, "producers": [[1000, 0, 0, 5, 0]]}),
    ("topic_config", {"id": TID, "config": {"cleanup.policy": "compact"}}),
    ("partitions_added", {"id": TID, "total": 3}),
    ("segment_tier", {"id": TID, "p": 0, "base": 0, "tier": "cold"}),
    ("log_start", {"id": TID, "p": 0, "offset": 2}),
    ("producer_ids", {"next": 2000}),
    ("offset_commit", {"g": "g", "rows": [["t", 0, 5, -1, "", 1]]}),
    ("offset_expire", {"g": "g", "tps": [["t", 0]]}),
    ("leader_epoch", {"id": TID, "p": 1, "epoch": 3, "start": 0}),
    ("group_state", {"g": "g2", "state": {"generation": 1}}),
    ("group_deleted", {"g": "g2"}),
    ("broker_config", {"scope": "", "configs": {"log.retention.ms": "1000"}}),
    ("group_config", {"g": "g", "configs": {"consumer.session.timeout.ms": "45000"}}),
    (
        "txn",
        {"tid": "app-1", "pid": 1000, "epoch": 0, "state": "complete_abort", "timeout_ms": 60000, "start_ms": 1,
         "last_ms": 2, "parts": [[TID, 0, 3]], "groups": [], "offsets": {}, "markers": [[TID, 0, 7]]},
    ),
    ("acked", {"parts": [[TID, 0, 5], [TID, 1, 0]]}),
    ("acls", {"created": [[2, "t", 4, "User:alice", "*", 3, 3], [3, "g", 3, "User:*", "*", 2, 2]],
              "deleted": [[3, "g", 3, "User:*", "*", 2, 2]]}),
    ("scram_credential", {"user": "alice", "mechanism": "SCRAM-SHA-256",
                          "cred": {"salt": "c2FsdA==", "iterations": 4096, "stored_key": "AA==", "server_key": "AA=="}}),
    ("scram_credential", {"user": "alice", "mechanism": "SCRAM-SHA-256", "cred": None}),
    ("client_quota", {"entity": [["user", "alice"], ["client-id", None]], "values": {"producer_byte_rate": 1024}}),
    ("client_quota", {"entity": [["client-id", None]], "values": None}),
    (
        "segment_rewritten",
        {"id": TID, "p": 0, "replaced": [[0, 0]], "segs": [[*_SEG[:9], 1, "22" * 32]], "clean": {"end": 5, "ms": 9}},
    ),
    ("plog_leader", {"id": TID, "p": 0, "epoch": 1, "leader": 1}),
    ("plog_commit", {"key": "f1", "ranges": [[TID, 0, 1, 0, 4, 32, 400, 5, 9, 7, 1]]}),
    ("plog_merged", {"id": TID, "p": 0, "epoch": 1, "ms": 5, "n": 1,
                     "seg": ["s0", 0, 4, 500, 432, 3, "00" * 32, 5, 9]}),
    ("plog_swept", {"keys": ["f1", "f2"]}),
    ("plog_start", {"id": TID, "p": 0, "epoch": 1, "ms": 9, "start": 2}),
    ("schema_version", {"subject": "s-value", "version": 1, "id": 1, "type": "AVRO", "schema": '"string"', "refs": []}),
    ("schema_config", {"subject": "", "config": {"compatibilityLevel": "FULL"}}),
    ("schema_mode", {"subject": "s-value", "mode": "READONLY"}),
    ("schema_deleted", {"subject": "s-value", "versions": [1], "permanent": False}),
    ("share_state", {"g": "sg", "id": TID, "p": 0, "start": 1, "end": 4, "batches": [[1, 2, 2, 1], [3, 3, 0, 2]], "gen": 1}),
    ("plog_compacted", {"id": TID, "p": 0, "epoch": 1, "ms": 9, "old": ["s0"],
                        "segs": [["s0-g1001", 0, 4, 300, 232, 3, "00" * 32, 2, 9, 1001]], "clean": [5, 9, -1]}),
    ("topic_deleted", {"id": TID}),
]
#: Trailer fields a structured segment mutation may change (not the CRC, version or magic).
_TRAILER_FIELDS = [v for k, v in TRAILER_FIELD_OFFSETS.items() if v < TRAILER_CRC_OFFSET]
_JSON_VALUES: list[Any] = [None, True, -1, 0, 2**63, -(2**63), 10**12, 1.5, "", "zz", "ab" * 16, [], [1, 2], {}, {"a": 1}]


def _base_state() -> MetaState:
    state = MetaState("c1")
    for kind, body in SEED_RECORDS[:3]:
        state.apply(kind, json.loads(json.dumps(body)))
    state.apply("offset_commit", {"g": "g", "rows": [["t", 0, 5, -1, "", 1]]})
    return state


def _fresh_value(rng: random.Random) -> Any:
    return json.loads(json.dumps(rng.choice(_JSON_VALUES)))  # a copy: the table is never changed


def mutate_json(rng: random.Random, doc: Any, rounds: int = 2) -> Any:
    """`doc` with a few values replaced, keys dropped or containers grown."""
    for _ in range(rounds):
        parent: Any = None
        key: Any = None
        node = doc
        for _depth in range(rng.randint(0, 5)):  # walk down a random path
            if isinstance(node, dict) and node:
                parent, key = node, rng.choice(list(node))
            elif isinstance(node, list) and node:
                parent, key = node, rng.randrange(len(node))
            else:
                break
            node = parent[key]
        if parent is None:
            continue
        op = rng.randrange(4)
        if op == 0 and isinstance(parent, dict):
            del parent[key]
        elif op == 1 and isinstance(node, list):
            node.extend(node[:1] * rng.randint(1, 3) or [_fresh_value(rng)])
        else:
            parent[key] = _fresh_value(rng)
    return doc


def _bytes_damage(rng: random.Random, data: bytearray, start: int = 0) -> None:
    n = len(data)
    if n <= start:
        return
    op = rng.randrange(4)
    pos = rng.randrange(start, n)
    if op == 0:
        data[pos] ^= 1 << rng.randrange(8)
    elif op == 1:
        del data[pos:]
    elif op == 2:
        data[pos : pos + 4] = rng.choice([b"\xff\xff\xff\x7f", b"\x00\x00\x00\x00", b"\xff\xff\xff\xff"])
    else:
        data[pos:pos] = rng.randbytes(rng.randint(1, 16))


# ---------------------------------------------------------------------------------- WAL frames


def make_wal(rng: random.Random) -> bytes:
    out = bytearray()
    for i in range(rng.randint(1, 4)):
        payload = rng.randbytes(rng.randint(0, 200))
        for part in encode_frame(i, i, bytes(16), 0, i * 10, i * 10 + 9, payload):
            out += bytes(part)
    if rng.random() < 0.3:
        out += bytes(rng.randint(0, 64))  # the preallocated tail
    for _ in range(rng.randint(1, 3)):
        _bytes_damage(rng, out)
    return bytes(out)


def run_wal(data: bytes) -> None:
    buf = memoryview(data)
    pos = 0
    while True:
        try:
            frame = decode_frame(buf, pos)
        except FrameError:
            find_valid_frame_after(buf, pos)
            return
        if frame is None:
            return
        assert frame.size > 0 and frame.position == pos
        pos += frame.size


# ---------------------------------------------------------------------------------- segments


def make_segment(rng: random.Random) -> bytes:
    txn = rng.random() < 0.3  # format version 3: a transaction index after an ABORT marker
    writer = SegmentWriter(0, bytes(32), 1, txn_index=txn)
    offset = 0
    for _ in range(rng.randint(1, 4)):
        count = rng.randint(1, 4)
        batch = build_batch(
            [(1_700_000_000_000 + i, None, rng.randbytes(rng.randint(0, 40)), []) for i in range(count)],
            base_offset=offset,
            compression=rng.choice([0, 0, 1, 4]),
        )
        writer.add_batch(batch)
        offset += count
    if txn:
        marker = bytearray(control_batch(7, 0, False, 0, 1_700_000_000_000))
        struct.pack_into(">q", marker, 0, offset)  # the base offset is outside the batch CRC
        writer.add_batch(marker)
        writer.aborted_txns = [(7, 0, offset)]
    parts, trailer, _index = writer.finish()
    out = bytearray(b"".join(bytes(p) for p in parts))
    if rng.random() < 0.5 and not txn:  # an index or trailer field changed, the trailer CRC made right again
        tail_at = len(out) - TRAILER_SIZE
        at = rng.choice([rng.randrange(trailer.index_position, tail_at), tail_at + rng.choice(_TRAILER_FIELDS)])
        width = rng.choice([4, 8])
        out[at : at + width] = rng.choice([0, 1, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1]).to_bytes(8, "little")[:width]
        index_position = struct.unpack_from("<Q", out, tail_at + 40)[0]
        if index_position <= tail_at:
            crc = crc32c.crc32c(bytes(out[index_position : tail_at + TRAILER_CRC_OFFSET]))
            struct.pack_into("<I", out, tail_at + TRAILER_CRC_OFFSET, crc)
        return bytes(out)
    for _ in range(rng.randint(1, 3)):
        _bytes_damage(rng, out)
    return bytes(out)


def run_segment(data: bytes) -> None:
    try:
        verify_segment(data, "seg")
    except (CorruptionError, CorruptRecordError):
        pass
    store = MemoryStore()
    store.put("seg", [data])
    reader = SegmentReader(store, "seg", chunk_bytes=64)
    for _chunk in reader.chunks():
        pass
    reader.finish(None)


# ---------------------------------------------------------------------------------- metadata


def make_record(rng: random.Random) -> bytes:
    kind, body = rng.choice(SEED_RECORDS)
    body = mutate_json(rng, json.loads(json.dumps(body)), rng.randint(0, 3))
    raw = bytearray(encode_record(kind, body))
    if rng.random() < 0.3:
        _bytes_damage(rng, raw)
    return bytes(raw)


def run_record(data: bytes) -> None:
    """As the metadata log replays one record: decode, then apply (a misfit is corruption)."""
    kind, body = decode_record(data, where="meta", position=0)
    state = _base_state()
    state.replaying = True
    try:
        state.apply(kind, body)
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptionError("meta", 0, repr(exc)) from None


def make_checkpoint(rng: random.Random) -> bytes:
    state = _base_state()
    img = capture(state)
    img.doc = mutate_json(rng, json.loads(json.dumps(img.doc)), rng.randint(0, 3))
    data = bytearray(b"".join(encode_checkpoint(img)))
    if rng.random() < 0.5:
        _bytes_damage(rng, data, 24)
    if rng.random() < 0.9 and len(data) >= 32:  # make the lengths and CRC agree with the damage
        json_len = struct.unpack_from("<I", data, 16)[0]
        struct.pack_into("<Q", data, 20, max(0, len(data) - 32 - json_len))
        covered = bytes(data[:28])
        struct.pack_into("<I", data, 28, crc32c.crc32c(bytes(data[32:]), crc32c.crc32c(covered)))
    return bytes(data)


def run_checkpoint(data: bytes) -> None:
    decode_checkpoint(data, path="ck")


def _snapshot_payload() -> dict[str, Any]:
    payload = {
        "version": 1,
        "cluster_id": "c1",
        "extra": {"next_producer_id": 1000, "groups": {"groups": {"g": [["t", 0, 5, -1, "", 1]]}}},
        "topics": {"t": {"id": TID, "partitions": 2, "config": {"retention.ms": "1"}, "created_ms": 1}},
        "partitions": {f"{TID}/0": {"log_start": 0, "sealed_end": 5, "chain": "11" * 32, "producers": {}, "segments": [_SEG]}},
    }
    return dict(json.loads(json.dumps(payload)))  # a copy: mutate_json changes it in place


def make_snapshot(rng: random.Random) -> bytes:
    payload = mutate_json(rng, _snapshot_payload(), rng.randint(0, 3))
    data = bytearray(encode_snapshot(7, payload))
    if rng.random() < 0.4:
        _bytes_damage(rng, data)
    if rng.random() < 0.9 and len(data) >= SNAP_HEADER.size:  # lengths and CRC agree again
        struct.pack_into(">I", data, 16, len(data) - SNAP_HEADER.size)
        struct.pack_into(">I", data, 20, crc32c.crc32c(bytes(data[24:]), crc32c.crc32c(bytes(data[:20]))))
    return bytes(data)


def run_snapshot(data: bytes) -> None:
    """As the metadata store's migration reads a version-1 snapshot."""
    _seq, payload = decode_snapshot(data, path="snap")
    try:
        state_from_snapshot(payload)
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptionError("snap", 0, repr(exc)) from None


assert set(RecordKind) == {k for k, _ in SEED_RECORDS}

TARGETS = [
    Target("wal_frames", make_wal, run_wal, (FrameError,)),
    Target("segments", make_segment, run_segment, (CorruptionError, CorruptRecordError)),
    Target("meta_records", make_record, run_record, (CorruptionError,)),
    Target("checkpoints", make_checkpoint, run_checkpoint, (CorruptionError,)),
    Target("snapshots", make_snapshot, run_snapshot, (CorruptionError,)),
]
