"""The broker process: listeners, the context every handler gets, start-up and shutdown.

`BrokerServer(config, engine)` serves an engine it is given (a single node's, or cluster mode's
over etcd and the bucket: the caller composes it, loglake.cli.serve; tests run it in-process).
`start` opens the engine, binds the listeners, joins the cluster view with the advertised ones,
builds what the handlers share (`BrokerContext`: group and transaction coordinators, authorizer,
quotas, fetch sessions) and starts one asyncio server per listener; every accepted socket becomes
a `loglake.broker.connection.Connection`, whose docstring tells how requests are read, handled
and answered. The broker never asks which mode it runs in.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import ssl
import time
from collections.abc import Callable

from loglake.broker import overload
from loglake.broker.config import BrokerConfig, parse_host_port
from loglake.broker.config_store import ConfigStore
from loglake.broker.connection import Connection
from loglake.broker.context import BrokerContext
from loglake.broker.dynamic_config import BrokerConfigs
from loglake.broker.fetch_sessions import FetchSessionCache
from loglake.broker.gcstats import GcStats, freeze_startup_objects
from loglake.broker.group_configs import GroupConfigStore, group_config_bounds
from loglake.broker.group_reload import GroupCoordination
from loglake.broker.groups import GroupCoordinator, MetaGroupLog, MetaGroupStore
from loglake.broker.groups.store import GroupStoreFactory, ReloadableGroupStore
from loglake.broker.listeners import (
    PLAINTEXT,
    WILDCARD_HOSTS,
    Listener,
    canonical_host_name,
    is_loopback,
    match_advertised,
)
from loglake.broker.metrics import Metrics, serve_metrics
from loglake.broker.security.authorized import TOPIC
from loglake.broker.security.authorizer import AclOperation, broker_authorizer
from loglake.broker.security.mutation_quota import MutationQuotas
from loglake.broker.security.quotas import QuotaManager
from loglake.broker.security.sasl import SaslAuthenticator
from loglake.broker.security.tls import PrincipalMapper, SecurityContext, handshake_or_close, server_context
from loglake.broker.security.users_inbox import serve_inbox
from loglake.broker.txn import TxnCoordinator, TxnSettings
from loglake.engine import Engine
from loglake.errors import ListenError, UnknownTopicError
from loglake.logsafe import RateLimitedLog, flush_all

log = logging.getLogger("loglake.broker")

#: Bytes read from a socket per call (loglake.broker.overload counts it into CONNECTION_BYTES).
READ_CHUNK_BYTES = overload.READ_CHUNK_BYTES
#: How long shutdown waits for in-flight requests before closing connections anyway.
SHUTDOWN_GRACE_S = 10.0
#: How often rate-limited log lines whose window is over get their summary written.
LOG_FLUSH_INTERVAL_S = 1.0


class BrokerServer:
    def __init__(self, config: BrokerConfig, engine: Engine, group_stores: GroupStoreFactory | None = None) -> None:
        """`engine`: not open yet (`start` opens it, so health endpoints answer during recovery).
        `group_stores`: how a group coordinator's store is made (cluster mode: fenced in etcd);
        by default the engine's metadata store's group records."""
        config.validate()
        self.config = config
        self._engine = engine
        self._group_stores = group_stores or (lambda _on_lost: MetaGroupStore(MetaGroupLog(engine.meta)))
        self.engine: Engine | None = None  # once open
        self.ctx: BrokerContext
        self._servers: list[asyncio.Server] = []
        self._metrics_server: asyncio.Server | None = None
        self._connections: set[Connection] = set()
        self._log_flusher: asyncio.Task[None] | None = None
        self._users_inbox: asyncio.Task[None] | None = None
        self.metrics = Metrics()
        #: Request bytes read and not yet handled, all connections (queued_max_request_bytes).
        self.request_bytes = self.metrics.request_bytes = overload.RequestBytes(config.queued_max_request_bytes)
        self.metrics.rss_budget = lambda: overload.rss_budget(self.config).total
        #: Warnings a client can repeat at will, keyed by condition and peer address.
        self.limited = RateLimitedLog(log, config.log_rate_limit_ms / 1000.0)
        self.host = ""
        self.port = 0
        #: Each listener as bound (its real port) with the (host, port) it advertises, in listener order.
        self.endpoints: list[tuple[Listener, tuple[str, int]]] = []
        self._tls: ssl.SSLContext | None = None
        self._principals = PrincipalMapper(config.ssl_principal_mapping_rules)

    def _readyz_notes(self) -> list[str]:
        """Lines /readyz adds while ready: engine failed, storage full, corrupt segments, segments
        failing reads (none makes it 503: the broker still serves reads)."""
        engine = self.engine
        if engine is None:
            return []
        full = [engine.space.describe()] if engine.space.full else []
        failure = engine.failure
        failed = [] if failure is None else [f"engine failed: {failure}; produce refused until restart, reads served"]
        return failed + full + engine.corruption.readyz_lines() + engine.read_errors.readyz_lines()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        listeners = self.config.listeners()
        if any(lst.tls for lst in listeners):
            # Before anything is opened: a key that cannot be read is a configuration error.
            c = self.config
            self._tls = server_context(c.ssl_cert, c.ssl_key, c.ssl_key_password, c.ssl_ca, c.ssl_client_auth)
        engine = self._engine
        if self.config.metrics_listen:
            # Health endpoints answer during recovery (readyz: 503 until it is done).
            mhost, mport = parse_host_port(self.config.metrics_listen, "--metrics-listen")
            if not is_loopback(mhost):
                log.warning("--metrics-listen %s: /metrics is reachable beyond this machine without authentication "
                            "(it names topics and groups); bind it to 127.0.0.1 unless a scraper elsewhere needs it", self.config.metrics_listen)
            try:
                self._metrics_server = await serve_metrics(
                    mhost,
                    mport,
                    lambda: self.metrics.render(self.engine, self.ctx.coordinator if hasattr(self, "ctx") else None)
                    if self.engine is not None and self.metrics.ready
                    else self.metrics.render(),
                    lambda: self.metrics.ready,
                    self._readyz_notes,
                )
            except OSError as exc:
                raise ListenError("--metrics-listen", self.config.metrics_listen, exc) from exc
        report = await loop.run_in_executor(None, engine.open)
        self.engine = engine
        del report  # the engine logs its own recovery summary
        bound: list[Listener] = []
        for lst in listeners:
            try:
                server = await asyncio.start_server(
                    functools.partial(self._on_connection, listener=lst), lst.host, lst.port, limit=READ_CHUNK_BYTES
                )
            except OSError as exc:
                raise ListenError("--listen", lst.url() if lst.protocol != PLAINTEXT else f"{lst.host}:{lst.port}", exc) from exc
            self._servers.append(server)
            host, port = server.sockets[0].getsockname()[:2]
            bound.append(Listener(lst.protocol, host, port))
        self.host, self.port = bound[0].host, bound[0].port
        for lst, adv in zip(bound, match_advertised(listeners, self.config.advertised_listener), strict=True):
            adv_host, adv_port = adv if adv is not None else (lst.host, lst.port)
            if adv_port == 0:
                adv_port = lst.port
            if adv_host in WILDCARD_HOSTS:
                # As Kafka does: a wildcard is no address to connect to; advertise the canonical host name.
                adv_host = await loop.run_in_executor(None, canonical_host_name)
                log.warning(
                    "listening on %s:%d: every interface is no address a client can connect to; advertising "
                    "%s:%d (this machine's canonical host name) in Metadata; set --advertised-listener "
                    "HOST:PORT if clients cannot reach that name",
                    lst.host, lst.port, adv_host, adv_port,
                )
            self.endpoints.append((lst, (adv_host, adv_port)))
        adv_host, adv_port = self.endpoints[0][1]
        self.ctx = BrokerContext(engine, self.config, adv_host, adv_port, self.metrics)
        # take part in the cluster with the advertised listeners (a single node: nothing to register)
        await loop.run_in_executor(None, engine.join, [lst.url(*adv) for lst, adv in self.endpoints])
        self.ctx.sasl = SaslAuthenticator(self.config, self.ctx.scram_store, self.metrics.sasl)
        self.ctx.fetch_sessions = self.metrics.fetch_sessions = FetchSessionCache.from_config(self.config)
        # Dynamic broker configs stored in the metadata log take effect before the first client.
        self.ctx.broker_configs = BrokerConfigs(
            self.config,
            engine,
            (self.host, self.port, adv_host, adv_port),
            (",".join(lst.url() for lst, _ in self.endpoints), ",".join(lst.url(*adv) for lst, adv in self.endpoints)),
        )
        await loop.run_in_executor(None, self.ctx.broker_configs.load)
        self.ctx.quotas = QuotaManager(self.config.quota_window_num, self.config.quota_window_size_seconds)
        self.ctx.quotas.load(self.ctx.quota_store.quotas())
        self.metrics.registry.register(self.ctx.quotas)
        self.ctx.mutation_quotas = MutationQuotas(self.ctx.quotas)
        self.ctx.group_configs = GroupConfigStore(ConfigStore.of(engine), lambda: group_config_bounds(self.config))
        self.ctx.group_configs.load()
        self.ctx.authorizer = broker_authorizer(self.config, self.ctx.acl_store)
        groups = GroupCoordination(engine.view, self._group_stores, lambda store: self._make_coordinator(engine, store), self.ctx.off_loop)
        self.ctx.groups = groups
        await groups.start()
        self.ctx.txn = TxnCoordinator(
            engine,
            groups.coordinator,
            TxnSettings(
                self.config.transaction_max_timeout_ms,
                self.config.transactional_id_expiration_ms,
                self.config.transaction_abort_timed_out_transaction_cleanup_interval_ms,
                self.config.transactional_ids_max,
            ),
            off_loop=self.ctx.off_loop,
        )
        await self.ctx.txn.start()  # completes transactions a crash left in a prepare state
        self._log_flusher = asyncio.create_task(self._flush_logs())
        self._users_inbox = asyncio.create_task(serve_inbox(self.ctx))  # `loglake users` while we run
        self.metrics.ready = True
        if self.config.port_file:
            tmp = f"{self.config.port_file}.tmp"
            with open(tmp, "w") as fh:
                fh.write("".join(f"{lst.port}\n" for lst, _ in self.endpoints))
            os.replace(tmp, self.config.port_file)

    def _make_coordinator(self, engine: Engine, store: ReloadableGroupStore) -> GroupCoordinator:
        def topic_exists(name: str, partition: int) -> bool:
            try:
                return 0 <= partition < engine.topic(name).partitions
            except UnknownTopicError:
                return False

        def topic_catalog() -> dict[str, tuple[str, int]]:
            return {t.name: (t.topic_id, t.partitions) for t in engine.topics()}

        retention_minutes = self.config.offsets_retention_minutes  # Kafka's offsets.retention.minutes
        group_configs = self.ctx.group_configs
        assert group_configs is not None  # made just before the coordinator
        coordinator = GroupCoordinator(
            store,
            topic_exists=topic_exists,
            initial_rebalance_delay_ms=self.config.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=self.config.group_min_session_timeout_ms,
            max_session_timeout_ms=self.config.group_max_session_timeout_ms,
            offsets_retention_ms=int(retention_minutes) * 60_000,
            consumer_limits=self.config.consumer_group_limits(),
            topic_catalog=topic_catalog,
            group_overrides=group_configs.overrides,
        )
        authz = self.ctx.authorizer
        if authz is not None:
            # KIP-848 regex subscriptions select only the topics the member may DESCRIBE
            coordinator.set_topic_filter(
                lambda principal, host, names: [
                    n for n in names if authz.authorize(principal, host, AclOperation.DESCRIBE, TOPIC, n)
                ],
                lambda: authz.generation,
            )
        return coordinator

    async def _flush_logs(self) -> None:
        """Write the summaries of rate-limited warnings once their window is over."""
        while True:
            await asyncio.sleep(LOG_FLUSH_INTERVAL_S)
            flush_all()

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, listener: Listener) -> None:
        if len(self._connections) >= self.config.max_connections:
            self.metrics.connections_rejected += 1
            self.limited.warning("max_connections", "refusing connection: %d connections open (max_connections)", len(self._connections))
            writer.close()
            return
        advertised = next((adv for lst, adv in self.endpoints if lst.protocol == listener.protocol), (listener.host, listener.port))
        bound = next((lst for lst, _ in self.endpoints if lst.protocol == listener.protocol), listener)
        security = SecurityContext(bound, advertised)
        if listener.tls:
            try:
                assert self._tls is not None
                if not await handshake_or_close(writer, self._tls, security, self._principals, self.metrics, self.limited):
                    return
            except asyncio.CancelledError:  # shutdown during the handshake: see below
                writer.transport.abort()
                return
        conn = Connection(self, reader, writer, security)
        log.debug("connection %s on %s listener: principal %s", conn.peer, listener.name, security.principal)
        self._connections.add(conn)
        self.metrics.connections_open += 1
        self.metrics.connections_total += 1
        try:
            await conn.run()
        except asyncio.CancelledError:
            # asyncio.run cancels connections still open after shutdown(); the stream callback would
            # log the cancellation as an error (Python 3.11) although nothing failed.
            pass
        except Exception:
            log.exception("connection %s failed", conn.peer)
        finally:
            self._connections.discard(conn)
            self.metrics.connections_open -= 1

    async def shutdown(self) -> None:
        """Stop accepting, let in-flight requests finish, then seal, snapshot and release."""
        log.info("shutting down: %d connections open", len(self._connections))
        self.metrics.ready = False
        for server in self._servers:
            server.close()
        if self._users_inbox is not None:
            self._users_inbox.cancel()
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        while any(c.busy for c in self._connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self._connections):
            conn.closing = True
            conn._close_transport()
        groups = getattr(getattr(self, "ctx", None), "groups", None)
        if groups is not None:
            groups.close()
        txn = getattr(getattr(self, "ctx", None), "txn", None)
        if txn is not None:
            txn.close()
        if self._metrics_server is not None:
            self._metrics_server.close()
        if self.engine is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.engine.close)
        if hasattr(self, "ctx"):
            self.ctx.executor.shutdown(wait=False)
        if self._log_flusher is not None:
            self._log_flusher.cancel()
        flush_all(force=True)
        log.info("shutdown complete")


def run_server(
    config: BrokerConfig,
    engine: Engine,
    group_stores: GroupStoreFactory | None = None,
    on_listening: Callable[[Listener, tuple[str, int]], None] | None = None,
) -> int:
    """Run the broker over `engine` until SIGTERM/SIGINT; returns the process exit code."""
    import signal

    if config.event_loop == "uvloop":  # validate() checked that it is installed
        import uvloop

        uvloop.install()
    log.info("event loop: %s", config.event_loop)

    async def main() -> int:
        server = BrokerServer(config, engine, group_stores)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await server.start()
        except BaseException:
            await server.shutdown()  # a half-started broker releases what it took (lock, ports)
            raise
        # this process is the broker's own: tune its collector and show its pauses on /metrics
        server.metrics.gc = GcStats().install()
        freeze_startup_objects()
        if on_listening is not None:
            for listener, advertised in server.endpoints:
                on_listening(listener, advertised)
        await stop.wait()
        await server.shutdown()
        return 0

    return asyncio.run(main())
