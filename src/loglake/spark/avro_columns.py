"""Avro datums of one writer schema decoded into Arrow columns all at once (numpy, no per-record
Python): the typed source's fast path (loglake.spark.typed).

The records of a batch that name the same schema id are decoded in lockstep: every record's
first field, then every record's second, each a few numpy operations over all of them (a
varint, a string's length and bytes, a union's branch). A writer field the reader lacks is
read and dropped, a reader field the writer lacks is its default, promotions (int to long,
float or double; long to float or double; float to double; string and bytes) are casts: Avro's
resolution rules for the schemas `compile_plan` accepts. It refuses (`Unsupported`) what it does
not read — arrays, maps, decimals, recursive or differently named types, logical types the two
schemas disagree on — and those schema ids go through fastavro, a record at a time.

A record that does not parse here (a varint or string running past its end, a union branch or
enum index out of range, bytes left after it, a symbol the reader lacks, bad UTF-8) is
reported, not raised: the caller reads those few again with fastavro for their exact reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa
    from numpy.typing import NDArray

__all__ = ["PAD", "Plan", "Unsupported", "compile_plan"]

#: Avro timestamp logical types -> microseconds per unit (the Spark column holds microseconds).
TIMESTAMP_UNITS = {
    "timestamp-millis": 1000, "timestamp-micros": 1, "local-timestamp-millis": 1000, "local-timestamp-micros": 1,
}  # fmt: skip
#: Promotions Avro's resolution allows: writer type -> reader types.
PROMOTIONS = {
    "int": {"int", "long", "float", "double"},
    "long": {"long", "float", "double"},
    "float": {"float", "double"},
    "string": {"string", "bytes"},
    "bytes": {"bytes", "string"},
}
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
#: Zero bytes a buffer of datums carries after its last one, so that the 8-byte read of a double
#: cut short at the end stays inside it (the record still fails: its read ends past its end).
PAD = 16

Schema = Any  # an Avro schema's JSON document


class Unsupported(Exception):
    """The pair of schemas is not read here (fastavro reads it)."""


class _State:
    """The records being decoded: their bytes, where each is now, where each ends, which failed."""

    def __init__(self, buf: NDArray[np.uint8], pos: NDArray[np.int64], end: NDArray[np.int64]) -> None:
        self.buf = buf
        self.pos = pos
        self.end = end
        self.bad = np.zeros(pos.size, dtype=bool)

    def fail(self, sel: NDArray[np.int64], mask: NDArray[np.bool_]) -> None:
        if mask.any():
            hit = sel[mask]
            self.bad[hit] = True
            self.pos[hit] = self.end[hit]  # every later read of them is out of range: stays bad

    def long(self, sel: NDArray[np.int64]) -> NDArray[np.int64]:
        """Zigzag varints at the records `sel`, advancing them; 0 where one does not parse."""
        buf, p, e = self.buf, self.pos[sel], self.end[sel]
        live = p < e
        b = buf[np.where(live, p, 0)].astype(np.uint64)
        val = b & np.uint64(0x7F)
        more = live & (b >= 0x80)
        p = p + live
        shift = 7
        while more.any():
            if shift > 63:
                live &= ~more
                break
            inside = p < e
            live &= ~(more & ~inside)
            more &= inside
            b = buf[np.where(more, p, 0)].astype(np.uint64)
            val |= np.where(more, (b & np.uint64(0x7F)) << np.uint64(shift), np.uint64(0))
            p = p + more
            more &= b >= 0x80
            shift += 7
        self.pos[sel] = p
        self.fail(sel, ~live)
        out: NDArray[np.int64] = (val >> np.uint64(1)).view(np.int64) ^ -((val & np.uint64(1)).view(np.int64))
        out[~live] = 0
        return out

    def fixed(self, sel: NDArray[np.int64], size: int) -> NDArray[np.int64]:
        """Start of `size` bytes at each record of `sel`, advancing them; bad where they run out."""
        p = self.pos[sel]
        over = p + size > self.end[sel]
        self.pos[sel] = p + size
        self.fail(sel, over)
        return np.where(over, 0, p)

    def gather(self, starts: NDArray[np.int64], lengths: NDArray[np.int64]) -> tuple[NDArray[np.int32], NDArray[np.uint8]]:
        """(Arrow offsets, data) of the byte strings at `starts` of `lengths`."""
        offsets = np.zeros(starts.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        if total > np.iinfo(np.int32).max:
            raise Unsupported("more than 2 GiB of strings in one batch")
        if total:
            idx = np.repeat(starts - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
            data = self.buf[idx]
        else:
            data = np.zeros(0, dtype=np.uint8)
        return offsets.astype(np.int32), data


# a node reads its type at the records `sel` and returns their column (None: read and dropped)
Read = Callable[[_State, "NDArray[np.int64]"], "pa.Array | None"]


def _bytes_like(kind: str, keep: bool) -> Read:
    import pyarrow as pa

    arrow_type = pa.string() if kind == "string" else pa.binary()

    def read(st: _State, sel: NDArray[np.int64]) -> pa.Array | None:
        lengths = st.long(sel)
        starts = st.pos[sel]
        over = (lengths < 0) | (starts + lengths > st.end[sel])
        st.fail(sel, over)
        lengths = np.where(over, 0, lengths)
        st.pos[sel] = np.where(over, st.pos[sel], starts + lengths)
        if not keep:
            return None
        offsets, data = st.gather(starts, lengths)
        arr = pa.Array.from_buffers(arrow_type, sel.size, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        if kind == "string":
            try:
                arr.validate(full=True)
            except pa.ArrowInvalid:  # bad UTF-8: find the records (rare), they are read again
                broken = np.zeros(sel.size, dtype=bool)
                for i, s in enumerate(arr.cast(pa.binary()).to_pylist()):
                    try:
                        s.decode()
                    except UnicodeDecodeError:
                        broken[i] = True
                st.fail(sel, broken)
                arr = pa.array([None if b else s for b, s in zip(broken, arr.cast(pa.binary()).to_pylist(), strict=True)], pa.binary()).cast(pa.string())
        return arr

    return read


def _numeric(kind: str, keep: bool) -> Read:
    import pyarrow as pa

    size = {"float": 4, "double": 8}[kind]
    dtype = np.dtype("<f4") if kind == "float" else np.dtype("<f8")

    def read(st: _State, sel: NDArray[np.int64]) -> pa.Array | None:
        starts = st.fixed(sel, size)
        if not keep:
            return None
        idx = starts[:, None] + np.arange(size, dtype=np.int64)
        values = np.ascontiguousarray(st.buf[idx]).view(dtype).reshape(sel.size)
        return pa.array(values)

    return read


def _varint(kind: str, keep: bool, unit: int) -> Read:
    import pyarrow as pa

    def read(st: _State, sel: NDArray[np.int64]) -> pa.Array | None:
        values = st.long(sel)
        if kind == "int":
            st.fail(sel, (values < -(1 << 31)) | (values >= 1 << 31))
        if not keep:
            return None
        if unit != 1:
            limit = np.iinfo(np.int64).max // unit
            st.fail(sel, (values > limit) | (values < -limit))
            values = values * unit
        return pa.array(values.astype(np.int32) if kind == "int" and unit == 1 else values)

    return read


def _boolean(keep: bool) -> Read:
    import pyarrow as pa

    def read(st: _State, sel: NDArray[np.int64]) -> pa.Array | None:
        starts = st.fixed(sel, 1)
        b = st.buf[starts]
        st.fail(sel, b > 1)
        return pa.array(b == 1) if keep else None

    return read


def _fixed(size: int, keep: bool) -> Read:
    import pyarrow as pa

    def read(st: _State, sel: NDArray[np.int64]) -> pa.Array | None:
        starts = st.fixed(sel, size)
        if not keep:
            return None
        offsets, data = st.gather(starts, np.full(sel.size, size, dtype=np.int64))
        return pa.Array.from_buffers(pa.binary(), sel.size, [None, pa.py_buffer(offsets), pa.py_buffer(data)])

    return read


def _enum(writer: list[str], reader: list[str] | None, default: str | None, keep: bool) -> Read:
    import pyarrow as pa

    # a writer symbol the reader lacks reads as the reader's default, or fails the record
    known = [s if reader is None or s in reader else default for s in writer]
    symbols = pa.array(known, pa.string())
    missing = np.array([s is None for s in known], dtype=bool)

    def read(st: _State, sel: NDArray[np.int64]) -> pa.Array | None:
        idx = st.long(sel)
        out_of_range = (idx < 0) | (idx >= len(writer))
        idx = np.where(out_of_range, 0, idx)
        st.fail(sel, out_of_range | missing[idx])
        return symbols.take(pa.array(idx)) if keep else None

    return read


def _scatter(values: pa.Array, at: NDArray[np.int64], n: int) -> pa.Array:
    """A column of `n` rows: `values` at rows `at`, null elsewhere."""
    import pyarrow as pa

    idx = np.full(n, -1, dtype=np.int64)
    idx[at] = np.arange(at.size, dtype=np.int64)
    return values.take(pa.array(idx, mask=idx < 0))


def _union(branches: list[Read | None], keep: bool, arrow_type: pa.DataType) -> Read:
    """`branches`: a node per writer branch; None for null. Branches the reader cannot take are
    compiled as failing nodes."""
    import pyarrow as pa

    def read(st: _State, sel: NDArray[np.int64]) -> pa.Array | None:
        which = st.long(sel)
        out_of_range = (which < 0) | (which >= len(branches))
        st.fail(sel, out_of_range)
        parts: list[tuple[NDArray[np.int64], pa.Array]] = []
        for b, node in enumerate(branches):
            if node is None:
                continue
            at = np.flatnonzero((which == b) & ~out_of_range)
            if not at.size:
                continue
            got = node(st, sel[at])
            if got is not None:
                parts.append((at, got))
        if not keep:
            return None
        if not parts:
            return pa.nulls(sel.size, arrow_type)
        if len(parts) == 1:
            return _scatter(parts[0][1].cast(arrow_type), parts[0][0], sel.size)
        at = np.concatenate([a for a, _ in parts])
        return _scatter(pa.concat_arrays([v.cast(arrow_type) for _, v in parts]), at, sel.size)

    return read


def _failing(st: _State, sel: NDArray[np.int64]) -> pa.Array | None:
    st.fail(sel, np.ones(sel.size, dtype=bool))
    return None


@dataclass
class _Names:
    """Named types of each schema by full name."""

    writer: dict[str, Schema] = field(default_factory=dict)
    reader: dict[str, Schema] = field(default_factory=dict)
    depth: int = 0


def _full(doc: Mapping[str, Any], namespace: str) -> tuple[str, str]:
    name = str(doc["name"])
    ns = str(doc.get("namespace", namespace))
    full = name if "." in name or not ns else f"{ns}.{name}"
    return full, full.rpartition(".")[0]


def _deref(schema: Schema, names: dict[str, Schema], namespace: str) -> tuple[Schema, str]:
    """(the schema a name refers to, or itself; its namespace), registering named types."""
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return schema, namespace
        full = schema if "." in schema or not namespace else f"{namespace}.{schema}"
        for name in (full, schema):
            if name in names:
                return names[name], name.rpartition(".")[0]
        raise Unsupported(f"unknown Avro type {schema!r}")
    if isinstance(schema, dict) and schema.get("type") in ("record", "error", "enum", "fixed"):
        full, ns = _full(schema, namespace)
        names[full] = schema
        return schema, ns
    return schema, namespace


def _kind(schema: Schema) -> tuple[str, str | None]:
    """(type name, logical type) of a non-union schema."""
    if isinstance(schema, str):
        return schema, None
    if isinstance(schema, dict):
        kind = schema["type"]
        if isinstance(kind, str):
            return kind, schema.get("logicalType")
        if isinstance(kind, dict):  # {"type": {"type": "long", ...}} nests
            return _kind(kind)
    raise Unsupported(f"not an Avro schema: {schema!r}")


def _node(w: Schema, r: Schema | None, target: pa.DataType | None, names: _Names, wns: str, rns: str) -> Read:
    """The node reading writer schema `w` as reader schema `r` into `target` (r None: dropped)."""
    import pyarrow as pa

    names.depth += 1
    if names.depth > 64:
        raise Unsupported("recursive Avro types")
    try:
        w, wns = _deref(w, names.writer, wns)
        nullable = r is None  # a dropped value may be null; a kept one only into a reader union
        if r is not None:
            r, rns = _deref(r, names.reader, rns)
            if isinstance(r, list):
                nullable = "null" in r
                rest = [b for b in r if b != "null"]
                if len(rest) != 1:
                    raise Unsupported("a reader union of several types")
                r, rns = _deref(rest[0], names.reader, rns)
        keep = r is not None
        if isinstance(w, list):
            branches: list[Read | None] = []
            for b in w:
                if b == "null":
                    # a null the reader's type cannot hold fails the record (fastavro's resolution error)
                    branches.append(None if nullable else _failing)
                    continue
                try:
                    branches.append(_node(b, r, target, names, wns, rns))
                except Unsupported:
                    if r is None:
                        raise
                    branches.append(_failing)  # a branch the reader cannot take: the record fails
            return _union(branches, keep, target if target is not None else pa.null())
        wk, wl = _kind(w)
        rk, rl = _kind(r) if r is not None else (wk, wl)
        if wk == "null":
            raise Unsupported("a null outside a union")
        if wl != rl:
            raise Unsupported(f"the logical types {wl} and {rl}")
        if wl == "decimal" or wk in ("array", "map"):
            raise Unsupported(f"Avro {wl or wk} is read by fastavro")
        if wk in ("record", "error", "enum", "fixed"):
            if rk != wk or _full(w, wns)[0] != _full(r, rns)[0]:  # type: ignore[arg-type]
                raise Unsupported("named types of different names")
        elif rk not in PROMOTIONS.get(wk, {wk}):
            raise Unsupported(f"Avro {wk} cannot be read as {rk}")
        node = _typed_node(w, r, wk, wl, target, names, wns, rns)
        if not keep or target is None:
            return node
        return _cast(node, target)
    finally:
        names.depth -= 1


def _cast(node: Read, target: pa.DataType) -> Read:
    def read(st: _State, sel: NDArray[np.int64]) -> pa.Array | None:
        got = node(st, sel)
        if got is None or got.type == target:
            return got
        return got.cast(target)

    return read


def _typed_node(
    w: Schema, r: Schema | None, wk: str, wl: str | None, target: pa.DataType | None, names: _Names, wns: str, rns: str
) -> Read:
    keep = r is not None
    if wk in ("string", "bytes"):
        return _bytes_like(wk, keep)
    if wk in ("float", "double"):
        return _numeric(wk, keep)
    if wk in ("int", "long"):
        return _varint(wk, keep, TIMESTAMP_UNITS.get(wl or "", 1))
    if wk == "boolean":
        return _boolean(keep)
    if wk == "fixed":
        return _fixed(int(w["size"]), keep)
    if wk == "enum":
        reader_symbols = list(r["symbols"]) if r is not None else None
        return _enum(list(w["symbols"]), reader_symbols, r.get("default") if r is not None else None, keep)
    if wk in ("record", "error"):
        return _record(w, r, target, names, wns, rns)
    raise Unsupported(f"Avro type {wk}")


def _record(w: Schema, r: Schema | None, target: pa.DataType | None, names: _Names, wns: str, rns: str) -> Read:
    import pyarrow as pa

    reader_fields: dict[str, tuple[int, Mapping[str, Any]]] = {}
    if r is not None:
        if target is None or not pa.types.is_struct(target) or target.num_fields != len(r["fields"]):
            raise Unsupported("the record's column is no struct of its fields")
        for i, f in enumerate(r["fields"]):
            for name in (f["name"], *f.get("aliases", ())):
                reader_fields[name] = (i, f)
    steps: list[tuple[int | None, Read]] = []
    seen: set[int] = set()
    for wf in w["fields"]:
        hit = reader_fields.get(wf["name"])
        if hit is None or hit[0] in seen:
            steps.append((None, _node(wf["type"], None, None, names, wns, rns)))
            continue
        i, rf = hit
        seen.add(i)
        steps.append((i, _node(wf["type"], rf["type"], target.field(i).type, names, wns, rns)))  # type: ignore[union-attr]
    if r is None or target is None:
        def skip(st: _State, sel: NDArray[np.int64]) -> pa.Array | None:
            for _, step in steps:
                step(st, sel)
            return None

        return skip
    defaults: dict[int, Any] = {}
    for i, rf in enumerate(r["fields"]):
        if i in seen:
            continue
        if "default" not in rf:
            # fastavro fails such a record with a resolution error: it reads it, here it is refused
            raise Unsupported(f"the reader field {rf['name']} has no default")
        ft = target.field(i).type
        if rf["default"] is None:
            defaults[i] = None
            continue
        # plain scalars only: a default of a logical, bytes or named type has its own encoding
        first = rf["type"][0] if isinstance(rf["type"], list) else rf["type"]
        scalar = first in ("boolean", "int", "long", "float", "double", "string")
        if not scalar or not (pa.types.is_integer(ft) or pa.types.is_floating(ft) or pa.types.is_string(ft) or pa.types.is_boolean(ft)):
            raise Unsupported(f"the default of {rf['name']}")
        try:
            defaults[i] = pa.array([rf["default"]], type=ft)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            raise Unsupported(f"the default of {rf['name']}") from None
    fields = [target.field(i) for i in range(target.num_fields)]

    def read(st: _State, sel: NDArray[np.int64]) -> pa.Array | None:
        children: list[pa.Array | None] = [None] * len(fields)
        for i, step in steps:
            got = step(st, sel)
            if i is not None:
                children[i] = got
        for i, default in defaults.items():
            children[i] = pa.nulls(sel.size, fields[i].type) if default is None else default.take(np.zeros(sel.size, dtype=np.int64))
        return pa.StructArray.from_arrays(children, fields=fields)

    return read


@dataclass(frozen=True, slots=True)
class Plan:
    """Reads the datums of one writer schema as the reader schema, into `target`."""

    read: Read
    target: pa.DataType
    wrapped: bool

    def decode(
        self, buf: NDArray[np.uint8], starts: NDArray[np.int64], ends: NDArray[np.int64]
    ) -> tuple[pa.Array, NDArray[np.bool_]]:
        """(the typed column of the datums buf[starts[i]:ends[i]], which of them did not parse).
        `buf` holds PAD zero bytes after the last datum (reads past a datum's end stay inside)."""
        import pyarrow as pa

        st = _State(buf, starts.copy(), ends)
        sel = np.arange(starts.size, dtype=np.int64)
        out = self.read(st, sel)
        st.fail(sel, st.pos != st.end)  # bytes left after a datum: corrupt
        assert out is not None
        if self.wrapped:
            out = pa.StructArray.from_arrays([out], fields=[self.target.field(0)])
        return out, st.bad


def compile_plan(writer: Schema, reader: Schema, target: pa.DataType, wrapped: bool) -> Plan:
    """The plan reading `writer`'s datums as `reader` into the Arrow type `target` (the column's;
    with `wrapped` a struct of one field `value` holding the reader's type). Raises Unsupported."""
    inner = target.field(0).type if wrapped else target
    return Plan(_node(writer, reader, inner, _Names(), "", ""), target, wrapped)
