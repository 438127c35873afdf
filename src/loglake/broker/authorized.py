"""The ACL operations a client is authorized for, as Metadata and DescribeCluster report them.

loglake has no authorizer yet, so every operation on a resource is allowed and these answers
do not depend on who asks. This module is the one place that says so: an authorizer replaces
these functions with answers from its ACLs, and the handlers stay as they are.

Operations are Kafka's AclOperation codes. They go to the codec as sets of bit numbers: the
codec (kafka-python's bitfield type) packs a set into the 32-bit field with bit n for code n,
and None into Kafka's "not requested" value, -2147483648 (bit 31 alone).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class AclOperation(IntEnum):
    """org.apache.kafka.common.acl.AclOperation codes."""

    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


_OP = AclOperation
#: What can be done to a topic (Kafka's operations valid for the TOPIC resource).
TOPIC_OPERATIONS = frozenset({_OP.READ, _OP.WRITE, _OP.CREATE, _OP.DELETE, _OP.ALTER, _OP.DESCRIBE,
                              _OP.DESCRIBE_CONFIGS, _OP.ALTER_CONFIGS})
#: What can be done to the cluster (Kafka's operations valid for the CLUSTER resource).
CLUSTER_OPERATIONS = frozenset({_OP.CREATE, _OP.ALTER, _OP.DESCRIBE, _OP.CLUSTER_ACTION, _OP.DESCRIBE_CONFIGS,
                                _OP.ALTER_CONFIGS, _OP.IDEMPOTENT_WRITE})


def topic_operations(topic: str) -> set[int]:
    """The operations on `topic` the caller may perform: all of them (no authorizer)."""
    del topic
    return {int(op) for op in TOPIC_OPERATIONS}


def cluster_operations() -> set[int]:
    """The operations on the cluster the caller may perform: all of them (no authorizer)."""
    return {int(op) for op in CLUSTER_OPERATIONS}


def cluster_allowed(ctx: Any, conn: Any, operation: AclOperation) -> bool:
    """Whether the connection's principal may perform `operation` on the cluster resource.

    The one call every cluster-level API (ACL, SCRAM credential and quota administration) makes
    before acting; it answers CLUSTER_AUTHORIZATION_FAILED when this is False. No authorizer
    yet: always True.
    """
    del ctx, conn, operation
    return True
