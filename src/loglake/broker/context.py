"""What every API handler gets (`BrokerContext`), the one function that builds it, and the type of
a handler.

`build_context` makes every collaborator in the order they need each other, then the context,
once: a frozen dataclass, nothing in it set afterwards. What changes while the broker runs lives
behind its own object: the group coordinator (`GroupCoordination` replaces it when the live set
moves; `ctx.coordinator` is the current one), dynamic broker and group configs (`BrokerConfigs`,
`GroupConfigStore`), quotas (`QuotaManager`) and ACLs (`Authorizer`).

A handler is `async (ctx, conn, req) -> response | None` (`Handler`): `conn` is what it may use
of the connection (`loglake.broker.conn.Conn`), `req` the decoded request, whose body is
kafka-python's (`KafkaStruct`: untyped).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from loglake.broker.completions import LoopCompletions
from loglake.broker.config import BrokerConfig
from loglake.broker.config_store import ConfigStore
from loglake.broker.conn import Conn
from loglake.broker.dynamic_config import BrokerConfigs
from loglake.broker.fetch_sessions import FetchSessionCache
from loglake.broker.group_configs import GroupConfigStore, group_config_bounds
from loglake.broker.group_reload import GroupCoordination
from loglake.broker.groups import GroupCoordinator
from loglake.broker.groups.store import GroupStoreFactory, ReloadableGroupStore
from loglake.broker.listeners import Listener
from loglake.broker.metrics import Metrics
from loglake.broker.off_loop import OffLoop
from loglake.broker.protocol.codec import DecodedRequest, Response
from loglake.broker.schema_validation import SchemaValidator
from loglake.broker.security.acl_store import AclStore
from loglake.broker.security.authorizer import AclOperation, Authorizer, ResourceType, broker_authorizer
from loglake.broker.security.mutation_quota import MutationQuotas
from loglake.broker.security.quota_store import QuotaStore
from loglake.broker.security.quotas import QuotaManager
from loglake.broker.security.sasl import SaslAuthenticator
from loglake.broker.security.scram_store import ScramStore
from loglake.broker.share import ShareCoordinator
from loglake.broker.share.store import MetaShareStore, ShareStore
from loglake.broker.txn import TxnBackend, TxnCoordinator, TxnSettings
from loglake.engine import Engine
from loglake.engine.view import ClusterView
from loglake.errors import UnknownTopicError
from loglake.meta.quotas import EntityKey

__all__ = ["BrokerContext", "Handler", "build_context", "group_coordinator"]

log = logging.getLogger("loglake.broker")


@dataclass(frozen=True, slots=True)
class CoordinatorStores:
    """How a broker's coordinators keep their state when it is not the engine's metadata store
    directly (cluster mode: claimed and fenced in etcd, loglake.cluster.node)."""

    groups: GroupStoreFactory
    txns: TxnBackend
    #: share-partition states (None: `MetaShareStore` over the engine's metadata store)
    shares: ShareStore | None = None


@dataclass(frozen=True, slots=True)
class BrokerContext:
    engine: Engine
    config: BrokerConfig
    #: The (host, port) the first listener advertises (a connection's own listener: `advertised_endpoint`).
    advertised_host: str
    advertised_port: int
    metrics: Metrics
    #: Blocking work off the event loop: `await ctx.off_loop(fn, *args)`.
    off_loop: OffLoop
    #: The group coordinator and its store, replaced when the live set changes.
    groups: GroupCoordination
    txn: TxnCoordinator
    #: The broker's settings with their dynamic layers (DescribeConfigs/AlterConfigs on BROKER).
    broker_configs: BrokerConfigs
    #: Per-group config overrides (Kafka's GROUP resource); the coordinator reads `overrides(group_id)`.
    group_configs: GroupConfigStore
    #: SASL mechanisms and credentials (connections on SASL listeners).
    sasl: SaslAuthenticator
    #: KIP-227 fetch sessions.
    fetch_sessions: FetchSessionCache
    #: The ACL authorizer (super users, allow.everyone.if.no.acl.found, the bindings).
    authorizer: Authorizer
    #: Client quota configs and rates.
    quotas: QuotaManager
    #: controller_mutation_rate token buckets.
    mutation_quotas: MutationQuotas
    #: The broker's facts in the engine's metadata store: ACL bindings, SCRAM credentials, client quotas.
    acl_store: AclStore
    scram_store: ScramStore
    quota_store: QuotaStore
    #: Share groups (KIP-932): members, share sessions, the share-partitions this broker leads.
    share: ShareCoordinator
    #: validated topics' produced records against the schema registry (confluent.*.schema.validation)
    schemas: SchemaValidator
    #: Futures the engine's threads complete (appends made durable), delivered to the loop in batches.
    completions: LoopCompletions

    @property
    def node_id(self) -> int:
        return self.engine.view.node_id

    @property
    def view(self) -> ClusterView:
        """Who is alive, who leads a partition, who coordinates a group (loglake.engine.view)."""
        return self.engine.view

    @property
    def coordinator(self) -> GroupCoordinator | None:
        """The current group coordinator (None until the first one is loaded)."""
        return self.groups.coordinator


#: An API handler: the response (a mapping of its fields, a kafka-python response object, or
#: Fetch's FetchResponseData), or None for a request that gets no answer (Produce with acks=0).
Handler = Callable[[BrokerContext, Conn, DecodedRequest], Awaitable[Response | None]]


async def build_context(
    config: BrokerConfig,
    engine: Engine,
    metrics: Metrics,
    endpoints: Sequence[tuple[Listener, tuple[str, int]]],
    *,
    off_loop: OffLoop,
    group_stores: GroupStoreFactory,
    txn_backend: TxnBackend | None = None,
    share_store: ShareStore | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> BrokerContext:
    """Every collaborator the handlers share, loaded from the engine's metadata, then the context.

    `engine` is open and has joined the cluster view; `endpoints` are the bound listeners, each
    with the (host, port) it advertises, the first one first. `clock` (monotonic seconds) paces
    the client quotas. The group and transaction coordinators are started (the latter completes
    transactions a crash left in a prepare state); if that fails, what was started is closed.
    """
    loop = asyncio.get_running_loop()
    first, (adv_host, adv_port) = endpoints[0]
    acl_store, scram_store, quota_store = AclStore.of(engine), ScramStore.of(engine), QuotaStore.of(engine)
    sasl = SaslAuthenticator(config, scram_store, metrics.sasl)
    fetch_sessions = metrics.fetch_sessions = FetchSessionCache.from_config(config)
    config_store = ConfigStore.of(engine)
    # Dynamic broker configs stored in the metadata log take effect before the first client.
    broker_configs = BrokerConfigs(
        config,
        engine,
        (first.host, first.port, adv_host, adv_port),
        (",".join(lst.url() for lst, _ in endpoints), ",".join(lst.url(*adv) for lst, adv in endpoints)),
    )

    def reload_broker_configs() -> None:
        try:
            broker_configs.load()
        except Exception:  # the next change loads them again; this broker keeps what it applied
            log.exception("dynamic broker configs: reloading after a change failed")

    def broker_config_changed(scope: str, configs: dict[str, str]) -> None:
        if broker_configs.concerns(scope):  # reloaded off the metadata store's thread, from the store
            with contextlib.suppress(RuntimeError):  # the loop closed: the broker is stopping
                loop.call_soon_threadsafe(_in_executor, loop, reload_broker_configs)

    # Followed before the first load: a change recorded in between is loaded again, never missed.
    config_store.follow_brokers(broker_config_changed)
    await loop.run_in_executor(None, broker_configs.load)
    quotas = QuotaManager(config.quota_window_num, config.quota_window_size_seconds, clock)
    quotas.load(quota_store.quotas())

    def quota_changed(key: EntityKey, values: dict[str, float] | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the broker is stopping
            loop.call_soon_threadsafe(quotas.set, key, values)

    quota_store.follow(quota_changed)
    metrics.registry.register(quotas)
    mutation_quotas = MutationQuotas(quotas, clock)
    group_configs = GroupConfigStore(config_store, lambda: group_config_bounds(config),
                                     share_defaults=lambda: config.share_limits())

    def group_config_changed(group_id: str, configs: dict[str, str]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the broker is stopping
            loop.call_soon_threadsafe(group_configs.changed, group_id, configs)

    # Followed before the load, as the broker configs; the loop takes the changes in their order.
    config_store.follow_groups(group_config_changed)
    group_configs.load()
    authorizer = broker_authorizer(config, acl_store)

    def make_coordinator(store: ReloadableGroupStore) -> GroupCoordinator:
        return group_coordinator(config, engine, group_configs, authorizer, store)

    groups = GroupCoordination(engine.view, group_stores, make_coordinator, off_loop)
    await groups.start()
    # The current coordinator, asked when a commit writes its offsets (GroupCoordination replaces it).
    store, markers = txn_backend(engine) if txn_backend is not None else (None, None)
    txn = TxnCoordinator(
        engine,
        lambda: groups.coordinator,
        TxnSettings(
            config.transaction_max_timeout_ms,
            config.transactional_id_expiration_ms,
            config.transaction_abort_timed_out_transaction_cleanup_interval_ms,
            config.transactional_ids_max,
        ),
        off_loop=off_loop,
        store=store,
        markers=markers,
    )
    try:
        await txn.start()  # completes transactions a crash left in a prepare state
    except BaseException:
        txn.close()
        groups.close()
        raise
    return BrokerContext(
        engine=engine,
        config=config,
        advertised_host=adv_host,
        advertised_port=adv_port,
        metrics=metrics,
        off_loop=off_loop,
        groups=groups,
        txn=txn,
        broker_configs=broker_configs,
        group_configs=group_configs,
        sasl=sasl,
        fetch_sessions=fetch_sessions,
        authorizer=authorizer,
        quotas=quotas,
        mutation_quotas=mutation_quotas,
        acl_store=acl_store,
        scram_store=scram_store,
        quota_store=quota_store,
        share=share_coordinator(config, engine, group_configs, share_store),
        schemas=SchemaValidator(engine),
        completions=LoopCompletions(asyncio.get_running_loop()),
    )


def _in_executor(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    with contextlib.suppress(RuntimeError):  # the executor shut down: the broker is stopping
        loop.run_in_executor(None, fn)


def share_coordinator(
    config: BrokerConfig, engine: Engine, group_configs: GroupConfigStore, store: ShareStore | None = None
) -> ShareCoordinator:
    """The share coordinator over `store` (by default the engine's metadata store), with the
    broker's group.share.* settings."""

    def topic_partitions(name: str) -> tuple[str, int] | None:
        try:
            return engine.topic_id_of(name).hex(), engine.topic(name).partitions
        except UnknownTopicError:
            return None

    def initial_offset(tid: str, partition: int, reset: str) -> int:
        name = engine.topic_name_of(bytes.fromhex(tid))
        if name is None:
            return 0
        info = engine.partition_info(name, partition)
        return info.log_start_offset if reset == "earliest" else info.high_watermark

    return ShareCoordinator(
        store if store is not None else MetaShareStore(engine.meta), config.share_limits(), topic_partitions=topic_partitions,
        initial_offset=initial_offset, auto_offset_reset=group_configs.share_auto_offset_reset,
        group_limits=group_configs.share_limits,
    )


def group_coordinator(
    config: BrokerConfig,
    engine: Engine,
    group_configs: GroupConfigStore,
    authorizer: Authorizer,
    store: ReloadableGroupStore,
) -> GroupCoordinator:
    """A group coordinator over `store` with the broker's group settings (GroupCoordination makes
    one at start and again whenever the live set moves)."""

    def topic_exists(name: str, partition: int) -> bool:
        try:
            return 0 <= partition < engine.topic(name).partitions
        except UnknownTopicError:
            return False

    def topic_catalog() -> dict[str, tuple[str, int]]:
        return {t.name: (t.topic_id, t.partitions) for t in engine.topics()}

    retention_minutes = config.offsets_retention_minutes  # Kafka's offsets.retention.minutes
    coordinator = GroupCoordinator(
        store,
        topic_exists=topic_exists,
        initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
        min_session_timeout_ms=config.group_min_session_timeout_ms,
        max_session_timeout_ms=config.group_max_session_timeout_ms,
        offsets_retention_ms=int(retention_minutes) * 60_000,
        consumer_limits=config.consumer_group_limits(),
        topic_catalog=topic_catalog,
        group_overrides=group_configs.overrides,
    )
    # KIP-848 regex subscriptions select only the topics the member may DESCRIBE
    coordinator.set_topic_filter(
        lambda principal, host, names: [
            n for n in names if authorizer.authorize(principal, host, AclOperation.DESCRIBE, ResourceType.TOPIC, n)
        ],
        lambda: authorizer.generation,
    )
    return coordinator
