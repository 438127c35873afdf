"""The share-partition record states and acknowledge types: one table each (KIP-932's numbers).

`RecordState` values are Kafka's (`RecordState` in its share coordinator: what the `share_state`
metadata record stores); `AckType` values are what ShareFetch/ShareAcknowledge carry in
`AcknowledgeTypes`. `ON_ACK` says where an acquired record goes for each acknowledge type.
"""

from __future__ import annotations

from enum import IntEnum, unique


@unique
class RecordState(IntEnum):
    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4

    @property
    def terminal(self) -> bool:
        """Acknowledged and archived records are never delivered again."""
        return self in (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)


@unique
class AckType(IntEnum):
    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3


#: acknowledge type -> the state an acquired record moves to (RELEASE: available again unless its
#: delivery count reached the limit, then archived; partition.py decides that).
ON_ACK: dict[AckType, RecordState] = {
    AckType.GAP: RecordState.ARCHIVED,
    AckType.ACCEPT: RecordState.ACKNOWLEDGED,
    AckType.RELEASE: RecordState.AVAILABLE,
    AckType.REJECT: RecordState.ARCHIVED,
}

__all__ = ["ON_ACK", "AckType", "RecordState"]
