"""Kafka error codes the group coordinator puts in its results (the handlers copy them to the wire).

The numbers live in `loglake.kafka_errors`; these names are re-exported for the coordinator
(``from loglake.broker.groups import errors as E; E.NONE``).
"""

from __future__ import annotations

from loglake.kafka_errors import ErrorCode

UNKNOWN_SERVER_ERROR: int = ErrorCode.UNKNOWN_SERVER_ERROR
NONE: int = ErrorCode.NONE
UNKNOWN_TOPIC_OR_PARTITION: int = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
OFFSET_METADATA_TOO_LARGE: int = ErrorCode.OFFSET_METADATA_TOO_LARGE
COORDINATOR_NOT_AVAILABLE: int = ErrorCode.COORDINATOR_NOT_AVAILABLE
NOT_COORDINATOR: int = ErrorCode.NOT_COORDINATOR
ILLEGAL_GENERATION: int = ErrorCode.ILLEGAL_GENERATION
INCONSISTENT_GROUP_PROTOCOL: int = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
INVALID_GROUP_ID: int = ErrorCode.INVALID_GROUP_ID
UNKNOWN_MEMBER_ID: int = ErrorCode.UNKNOWN_MEMBER_ID
INVALID_SESSION_TIMEOUT: int = ErrorCode.INVALID_SESSION_TIMEOUT
REBALANCE_IN_PROGRESS: int = ErrorCode.REBALANCE_IN_PROGRESS
INVALID_COMMIT_OFFSET_SIZE: int = ErrorCode.INVALID_COMMIT_OFFSET_SIZE
INVALID_REQUEST: int = ErrorCode.INVALID_REQUEST
NON_EMPTY_GROUP: int = ErrorCode.NON_EMPTY_GROUP
GROUP_ID_NOT_FOUND: int = ErrorCode.GROUP_ID_NOT_FOUND
MEMBER_ID_REQUIRED: int = ErrorCode.MEMBER_ID_REQUIRED
GROUP_MAX_SIZE_REACHED: int = ErrorCode.GROUP_MAX_SIZE_REACHED
FENCED_INSTANCE_ID: int = ErrorCode.FENCED_INSTANCE_ID
