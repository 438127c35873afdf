"""The Kafka v2 RecordBatch header layout lives in `loglake.records` only: no module outside it
spells a header offset, size or struct format (it imports `records.batch`'s names and helpers).

The scan is a heuristic over what re-spelled layout has looked like: big-endian struct formats that
are a run of the header's fields, the header's distinctive offsets and size (17 crc, 21 attributes,
22 their low byte, 23 last_offset_delta, ..., 43 producer_id, 57 record_count, 61 the header) used
to index, slice or step through bytes, and batch_length read by hand (``[pos + 8 : pos + 12]``,
``+ 12``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import loglake
from loglake.errors import CorruptRecordError
from loglake.records import batch
from loglake.records.batch import HEADER

SRC = Path(loglake.__file__).parent
OWNER = SRC / "records"

#: The header's field codes, one a field, case folded (``B`` magic and ``b`` are one spelling).
FIELDS = HEADER.format.lstrip("<>!=@").lower()
#: Offsets and sizes no other format of loglake shares by accident.
DISTINCTIVE = {
    batch.CRC_OFFSET,
    batch.CRC_COVERED_START,
    batch.ATTRIBUTES_OFFSET + 1,
    batch.LAST_OFFSET_DELTA_OFFSET,
    batch.FIRST_TIMESTAMP_OFFSET,
    batch.MAX_TIMESTAMP_OFFSET,
    batch.PRODUCER_ID_OFFSET,
    batch.PRODUCER_ID_OFFSET + 8,  # producer_epoch
    batch.PRODUCER_ID_OFFSET + 10,  # base_sequence
    batch.RECORD_COUNT_OFFSET,
    batch.BATCH_HEADER_SIZE,
}
#: Two-field runs that only the header pairs this way: producer id and epoch, and runs with magic.
PAIRS = {"qh", "ib", "bi"}
STRUCT_CALLS = {"Struct", "unpack", "unpack_from", "pack", "pack_into", "iter_unpack", "calcsize"}
#: Names a byte position goes by, next to which a header offset is a header offset.
POSITION = re.compile(r"pos|^at$|offset|start|^i$|^n$|index|^p$")
#: A struct named for a batch: even two fields from the header's start are its head (base_offset,
#: batch_length), though ``>qi`` alone is a common pair elsewhere.
BATCH_NAMED = re.compile(r"batch|head|length", re.IGNORECASE)
#: Module constants that name a place in bytes.
PLACE = re.compile(r"(_AT|_OFFSET|_BYTE|_POS|_SIZE|_START|_END)$")


def _ints(node: ast.AST) -> list[int]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and type(n.value) is int]


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return _name(node.func)
    return ""


def _codes(fmt: str) -> str | None:
    """A big-endian format's field codes, case folded; None for other byte orders (the header is
    big-endian; WAL and segment formats are little-endian) and for counts or padding."""
    if not fmt or fmt[0] not in ">!" or not re.fullmatch(r"[A-Za-z?]+", fmt[1:]):
        return None
    return fmt[1:].lower()


def header_run(fmt: str, name: str = "") -> bool:
    """Whether a struct format spells consecutive header fields: three or more, a telling pair,
    or, for a struct named for a batch, the header's first fields."""
    codes = _codes(fmt)
    if codes is None or codes not in FIELDS:
        return False
    if len(codes) >= 3 or codes in PAIRS:
        return True
    return len(codes) == 2 and FIELDS.startswith(codes) and bool(BATCH_NAMED.search(name))


def layout_literals(source: str, filename: str) -> list[str]:
    """`file:line what` for every header offset, size or format spelled in `source`."""
    found: list[str] = []
    tree = ast.parse(source, filename)
    module_level = {id(s) for s in tree.body}

    def hit(node: ast.AST, what: str) -> None:
        found.append(f"{filename}:{getattr(node, 'lineno', 0)} {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            callee = _name(node.func)
            if callee in STRUCT_CALLS and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str) and header_run(first.value):
                    hit(node, f"struct format {first.value!r}")
                # the offset argument: Struct(...).unpack_from(buf, off), struct.unpack_from(fmt, buf, off)
                at = 2 if isinstance(first, ast.Constant) and isinstance(first.value, str) else 1
                if callee in ("unpack_from", "pack_into") and len(node.args) > at:
                    hit_ints = DISTINCTIVE.intersection(_ints(node.args[at]))
                    for n in sorted(hit_ints):
                        hit(node, f"{callee} at {n}")
            if callee == "from_bytes" and node.args and isinstance(node.args[0], ast.Subscript):
                s = node.args[0].slice
                if isinstance(s, ast.Slice) and s.lower and s.upper:
                    lo, hi = _ints(s.lower), _ints(s.upper)
                    if batch.BATCH_LENGTH_OFFSET in lo and batch.LENGTH_FIELD_END in hi:
                        hit(node, "batch_length read by hand")
        elif isinstance(node, ast.Subscript):
            for n in sorted(DISTINCTIVE.intersection(_ints(node.slice))):
                hit(node, f"bytes indexed at {n}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
            for lit, other in ((node.left, node.right), (node.right, node.left)):
                if not (isinstance(lit, ast.Constant) and type(lit.value) is int):
                    continue
                if lit.value in DISTINCTIVE and POSITION.search(_name(other)):
                    hit(node, f"position + {lit.value}")
                if lit.value == batch.LENGTH_FIELD_END and "length" in _name(other).lower():
                    hit(node, "batch_length + 12")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Call) and _name(s) == "len" for s in sides):
                for s in sides:
                    for n in sorted(DISTINCTIVE.intersection(_ints(s))):
                        hit(node, f"length compared with {n}")
        elif isinstance(node, ast.Assign | ast.AnnAssign) and id(node) in module_level:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            if isinstance(value, ast.Call) and _name(value) == "Struct" and value.args:
                fmt = value.args[0]
                if isinstance(fmt, ast.Constant) and isinstance(fmt.value, str):
                    for t in targets:
                        if not header_run(fmt.value) and header_run(fmt.value, _name(t)):
                            hit(node, f"{_name(t)} = Struct({fmt.value!r})")
            if isinstance(value, ast.Constant) and type(value.value) is int and value.value in DISTINCTIVE:
                for t in targets:
                    if PLACE.search(_name(t)):
                        hit(node, f"{_name(t)} = {value.value}")
    return found


