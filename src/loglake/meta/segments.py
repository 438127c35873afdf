"""The sealed-segment catalog of one partition, packed: ~149 bytes a segment.

A partition of a busy broker holds tens of thousands of sealed segments and a broker holds
millions; a Python object per segment costs ~500 bytes and makes a checkpoint load allocate
millions of objects. `SegmentTable` keeps one fixed-size binary entry per segment in a single
bytearray (the same bytes a checkpoint stores, so loading is one copy) and hands out
`SegmentRef` values on access. Entries are in offset order; keys are derived from the
partition's key prefix, the base offset and the rewrite generation, never stored.

Entry layout (little-endian, `ENTRY`, version 2)::

    0   8  base_offset      i64   first offset the segment covers
    8   8  last_offset      i64   last offset it covers (a rewritten one may hold fewer)
    16  8  size             i64   bytes of the segment object
    24  8  max_timestamp    i64
    32  8  record_count     i64
    40  8  created_ms       i64
    48  1  tier             u8    0 = hot, 1 = cold
    49  4  generation       u32   0 as sealed, n after the n-th rewrite at this base
    53 32  prev_hash              chain hash of the previous segment (its link hash)
    85 32  chain_hash             SHA-256(prev_hash || data)
    117 32 link_hash              what the next segment's prev_hash names: the chain hash for a
                                  sealed segment, the replaced range's link for a rewritten one

Version 1 entries (113 bytes, checkpoints of format 2) had no generation or link hash;
`SegmentTable.from_v1` widens them.

The table is not locked: the engine mutates it under the partition's lock, and the metadata
store applies replayed records before the engine starts.
"""

from __future__ import annotations

import bisect
import itertools
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from loglake.meta.lifecycle import Tier
from loglake.segment.format import SegmentTrailer
from loglake.segment.index import SegmentIndex
from loglake.store.base import segment_file_name

__all__ = ["ENTRY", "ENTRY_V1", "TIERS", "SegmentRef", "SegmentTable"]

ENTRY = struct.Struct("<qqqqqqBI32s32s32s")
ENTRY_SIZE = ENTRY.size
#: The version-1 entry (no generation, no link hash), read from older checkpoints.
ENTRY_V1 = struct.Struct("<qqqqqqB32s32s")
#: stored code -> tier (the entry's `tier` byte; checkpoints hold these codes)
TIERS = (Tier.HOT, Tier.COLD)
_TIER_CODE = {tier: code for code, tier in enumerate(TIERS)}
_TIER_OFFSET = 48
_GEN_OFFSET = 49


@dataclass(slots=True)
class SegmentRef:
    """A sealed segment as the catalog knows it (a value: changing it changes no table)."""

    base_offset: int
    last_offset: int
    key: str
    size: int
    max_timestamp: int
    record_count: int
    prev_hash: bytes
    chain_hash: bytes
    created_ms: int
    tier: Tier = Tier.HOT
    index: SegmentIndex | None = None  # parsed index, when the caller has one at hand
    generation: int = 0
    link_hash: bytes = b""  # empty: the chain hash (a segment as sealed)

    def __post_init__(self) -> None:
        if not self.link_hash:
            self.link_hash = self.chain_hash

    @property
    def end_offset(self) -> int:
        return self.last_offset + 1

    @property
    def rewritten(self) -> bool:
        return self.generation > 0

    def to_json(self) -> list[object]:
        return [
            self.base_offset,
            self.last_offset,
            self.size,
            self.max_timestamp,
            self.record_count,
            self.prev_hash.hex(),
            self.chain_hash.hex(),
            self.created_ms,
            self.tier,
            self.generation,
            self.link_hash.hex(),
        ]

    def pack(self) -> bytes:
        return ENTRY.pack(
            self.base_offset,
            self.last_offset,
            self.size,
            self.max_timestamp,
            self.record_count,
            self.created_ms,
            _TIER_CODE[self.tier],
            self.generation,
            self.prev_hash,
            self.chain_hash,
            self.link_hash,
        )

    @classmethod
    def from_trailer(cls, key: str, trailer: SegmentTrailer, tier: Tier, index: SegmentIndex | None) -> SegmentRef:
        return cls(
            trailer.base_offset,
            trailer.last_offset,
            key,
            trailer.size,
            trailer.max_timestamp,
            trailer.record_count,
            trailer.prev_hash,
            trailer.chain_hash,
            trailer.created_ms,
            tier,
            index,
            trailer.generation,
            trailer.link_hash,
        )

    @classmethod
    def from_json(cls, key: str, raw: list[object]) -> SegmentRef:
        """From `to_json`'s list; 9 fields (before rewrites existed) or 11."""
        generation, link_h = (int(str(raw[9])), bytes.fromhex(str(raw[10]))) if len(raw) == 11 else (0, b"")
        base, last, size, max_ts, count, prev_h, chain_h, created, tier = raw[:9]
        tier_s = str(tier)
        if tier_s not in _TIER_CODE:
            raise ValueError(f"unknown segment tier {tier_s!r}")
        return cls(
            int(str(base)),
            int(str(last)),
            key,
            int(str(size)),
            int(str(max_ts)),
            int(str(count)),
            bytes.fromhex(str(prev_h)),
            bytes.fromhex(str(chain_h)),
            int(str(created)),
            Tier(tier_s),
            None,
            generation,
            link_h,
        )


