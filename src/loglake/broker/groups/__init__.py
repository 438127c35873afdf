"""Consumer-group coordinator (Kafka's classic group protocol) and durable committed offsets.

See docs/_groups.md for the API contract and the Kafka behaviours covered.
"""

from loglake.broker.groups import errors
from loglake.broker.groups.coordinator import (
    GROUP_MAX_SIZE_DEFAULT,
    MAX_GROUPS_DEFAULT,
    MEMBER_METADATA_MAX_BYTES_DEFAULT,
    NEW_MEMBER_JOIN_TIMEOUT_MS_DEFAULT,
    OFFSET_METADATA_MAX_BYTES_DEFAULT,
    GroupCoordinator,
    GroupDescription,
    MemberDescription,
)
from loglake.broker.groups.group import VALID_PREVIOUS_STATES, GroupState, JoinResult, SyncResult
from loglake.broker.groups.offsets import (
    EngineOffsetsStore,
    InMemoryOffsetsStore,
    OffsetEntry,
    OffsetsFormatError,
    OffsetsStore,
)

__all__ = [
    "GROUP_MAX_SIZE_DEFAULT",
    "MAX_GROUPS_DEFAULT",
    "MEMBER_METADATA_MAX_BYTES_DEFAULT",
    "NEW_MEMBER_JOIN_TIMEOUT_MS_DEFAULT",
    "OFFSET_METADATA_MAX_BYTES_DEFAULT",
    "VALID_PREVIOUS_STATES",
    "EngineOffsetsStore",
    "GroupCoordinator",
    "GroupDescription",
    "GroupState",
    "InMemoryOffsetsStore",
    "JoinResult",
    "MemberDescription",
    "OffsetEntry",
    "OffsetsFormatError",
    "OffsetsStore",
    "SyncResult",
    "errors",
]
