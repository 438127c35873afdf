"""What every API handler gets: the engine, the group coordinator, the broker's identity and settings."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from loglake.broker.config import BrokerConfig
from loglake.broker.metrics import Metrics
from loglake.broker.security.acl_store import AclStore
from loglake.broker.security.quota_store import QuotaStore
from loglake.broker.security.scram_store import ScramStore
from loglake.engine import Engine
from loglake.engine.view import ClusterView

if TYPE_CHECKING:
    from loglake.broker.dynamic_config import BrokerConfigs
    from loglake.broker.fetch_sessions import FetchSessionCache
    from loglake.broker.group_configs import GroupConfigStore
    from loglake.broker.group_reload import GroupCoordination
    from loglake.broker.groups import GroupCoordinator
    from loglake.broker.security.authorizer import Authorizer
    from loglake.broker.security.mutation_quota import MutationQuotas
    from loglake.broker.security.quotas import QuotaManager

T = TypeVar("T")


@dataclass
class BrokerContext:
    engine: Engine
    config: BrokerConfig
    advertised_host: str
    advertised_port: int
    metrics: Metrics
    #: the group coordinator and its store, replaced when the live set changes (set by the server)
    groups: GroupCoordination | None = None
    #: loglake.broker.txn.TxnCoordinator, set by the server
    txn: Any = None
    #: The broker's settings with their dynamic layers (DescribeConfigs/AlterConfigs on BROKER), set by the server.
    broker_configs: BrokerConfigs | None = None
    #: Per-group config overrides (Kafka's GROUP resource); the coordinator reads `overrides(group_id)`.
    group_configs: GroupConfigStore | None = None
    #: loglake.broker.security.sasl.SaslAuthenticator (mechanisms, credentials), set by the server.
    sasl: Any = None
    #: KIP-227 fetch sessions (None: every fetch is sessionless), set by the server.
    fetch_sessions: FetchSessionCache | None = None
    #: The ACL authorizer (loglake.broker.security.authorizer), set by the server; None allows everything.
    authorizer: Authorizer | None = None
    #: Client quota configs and rates (loglake.broker.security.quotas), set by the server.
    quotas: QuotaManager | None = None
    #: controller_mutation_rate token buckets (loglake.broker.security.mutation_quota), set by the server.
    mutation_quotas: MutationQuotas | None = None
    executor: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="loglake-io")
    )
    #: The broker's facts in the engine's metadata store: ACL bindings, SCRAM credentials, client quotas.
    acl_store: AclStore = field(init=False)
    scram_store: ScramStore = field(init=False)
    quota_store: QuotaStore = field(init=False)

    def __post_init__(self) -> None:
        self.acl_store = AclStore.of(self.engine)
        self.scram_store = ScramStore.of(self.engine)
        self.quota_store = QuotaStore.of(self.engine)

    @property
    def node_id(self) -> int:
        return self.engine.view.node_id

    @property
    def view(self) -> ClusterView:
        """Who is alive, who leads a partition, who coordinates a group (loglake.engine.view)."""
        return self.engine.view

    @property
    def coordinator(self) -> GroupCoordinator | None:
        return self.groups.coordinator if self.groups is not None else None

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
