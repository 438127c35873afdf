"""Admin APIs: topics, partitions, records, configs, cluster description.

Exports `HANDLERS` (api key -> handler), which `loglake.broker.handlers` merges into the server's
table. The handlers live in `admin_topics` and `admin_configs`; DescribeCluster is here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from loglake.broker.authorized import CLUSTER, AclOperation, allowed, cluster_operations
from loglake.broker.authorizer import CLUSTER_NAME
from loglake.broker.context import BrokerContext, advertised_endpoint
from loglake.broker.handlers.admin_common import MISMATCHED_ENDPOINT_TYPE
from loglake.broker.handlers.admin_configs import alter_configs, describe_configs, incremental_alter_configs
from loglake.broker.handlers.admin_topics import (
    create_partitions,
    create_topics,
    delete_records,
    delete_topics,
)
from loglake.broker.handlers.errors import NONE
from loglake.broker.protocol import DecodedRequest

#: DescribeCluster endpoint types (KIP-919).
ENDPOINT_BROKERS = 1


async def describe_cluster(ctx: BrokerContext, conn: Any, req: DecodedRequest) -> dict[str, Any]:
    body = req.body
    endpoint_type = int(getattr(body, "endpoint_type", ENDPOINT_BROKERS))
    response: dict[str, Any] = {
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
    host, port = advertised_endpoint(ctx, conn)
    response["brokers"] = [
        {
            "broker_id": ctx.node_id,
            "host": host,
            "port": port,
            "rack": None,
            "is_fenced": False,
        }
    ]
    return response


HANDLERS: dict[int, Callable[[BrokerContext, Any, DecodedRequest], Awaitable[Any]]] = {
    19: create_topics,
    20: delete_topics,
    21: delete_records,
    32: describe_configs,
    33: alter_configs,
    37: create_partitions,
    44: incremental_alter_configs,
    60: describe_cluster,
}
