"""OffsetDelete (47): drop a group's committed offsets for some partitions, as Kafka does.

Per group state (Kafka's GroupCoordinator.handleDeleteOffsets):

* unknown or Dead → GROUP_ID_NOT_FOUND for the whole request;
* Empty → every partition's offset is deleted;
* PreparingRebalance / CompletingRebalance / Stable with protocol type "consumer" → partitions of
  topics some member subscribes to answer GROUP_SUBSCRIBED_TO_TOPIC, the others are deleted. The
  subscriptions come from the members' ConsumerProtocolSubscription metadata (every protocol a
  member offered: range, cooperative-sticky... carry the same topics); a member whose metadata
  does not parse counts as subscribed to everything (Kafka treats unknown subscriptions so);
* any other group with members → NON_EMPTY_GROUP.

The deletion is one store change (`expire`: an `offset_expire` metadata record with the engine's
store), answered once durable; a failed record answers COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

import logging
import struct

from loglake.broker.groups import errors as E
from loglake.broker.groups.changes import ChangeQueueFull
from loglake.broker.groups.group import Group, GroupState
from loglake.broker.groups.registry import GroupRegistry
from loglake.broker.groups.store import TopicPartition

__all__ = ["ALL_TOPICS", "delete_offsets", "subscribed_topics"]

log = logging.getLogger(__name__)

CONSUMER_PROTOCOL = "consumer"
#: Stands for "every topic" when a member's subscription cannot be read.
ALL_TOPICS = frozenset({"*"})
#: Most topics read from one member's subscription (a corrupt count never allocates).
SUBSCRIPTION_TOPICS_MAX = 100_000
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def _topics_of(metadata: bytes) -> set[str] | None:
    """Topic names of a ConsumerProtocolSubscription (any version: the topics follow the version
    in all of them); None if it does not parse."""
    try:
        pos = _I16.size
        (count,) = _I32.unpack_from(metadata, pos)
        pos += _I32.size
        if not 0 <= count <= SUBSCRIPTION_TOPICS_MAX:
            return None
        topics: set[str] = set()
        for _ in range(count):
            (length,) = _I16.unpack_from(metadata, pos)
            pos += _I16.size
            if length < 0 or pos + length > len(metadata):
                return None
            topics.add(metadata[pos : pos + length].decode("utf-8"))
            pos += length
        return topics
    except (struct.error, UnicodeDecodeError):
        return None


def subscribed_topics(group: Group) -> frozenset[str]:
    """Topics the group's members subscribe to; ALL_TOPICS when one cannot be read."""
    out: set[str] = set()
    for member in group.members.values():
        for _name, metadata in member.protocols:
            topics = _topics_of(metadata)
            if topics is None:
                return ALL_TOPICS
            out |= topics
    return frozenset(out)


async def delete_offsets(reg: GroupRegistry, group_id: str, partitions: list[TopicPartition]) -> tuple[int, list[tuple[str, int, int]]]:
    """(group error, [(topic, partition, error)]); a group error comes with no partitions."""
    if reg.closed:
        return E.COORDINATOR_NOT_AVAILABLE, []
    group = reg.groups.get(group_id)
    if group is None or group.is_(GroupState.DEAD):
        return E.GROUP_ID_NOT_FOUND, []
    if group.deleting:
        return E.COORDINATOR_NOT_AVAILABLE, []  # retried: by then GROUP_ID_NOT_FOUND
    if group.is_(GroupState.EMPTY):
        subscribed: frozenset[str] = frozenset()
    elif group.protocol_type == CONSUMER_PROTOCOL:
        subscribed = subscribed_topics(group)
    else:
        return E.NON_EMPTY_GROUP, []
    results: list[tuple[str, int, int]] = []
    doomed: list[TopicPartition] = []
    for topic, partition in dict.fromkeys(partitions):
        if subscribed is ALL_TOPICS or topic in subscribed:
            results.append((topic, partition, E.GROUP_SUBSCRIBED_TO_TOPIC))
        else:
            results.append((topic, partition, E.NONE))
            if (topic, partition) in group.offsets:
                doomed.append((topic, partition))
    if not doomed:
        return E.NONE, results
    target = group

    def apply() -> None:
        for tp in doomed:
            target.offsets.pop(tp, None)
        log.info("group %r: %d committed offsets deleted (OffsetDelete)", group_id, len(doomed))

    try:
        ok = await reg.record(group, f"deletion of {len(doomed)} offsets", lambda: reg.store.expire(group_id, doomed), apply)
    except ChangeQueueFull:
        ok = False
    if not ok:
        return E.NONE, [(t, p, E.COORDINATOR_NOT_AVAILABLE if c == E.NONE else c) for t, p, c in results]
    return E.NONE, results
