"""Kafka API keys by name: the one table of them in loglake.

Each member is Kafka's number for a request type and its name as Kafka's ApiKeys enum spells it
(the message name ``ApiVersions`` is ``API_VERSIONS``); `ApiKey.kafka_name` gives the message name
back. Only the APIs loglake serves are listed; add a member here before serving a new one, and its
range to `versions.SUPPORTED`.

Everything else refers to an API by name: the version table, the codec, the handler tables, the
quota and SASL exemptions, the ACL rules. `tests/test_api_keys.py` fails if a module of `src/`
spells an API key as a number, and checks every member against Kafka's JSON message schemas.

`ApiKey` members are ints (an IntEnum): they go on the wire as they are, compare equal to the
decoded request's plain ``api_key`` and hash like it, so tables keyed by members are looked up
with the number off the wire.
"""

from __future__ import annotations

from enum import IntEnum, unique


@unique
class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    INCREMENTAL_ALTER_CONFIGS = 44
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    SHARE_GROUP_HEARTBEAT = 76
    SHARE_GROUP_DESCRIBE = 77
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79
    DESCRIBE_SHARE_GROUP_OFFSETS = 90
    ALTER_SHARE_GROUP_OFFSETS = 91
    DELETE_SHARE_GROUP_OFFSETS = 92

    @property
    def kafka_name(self) -> str:
        """The message name, as in Kafka's schemas and ApiVersions tooling: ``ApiVersions``."""
        return "".join(word.capitalize() for word in self.name.split("_"))


__all__ = ["ApiKey"]
