"""Which operation on which resource each API needs: the one table, as Kafka's KafkaApis has it.

Handlers enforce these rules through `loglake.broker.security.authorized` (`check`, `denied`,
`cluster_allowed`); this table is what they implement, in one readable place.
`tests/test_authorizer.py` fails when an API has a handler but no row here, so the next API
added cannot forget its rule.

Reading a row: "WRITE topic -> TOPIC_AUTHORIZATION_FAILED per partition" means each topic the
principal may not WRITE is answered with that code for each of its partitions, while the rest
of the request goes on; "whole request" means nothing of it is done.
"""

from __future__ import annotations

from loglake.broker.protocol.api_keys import ApiKey

__all__ = ["API_ACLS"]

#: api key -> the rule. Resource names: a topic, a group id, a transactional id, or the
#: cluster (``kafka-cluster``).
API_ACLS: dict[int, str] = {
    ApiKey.PRODUCE: "transactional batches: WRITE transactional id (whole request, "
                    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED); WRITE topic -> TOPIC_AUTHORIZATION_FAILED per partition",
    ApiKey.FETCH: "READ topic -> TOPIC_AUTHORIZATION_FAILED per partition",
    ApiKey.LIST_OFFSETS: "DESCRIBE topic -> TOPIC_AUTHORIZATION_FAILED per partition",
    ApiKey.METADATA: "DESCRIBE topic: all-topics requests list only those, named ones get TOPIC_AUTHORIZATION_FAILED; "
                     "auto-creation needs CREATE on the cluster or the topic; authorized operations from the ACLs",
    ApiKey.OFFSET_COMMIT: "READ group (GROUP_AUTHORIZATION_FAILED, whole request); READ topic per partition",
    ApiKey.OFFSET_FETCH: "DESCRIBE group (GROUP_AUTHORIZATION_FAILED); DESCRIBE topic per partition (all-offsets "
                         "requests list only those topics)",
    ApiKey.FIND_COORDINATOR: "DESCRIBE group (GROUP_AUTHORIZATION_FAILED) or transactional id "
                             "(TRANSACTIONAL_ID_AUTHORIZATION_FAILED), per key",
    ApiKey.JOIN_GROUP: "READ group -> GROUP_AUTHORIZATION_FAILED",
    ApiKey.HEARTBEAT: "READ group -> GROUP_AUTHORIZATION_FAILED",
    ApiKey.LEAVE_GROUP: "READ group -> GROUP_AUTHORIZATION_FAILED",
    ApiKey.SYNC_GROUP: "READ group -> GROUP_AUTHORIZATION_FAILED",
    ApiKey.DESCRIBE_GROUPS: "DESCRIBE group -> GROUP_AUTHORIZATION_FAILED per group",
    ApiKey.LIST_GROUPS: "DESCRIBE cluster lists every group, else only groups with DESCRIBE",
    ApiKey.SASL_HANDSHAKE: "none (authentication itself)",
    ApiKey.API_VERSIONS: "none (before authentication)",
    ApiKey.CREATE_TOPICS: "CREATE cluster, else CREATE topic -> TOPIC_AUTHORIZATION_FAILED per topic; v5+ "
                          "configs only with DESCRIBE_CONFIGS (else topic_config_error_code)",
    ApiKey.DELETE_TOPICS: "DELETE topic -> TOPIC_AUTHORIZATION_FAILED per topic",
    ApiKey.DELETE_RECORDS: "DELETE topic -> TOPIC_AUTHORIZATION_FAILED per partition",
    ApiKey.INIT_PRODUCER_ID: "with a transactional id: WRITE it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED); without "
                             "(idempotent, Kafka 3+): IDEMPOTENT_WRITE cluster or WRITE on some topic "
                             "(CLUSTER_AUTHORIZATION_FAILED)",
    ApiKey.OFFSET_FOR_LEADER_EPOCH: "DESCRIBE topic -> TOPIC_AUTHORIZATION_FAILED per partition",
    ApiKey.ADD_PARTITIONS_TO_TXN: "v0-3: WRITE transactional id (whole request), WRITE topic (TOPIC_AUTHORIZATION_FAILED, "
                                  "the others OPERATION_NOT_ATTEMPTED); v4+ (brokers' form): CLUSTER_ACTION cluster",
    ApiKey.ADD_OFFSETS_TO_TXN: "WRITE transactional id, then READ group (GROUP_AUTHORIZATION_FAILED)",
    ApiKey.END_TXN: "WRITE transactional id -> TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    ApiKey.TXN_OFFSET_COMMIT: "WRITE transactional id, READ group (whole request); READ topic per partition",
    ApiKey.DESCRIBE_ACLS: "DESCRIBE cluster -> CLUSTER_AUTHORIZATION_FAILED",
    ApiKey.CREATE_ACLS: "ALTER cluster -> CLUSTER_AUTHORIZATION_FAILED per creation",
    ApiKey.DELETE_ACLS: "ALTER cluster -> CLUSTER_AUTHORIZATION_FAILED per filter",
    ApiKey.DESCRIBE_CONFIGS: "DESCRIBE_CONFIGS on the topic (TOPIC_...), group (GROUP_...) or, for broker and "
                             "broker-logger resources, the cluster (CLUSTER_AUTHORIZATION_FAILED), per resource",
    ApiKey.ALTER_CONFIGS: "ALTER_CONFIGS, per resource as DescribeConfigs",
    ApiKey.DESCRIBE_LOG_DIRS: "DESCRIBE cluster -> CLUSTER_AUTHORIZATION_FAILED (nothing listed)",
    ApiKey.SASL_AUTHENTICATE: "none (authentication itself)",
    ApiKey.CREATE_PARTITIONS: "ALTER topic -> TOPIC_AUTHORIZATION_FAILED per topic",
    ApiKey.DELETE_GROUPS: "DELETE group -> GROUP_AUTHORIZATION_FAILED per group",
    ApiKey.INCREMENTAL_ALTER_CONFIGS: "ALTER_CONFIGS, per resource as DescribeConfigs",
    ApiKey.OFFSET_DELETE: "DELETE group (GROUP_AUTHORIZATION_FAILED); READ topic per partition",
    ApiKey.DESCRIBE_CLIENT_QUOTAS: "DESCRIBE_CONFIGS cluster -> CLUSTER_AUTHORIZATION_FAILED (cluster_allowed)",
    ApiKey.ALTER_CLIENT_QUOTAS: "ALTER_CONFIGS cluster -> CLUSTER_AUTHORIZATION_FAILED (cluster_allowed)",
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: "DESCRIBE cluster -> CLUSTER_AUTHORIZATION_FAILED (cluster_allowed)",
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: "ALTER cluster -> CLUSTER_AUTHORIZATION_FAILED (cluster_allowed)",
    ApiKey.DESCRIBE_CLUSTER: "none (as Metadata); authorized operations only with DESCRIBE cluster, else empty",
    ApiKey.DESCRIBE_PRODUCERS: "READ topic -> TOPIC_AUTHORIZATION_FAILED per partition",
    ApiKey.DESCRIBE_TRANSACTIONS: "DESCRIBE transactional id -> TRANSACTIONAL_ID_AUTHORIZATION_FAILED per id; "
                                  "partitions listed only of topics with DESCRIBE",
    ApiKey.LIST_TRANSACTIONS: "lists only transactional ids with DESCRIBE",
    ApiKey.CONSUMER_GROUP_HEARTBEAT: "READ group (GROUP_AUTHORIZATION_FAILED); DESCRIBE each subscribed topic "
                                     "(TOPIC_AUTHORIZATION_FAILED naming them)",
    ApiKey.CONSUMER_GROUP_DESCRIBE: "DESCRIBE group -> GROUP_AUTHORIZATION_FAILED per group",
    ApiKey.SHARE_GROUP_HEARTBEAT: "READ group (GROUP_AUTHORIZATION_FAILED); DESCRIBE each subscribed topic "
    "(TOPIC_AUTHORIZATION_FAILED)",
    ApiKey.SHARE_GROUP_DESCRIBE: "DESCRIBE group -> GROUP_AUTHORIZATION_FAILED per group",
    ApiKey.SHARE_FETCH: "READ group (GROUP_AUTHORIZATION_FAILED); READ topic -> TOPIC_AUTHORIZATION_FAILED per partition",
    ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: "DESCRIBE group (GROUP_AUTHORIZATION_FAILED per group); DESCRIBE topic "
    "(TOPIC_AUTHORIZATION_FAILED per partition)",
    ApiKey.ALTER_SHARE_GROUP_OFFSETS: "READ group (GROUP_AUTHORIZATION_FAILED); READ topic -> TOPIC_AUTHORIZATION_FAILED per partition",
    ApiKey.DELETE_SHARE_GROUP_OFFSETS: "DELETE group (GROUP_AUTHORIZATION_FAILED); READ topic -> TOPIC_AUTHORIZATION_FAILED per partition",
    ApiKey.SHARE_ACKNOWLEDGE: "READ group (GROUP_AUTHORIZATION_FAILED); READ topic -> TOPIC_AUTHORIZATION_FAILED per partition",
}
