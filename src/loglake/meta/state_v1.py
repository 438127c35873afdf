"""Migration: the metadata state held by a version-1 snapshot (docs/FORMAT.md, "Version 1")."""

from __future__ import annotations

import struct
from typing import Any

from loglake.meta.producers import ProducerStates
from loglake.meta.segments import SegmentRef
from loglake.meta.state import GroupMeta, MetaState, TopicMeta, _partition_count

__all__ = ["state_from_snapshot"]


def state_from_snapshot(payload: dict[str, Any]) -> MetaState:
    """Migration: the state held by a version-1 metadata snapshot (`snapshot-*.bin`, meta.json).

    A payload of the wrong shape raises KeyError, ValueError or TypeError (never AttributeError,
    IndexError or struct.error), which callers report as corruption."""
    try:
        return _state_from_snapshot(payload)
    except (AttributeError, IndexError, struct.error) as exc:
        raise ValueError(f"snapshot payload does not fit: {exc!r}") from None


def _state_from_snapshot(payload: dict[str, Any]) -> MetaState:
    state = MetaState(str(payload["cluster_id"]))
    extra = payload.get("extra", {}) or {}
    state.next_producer_id = int(extra.get("next_producer_id", 1000))
    for name, t in payload["topics"].items():
        tid = bytes.fromhex(t["id"])
        topic = TopicMeta(str(name), tid, _partition_count(t["partitions"]), {str(k): str(v) for k, v in t["config"].items()}, int(t["created_ms"]))
        state.topics[tid] = topic
        state.names[topic.name] = tid
        for i in range(topic.partitions):
            pm = state._new_partition(topic, i)
            raw = payload["partitions"].get(f"{t['id']}/{i}")
            if raw is None:
                continue
            pm.log_start = int(raw["log_start"])
            pm.sealed_end = int(raw["sealed_end"])
            pm.chain_hash = bytes.fromhex(raw["chain"])
            pm.producers = ProducerStates.from_json(raw.get("producers", {}))
            for seg in raw["segments"]:
                pm.segments.append(SegmentRef.from_json(pm.segments.key_for(int(seg[0])), seg))
    groups_doc = extra.get("groups")
    if isinstance(groups_doc, dict):
        for g, rows in (groups_doc.get("groups") or {}).items():
            gm = state.groups.setdefault(str(g), GroupMeta())
            for topic_name, p, offset, epoch, metadata, ts in rows:
                gm.offsets[(str(topic_name), int(p))] = [int(offset), int(epoch), str(metadata), int(ts)]
    return state
