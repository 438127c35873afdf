"""Regressions for the bugs the fuzzers (tests/test_fuzz.py) found, one test each, with the seed
and case that found them."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import crc32c
import pytest

from loglake.broker.protocol import MalformedRequestError, decode_request, request_class
from loglake.engine import Engine
from loglake.errors import CorruptionError
from loglake.meta.checkpoint import capture, decode_checkpoint, encode_checkpoint
from loglake.meta.snapshot import decode_snapshot, encode_snapshot
from loglake.meta.state import PARTITIONS_PER_TOPIC_MAX, MetaState
from loglake.meta.state_v1 import state_from_snapshot
from loglake.records.batch import build_batch
from loglake.segment.format import TRAILER_CRC_OFFSET, TRAILER_SIZE, SegmentWriter
from loglake.segment.index import INDEX_ENTRY_SIZE
from loglake.segment.verify import SegmentReader
from loglake.store.memory import MemoryStore
from test_protocol_samples import client_bytes

from ctxkit import HandlerConn, broker_context
from enginekit import small_config

TID = "ab" * 16


def _topic_state() -> MetaState:
    state = MetaState("c1")
    state.apply("topic_created", {"name": "t", "id": TID, "partitions": 1, "config": {}, "created_ms": 1})
    return state


# Found by meta_records, seed 1 case 220: a record whose "config" is a list replayed as an
# AttributeError, which the metadata log's replay does not turn into CorruptionError.
@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("topic_config", {"id": TID, "config": [1, 2]}),
        ("topic_created", {"name": "u", "id": "cd" * 16, "partitions": 1, "config": "x", "created_ms": 1}),
        ("segment_rewritten", {"id": TID, "p": 0, "replaced": [], "segs": []}),
        ("offset_commit", {"g": "g", "rows": 5}),
        # meta_records, seed 1479663067 case 23028 (make test-long): an infinite partition index
        # raised OverflowError out of int()
        ("segment_tier", {"id": TID, "p": float("inf"), "base": 0, "tier": "cold"}),
        ("topic_created", {"name": "u", "id": "cd" * 16, "partitions": float("inf"), "config": {}, "created_ms": 1}),
    ],
)
def test_a_record_of_the_wrong_shape_is_a_value_error(kind: str, body: dict[str, object]) -> None:
    with pytest.raises((KeyError, ValueError, TypeError)):
        _topic_state().apply(kind, body)


# Found by meta_records, seed 1 case 778: "partitions": 10**12 built partitions until the case
# was stopped (unbounded time and memory on replay of one bad record).
@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("topic_created", {"name": "u", "id": "cd" * 16, "partitions": 10**12, "config": {}, "created_ms": 1}),
        ("partitions_added", {"id": TID, "total": 2**63}),
        ("partitions_added", {"id": TID, "total": PARTITIONS_PER_TOPIC_MAX + 1}),
    ],
)
def test_a_partition_count_over_the_limit_is_refused(kind: str, body: dict[str, object]) -> None:
    state = _topic_state()
    with pytest.raises(ValueError, match="partition count"):
        state.apply(kind, body)
    assert len(state.partitions) == 1


def _checkpoint_with(doc_change: dict[str, object]) -> bytes:
    img = capture(_topic_state())
    img.doc = {**img.doc, **doc_change}
    return b"".join(encode_checkpoint(img))


# Found by checkpoints, seed 1 case 901: a CRC-valid checkpoint whose "groups" is null raised
# AttributeError out of decode_checkpoint instead of CorruptionError.
@pytest.mark.parametrize(
    "change",
    [{"groups": None}, {"topics": [5]}, {"topics": [{"name": "t", "id": TID, "partitions": 10**9, "config": {},
                                                     "created_ms": 1}]}],
)
def test_a_checkpoint_of_the_wrong_shape_is_corruption(change: dict[str, object]) -> None:
    with pytest.raises(CorruptionError, match="does not parse"):
        decode_checkpoint(_checkpoint_with(change), path="ck")


def _snapshot_payload(**change: object) -> dict[str, object]:
    payload: dict[str, object] = {
        "version": 1,
        "cluster_id": "c1",
        "extra": {},
        "topics": {"t": {"id": TID, "partitions": 1, "config": {}, "created_ms": 1}},
        "partitions": {f"{TID}/0": {"log_start": 0, "sealed_end": 0, "chain": "11" * 32, "producers": {},
                                    "segments": []}},
    }
    payload.update(change)
    return payload


# Found by snapshots, seed 1 cases 13, 304 and 1786: a version-1 snapshot whose "partitions" is a
# string, "topics" a list, or a segment row empty escaped the migration's error handling.
@pytest.mark.parametrize(
    "change",
    [{"partitions": "x"}, {"topics": [1]}, {"partitions": {f"{TID}/0": {"log_start": 0, "sealed_end": 0,
                                                                        "chain": "", "producers": True,
                                                                        "segments": []}}},
     {"partitions": {f"{TID}/0": {"log_start": 0, "sealed_end": 0, "chain": "", "producers": {},
                                  "segments": [[]]}}}],
)
def test_a_snapshot_of_the_wrong_shape_is_a_value_error(change: dict[str, object]) -> None:
    _seq, payload = decode_snapshot(encode_snapshot(3, _snapshot_payload(**change)), path="s")
    with pytest.raises((KeyError, ValueError, TypeError)):
        state_from_snapshot(payload)


# Found by snapshots, seed 20261124 case 3885 (and segment_published records): a segment row with
# a number outside int64 raised struct.error, which is not a ValueError, out of the replay.
def test_a_segment_row_out_of_int64_range_is_a_value_error() -> None:
    row = [0, 2**63, 100, 5, 5, "00" * 32, "11" * 32, 1, "hot"]
    with pytest.raises(ValueError):
        _topic_state().apply("segment_published", {"id": TID, "p": 0, "seg": row})
    part = {f"{TID}/0": {"log_start": 0, "sealed_end": 0, "chain": "", "producers": {}, "segments": [row]}}
    _seq, payload = decode_snapshot(encode_snapshot(3, _snapshot_payload(partitions=part)), path="s")
    with pytest.raises(ValueError):
        state_from_snapshot(payload)


def test_good_documents_still_load() -> None:
    decode_checkpoint(_checkpoint_with({}), path="ck")
    assert state_from_snapshot(_snapshot_payload()).topics


# Found by the live-broker fuzz, seed 99: DeleteRecords v2 whose partitions array is null (a
# compact length of 0) reached the handler as None ("'NoneType' object is not iterable", a
# traceback in the broker log). Kafka refuses null in a non-nullable field; so does the codec now.
def test_null_in_a_non_nullable_field_is_malformed() -> None:
    cls = request_class(21)
    req = cls[2](topics=[cls[2].DeleteRecordsTopic(name="t", partitions=None)], timeout_ms=1)
    with pytest.raises(MalformedRequestError, match=r"non-nullable field topics\.partitions is null"):
        decode_request(client_bytes(req)[4:])
    ok = cls[2](topics=[cls[2].DeleteRecordsTopic(name="t", partitions=[])], timeout_ms=1)
    assert decode_request(client_bytes(ok)[4:]).body.topics[0].partitions == []


# Found by the live-broker fuzz, seed 99: ConsumerGroupHeartbeat owning partitions of the zero
# topic id (which kafka-python decodes as None) failed with AttributeError in the handler.
def test_heartbeat_owning_the_zero_topic_id_is_answered(tmp_path: Path) -> None:
    from loglake.broker.handlers.consumer_groups import consumer_group_heartbeat

    class Coordinator:
        owned: object = None

        def close(self) -> None:
            pass

        async def consumer_heartbeat(self, hb: object) -> object:
            Coordinator.owned = hb.owned  # type: ignore[attr-defined]
            raise LookupError("stop here")

    cls = request_class(68)
    req = cls[0](group_id="g", member_id="m", member_epoch=0, instance_id=None, rack_id=None,
                 rebalance_timeout_ms=1000, subscribed_topic_names=["t"], server_assignor=None,
                 topic_partitions=[cls[0].TopicPartitions(topic_id=None, partitions=[0])])
    decoded = decode_request(client_bytes(req)[4:])
    engine = Engine(str(tmp_path / "data"), small_config(), start_background=False)
    engine.open()

    async def heartbeat() -> None:
        async with broker_context(engine, str(tmp_path)) as ctx:
            ctx.groups.coordinator.close()  # type: ignore[union-attr]
            ctx.groups.coordinator = Coordinator()  # type: ignore[assignment]  # this broker coordinates "g"
            await consumer_group_heartbeat(ctx, HandlerConn(), decoded)  # type: ignore[arg-type]

    try:
        with pytest.raises(LookupError):
            asyncio.run(heartbeat())
    finally:
        engine.close()
    assert Coordinator.owned == [("0" * 32, [0])]


# Found by the live-broker fuzz, seed 99 case 1500..: ConsumerGroupHeartbeat v1 subscribing to a
# null topic name reached the group coordinator as None (TypeError, a traceback in the log).
def test_a_null_element_of_a_string_array_is_malformed() -> None:
    cls = request_class(68)
    req = cls[1](group_id="g", member_id="m", member_epoch=0, instance_id=None, rack_id=None,
                 rebalance_timeout_ms=1000, subscribed_topic_names=["t", None], subscribed_topic_regex=None,
                 server_assignor=None, topic_partitions=None)
    with pytest.raises(MalformedRequestError, match=r"subscribed_topic_names\[1\] is null"):
        decode_request(client_bytes(req)[4:])


# Found by segments, seed 3 case 14: an index whose positions are out of order (the trailer CRC
# made right again) gave SegmentReader a negative byte range: ValueError from the store instead
# of CorruptionError.
def test_segment_reader_refuses_an_index_out_of_order() -> None:
    writer = SegmentWriter(0, bytes(32), 1)
    for base in range(3):
        writer.add_batch(build_batch([(1, None, b"v%d" % base, [])], base_offset=base))
    parts, trailer, _index = writer.finish()
    data = bytearray(b"".join(bytes(p) for p in parts))
    tail_at = len(data) - TRAILER_SIZE
    struct.pack_into("<Q", data, trailer.index_position + INDEX_ENTRY_SIZE + 8, 0)  # entry 1 at byte 0
    crc = crc32c.crc32c(bytes(data[trailer.index_position : tail_at + TRAILER_CRC_OFFSET]))
    struct.pack_into("<I", data, tail_at + TRAILER_CRC_OFFSET, crc)
    store = MemoryStore()
    store.put("seg", [bytes(data)])
    reader = SegmentReader(store, "seg", chunk_bytes=1)
    with pytest.raises(CorruptionError, match="outside the data section"):
        for _chunk in reader.chunks():
            pass
