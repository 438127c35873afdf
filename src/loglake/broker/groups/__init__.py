"""Consumer-group coordinator (Kafka's classic group protocol), durable offsets and group states.

See docs/GROUPS.md for the API contract, the persistence, and the Kafka behaviours covered.
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
from loglake.broker.groups.limits import OFFSETS_RETENTION_MINUTES_DEFAULT
from loglake.broker.groups.meta_store import GroupLog, MetaGroupLog, MetaGroupStore
from loglake.broker.groups.persistence import GroupStateError
from loglake.broker.groups.store import (
    GroupStore,
    InMemoryGroupStore,
    OffsetEntry,
    StoredGroup,
    StoreFormatError,
)

#: Former names, kept for callers that still use them.
OffsetsStore = GroupStore
InMemoryOffsetsStore = InMemoryGroupStore
OffsetsFormatError = StoreFormatError

__all__ = [
    "GROUP_MAX_SIZE_DEFAULT",
    "MAX_GROUPS_DEFAULT",
    "MEMBER_METADATA_MAX_BYTES_DEFAULT",
    "NEW_MEMBER_JOIN_TIMEOUT_MS_DEFAULT",
    "OFFSETS_RETENTION_MINUTES_DEFAULT",
    "OFFSET_METADATA_MAX_BYTES_DEFAULT",
    "VALID_PREVIOUS_STATES",
    "GroupCoordinator",
    "GroupDescription",
    "GroupLog",
    "GroupState",
    "GroupStateError",
    "GroupStore",
    "InMemoryGroupStore",
    "InMemoryOffsetsStore",
    "JoinResult",
    "MemberDescription",
    "MetaGroupLog",
    "MetaGroupStore",
    "OffsetEntry",
    "OffsetsFormatError",
    "OffsetsStore",
    "StoreFormatError",
    "StoredGroup",
    "SyncResult",
    "errors",
]
