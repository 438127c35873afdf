"""The saved state of a consumer-protocol (KIP-848) group: layout version 2 of the `group_state` document.

Written (`encode_consumer`) after every change a heartbeat, a session expiry or a revocation
timeout makes to the group: epochs, members, subscriptions, target and current assignments.
The heartbeat that made the change is answered only once the document is durable, so what a
member was told is what a restart resumes. Plain heartbeats change nothing and save nothing.

Layout, version 2 (topic ids are 32 lowercase hex characters; assignments map topic id ->
sorted partitions)::

    {"version": 2, "type": "consumer", "group_epoch": 5, "assignment_epoch": 5,
     "assignor": "uniform", "empty_since_ms": 1700000000000,
     "subscription": {"<topic id>": ["name", 6]},
     "target": {"<member id>": {"<topic id>": [0, 1, 2]}},
     "members": [{"member_id": "...", "instance_id": "..." | null, "rack_id": "..." | null,
                  "client_id": "...", "client_host": "/10.0.0.1", "rebalance_timeout_ms": 300000,
                  "subscribed_names": ["t"], "subscribed_regex": "^t.*" | null,
                  "server_assignor": "range" | null, "member_epoch": 5, "previous_epoch": 4,
                  "state": "stable" | "unrevoked_partitions" | "unreleased_partitions",
                  "assigned": {"<topic id>": [0, 1]}, "revoking": {}}]}

Version 1 documents (classic groups, persistence.py) load as before. Reading is defensive like
version 1: a document that does not validate raises `GroupStateError` and the group loads as an
Empty classic group with its offsets (a restarted member then gets UNKNOWN_MEMBER_ID / a new
group and rejoins).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal, TypeVar, overload

from loglake.broker.groups.consumer_model import (
    Assignment,
    ConsumerGroupData,
    ConsumerMember,
    MemberState,
    TopicMetadata,
)
from loglake.broker.groups.limits import ConsumerLimits
from loglake.broker.groups.store import StateDoc

T = TypeVar("T")

CONSUMER_FORMAT_VERSION = 2
_HEX_ID = re.compile(r"[0-9a-f]{32}")


class ConsumerStateError(ValueError):
    """A version 2 document that cannot be resumed."""


def _assignment(a: Assignment) -> dict[str, list[int]]:
    return {t: sorted(p) for t, p in sorted(a.items()) if p}


def encode_consumer(cg: ConsumerGroupData, empty_since_ms: int) -> StateDoc:
    return {
        "version": CONSUMER_FORMAT_VERSION,
        "type": "consumer",
        "group_epoch": cg.group_epoch,
        "assignment_epoch": cg.assignment_epoch,
        "assignor": cg.assignor,
        "empty_since_ms": empty_since_ms,
        "subscription": {t: [name, n] for t, (name, n) in sorted(cg.subscription.items())},
        "target": {m: _assignment(a) for m, a in sorted(cg.target.items())},
        "members": [
            {
                "member_id": m.member_id,
                "instance_id": m.instance_id,
                "rack_id": m.rack_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "rebalance_timeout_ms": m.rebalance_timeout_ms,
                "subscribed_names": list(m.subscribed_names),
                "subscribed_regex": m.subscribed_regex,
                "server_assignor": m.server_assignor,
                "member_epoch": m.member_epoch,
                "previous_epoch": m.previous_epoch,
                "state": m.state.value,
                "assigned": _assignment(m.assigned),
                "revoking": _assignment(m.revoking),
            }
            for m in cg.members.values()
        ],
    }


@overload
def _get(doc: Mapping[str, object], name: str, kind: type[T]) -> T: ...
@overload
def _get(doc: Mapping[str, object], name: str, kind: type[T], *, nullable: Literal[True]) -> T | None: ...
def _get(doc: Mapping[str, object], name: str, kind: type[T], *, nullable: bool = False) -> T | None:
    value = doc.get(name)
    if value is None and nullable:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConsumerStateError(f"field {name!r}: expected {kind.__name__}, got {str(value)[:80]!r}")
    return value


def _decode_assignment(raw: object, what: str, max_partitions: int) -> Assignment:
    if not isinstance(raw, dict) or len(raw) > max_partitions:
        raise ConsumerStateError(f"{what}: not an assignment")
    out: Assignment = {}
    for tid, parts in raw.items():
        if not isinstance(tid, str) or not _HEX_ID.fullmatch(tid) or not isinstance(parts, list):
            raise ConsumerStateError(f"{what}: bad topic entry {str(tid)[:40]!r}")
        if len(parts) > max_partitions or not all(isinstance(p, int) and p >= 0 for p in parts):
            raise ConsumerStateError(f"{what}: bad partitions")
        if parts:
            out[tid] = frozenset(parts)
    return out


def decode_consumer(doc: Mapping[str, object], limits: ConsumerLimits, max_partitions: int = 1_000_000) -> tuple[
    ConsumerGroupData, int | None
]:
    """The group's consumer data and its `empty_since_ms`; raises ConsumerStateError."""
    if doc.get("version") != CONSUMER_FORMAT_VERSION or doc.get("type") != "consumer":
        raise ConsumerStateError("not a version 2 consumer document")
    cg = ConsumerGroupData()
    cg.group_epoch = _get(doc, "group_epoch", int)
    cg.assignment_epoch = _get(doc, "assignment_epoch", int)
    cg.assignor = _get(doc, "assignor", str)
    if not 0 <= cg.assignment_epoch <= cg.group_epoch:
        raise ConsumerStateError("epochs out of order")
    empty_since = _get(doc, "empty_since_ms", int, nullable=True)
    subscription: TopicMetadata = {}
    for tid, entry in _get(doc, "subscription", dict).items():
        if not _HEX_ID.fullmatch(str(tid)) or not isinstance(entry, list) or len(entry) != 2:
            raise ConsumerStateError(f"subscription entry {str(tid)[:40]!r}")
        name, count = entry
        if not isinstance(name, str) or not isinstance(count, int) or count < 0:
            raise ConsumerStateError(f"subscription entry {str(tid)[:40]!r}")
        subscription[tid] = (name, count)
    cg.subscription = subscription
    raw_members = _get(doc, "members", list)
    if len(raw_members) > limits.max_size:
        raise ConsumerStateError(f"{len(raw_members)} members over group.consumer.max.size={limits.max_size}")
    for raw in raw_members:
        if not isinstance(raw, dict):
            raise ConsumerStateError("member is not a document")
        names = _get(raw, "subscribed_names", list)
        if len(names) > limits.max_topics_per_subscription or not all(isinstance(n, str) for n in names):
            raise ConsumerStateError("bad subscribed_names")
        regex = _get(raw, "subscribed_regex", str, nullable=True)
        if regex is not None and len(regex) > limits.max_regex_length:
            raise ConsumerStateError("subscribed_regex too long")
        try:
            state = MemberState(raw.get("state"))
        except ValueError:
            raise ConsumerStateError(f"unknown member state {str(raw.get('state'))[:40]!r}") from None
        member = ConsumerMember(
            member_id=_get(raw, "member_id", str),
            instance_id=_get(raw, "instance_id", str, nullable=True),
            rack_id=_get(raw, "rack_id", str, nullable=True),
            client_id=_get(raw, "client_id", str),
            client_host=_get(raw, "client_host", str),
            rebalance_timeout_ms=_get(raw, "rebalance_timeout_ms", int),
            subscribed_names=tuple(names),
            subscribed_regex=regex,
            server_assignor=_get(raw, "server_assignor", str, nullable=True),
            member_epoch=_get(raw, "member_epoch", int),
            previous_epoch=_get(raw, "previous_epoch", int),
            state=state,
            assigned=_decode_assignment(raw.get("assigned"), "assigned", max_partitions),
            revoking=_decode_assignment(raw.get("revoking"), "revoking", max_partitions),
        )
        if not member.member_id or member.member_id in cg.members:
            raise ConsumerStateError("empty or duplicate member id")
        if member.instance_id is not None and member.instance_id in cg.static_members:
            raise ConsumerStateError("duplicate instance id")
        cg.add(member)
    for member_id, raw_target in _get(doc, "target", dict).items():
        if member_id in cg.members:
            cg.target[member_id] = _decode_assignment(raw_target, "target", max_partitions)
    return cg, empty_since


__all__ = ["CONSUMER_FORMAT_VERSION", "ConsumerStateError", "decode_consumer", "encode_consumer"]
