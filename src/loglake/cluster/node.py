"""Cluster mode's composition: the engine of `loglake serve --cluster`, and its group stores.

The same `Engine` class as a single node, composed of cluster mode's parts: the etcd metadata
store, the shared partition log over the bucket (loglake.cluster.shared_log) and the etcd cluster
view (loglake.cluster.view). The broker gets this engine and the fenced stores of its group and
transaction coordinators (loglake.cluster.groups, loglake.cluster.txn) and never asks which mode
it runs in.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from loglake.broker.config import BrokerConfig
from loglake.broker.context import CoordinatorStores
from loglake.cluster.etcd import EtcdMetaStore
from loglake.cluster.etcd_client import EtcdClient
from loglake.cluster.flusher import FlushSettings
from loglake.cluster.groups import fenced_stores
from loglake.cluster.shared_log import ClusterSettings, SharedPartitionLog
from loglake.cluster.shares import FencedShareStore
from loglake.cluster.txn import txn_backend
from loglake.cluster.view import EtcdClusterView
from loglake.engine.catalog import Catalog
from loglake.engine.config import EngineConfig
from loglake.engine.engine import Engine, EngineParts
from loglake.engine.space import SpaceGuard
from loglake.errors import ConfigError
from loglake.fs.os_fs import OsFileSystem
from loglake.meta.etcd_url import parse_cluster_url
from loglake.store.base import ObjectStore

__all__ = ["cluster_node", "cluster_parts", "settings_of"]


def settings_of(c: BrokerConfig) -> ClusterSettings:
    """A cluster broker's settings from the broker's (cluster, node_id, ...)."""
    if c.cluster is None:
        raise ConfigError("cluster mode needs --cluster etcd://HOST:PORT/PREFIX")
    return ClusterSettings(
        c.cluster,
        c.node_id,
        rack=c.rack,
        lease_ttl_s=c.cluster_lease_ttl_s,
        flush=FlushSettings(object_flush_bytes=c.object_flush_bytes, object_flush_ms=c.object_flush_ms),
        maintenance_interval_ms=c.cluster_maintenance_interval_ms,
        unreachable_release_ms=c.cluster_unreachable_release_ms,
    )


def cluster_parts(
    data_dir: str,
    config: EngineConfig,
    settings: ClusterSettings,
    *,
    store: ObjectStore | None = None,
    clock: Callable[[], float] = time.time,
) -> EngineParts:
    """Every part of a cluster broker's engine; `store`: the bucket (else `config.cold_store_url`)."""
    fs = OsFileSystem()
    url = config.cold_store_url
    if store is None and not url:
        raise ConfigError("cluster mode needs a cold store (--cold-store): the bucket holds every partition")

    def bucket() -> ObjectStore:
        if store is not None:
            return store
        from loglake.store import open_store

        return open_store(str(url), fs)

    endpoints, prefix = parse_cluster_url(settings.url)
    client = EtcdClient(",".join(f"{h}:{p}" for h, p in endpoints))
    etcd = EtcdMetaStore(client, prefix)
    catalog = Catalog(etcd, config, clock)
    view: list[EtcdClusterView] = []  # made just below; the log asks it only once open
    log = SharedPartitionLog(
        config, settings, etcd=etcd, catalog=catalog, bucket=bucket, publishes=lambda: bool(view) and view[0].publishes(),
        bucket_url=str(url) if store is None else None,  # a given store object cannot be reopened elsewhere
    )
    view.append(EtcdClusterView(log, etcd, client, settings))
    # no reserve: the data directory holds only a cache here
    space = SpaceGuard(fs, data_dir, min_free_bytes=0, min_free_percent=0.0, check_interval_ms=config.storage_space_check_interval_ms)
    return EngineParts(fs, etcd, catalog, log, view[0], space, telemetry=view[0])


def cluster_node(c: BrokerConfig) -> tuple[Engine, CoordinatorStores]:
    """The engine of `serve --cluster` (not yet open) and its coordinators' fenced stores (groups:
    loglake.cluster.groups; transactions: loglake.cluster.txn; share-partitions: loglake.cluster.shares)."""
    data_dir = os.path.abspath(c.data_dir)
    config = c.engine_config()
    parts = cluster_parts(data_dir, config, settings_of(c))
    assert isinstance(parts.meta, EtcdMetaStore)  # cluster_parts made it
    assert isinstance(parts.log, SharedPartitionLog)
    stores = CoordinatorStores(
        fenced_stores(parts.meta, parts.view), txn_backend(parts.meta, parts.view, parts.log), FencedShareStore(parts.meta)
    )
    return Engine(data_dir, config, parts=parts), stores