def test_no_module_outside_records_spells_the_header() -> None:
    found: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        if OWNER not in path.parents:
            found += layout_literals(path.read_text(), str(path.relative_to(SRC)))
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        "_PRODUCER = struct.Struct('>qh')",
        "_HEAD = struct.Struct('>qiibI')",
        "BATCH_HEAD = Struct('>qii')",
        "x = struct.unpack_from('>qiiB', buf, 0)",
        "_PRODUCER_AT = 43",
        "_ATTR_LOW_BYTE = 22",
        "if records[22] & 0x10:\n    pass",
        "pid, epoch = _PRODUCER.unpack_from(records, 43)",
        "end = base + struct.unpack_from('>i', view, pos + 23)[0] + 1",
        "while pos + 61 <= len(view):\n    pass",
        "if len(records) <= 53:\n    pass",
        "size = int.from_bytes(chunk[pos + 8 : pos + 12], 'big') + 12",
        "pos += 12 + length",
        "body = data[at + 61 :]",
        "BATCH_HEAD = Struct('>qi')",
        "_BASE_AND_LENGTH = struct.Struct('>qi')",
    ],
)
def test_the_scan_sees_a_spelled_layout(source: str) -> None:
    assert layout_literals(source, "m.py"), source


def test_the_scan_ignores_other_layouts() -> None:
    source = (
        "_QI = Struct('>qi')\n_HI = Struct('>hi')\n_P4 = Struct('>ihqq')\n"
        "ENTRY = struct.Struct('<qqqqqqBI32s32s32s')\n"  # little-endian: a loglake format
        "_GEN_OFFSET = 49\nTIMEOUT_S = 61\n"
        "x = I32.unpack_from(data, 4)[0]\n"
        "if pos + 8 > n:\n    pass\n"
        "window = items[pos : pos + 20]\n"
        "size = batch_size(chunk, pos)\n"
        "while pos + BATCH_HEADER_SIZE <= len(view):\n    pass\n"
    )
    assert layout_literals(source, "m.py") == []


def test_owner_names_are_the_header() -> None:
    """The names callers use agree with the header struct they were derived from."""
    assert batch.BATCH_HEADER_SIZE == HEADER.size == 61
    assert batch.BASE_AND_LENGTH.size == batch.LENGTH_FIELD_END == 12
    assert batch.UNCOVERED_HEAD.size == batch.CRC_COVERED_START == 21
    assert (batch.LAST_OFFSET_DELTA_OFFSET, batch.PRODUCER_ID_OFFSET, batch.RECORD_COUNT_OFFSET) == (23, 43, 57)


def _batch(**kw: object) -> bytes:
    rows = [(1_000 + i, b"k%d" % i, b"v", []) for i in range(3)]
    return batch.build_batch(rows, base_offset=40, **kw)


def test_peek_txn_producer() -> None:
    """What Produce checks per batch: the producer of a transactional batch, nothing of others."""
    txn = _batch(producer_id=7_000_000_000, producer_epoch=3, base_sequence=0, is_transactional=True)
    assert batch.peek_txn_producer(txn) == (7_000_000_000, 3)
    assert batch.peek_txn_producer(memoryview(b"xx" + txn), 2) == (7_000_000_000, 3)
    assert batch.peek_txn_producer(_batch(producer_id=5, producer_epoch=1, base_sequence=0)) is None
    # A header cut short is left to validation (which calls it corrupt), not read past its end.
    assert batch.peek_txn_producer(txn[: batch.BATCH_HEADER_SIZE - 1]) is None
    assert batch.peek_txn_producer(b"") is None


def test_batch_size_and_last_offset() -> None:
    one = _batch()
    two = one + _batch(compression=1)
    assert batch.batch_size(one) == len(one)
    assert batch.batch_size(two, len(one)) == len(two) - len(one)
    assert batch.batch_size(memoryview(one)[: batch.LENGTH_FIELD_END]) == len(one)
    assert batch.peek_last_offset(two, len(one)) == 42 == batch.peek_header(two, len(one)).last_offset
    with pytest.raises(CorruptRecordError):
        batch.batch_size(one[: batch.LENGTH_FIELD_END - 1])
    # A negative batch_length (corrupt) reads as a size past the data: a scan moves on, never back.
    corrupt = bytearray(one)
    corrupt[batch.BATCH_LENGTH_OFFSET : batch.LENGTH_FIELD_END] = b"\xff\xff\xff\xf0"
    assert batch.batch_size(corrupt) > len(corrupt)
