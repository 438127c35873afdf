"""Kafka protocol error codes: the one table of them in loglake.

Each row is Kafka's number and name (org.apache.kafka.common.protocol.Errors), whether Kafka's
clients treat the error as retriable (its exception is a RetriableException), and a short message.
Only the codes loglake answers with are listed; add a row here before answering with a new one.

Everything else takes its numbers from here: the engine's typed errors (`loglake.errors`), the
protocol codec, the broker handlers and the group coordinator (those re-export the names they use).
This module sits at the bottom of the layer order beside `loglake.errors` and imports nothing of
loglake, so any layer may use it. `tests/test_kafka_errors.py` fails if any other module of
`src/` assigns an integer literal to one of these names.

`ErrorCode` members are ints (an IntEnum): they go on the wire as they are and compare equal to
plain numbers; `str()` of a member is its number.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    _value_: int
    #: Whether Kafka's clients retry on this error (Kafka's RetriableException).
    retriable: bool
    #: A short description, as Kafka's Errors table words it.
    message: str

    def __new__(cls, code: int, retriable: bool, message: str) -> ErrorCode:
        member = int.__new__(cls, code)
        member._value_ = code
        member.retriable = retriable
        member.message = message
        return member

    # name = (code, retriable, message)
    UNKNOWN_SERVER_ERROR = (-1, False, "The server experienced an unexpected error when processing the request.")
    NONE = (0, False, "No error.")
    OFFSET_OUT_OF_RANGE = (1, False, "The requested offset is not within the range of offsets maintained by the server.")
    CORRUPT_MESSAGE = (2, True, "This message has failed its CRC checksum, exceeds the valid size, or is otherwise corrupt.")
    UNKNOWN_TOPIC_OR_PARTITION = (3, True, "This server does not host this topic-partition.")
    LEADER_NOT_AVAILABLE = (5, True, "There is no leader for this topic-partition as we are in the middle of a leadership election.")
    NOT_LEADER_OR_FOLLOWER = (6, True, "For requests intended only for the leader, this error indicates that the broker is not the current leader.")
    REQUEST_TIMED_OUT = (7, True, "The request timed out.")
    MESSAGE_TOO_LARGE = (10, False, "The request included a message larger than the max message size the server will accept.")
    OFFSET_METADATA_TOO_LARGE = (12, False, "The metadata field of the offset request was too large.")
    COORDINATOR_LOAD_IN_PROGRESS = (14, True, "The coordinator is loading and hence can't process requests.")
    COORDINATOR_NOT_AVAILABLE = (15, True, "The coordinator is not available.")
    NOT_COORDINATOR = (16, True, "This is not the correct coordinator.")
    INVALID_TOPIC_EXCEPTION = (17, False, "The request attempted to perform an operation on an invalid topic.")
    INVALID_REQUIRED_ACKS = (21, False, "Produce request specified an invalid value for required acks.")
    ILLEGAL_GENERATION = (22, False, "Specified group generation id is not valid.")
    INCONSISTENT_GROUP_PROTOCOL = (23, False, "The group member's supported protocols are incompatible with those of existing members.")
    INVALID_GROUP_ID = (24, False, "The configured groupId is invalid.")
    UNKNOWN_MEMBER_ID = (25, False, "The coordinator is not aware of this member.")
    INVALID_SESSION_TIMEOUT = (26, False, "The session timeout is not within the range allowed by the broker.")
    REBALANCE_IN_PROGRESS = (27, False, "The group is rebalancing, so a rejoin is needed.")
    INVALID_COMMIT_OFFSET_SIZE = (28, False, "The committing offset data size is not valid.")
    TOPIC_AUTHORIZATION_FAILED = (29, False, "Topic authorization failed.")
    GROUP_AUTHORIZATION_FAILED = (30, False, "Group authorization failed.")
    CLUSTER_AUTHORIZATION_FAILED = (31, False, "Cluster authorization failed.")
    UNSUPPORTED_SASL_MECHANISM = (33, False, "The broker does not support the requested SASL mechanism.")
    ILLEGAL_SASL_STATE = (34, False, "Request is not valid given the current SASL state.")
    UNSUPPORTED_VERSION = (35, False, "The version of API is not supported.")
    TOPIC_ALREADY_EXISTS = (36, False, "Topic with this name already exists.")
    INVALID_PARTITIONS = (37, False, "Number of partitions is below 1.")
    INVALID_REPLICATION_FACTOR = (38, False, "Replication factor is below 1 or larger than the number of available brokers.")
    INVALID_REPLICA_ASSIGNMENT = (39, False, "Replica assignment is invalid.")
    INVALID_CONFIG = (40, False, "Configuration is invalid.")
    INVALID_REQUEST = (42, False, "This most likely occurs because of a request being malformed by the client library.")
    POLICY_VIOLATION = (44, False, "Request parameters do not satisfy the configured policy.")
    OUT_OF_ORDER_SEQUENCE_NUMBER = (45, False, "The broker received an out of order sequence number.")
    INVALID_PRODUCER_EPOCH = (47, False, "Producer attempted to produce with an old epoch.")
    INVALID_TXN_STATE = (48, False, "The producer attempted a transactional operation in an invalid state.")
    INVALID_PRODUCER_ID_MAPPING = (49, False, "The producer attempted to use a producer id which is not currently assigned to its transactional id.")
    INVALID_TRANSACTION_TIMEOUT = (50, False, "The transaction timeout is larger than the maximum value allowed by the broker (as configured by transaction.max.timeout.ms).")
    CONCURRENT_TRANSACTIONS = (51, True, "The producer attempted to update a transaction while another concurrent operation on the same transaction was ongoing.")
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = (53, False, "Transactional Id authorization failed.")
    OPERATION_NOT_ATTEMPTED = (55, False, "The broker did not attempt to execute this operation.")
    KAFKA_STORAGE_ERROR = (56, True, "Disk error when trying to access log file on the disk.")
    SASL_AUTHENTICATION_FAILED = (58, False, "SASL Authentication failed.")
    NON_EMPTY_GROUP = (68, False, "The group is not empty.")
    GROUP_ID_NOT_FOUND = (69, False, "The group id does not exist.")
    FETCH_SESSION_ID_NOT_FOUND = (70, True, "The fetch session ID was not found.")
    INVALID_FETCH_SESSION_EPOCH = (71, True, "The fetch session epoch is invalid.")
    FENCED_LEADER_EPOCH = (74, True, "The leader epoch in the request is older than the epoch on the broker.")
    UNKNOWN_LEADER_EPOCH = (75, True, "The leader epoch in the request is newer than the epoch on the broker.")
    OFFSET_NOT_AVAILABLE = (78, True, "The leader high watermark has not caught up from a recent leader election so the offsets cannot be guaranteed to be monotonically increasing.")
    MEMBER_ID_REQUIRED = (79, False, "The group member needs to have a valid member id before actually entering a consumer group.")
    GROUP_MAX_SIZE_REACHED = (81, False, "The consumer group has reached its max size.")
    FENCED_INSTANCE_ID = (82, False, "The broker rejected this static consumer since another consumer with the same group.instance.id has registered with a different member.id.")
    GROUP_SUBSCRIBED_TO_TOPIC = (86, False, "The consumer group is actively subscribed to the topic.")
    INVALID_RECORD = (87, False, "This record has failed the validation on broker and hence will be rejected.")
    UNSTABLE_OFFSET_COMMIT = (88, True, "There are unstable offsets that need to be cleared.")
    THROTTLING_QUOTA_EXCEEDED = (89, True, "The throttling quota has been exceeded.")
    PRODUCER_FENCED = (90, False, "There is a newer producer with the same transactionalId which fences the current one.")
    RESOURCE_NOT_FOUND = (91, False, "A request illegally referred to a resource that does not exist.")
    DUPLICATE_RESOURCE = (92, False, "A request illegally referred to the same resource twice.")
    UNACCEPTABLE_CREDENTIAL = (93, False, "Requested credential would not meet criteria for acceptability.")
    UNKNOWN_TOPIC_ID = (100, True, "This server does not host this topic ID.")
    TRANSACTIONAL_ID_NOT_FOUND = (105, False, "The transactionalId could not be found.")
    FETCH_SESSION_TOPIC_ID_ERROR = (106, True, "The fetch session encountered inconsistent topic ID usage.")
    FENCED_MEMBER_EPOCH = (110, False, "The member epoch is fenced by the group coordinator. The member must abandon all its partitions and rejoin.")
    UNRELEASED_INSTANCE_ID = (111, False, "The instance ID is still used by another member in the consumer group. That member must leave first.")
    UNSUPPORTED_ASSIGNOR = (112, False, "The assignor or its version range is not supported by the consumer group.")
    STALE_MEMBER_EPOCH = (113, False, "The member epoch is stale. The member must retry after receiving its updated member epoch via the ConsumerGroupHeartbeat API.")
    MISMATCHED_ENDPOINT_TYPE = (114, False, "The request was sent to an endpoint of the wrong type.")
    INVALID_RECORD_STATE = (121, False, "The record state is invalid. The acknowledgement of delivery could not be completed.")
    SHARE_SESSION_NOT_FOUND = (122, True, "The share session was not found.")
    INVALID_SHARE_SESSION_EPOCH = (123, True, "The share session epoch is invalid.")
    INVALID_REGULAR_EXPRESSION = (128, False, "The regular expression is not valid.")
    SHARE_SESSION_LIMIT_REACHED = (133, True, "The limit of share sessions has been reached.")


__all__ = ["ErrorCode"]
