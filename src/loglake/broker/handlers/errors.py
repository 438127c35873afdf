"""Kafka error codes the handlers answer with, and mapping of engine errors to them."""

from __future__ import annotations

from loglake.errors import LoglakeError

NONE = 0
UNKNOWN_SERVER_ERROR = -1
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
MESSAGE_TOO_LARGE = 10
COORDINATOR_NOT_AVAILABLE = 15
INVALID_TOPIC_EXCEPTION = 17
INVALID_REQUIRED_ACKS = 21
TOPIC_AUTHORIZATION_FAILED = 29
UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
KAFKA_STORAGE_ERROR = 56
UNKNOWN_TOPIC_ID = 100


def error_code(exc: BaseException) -> int:
    if isinstance(exc, LoglakeError) and exc.kafka_code != -1:
        return exc.kafka_code
    return UNKNOWN_SERVER_ERROR
