"""A group's saved state: the JSON document written at membership transitions, and reading it back.

What is saved, and when (Kafka writes the same fields to __consumer_offsets):

* The leader's SyncGroup completes a generation (CompletingRebalance -> Stable): the Stable
  document, with the new assignment, *before* any member gets it (`rebalance.py`).
* A static member (KIP-345) comes back under a new member id without a rebalance: the Stable
  document with the new id, before the member gets its JoinGroup answer (`membership.py`).
* The group goes Empty: the Empty document (generation, protocol type, since when Empty).
* The group goes Dead by deletion or retention: the store forgets the group (`delete_group`).
Heartbeats and commits never save a state. Closing the coordinator saves nothing: the last
document is what the next start resumes.

Layout, version 1 (bytes are base64, standard alphabet with padding)::

    {"version": 1, "state": "Empty", "generation": 7, "protocol_type": "consumer" | null,
     "empty_since_ms": 1700000000000}
    {"version": 1, "state": "Stable", "generation": 7, "protocol_type": "consumer",
     "protocol": "range", "leader": "<member id>",
     "members": [{"member_id": "...", "group_instance_id": "..." | null, "client_id": "...",
                  "client_host": "/10.0.0.1", "session_timeout_ms": 10000,
                  "rebalance_timeout_ms": 300000, "metadata": "<base64>", "assignment": "<base64>"}]}

Layout, version 2: a group of KIP-848's consumer protocol (``"version": 2, "type": "consumer"``),
written and read by `consumer_persistence.py`, whose docstring lists its fields. `restore_group`
reads both versions; version 1 documents written by earlier releases load unchanged.

Only the chosen protocol's metadata is kept per member (as Kafka does): a member that rejoins
with a different protocol list after a restart causes a rebalance, as it would anyway.

Reading is defensive: a document this code does not understand (unknown version or state, a
missing or mistyped field, more members than `group_max_size`, metadata over
`member_metadata_max_bytes`) raises `GroupStateError`; `restore_group` logs one warning and
loads the group Empty with its offsets. A bad state never stops the broker.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar, overload

from loglake.broker.groups.consumer_persistence import (
    CONSUMER_FORMAT_VERSION,
    ConsumerStateError,
    decode_consumer,
)
from loglake.broker.groups.group import Group, GroupState, Member
from loglake.broker.groups.limits import ConsumerLimits, CoordinatorLimits
from loglake.broker.groups.store import StateDoc, StoredGroup

T = TypeVar("T")

log = logging.getLogger(__name__)

STATE_FORMAT_VERSION = 1


class GroupStateError(ValueError):
    """A saved group state that cannot be resumed; the group loads Empty."""


# ---- writing ------------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def encode_empty(group: Group) -> StateDoc:
    return {
        "version": STATE_FORMAT_VERSION,
        "state": GroupState.EMPTY.value,
        "generation": group.generation_id,
        "protocol_type": group.protocol_type,
        "empty_since_ms": group.empty_since_ms,
    }


def encode_stable(group: Group, assignments: Mapping[str, bytes] | None = None) -> StateDoc:
    """The Stable document for the group's current generation; `assignments` overrides the
    members' current assignment (the leader's SyncGroup, before it is applied)."""
    protocol = group.protocol_name or ""
    return {
        "version": STATE_FORMAT_VERSION,
        "state": GroupState.STABLE.value,
        "generation": group.generation_id,
        "protocol_type": group.protocol_type,
        "protocol": protocol,
        "leader": group.leader_id,
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "session_timeout_ms": m.session_timeout_ms,
                "rebalance_timeout_ms": m.rebalance_timeout_ms,
                "metadata": _b64(m.metadata(protocol)),
                "assignment": _b64(assignments.get(m.member_id, b"") if assignments is not None else m.assignment),
            }
            for m in group.members.values()
        ],
    }


# ---- reading ------------------------------------------------------------------------------------


@dataclass
class SavedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    metadata: bytes
    assignment: bytes


@dataclass
class SavedState:
    state: GroupState  # EMPTY or STABLE
    generation: int
    protocol_type: str | None
    protocol: str | None = None
    leader: str | None = None
    members: list[SavedMember] | None = None
    empty_since_ms: int | None = None


@overload
def _field(doc: Mapping[str, object], name: str, kind: type[T]) -> T: ...
@overload
def _field(doc: Mapping[str, object], name: str, kind: type[T], *, nullable: Literal[True]) -> T | None: ...
def _field(doc: Mapping[str, object], name: str, kind: type[T], *, nullable: bool = False) -> T | None:
    value = doc.get(name)
    if value is None and nullable:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise GroupStateError(f"field {name!r}: expected {kind.__name__}, got {str(value)[:80]!r}")
    return value


def _bytes_field(doc: Mapping[str, object], name: str, max_bytes: int | None) -> bytes:
    text = _field(doc, name, str)
    if max_bytes is not None and len(text) > (max_bytes + 2) // 3 * 4:
        raise GroupStateError(f"field {name!r}: over {max_bytes} bytes")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise GroupStateError(f"field {name!r}: not base64 ({exc})") from None


def decode_state(doc: object, limits: CoordinatorLimits) -> SavedState:
    if not isinstance(doc, dict):
        raise GroupStateError(f"not a document: {str(doc)[:80]!r}")
    if doc.get("version") != STATE_FORMAT_VERSION:
        raise GroupStateError(f"unknown version {str(doc.get('version'))[:20]!r}")
    generation = _field(doc, "generation", int)
    if generation < 0:
        raise GroupStateError(f"negative generation {generation}")
    protocol_type = _field(doc, "protocol_type", str, nullable=True)
    state = doc.get("state")
    if state == GroupState.EMPTY.value:
        since = _field(doc, "empty_since_ms", int, nullable=True)
        return SavedState(GroupState.EMPTY, generation, protocol_type, empty_since_ms=since)
    if state != GroupState.STABLE.value:
        raise GroupStateError(f"unknown state {str(state)[:40]!r}")
    protocol = _field(doc, "protocol", str)
    leader = _field(doc, "leader", str)
    raw_members = _field(doc, "members", list)
    if protocol_type is None or not protocol:
        raise GroupStateError("a Stable group needs a protocol type and a protocol")
    if not 1 <= len(raw_members) <= limits.group_max_size:
        raise GroupStateError(f"{len(raw_members)} members (need 1..group_max_size={limits.group_max_size})")
    members: list[SavedMember] = []
    for raw in raw_members:
        if not isinstance(raw, dict):
            raise GroupStateError(f"member is not a document: {str(raw)[:80]!r}")
        member = SavedMember(
            _field(raw, "member_id", str),
            _field(raw, "group_instance_id", str, nullable=True),
            _field(raw, "client_id", str),
            _field(raw, "client_host", str),
            _field(raw, "session_timeout_ms", int),
            _field(raw, "rebalance_timeout_ms", int),
            _bytes_field(raw, "metadata", limits.member_metadata_max_bytes),
            _bytes_field(raw, "assignment", None),  # bounded by the SyncGroup request that carried it
        )
        if not member.member_id or member.session_timeout_ms <= 0 or member.rebalance_timeout_ms < 0:
            raise GroupStateError(f"member {member.member_id!r}: empty id or bad timeouts")
        members.append(member)
    if len({m.member_id for m in members}) != len(members):
        raise GroupStateError("duplicate member ids")
    instances = [m.group_instance_id for m in members if m.group_instance_id is not None]
    if len(set(instances)) != len(instances):
        raise GroupStateError("duplicate group instance ids")
    if leader not in {m.member_id for m in members}:
        raise GroupStateError(f"leader {leader[:80]!r} is not a member")
    return SavedState(GroupState.STABLE, generation, protocol_type, protocol, leader, members)


def restore_group(
    group_id: str,
    stored: StoredGroup,
    limits: CoordinatorLimits,
    now_ms: int,
    consumer_limits: ConsumerLimits | None = None,
) -> Group:
    """The group as it was saved; Empty with its offsets if the state is missing or unusable.

    A version 2 document (consumer_persistence.py) restores a consumer-protocol group.

    Member heartbeat timers are not armed here (the caller starts them, session timeout from
    the moment the loop runs): a member that does not come back expires as usual.
    """
    group = Group(group_id, now_ms)
    group.offsets = dict(stored.offsets)
    if stored.state is None:
        return group
    if stored.state.get("version") == CONSUMER_FORMAT_VERSION:
        try:
            cg, since = decode_consumer(stored.state, consumer_limits or ConsumerLimits())
        except ConsumerStateError as exc:
            log.warning("group %r: saved consumer group state not usable (%s); loading it Empty with its %d "
                        "committed offsets", group_id, exc, len(group.offsets))
            return group
        group.consumer = cg
        group.protocol_type = "consumer"
        group.generation_id = cg.group_epoch
        if since is not None:
            group.empty_since_ms = min(since, now_ms)
        return group
    try:
        saved = decode_state(stored.state, limits)
    except GroupStateError as exc:
        log.warning("group %r: saved state not usable (%s); loading it Empty with its %d committed offsets",
                    group_id, exc, len(group.offsets))
        return group
    group.generation_id = saved.generation
    group.protocol_type = saved.protocol_type
    if saved.state is GroupState.EMPTY:
        if saved.empty_since_ms is not None:
            group.empty_since_ms = min(saved.empty_since_ms, now_ms)
        return group
    assert saved.members is not None and saved.protocol is not None and saved.leader is not None
    for m in saved.members:
        group.add(
            Member(
                m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                m.session_timeout_ms, saved.protocol_type or "", [(saved.protocol, m.metadata)], m.assignment,
            ),
            None,
        )
    group.protocol_type = saved.protocol_type
    group.resume_stable(saved.protocol, saved.leader)
    return group


__all__ = [
    "STATE_FORMAT_VERSION",
    "GroupStateError",
    "SavedMember",
    "SavedState",
    "decode_state",
    "encode_empty",
    "encode_stable",
    "restore_group",
]
