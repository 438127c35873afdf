"""Admin APIs: topics, partitions, records, configs, cluster description.

Exports `HANDLERS` (api key -> handler), which `loglake.broker.handlers` merges into the server's
table. The handlers live in `admin_topics` and `admin_configs`; DescribeCluster is here.
"""

from __future__ import annotations

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext, Handler
from loglake.broker.handlers.admin_common import MISMATCHED_ENDPOINT_TYPE
from loglake.broker.handlers.admin_configs import alter_configs, describe_configs, incremental_alter_configs
from loglake.broker.handlers.admin_topics import (
    create_partitions,
    create_topics,
    delete_records,
    delete_topics,
)
from loglake.broker.handlers.errors import NONE
from loglake.broker.protocol import ApiKey, DecodedRequest
from loglake.broker.security.authorized import CLUSTER, AclOperation, allowed, cluster_operations
from loglake.broker.security.authorizer import CLUSTER_NAME

#: DescribeCluster endpoint types (KIP-919).
ENDPOINT_BROKERS = 1


async def describe_cluster(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    endpoint_type = int(getattr(body, "endpoint_type", ENDPOINT_BROKERS))
    response: dict[str, object] = {
        "throttle_time_ms": 0,
        "error_code": NONE,
        "error_message": None,
        "endpoint_type": endpoint_type,
        "cluster_id": ctx.engine.cluster_id,
        "controller_id": ctx.node_id,
        "brokers": [],
        # Kafka answers anyone (like Metadata); the operations only to a principal that may
        # DESCRIBE the cluster, an empty set to others.
        "authorized_operations": (
            (cluster_operations(ctx, conn) if allowed(ctx, conn, AclOperation.DESCRIBE, CLUSTER, CLUSTER_NAME) else set())
            if body.include_cluster_authorized_operations else None
        ),
    }
    if endpoint_type != ENDPOINT_BROKERS:
        response["error_code"] = MISMATCHED_ENDPOINT_TYPE
        response["error_message"] = (
            f"The request was sent to a broker endpoint, but it asked for endpoint type {endpoint_type}."
        )
        return response
    from loglake.broker.handlers.metadata import brokers_of

    # Every live broker in cluster mode, this one alone otherwise (as Metadata lists them).
    listed = brokers_of(ctx, conn)
    response["brokers"] = [
        {"broker_id": b["node_id"], "host": b["host"], "port": b["port"], "rack": b["rack"], "is_fenced": False}
        for b in listed
    ]
    response["controller_id"] = min(b["node_id"] for b in listed)
    return response


HANDLERS: dict[int, Handler] = {
    ApiKey.CREATE_TOPICS: create_topics,
    ApiKey.DELETE_TOPICS: delete_topics,
    ApiKey.DELETE_RECORDS: delete_records,
    ApiKey.DESCRIBE_CONFIGS: describe_configs,
    ApiKey.ALTER_CONFIGS: alter_configs,
    ApiKey.CREATE_PARTITIONS: create_partitions,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: incremental_alter_configs,
    ApiKey.DESCRIBE_CLUSTER: describe_cluster,
}
