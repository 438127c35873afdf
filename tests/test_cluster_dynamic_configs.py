"""Dynamic configs recorded by one cluster broker hold on every broker without a restart: two real
brokers over etcd and a shared folder (tests/clusterkit.py, `cold_store="file"`).

* A GROUP config (Kafka 4.0's resource 32) altered through one broker is what the group's
  coordinator — the other broker — describes and hands out: a KIP-848 member is told the
  group's `consumer.heartbeat.interval.ms`, and the broker's again once the config is deleted.
* A cluster-wide default BROKER config (resource name "") altered through one broker is the other
  broker's DYNAMIC_DEFAULT_BROKER_CONFIG layer, and acts there: a topic default (log.retention.ms)
  becomes the retention of that broker's topics without their own.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from clusterkit import Cluster, running_cluster
from etcdkit import needs_etcd
from loglake.broker.dynamic_config import DYNAMIC_DEFAULT_BROKER_CONFIG
from loglake.broker.handlers.admin_common import RESOURCE_GROUP
from loglake.broker.protocol.kip848 import ConsumerGroupHeartbeatRequest
from loglake.broker.settings import BROKER_SETTINGS
from loglake.cluster.coordinators import coordinator_of
from loglake.kafka_errors import ErrorCode as E
from modekit import CLUSTER_ARGS
from test_broker_admin import raw_call
from test_broker_malformed import RawClient

pytestmark = needs_etcd

#: The brokers' own group.consumer.heartbeat.interval.ms (a group without its own is told this).
HEARTBEAT_MS = int(BROKER_SETTINGS["group_consumer_heartbeat_interval_ms"].default)  # type: ignore[call-overload]
#: How long the other broker may take to apply a change (etcd's watch brings it in milliseconds).
AGREE_WAIT_S = 30.0
T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = Path(tmp_path_factory.mktemp("cluster-configs"))
    with running_cluster(tmp, brokers=2, cold_store="file", broker_args=list(CLUSTER_ARGS)) as c:
        yield c


def eventually(ask: Callable[[], T], want: T) -> T:
    deadline = time.monotonic() + AGREE_WAIT_S
    while (got := ask()) != want:
        assert time.monotonic() < deadline, f"still {got!r}, not {want!r}, after {AGREE_WAIT_S} s"
        time.sleep(0.1)
    return got


def alter(bootstrap: str, resource: ConfigResource) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the answer: destroying it cancels
    for fut in admin.incremental_alter_configs([resource]).values():
        fut.result(30)


def alter_default(cluster: Cluster, node: int, retention_ms: str | None, op: AlterConfigOpType) -> None:
    """IncrementalAlterConfigs of log.retention.ms on the cluster-wide default broker resource
    through `node` ("": confluent-kafka refuses an empty resource name, so a raw request)."""
    resp = raw_call(cluster.by_node(node), 44, 1, validate_only=False, resources=[{
        "resource_type": ResourceType.BROKER.value, "resource_name": "",
        "configs": [{"name": "log.retention.ms", "config_operation": op.value, "value": retention_ms}],
    }])  # fmt: skip
    assert resp.responses[0].error_code == E.NONE, resp


def described(bootstrap: str, rtype: ResourceType, name: str, key: str) -> tuple[str | None, int]:
    """(value, source) of config `key` of the resource, asked of the broker at `bootstrap` alone."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    [fut] = admin.describe_configs([ConfigResource(rtype, name)]).values()
    entry = fut.result(30)[key]
    return entry.value, int(entry.source)


def test_a_group_config_altered_on_one_broker_holds_at_the_groups_coordinator(cluster: Cluster) -> None:
    topic = "cfg-t"
    cluster.create_topic(topic, 2)
    live = sorted(b.node_id for b in cluster.brokers)
    coordinator, other = live[1], live[0]
    group = next(g for g in (f"g-{uuid.uuid4().hex[:8]}" for _ in range(10_000)) if coordinator_of(g, live) == coordinator)
    at = cluster.by_node(coordinator).bootstrap

    def heartbeat_interval() -> int:
        with RawClient(at) as c:
            resp = c.request(ConsumerGroupHeartbeatRequest[0](
                group_id=group, member_id="", member_epoch=0, rebalance_timeout_ms=30_000,
                subscribed_topic_names=[topic], topic_partitions=[]))  # fmt: skip
        assert resp.error_code == E.NONE, resp
        return int(resp.heartbeat_interval_ms)

    def interval_described() -> str | None:
        # Asked of the coordinator itself: confluent-kafka's admin client may send a GROUP
        # DescribeConfigs to any broker it learnt of, the one that took the change included.
        resp = raw_call(cluster.by_node(coordinator), 32, 4, include_synonyms=False, include_documentation=False,
                        resources=[{"resource_type": RESOURCE_GROUP, "resource_name": group,
                                    "configuration_keys": ["consumer.heartbeat.interval.ms"]}])
        [result] = resp.results
        assert result.error_code == E.NONE, result
        [entry] = result.configs
        return str(entry.value)

    assert heartbeat_interval() == HEARTBEAT_MS
    key = "consumer.heartbeat.interval.ms"
    alter(cluster.by_node(other).bootstrap, ConfigResource(
        ResourceType.GROUP, group, incremental_configs=[ConfigEntry(key, "7000", incremental_operation=AlterConfigOpType.SET)]))  # fmt: skip
    eventually(interval_described, "7000")
    assert heartbeat_interval() == 7000
    alter(cluster.by_node(other).bootstrap, ConfigResource(
        ResourceType.GROUP, group, incremental_configs=[ConfigEntry(key, None, incremental_operation=AlterConfigOpType.DELETE)]))  # fmt: skip
    eventually(interval_described, str(HEARTBEAT_MS))
    assert heartbeat_interval() == HEARTBEAT_MS


def test_a_cluster_wide_broker_config_altered_on_one_broker_acts_on_the_other(cluster: Cluster) -> None:
    first, second = sorted(b.node_id for b in cluster.brokers)
    at = cluster.by_node(second).bootstrap
    topic = f"cfg-retention-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 1)
    week = str(7 * 24 * 3600 * 1000)
    assert described(at, ResourceType.TOPIC, topic, "retention.ms")[0] == week
    alter_default(cluster, first, "3600000", AlterConfigOpType.SET)
    eventually(lambda: described(at, ResourceType.BROKER, str(second), "log.retention.ms"),
               ("3600000", DYNAMIC_DEFAULT_BROKER_CONFIG))
    eventually(lambda: described(at, ResourceType.TOPIC, topic, "retention.ms")[0], "3600000")
    alter_default(cluster, first, None, AlterConfigOpType.DELETE)
    eventually(lambda: described(at, ResourceType.TOPIC, topic, "retention.ms")[0], week)
