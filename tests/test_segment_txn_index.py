"""Segment format version 3: the transaction index (aborted transactions per segment).

Format level: a version-3 segment round-trips (sealed and rewritten), verification checks every
entry against an ABORT marker in the data, and a damaged or impossible index is corruption.
Engine level: a seal writes version 3 exactly for segments holding transactional batches, each
ABORT marker's entry carries its transaction's first offset even when the data lies in an
earlier segment, and compaction carries the index into the rewritten segment.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import crc32c
import pytest

from loglake.broker.txn.id_store import TxnIdStore
from loglake.engine import Engine
from loglake.engine.txn import control_batch
from loglake.engine.verify import verify_data_dir
from loglake.errors import CorruptionError
from loglake.records.batch import BatchBuilder
from loglake.segment import ZERO_HASH, SegmentWriter, parse_tail, verify_segment
from loglake.segment.format import FLAG_TXN_INDEX, TRAILER_V2, TRAILER_V2_FIELD_OFFSETS, TXN_VERSION, Rewrite
from loglake.segment.verify import describe_segment
from test_txn_recovery import body, end_txn


def batch_at(base: int, pid: int = -1, txn: bool = False, n: int = 2) -> bytes:
    b = BatchBuilder(producer_id=pid, producer_epoch=0 if pid >= 0 else -1, base_sequence=0 if pid >= 0 else -1, is_transactional=txn)
    for i in range(n):
        b.append(1_000 + i, None, b"v%d" % i, [])
    out = bytearray(b.build())
    return _rebase(out, base)


def marker_at(base: int, pid: int, commit: bool) -> bytes:
    return _rebase(control_batch(pid, 0, commit, 0, 1_000), base)


def _rebase(buf: bytearray, base: int) -> bytes:
    struct.pack_into(">q", buf, 0, base)  # the base offset is outside the CRC
    return bytes(buf)


def build(batches: list[bytes], aborted: list[tuple[int, int, int]], rewrite: Rewrite | None = None) -> bytes:
    base = int.from_bytes(batches[0][:8], "big")
    w = SegmentWriter(base, ZERO_HASH, 5, rewrite, txn_index=True)
    for b in batches:
        w.add_batch(b)
    w.aborted_txns = list(aborted)
    parts, _trailer, _index = w.finish()
    return b"".join(bytes(p) for p in parts)


def test_sealed_version_3_round_trips_and_verifies() -> None:
    data = build([batch_at(10, 7, True), batch_at(12), marker_at(14, 7, False), marker_at(15, 8, True)], [(7, 10, 14)])
    parsed = parse_tail(data, len(data), "k")
    assert not isinstance(parsed, int)
    trailer, _index = parsed
    assert trailer.version == TXN_VERSION and trailer.txn_index and not trailer.rewritten
    assert trailer.aborted_txns == ((7, 10, 14),) and trailer.provenance is None
    assert trailer.link_hash == trailer.chain_hash and trailer.last_offset == 15
    assert verify_segment(data, "k") == trailer
    assert describe_segment(data, "k")["aborted_txns"] == [[7, 10, 14]]
    assert data[6] == FLAG_TXN_INDEX  # header flags (little-endian u16 at byte 6)


def test_rewritten_version_3_keeps_provenance_and_index() -> None:
    prov = {"kind": "merge", "ms": 5, "params": {}, "replaced": [[10, 20, "", "", 0, 1]]}
    rw = Rewrite(20, b"\x01" * 32, 1, prov)
    data = build([batch_at(10, 7, True), marker_at(19, 7, False)], [(7, 10, 19)], rw)
    parsed = parse_tail(data, len(data), "k")
    assert not isinstance(parsed, int)
    trailer, _ = parsed
    assert trailer.rewritten and trailer.generation == 1 and trailer.provenance == prov
    assert trailer.aborted_txns == ((7, 10, 19),) and trailer.link_hash == b"\x01" * 32


def test_index_naming_no_abort_marker_is_corruption() -> None:
    # offset 14 is a COMMIT marker, and 12 is not a marker at all: both are caught by verification
    for entry in ((7, 10, 14), (7, 10, 12), (9, 10, 15)):
        data = build([batch_at(10, 7, True), batch_at(12), marker_at(14, 7, True), marker_at(15, 8, False)], [entry])
        with pytest.raises(CorruptionError, match="ABORT marker"):
            verify_segment(data, "k")


def _with_section(data: bytes, section: bytes) -> bytes:
    """The segment with its JSON section replaced (trailer length and CRC fixed up)."""
    t = TRAILER_V2.unpack_from(data, len(data) - TRAILER_V2.size)
    index_position, entry_count, old_len = t[5], t[6], t[12]
    index_end = index_position + entry_count * 40
    fields = list(t)
    fields[12] = len(section)
    head = TRAILER_V2.pack(*fields)[: TRAILER_V2_FIELD_OFFSETS["trailer_crc"]]
    fields[13] = crc32c.crc32c(head, crc32c.crc32c(section, crc32c.crc32c(data[index_position:index_end])))
    assert len(data) == index_end + old_len + TRAILER_V2.size
    return data[:index_end] + section + TRAILER_V2.pack(*fields)


@pytest.mark.parametrize(
    "section",
    [
        b"{}",  # no index at all
        b'{"aborted_txns": [[7, 10]]}',  # short entry
        b'{"aborted_txns": [[7, 10, 99]]}',  # marker outside the segment
        b'{"aborted_txns": [[7, 15, 14]]}',  # first after its marker
        b'{"aborted_txns": [[7, 10, 14], [8, 10, 14]]}',  # markers not strictly increasing
        b'{"aborted_txns": [], "kind": "merge"}',  # a sealed segment with provenance keys
        b'{"aborted_txns": [[7, 10, "14"]]}',  # not an integer
    ],
)
def test_impossible_index_is_corruption(section: bytes) -> None:
    data = _with_section(build([batch_at(10, 7, True), batch_at(12), marker_at(14, 7, False)], [(7, 10, 14)]), section)
    with pytest.raises(CorruptionError):
        parse_tail(data, len(data), "k")


def test_good_section_rewritten_by_the_helper_still_parses() -> None:
    data = build([batch_at(10, 7, True), batch_at(12), marker_at(14, 7, False)], [(7, 10, 14)])
    again = _with_section(data, json.dumps({"aborted_txns": [[7, 10, 14]]}, separators=(",", ":")).encode())
    assert again == data  # the helper is exact, so the parametrized failures above are the content's


def test_writer_rejects_an_entry_outside_the_segment() -> None:
    w = SegmentWriter(10, ZERO_HASH, 5, txn_index=True)
    w.add_batch(batch_at(10, 7, True))
    w.aborted_txns = [(7, 10, 30)]
    with pytest.raises(ValueError, match="outside the segment"):
        w.finish()


def open_txn(engine: Engine, topic: str, n: int) -> tuple[int, dict[tuple[str, int], int]]:
    """An ongoing transaction with `n` keyed records in partition 0 (a compacted topic needs keys)."""
    pid = engine.allocate_producer_id()
    parts = {(topic, 0): engine.partition_info(topic, 0).next_offset}
    TxnIdStore.of(engine).record(body(engine, pid, "ongoing", parts)).result()
    b = BatchBuilder(producer_id=pid, producer_epoch=0, base_sequence=0, is_transactional=True)
    for i in range(n):
        b.append(1_000 + i, b"tk%d" % i, b"tv%d" % i, [])
    engine.append_batch(topic, 0, bytearray(b.build())).result()
    return pid, parts


def _trailers(engine: Engine, topic: str, partition: int) -> list[object]:
    from loglake.segment import read_tail

    p = engine.catalog.partition(topic, partition)
    return [read_tail(engine.log.stores.hot, s.key, s.size)[0] for s in p.segments]


def test_seal_writes_the_index_only_where_transactions_are(tmp_path: Path) -> None:
    with Engine(str(tmp_path / "d")) as engine:
        engine.create_topic("plain", 1)
        engine.create_topic("t", 1, {"cleanup.policy": "compact"})
        engine.append_records("plain", 0, [(None, b"k", b"v", [])]).result()
        engine.append_records("t", 0, [(None, b"k0", b"before", [])]).result()
        pid, parts = open_txn(engine, "t", 3)  # offsets 1..3
        engine.flush()  # the transaction's data is sealed while it is still open
        end_txn(engine, pid, parts, commit=False)  # ABORT marker at 4, in the next segment
        pid2, parts2 = open_txn(engine, "t", 2)  # 5..6
        end_txn(engine, pid2, parts2, commit=True)  # COMMIT at 7
        pid3, parts3 = open_txn(engine, "t", 1)  # 8
        end_txn(engine, pid3, parts3, commit=False)  # ABORT at 9
        engine.append_records("t", 0, [(None, b"k1", b"after", [])]).result()
        engine.flush()
        plain = _trailers(engine, "plain", 0)
        assert [t.version for t in plain] == [1]  # type: ignore[attr-defined]
        ts = _trailers(engine, "t", 0)
        assert [t.version for t in ts] == [3, 3]  # type: ignore[attr-defined]
        assert ts[0].aborted_txns == ()  # type: ignore[attr-defined]
        # the first offset of the first aborted transaction lies in the earlier segment
        assert ts[1].aborted_txns == ((pid, 1, 4), (pid3, 8, 9))  # type: ignore[attr-defined]
        assert verify_data_dir(engine).ok
        # compaction rewrites the segments (aborted records dropped, markers kept): the index stays
        engine.compact("t")
        after = _trailers(engine, "t", 0)
        assert all(t.version == 3 and t.rewritten for t in after)  # type: ignore[attr-defined]
        assert [e for t in after for e in t.aborted_txns] == [(pid, 1, 4), (pid3, 8, 9)]  # type: ignore[attr-defined]
        assert verify_data_dir(engine).ok
