"""Acknowledged ends: how far each partition's acknowledged, durable data reaches.

One record kind, ``acked``, body ``{parts: [[topic id hex, partition, end], ...]}``: for each
partition listed, every offset below `end` was acknowledged to a producer after its WAL group
was fdatasync'd (durability class ``fsync``), or sealed. Applying it raises
`PartitionMeta.acked_end` (never lowers it). The engine writes one record per
`acked_end_interval_ms` for the partitions whose high watermark moved (engine/acked.py), so the
record lags the acknowledgements by at most that interval.

Recovery compares each partition's recovered log end with its acknowledged end: a log that ends
below it lost acknowledged data (a WAL file cut short, a frame damaged in place), which a torn,
never-acknowledged write cannot explain. The engine then refuses to open unless told to accept
the loss, and after an accepted loss the partition's next offset is its acknowledged end, so
offsets consumers may have seen are never handed out again for different records.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["ACKED_PARTS_MAX", "apply_acked"]

#: Most partitions one ``acked`` record lists (bounds its body well under RECORD_BYTES_MAX).
ACKED_PARTS_MAX = 50_000


class AckedPartition(Protocol):
    """A partition's acknowledged end (`loglake.meta.state.PartitionMeta`)."""

    acked_end: int


class AckedState(Protocol):
    """What an ``acked`` record moves of the metadata state (`loglake.meta.state.MetaState`, which
    imports this module): its partitions' acknowledged ends."""

    @property
    def partitions(self) -> Mapping[tuple[bytes, int], AckedPartition]: ...


def apply_acked(state: AckedState, b: dict[str, Any]) -> None:
    for tid_hex, index, end in b["parts"]:
        pm = state.partitions.get((bytes.fromhex(tid_hex), int(index)))
        if pm is not None and int(end) > pm.acked_end:  # a deleted topic's partitions are gone
            pm.acked_end = int(end)
