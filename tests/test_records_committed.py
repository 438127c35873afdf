"""loglake.records.committed: Kafka's read_committed consumer rule over batch headers."""

from __future__ import annotations

import pytest

from loglake.engine.txn import control_batch
from loglake.records.batch import BatchBuilder, BatchHeader, peek_header
from loglake.records.committed import CommittedFilter, check_isolation, committed_batches, control_type


def txn_batch(pid: int, values: list[bytes]) -> bytearray:
    b = BatchBuilder(producer_id=pid, producer_epoch=0, is_transactional=True)
    for v in values:
        b.append(0, None, v, [])
    return bytearray(b.build())


def header(base: int, count: int, pid: int, *, txn: bool = True, control: bool = False) -> BatchHeader:
    attrs = (0x10 if txn else 0) | (0x20 if control else 0)
    return BatchHeader(base, 0, 0, 2, 0, attrs, count - 1, 0, 0, pid, 0, 0, count)


ABORT, COMMIT = b"\x00\x00\x00\x00", b"\x00\x00\x00\x01"


def test_filter_follows_kafkas_rule() -> None:
    f = CommittedFilter([(7, 5), (7, 20), (9, 6)])
    assert f.keep(header(0, 5, 7))  # before its first aborted txn: kept
    assert not f.keep(header(5, 1, 7))  # pid 7 active from offset 5
    assert not f.keep(header(6, 2, 9))  # pid 9 active from offset 6
    assert f.keep(header(8, 1, -1, txn=False))  # a plain batch in between
    assert f.keep(header(9, 1, 7, txn=False))  # idempotent, not transactional: kept
    assert not f.keep(header(10, 1, 7, control=True), ABORT)  # marker ends pid 7's range
    assert f.keep(header(11, 3, 7))  # pid 7's next transaction (committed)
    assert not f.keep(header(14, 1, 7, control=True), COMMIT)
    assert not f.keep(header(15, 1, 9))  # pid 9 still active
    assert not f.keep(header(16, 1, 9, control=True), ABORT)
    assert f.keep(header(17, 1, 9))
    assert not f.keep(header(19, 2, 7))  # a batch holding the first offset 20 of pid 7's second abort
    assert not f.keep(header(21, 1, 7, control=True), ABORT)
    assert f.keep(header(22, 1, 7))


def test_uncommitted_drops_only_control_batches() -> None:
    data = bytes(txn_batch(3, [b"a", b"b"])) + bytes(control_batch(3, 0, False, 0, 0))
    rebased = bytearray(data)
    second = peek_header(data, 0).size
    rebased[second : second + 8] = (2).to_bytes(8, "big")  # the marker at offset 2
    out = [(h.base_offset, h.is_control, keep) for h, _r, keep in committed_batches(rebased, None, check_crc=False)]
    assert out == [(0, False, True), (2, True, False)]
    out = [keep for _h, _r, keep in committed_batches(rebased, [(3, 0)], check_crc=False)]
    assert out == [False, False]
    assert control_type(ABORT) == 0 and control_type(COMMIT) == 1 and control_type(b"\x00") is None


def test_check_isolation() -> None:
    assert check_isolation("read_committed") == "read_committed"
    with pytest.raises(ValueError, match="got 'READ_COMMITTED'"):
        check_isolation("READ_COMMITTED")
