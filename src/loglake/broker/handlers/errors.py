"""Kafka error codes the handlers answer with, and mapping of engine errors to them.

The numbers live in `loglake.kafka_errors`; these names are re-exported for the handlers' imports.
"""

from __future__ import annotations

from loglake.broker.context import BrokerContext
from loglake.broker.groups import GroupCoordinator
from loglake.errors import LoglakeError
from loglake.kafka_errors import ErrorCode

NONE: int = ErrorCode.NONE
UNKNOWN_SERVER_ERROR: int = ErrorCode.UNKNOWN_SERVER_ERROR
OFFSET_OUT_OF_RANGE: int = ErrorCode.OFFSET_OUT_OF_RANGE
OFFSET_NOT_AVAILABLE: int = ErrorCode.OFFSET_NOT_AVAILABLE
CORRUPT_MESSAGE: int = ErrorCode.CORRUPT_MESSAGE
UNKNOWN_TOPIC_OR_PARTITION: int = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
LEADER_NOT_AVAILABLE: int = ErrorCode.LEADER_NOT_AVAILABLE
NOT_LEADER_OR_FOLLOWER: int = ErrorCode.NOT_LEADER_OR_FOLLOWER
REQUEST_TIMED_OUT: int = ErrorCode.REQUEST_TIMED_OUT
MESSAGE_TOO_LARGE: int = ErrorCode.MESSAGE_TOO_LARGE
COORDINATOR_NOT_AVAILABLE: int = ErrorCode.COORDINATOR_NOT_AVAILABLE
INVALID_TOPIC_EXCEPTION: int = ErrorCode.INVALID_TOPIC_EXCEPTION
INVALID_REQUIRED_ACKS: int = ErrorCode.INVALID_REQUIRED_ACKS
TOPIC_AUTHORIZATION_FAILED: int = ErrorCode.TOPIC_AUTHORIZATION_FAILED
GROUP_AUTHORIZATION_FAILED: int = ErrorCode.GROUP_AUTHORIZATION_FAILED
CLUSTER_AUTHORIZATION_FAILED: int = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
UNSUPPORTED_VERSION: int = ErrorCode.UNSUPPORTED_VERSION
INVALID_REQUEST: int = ErrorCode.INVALID_REQUEST
INVALID_TXN_STATE: int = ErrorCode.INVALID_TXN_STATE
UNSTABLE_OFFSET_COMMIT: int = ErrorCode.UNSTABLE_OFFSET_COMMIT
TRANSACTIONAL_ID_AUTHORIZATION_FAILED: int = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
KAFKA_STORAGE_ERROR: int = ErrorCode.KAFKA_STORAGE_ERROR
UNKNOWN_TOPIC_ID: int = ErrorCode.UNKNOWN_TOPIC_ID
GROUP_ID_NOT_FOUND: int = ErrorCode.GROUP_ID_NOT_FOUND
INCONSISTENT_GROUP_PROTOCOL: int = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
NON_EMPTY_GROUP: int = ErrorCode.NON_EMPTY_GROUP
FENCED_LEADER_EPOCH: int = ErrorCode.FENCED_LEADER_EPOCH
UNKNOWN_LEADER_EPOCH: int = ErrorCode.UNKNOWN_LEADER_EPOCH
NOT_COORDINATOR: int = ErrorCode.NOT_COORDINATOR
COORDINATOR_LOAD_IN_PROGRESS: int = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS


def coordinator_error(ctx: BrokerContext, group_id: str) -> int:
    """NONE when this broker coordinates `group_id` now, else why not (GroupCoordination.gate:
    COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS)."""
    return ctx.groups.gate(group_id)


def coordinator_for(ctx: BrokerContext, group_id: str) -> GroupCoordinator | int:
    """The coordinator to ask about `group_id` when this broker coordinates it now, else the
    error code that says why not (`coordinator_error`)."""
    code = coordinator_error(ctx, group_id)
    coordinator = ctx.coordinator
    if code != NONE or coordinator is None:
        return code or COORDINATOR_NOT_AVAILABLE
    return coordinator


def epoch_check(current: int, client: int) -> int:
    """A request's current_leader_epoch against the partition's: -1 skips the check (Kafka)."""
    if client < 0 or client == current:
        return NONE
    return FENCED_LEADER_EPOCH if client < current else UNKNOWN_LEADER_EPOCH


def error_code(exc: BaseException) -> int:
    if isinstance(exc, LoglakeError) and exc.kafka_code != ErrorCode.UNKNOWN_SERVER_ERROR:
        return exc.kafka_code
    return UNKNOWN_SERVER_ERROR
