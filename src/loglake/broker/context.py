"""What every API handler gets: the engine, the group coordinator, the broker's identity and settings."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from loglake.broker.config import BrokerConfig
from loglake.broker.metrics import Metrics
from loglake.engine import Engine

if TYPE_CHECKING:
    from loglake.broker.authorizer import Authorizer
    from loglake.broker.dynamic_config import BrokerConfigs
    from loglake.broker.fetch_sessions import FetchSessionCache
    from loglake.broker.group_configs import GroupConfigStore
    from loglake.broker.mutation_quota import MutationQuotas
    from loglake.broker.quotas import QuotaManager

T = TypeVar("T")


@dataclass
class BrokerContext:
    engine: Engine
    config: BrokerConfig
    advertised_host: str
    advertised_port: int
    metrics: Metrics
    coordinator: Any = None  # loglake.broker.groups.GroupCoordinator, set by the server
    #: loglake.broker.txn.TxnCoordinator, set by the server
    txn: Any = None
    #: The broker's settings with their dynamic layers (DescribeConfigs/AlterConfigs on BROKER), set by the server.
    broker_configs: BrokerConfigs | None = None
    #: Per-group config overrides (Kafka's GROUP resource); the coordinator reads `overrides(group_id)`.
    group_configs: GroupConfigStore | None = None
    #: loglake.broker.sasl.SaslAuthenticator (mechanisms, credentials), set by the server.
    sasl: Any = None
    #: KIP-227 fetch sessions (None: every fetch is sessionless), set by the server.
    fetch_sessions: FetchSessionCache | None = None
    #: The ACL authorizer (loglake.broker.authorizer), set by the server; None allows everything.
    authorizer: Authorizer | None = None
    #: Client quota configs and rates (loglake.broker.quotas), set by the server.
    quotas: QuotaManager | None = None
    #: controller_mutation_rate token buckets (loglake.broker.mutation_quota), set by the server.
    mutation_quotas: MutationQuotas | None = None
    #: Cluster mode's view of the cluster (loglake.cluster.leadership.Leadership: live brokers,
    #: partition leaders, group coordinators), set by the server; None on a single-node broker.
    cluster: Any = None
    #: Cluster mode: the fenced group store of the current coordinator (loglake.broker.cluster_groups)
    #: and what reloads the coordinator (loglake.broker.cluster.CoordinatorReloader); None otherwise.
    group_fence: Any = None
    group_reloader: Any = None
    executor: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="loglake-io")
    )

    @property
    def node_id(self) -> int:
        return self.config.node_id

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking engine work (topic admin, waits for memory) off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)


def advertised_endpoint(ctx: BrokerContext, conn: Any) -> tuple[str, int]:
    """The (host, port) to answer a request with: that of the listener the connection came in on
    (Kafka answers Metadata with the endpoint of the request's listener), else the first one."""
    security = getattr(conn, "security", None)
    if security is not None:
        host, port = security.advertised
        return str(host), int(port)
    return ctx.advertised_host, ctx.advertised_port