class _Bases:
    """The base offsets of a table as a sequence, for bisect (no copy)."""

    __slots__ = ("_data",)

    def __init__(self, data: bytearray) -> None:
        self._data = data

    def __len__(self) -> int:
        return len(self._data) // ENTRY_SIZE

    def __getitem__(self, i: int) -> int:
        return int.from_bytes(self._data[i * ENTRY_SIZE : i * ENTRY_SIZE + 8], "little", signed=True)


class SegmentTable:
    """One partition's sealed segments, oldest first (see the module docstring)."""

    __slots__ = ("_bytes_total", "_data", "key_prefix")

    def __init__(self, key_prefix: str, data: bytes | bytearray | memoryview = b"") -> None:
        if len(data) % ENTRY_SIZE:
            raise ValueError(f"segment table of {len(data)} bytes is not a whole number of {ENTRY_SIZE}-byte entries")
        self.key_prefix = key_prefix  # "<...>/<topic>-<id>/<partition>/"
        self._data = bytearray(data)
        self._bytes_total: int | None = None  # sum of segment sizes, computed on first use

    # ---- reading ---------------------------------------------------------------------------

    @classmethod
    def from_v1(cls, key_prefix: str, data: bytes | bytearray | memoryview) -> SegmentTable:
        """A table from version-1 entries (generation 0, link hash = chain hash)."""
        if len(data) % ENTRY_V1.size:
            raise ValueError(f"segment table of {len(data)} bytes is not a whole number of {ENTRY_V1.size}-byte entries")
        out = bytearray()
        for base, last, size, max_ts, count, created, tier, prev_h, chain_h in ENTRY_V1.iter_unpack(data):
            out += ENTRY.pack(base, last, size, max_ts, count, created, tier, 0, prev_h, chain_h, chain_h)
        return cls(key_prefix, out)

    def key_for(self, base_offset: int, generation: int = 0) -> str:
        return self.key_prefix + segment_file_name(base_offset, generation)

    def key_at(self, i: int) -> str:
        """The object key of entry `i`."""
        return self.key_for(self.base_at(i), self.generation_at(i))

    def generation_at(self, i: int) -> int:
        return int.from_bytes(self._data[i * ENTRY_SIZE + _GEN_OFFSET : i * ENTRY_SIZE + _GEN_OFFSET + 4], "little")

    def keys(self) -> list[str]:
        return [self.key_at(i) for i in range(len(self))]

    def __len__(self) -> int:
        return len(self._data) // ENTRY_SIZE

    def __bool__(self) -> bool:
        return bool(self._data)

    def _ref(self, i: int) -> SegmentRef:
        base, last, size, max_ts, count, created, tier, gen, prev_h, chain_h, link_h = ENTRY.unpack_from(
            self._data, i * ENTRY_SIZE
        )
        return SegmentRef(
            base, last, self.key_for(base, gen), size, max_ts, count, prev_h, chain_h, created, TIERS[tier], None, gen, link_h
        )

    def __getitem__(self, i: int) -> SegmentRef:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"segment {i} of {n}")
        return self._ref(i)

    def __iter__(self) -> Iterator[SegmentRef]:
        for i in range(len(self)):
            yield self._ref(i)

    def slice(self, start: int, stop: int | None = None) -> list[SegmentRef]:
        n = len(self)
        stop = n if stop is None else min(stop, n)
        return [self._ref(i) for i in range(max(0, start), stop)]

    def last(self) -> SegmentRef | None:
        return self._ref(len(self) - 1) if self._data else None

    def base_at(self, i: int) -> int:
        return _Bases(self._data)[i]

    def find_base(self, base_offset: int) -> int | None:
        """Index of the segment starting at `base_offset`, or None."""
        bases = _Bases(self._data)
        i = bisect.bisect_left(bases, base_offset)
        return i if i < len(bases) and bases[i] == base_offset else None

    def find(self, offset: int) -> int | None:
        """Index of the segment holding `offset`; in a gap (compaction), the next segment; else None."""
        bases = _Bases(self._data)
        lo = bisect.bisect_right(bases, offset)
        i = lo - 1
        if i >= 0:
            last = int.from_bytes(self._data[i * ENTRY_SIZE + 8 : i * ENTRY_SIZE + 16], "little", signed=True)
            if last >= offset:
                return i
        return lo if lo < len(bases) and bases[lo] > offset else None

    def total_bytes(self) -> int:
        if self._bytes_total is None:
            self._bytes_total = sum(e[2] for e in ENTRY.iter_unpack(self._data))
        return self._bytes_total

    def bytes_from(self, offset: int) -> int:
        """Bytes of the segments ending at or after `offset` (compaction's dirty part)."""
        first = self.find(offset)
        if first is None:
            return 0
        return sum(e[2] for e in ENTRY.iter_unpack(memoryview(self._data)[first * ENTRY_SIZE :]))

    def indexes_in_tier(self, tier: Tier) -> list[int]:
        """Indexes of the segments in `tier`, oldest first (a C-speed scan of the tier bytes)."""
        tiers = bytes(self._data[_TIER_OFFSET::ENTRY_SIZE])
        code = bytes((_TIER_CODE[tier],))
        out: list[int] = []
        i = tiers.find(code)
        while i >= 0:
            out.append(i)
            i = tiers.find(code, i + 1)
        return out

    def count_in_tier(self, tier: Tier) -> int:
        return bytes(self._data[_TIER_OFFSET::ENTRY_SIZE]).count(_TIER_CODE[tier])

    def raw(self) -> bytes:
        """The packed entries (for checkpoints)."""
        return bytes(self._data)

    # ---- changing (caller holds the partition's lock) ---------------------------------------

    def append(self, ref: SegmentRef) -> None:
        last = self.last()
        if last is not None and ref.base_offset <= last.last_offset:
            raise ValueError(f"segment at {ref.base_offset} does not follow the last one ending at {last.last_offset}")
        self._data += ref.pack()
        if self._bytes_total is not None:
            self._bytes_total += ref.size

    def replace(self, start: int, stop: int, refs: Sequence[SegmentRef]) -> list[SegmentRef]:
        """Put `refs` in place of entries [start, stop) (a rewrite); returns the replaced ones.

        The new entries must cover exactly the offsets the old ones did.
        """
        if not 0 <= start < stop <= len(self):
            raise ValueError(f"rewrite of entries [{start}, {stop}) of a table of {len(self)}")
        gone = self.slice(start, stop)
        if not refs or refs[0].base_offset != gone[0].base_offset or refs[-1].last_offset != gone[-1].last_offset:
            raise ValueError(
                f"rewrite covers {refs[0].base_offset if refs else '-'}..{refs[-1].last_offset if refs else '-'}, "
                f"the replaced segments {gone[0].base_offset}..{gone[-1].last_offset}"
            )
        for a, b in itertools.pairwise(refs):
            if b.base_offset != a.last_offset + 1:
                raise ValueError(f"rewritten segments leave a hole between {a.last_offset} and {b.base_offset}")
        self._data[start * ENTRY_SIZE : stop * ENTRY_SIZE] = b"".join(r.pack() for r in refs)
        if self._bytes_total is not None:
            self._bytes_total += sum(r.size for r in refs) - sum(g.size for g in gone)
        return gone

    def drop_front(self, count: int) -> list[SegmentRef]:
        """Remove and return the `count` oldest segments."""
        count = min(count, len(self))
        gone = self.slice(0, count)
        del self._data[: count * ENTRY_SIZE]
        if self._bytes_total is not None:
            self._bytes_total -= sum(g.size for g in gone)
        return gone

    def drop_below(self, end_offset: int) -> list[SegmentRef]:
        """Remove segments that end at or below `end_offset` (whole segments only)."""
        count = 0
        for i in range(len(self)):
            last = int.from_bytes(self._data[i * ENTRY_SIZE + 8 : i * ENTRY_SIZE + 16], "little", signed=True)
            if last + 1 > end_offset:
                break
            count += 1
        return self.drop_front(count)

    def truncate(self, count: int) -> list[SegmentRef]:
        """Keep the `count` oldest segments; return the rest."""
        gone = self.slice(count)
        del self._data[count * ENTRY_SIZE :]
        if self._bytes_total is not None:
            self._bytes_total -= sum(g.size for g in gone)
        return gone

    def set_tier(self, base_offset: int, tier: Tier) -> bool:
        i = self.find_base(base_offset)
        if i is None:
            return False
        self._data[i * ENTRY_SIZE + _TIER_OFFSET] = _TIER_CODE[tier]
        return True

    def clear(self) -> list[SegmentRef]:
        return self.drop_front(len(self))
