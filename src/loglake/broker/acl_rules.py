"""Which operation on which resource each API needs: the one table, as Kafka's KafkaApis has it.

Handlers enforce these rules through `loglake.broker.authorized` (`check`, `denied`,
`cluster_allowed`); this table is what they implement, in one readable place.
`tests/test_authorizer.py` fails when an API has a handler but no row here, so the next API
added cannot forget its rule.

Reading a row: "WRITE topic -> TOPIC_AUTHORIZATION_FAILED per partition" means each topic the
principal may not WRITE is answered with that code for each of its partitions, while the rest
of the request goes on; "whole request" means nothing of it is done.
"""

from __future__ import annotations

__all__ = ["API_ACLS"]

#: api key -> (API, the rule). Resource names: a topic, a group id, a transactional id, or the
#: cluster (``kafka-cluster``).
API_ACLS: dict[int, tuple[str, str]] = {
    0: ("Produce", "transactional batches: WRITE transactional id (whole request, "
                   "TRANSACTIONAL_ID_AUTHORIZATION_FAILED); WRITE topic -> TOPIC_AUTHORIZATION_FAILED per partition"),
    1: ("Fetch", "READ topic -> TOPIC_AUTHORIZATION_FAILED per partition"),
    2: ("ListOffsets", "DESCRIBE topic -> TOPIC_AUTHORIZATION_FAILED per partition"),
    3: ("Metadata", "DESCRIBE topic: all-topics requests list only those, named ones get TOPIC_AUTHORIZATION_FAILED; "
                    "auto-creation needs CREATE on the cluster or the topic; authorized operations from the ACLs"),
    8: ("OffsetCommit", "READ group (GROUP_AUTHORIZATION_FAILED, whole request); READ topic per partition"),
    9: ("OffsetFetch", "DESCRIBE group (GROUP_AUTHORIZATION_FAILED); DESCRIBE topic per partition (all-offsets "
                       "requests list only those topics)"),
    10: ("FindCoordinator", "DESCRIBE group (GROUP_AUTHORIZATION_FAILED) or transactional id "
                            "(TRANSACTIONAL_ID_AUTHORIZATION_FAILED), per key"),
    11: ("JoinGroup", "READ group -> GROUP_AUTHORIZATION_FAILED"),
    12: ("Heartbeat", "READ group -> GROUP_AUTHORIZATION_FAILED"),
    13: ("LeaveGroup", "READ group -> GROUP_AUTHORIZATION_FAILED"),
    14: ("SyncGroup", "READ group -> GROUP_AUTHORIZATION_FAILED"),
    15: ("DescribeGroups", "DESCRIBE group -> GROUP_AUTHORIZATION_FAILED per group"),
    16: ("ListGroups", "DESCRIBE cluster lists every group, else only groups with DESCRIBE"),
    17: ("SaslHandshake", "none (authentication itself)"),
    18: ("ApiVersions", "none (before authentication)"),
    19: ("CreateTopics", "CREATE cluster, else CREATE topic -> TOPIC_AUTHORIZATION_FAILED per topic; v5+ "
                         "configs only with DESCRIBE_CONFIGS (else topic_config_error_code)"),
    20: ("DeleteTopics", "DELETE topic -> TOPIC_AUTHORIZATION_FAILED per topic"),
    21: ("DeleteRecords", "DELETE topic -> TOPIC_AUTHORIZATION_FAILED per partition"),
    22: ("InitProducerId", "with a transactional id: WRITE it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED); without "
                           "(idempotent, Kafka 3+): IDEMPOTENT_WRITE cluster or WRITE on some topic "
                           "(CLUSTER_AUTHORIZATION_FAILED)"),
    23: ("OffsetForLeaderEpoch", "DESCRIBE topic -> TOPIC_AUTHORIZATION_FAILED per partition"),
    24: ("AddPartitionsToTxn", "v0-3: WRITE transactional id (whole request), WRITE topic (TOPIC_AUTHORIZATION_FAILED, "
                               "the others OPERATION_NOT_ATTEMPTED); v4+ (brokers' form): CLUSTER_ACTION cluster"),
    25: ("AddOffsetsToTxn", "WRITE transactional id, then READ group (GROUP_AUTHORIZATION_FAILED)"),
    26: ("EndTxn", "WRITE transactional id -> TRANSACTIONAL_ID_AUTHORIZATION_FAILED"),
    28: ("TxnOffsetCommit", "WRITE transactional id, READ group (whole request); READ topic per partition"),
    29: ("DescribeAcls", "DESCRIBE cluster -> CLUSTER_AUTHORIZATION_FAILED"),
    30: ("CreateAcls", "ALTER cluster -> CLUSTER_AUTHORIZATION_FAILED per creation"),
    31: ("DeleteAcls", "ALTER cluster -> CLUSTER_AUTHORIZATION_FAILED per filter"),
    32: ("DescribeConfigs", "DESCRIBE_CONFIGS on the topic (TOPIC_...), group (GROUP_...) or, for broker and "
                            "broker-logger resources, the cluster (CLUSTER_AUTHORIZATION_FAILED), per resource"),
    33: ("AlterConfigs", "ALTER_CONFIGS, per resource as DescribeConfigs"),
    35: ("DescribeLogDirs", "DESCRIBE cluster -> CLUSTER_AUTHORIZATION_FAILED (nothing listed)"),
    36: ("SaslAuthenticate", "none (authentication itself)"),
    37: ("CreatePartitions", "ALTER topic -> TOPIC_AUTHORIZATION_FAILED per topic"),
    42: ("DeleteGroups", "DELETE group -> GROUP_AUTHORIZATION_FAILED per group"),
    44: ("IncrementalAlterConfigs", "ALTER_CONFIGS, per resource as DescribeConfigs"),
    47: ("OffsetDelete", "DELETE group (GROUP_AUTHORIZATION_FAILED); READ topic per partition"),
    48: ("DescribeClientQuotas", "DESCRIBE_CONFIGS cluster -> CLUSTER_AUTHORIZATION_FAILED (cluster_allowed)"),
    49: ("AlterClientQuotas", "ALTER_CONFIGS cluster -> CLUSTER_AUTHORIZATION_FAILED (cluster_allowed)"),
    50: ("DescribeUserScramCredentials", "DESCRIBE cluster -> CLUSTER_AUTHORIZATION_FAILED (cluster_allowed)"),
    51: ("AlterUserScramCredentials", "ALTER cluster -> CLUSTER_AUTHORIZATION_FAILED (cluster_allowed)"),
    60: ("DescribeCluster", "none (as Metadata); authorized operations only with DESCRIBE cluster, else empty"),
    61: ("DescribeProducers", "READ topic -> TOPIC_AUTHORIZATION_FAILED per partition"),
    65: ("DescribeTransactions", "DESCRIBE transactional id -> TRANSACTIONAL_ID_AUTHORIZATION_FAILED per id; "
                                 "partitions listed only of topics with DESCRIBE"),
    66: ("ListTransactions", "lists only transactional ids with DESCRIBE"),
    68: ("ConsumerGroupHeartbeat", "READ group (GROUP_AUTHORIZATION_FAILED); DESCRIBE each subscribed topic "
                                   "(TOPIC_AUTHORIZATION_FAILED naming them)"),
    69: ("ConsumerGroupDescribe", "DESCRIBE group -> GROUP_AUTHORIZATION_FAILED per group"),
}
