"""Cluster mode's settings (docs/CLUSTER.md): from flags, TOML and the environment, checked at
start-up with one line naming the setting — before anything is opened or contacted."""

from __future__ import annotations

from pathlib import Path

import pytest

from loglake.broker.config import BrokerConfig
from loglake.errors import ConfigError

URL = "etcd://127.0.0.1:2379,127.0.0.1:22379/loglake/prod"
BUCKET = "s3://lake/prod?region=us-east-1"


def test_single_node_by_default() -> None:
    c = BrokerConfig.load(None, env={})
    assert c.cluster is None and c.rack is None
    assert (c.cluster_lease_ttl_s, c.object_flush_bytes, c.object_flush_ms) == (3, 4 * 1024 * 1024, 500)


def test_flags_env_and_toml(tmp_path: Path) -> None:
    c = BrokerConfig.load(
        None, env={}, cluster=URL, cold_store=BUCKET, node_id=2, rack="a", object_flush_ms=50
    )
    assert (c.cluster, c.node_id, c.rack, c.object_flush_ms) == (URL, 2, "a", 50)
    env = {
        "LOGLAKE_CLUSTER": URL,
        "LOGLAKE_NODE_ID": "3",
        "LOGLAKE_COLD_STORE": BUCKET,
        "LOGLAKE_CLUSTER_LEASE_TTL_S": "5",
    }
    c = BrokerConfig.load(None, env=env)
    assert (c.cluster, c.node_id, c.cluster_lease_ttl_s) == (URL, 3, 5)
    toml = tmp_path / "broker.toml"
    toml.write_text(f'cluster = "{URL}"\ncold_store = "{BUCKET}"\nnode_id = 4\nobject_flush_bytes = 65536\n')
    c = BrokerConfig.load(str(toml), env={})
    assert (c.cluster, c.node_id, c.object_flush_bytes) == (URL, 4, 65536)


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"cluster": URL}, "needs --cold-store"),
        ({"cluster": "http://127.0.0.1:2379/x", "cold_store": BUCKET}, "must start with etcd://"),
        ({"cluster": "etcd://127.0.0.1:2379", "cold_store": BUCKET}, "needs a key prefix"),
        ({"cluster": URL, "cold_store": BUCKET, "cluster_lease_ttl_s": 1}, "cluster_lease_ttl_s=1"),
        (
            {"cluster": URL, "cold_store": BUCKET, "object_flush_bytes": 128 * 1024 * 1024},
            "object_flush_bytes",
        ),
    ],
)
def test_bad_cluster_settings_are_one_config_error(settings: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        BrokerConfig.load(None, env={}, **settings)
