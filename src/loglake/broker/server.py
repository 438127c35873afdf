"""The broker process: listeners, the context every handler gets, start-up and shutdown.

`BrokerServer(config, engine)` serves an engine it is given (a single node's, or cluster mode's
over etcd and the bucket: the caller composes it, loglake.cli.serve; tests run it in-process).
`start` opens the engine, binds the listeners, joins the cluster view with the advertised ones,
builds what the handlers share (`loglake.broker.context.build_context`: group and transaction
coordinators, authorizer, quotas, fetch sessions), and only then serves the listeners (a client
that connects before waits in the accept backlog), one asyncio server each; every accepted socket becomes
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
from collections.abc import Callable, Coroutine

from loglake.broker import overload
from loglake.broker.config import BrokerConfig, parse_host_port, parse_registry_listen
from loglake.broker.connection import Connection
from loglake.broker.context import BrokerContext, CoordinatorStores, build_context
from loglake.broker.gcstats import GcStats, freeze_startup_objects
from loglake.broker.groups import MetaGroupLog, MetaGroupStore
from loglake.broker.http import HttpServer
from loglake.broker.listeners import (
    PLAINTEXT,
    WILDCARD_HOSTS,
    Listener,
    canonical_host_name,
    is_loopback,
    match_advertised,
)
from loglake.broker.metrics import Metrics, serve_metrics
from loglake.broker.off_loop import OffLoop
from loglake.broker.receive import FrameReceiver
from loglake.broker.security.tls import (
    PrincipalMapper,
    SecurityContext,
    handshake_or_close,
    server_context,
)
from loglake.broker.security.users_inbox import serve_inbox
from loglake.engine import Engine
from loglake.errors import ListenError
from loglake.logsafe import RateLimitedLog, flush_all

log = logging.getLogger("loglake.broker")

#: Bytes read from a socket per call (loglake.broker.overload counts it into CONNECTION_BYTES).
READ_CHUNK_BYTES = overload.READ_CHUNK_BYTES
#: How long shutdown waits for in-flight requests before closing connections anyway.
SHUTDOWN_GRACE_S = 10.0
#: How often rate-limited log lines whose window is over get their summary written.
LOG_FLUSH_INTERVAL_S = 1.0


class BrokerServer:
    def __init__(self, config: BrokerConfig, engine: Engine, stores: CoordinatorStores | None = None) -> None:
        """`engine`: not open yet (`start` opens it, so health endpoints answer during recovery).
        `stores`: how the group and transaction coordinators keep their state (cluster mode:
        fenced in etcd); by default the engine's metadata store's records."""
        config.validate()
        self.config = config
        self._engine = engine
        self._group_stores = stores.groups if stores else (lambda _on_lost: MetaGroupStore(MetaGroupLog(engine.meta)))
        self._txn_backend = stores.txns if stores else None
        self._share_store = stores.shares if stores else None
        self.engine: Engine | None = None  # once open
        self._ctx: BrokerContext | None = None  # once started
        #: The thread pool for blocking work (`ctx.off_loop`); shut down last.
        self._off_loop: OffLoop | None = None
        self._servers: list[asyncio.Server] = []
        self._metrics_server: HttpServer | None = None
        self._registry_server: HttpServer | None = None
        self._connections: set[Connection] = set()
        self._log_flusher: asyncio.Task[None] | None = None
        self._users_inbox: asyncio.Task[None] | None = None
        self.metrics = Metrics()
        #: Request bytes read and not yet handled, all connections (queued_max_request_bytes).
        self.request_bytes = self.metrics.request_bytes = overload.RequestBytes(config.queued_max_request_bytes, config.max_frame_bytes)
        self.metrics.rss_budget = lambda: overload.rss_budget(self.config, engine.memory_pool.budget_bytes).total
        self.metrics.send_buffered = lambda: sum(c.send_buffered for c in self._connections)
        #: Warnings a client can repeat at will, keyed by condition and peer address.
        self.limited = RateLimitedLog(log, config.log_rate_limit_ms / 1000.0)
        self.host = ""
        self.port = 0
        #: the schema registry's bound port (--schema-registry-listen with port 0 picks one), 0 when off
        self.registry_port = 0
        #: Each listener as bound (its real port) with the (host, port) it advertises, in listener order.
        self.endpoints: list[tuple[Listener, tuple[str, int]]] = []
        self._tls: ssl.SSLContext | None = None
        self._principals = PrincipalMapper(config.ssl_principal_mapping_rules)

    @property
    def ctx(self) -> BrokerContext:
        """What the handlers share; built by `start` (RuntimeError before)."""
        if self._ctx is None:
            raise RuntimeError("the broker is not started")
        return self._ctx

    def _render_metrics(self) -> str:
        """/metrics: the engine's families once recovery is done."""
        if self.engine is None or not self.metrics.ready:
            return self.metrics.render()
        return self.metrics.render(self.engine, self._ctx.coordinator if self._ctx is not None else None)

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

    def _readyz_blockers(self) -> list[str]:
        """Why /readyz says "not ready" once started: what the engine's parts report (cluster mode:
        etcd or the bucket unreachable, so this broker leads nothing)."""
        engine = self.engine
        return [] if engine is None else engine.telemetry.not_ready()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        listeners = self.config.listeners()
        registry_https = bool(self.config.schema_registry_listen) and parse_registry_listen(str(self.config.schema_registry_listen))[0]
        if any(lst.tls for lst in listeners) or registry_https:
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
                    mhost, mport, self._render_metrics, lambda: self.metrics.ready, self._readyz_notes,
                    self._readyz_blockers,
                )
            except OSError as exc:
                raise ListenError("--metrics-listen", self.config.metrics_listen, exc) from exc
        report = await loop.run_in_executor(None, engine.open)
        self.engine = engine
        del report  # the engine logs its own recovery summary
        bound: list[Listener] = []
        for lst in listeners:
            try:
                server = await loop.create_server(
                    functools.partial(self._receiver, functools.partial(self._on_connection, listener=lst)),
                    lst.host, lst.port,
                    start_serving=False,  # once the context is built (a client waits in the accept backlog)
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
        # take part in the cluster with the advertised listeners (a single node: nothing to register)
        await loop.run_in_executor(None, engine.join, [lst.url(*adv) for lst, adv in self.endpoints])
        self._off_loop = OffLoop()
        self._ctx = ctx = await build_context(
            self.config, engine, self.metrics, self.endpoints, off_loop=self._off_loop, group_stores=self._group_stores,
            txn_backend=self._txn_backend, share_store=self._share_store,
        )
        if self.config.schema_registry_listen:
            await self._serve_registry(ctx, self.config.schema_registry_listen)
        for server in self._servers:
            await server.start_serving()
        self._log_flusher = asyncio.create_task(self._flush_logs())
        # `loglake users` while we run
        self._users_inbox = asyncio.create_task(serve_inbox(ctx.scram_store, self.config.data_dir, ctx.off_loop))
        self.metrics.ready = True
        if self.config.port_file:
            tmp = f"{self.config.port_file}.tmp"
            with open(tmp, "w") as fh:
                fh.write("".join(f"{lst.port}\n" for lst, _ in self.endpoints))
            os.replace(tmp, self.config.port_file)

    async def _serve_registry(self, ctx: BrokerContext, listen: str) -> None:
        """The schema registry (after the context: it asks the broker's credentials and authorizer)."""
        from loglake.broker.schema_registry import serve_schema_registry
        from loglake.broker.security.registry_auth import RegistryAuth

        https, rhost, rport = parse_registry_listen(listen)
        auth = RegistryAuth(self.config, ctx.sasl, ctx.authorizer, self.limited)
        if not auth.required and not is_loopback(rhost):
            log.warning("--schema-registry-listen %s: no Kafka listener authenticates clients, so the registry asks "
                        "for no credentials, and it is reachable beyond this machine", listen)
        try:
            self._registry_server = await serve_schema_registry(rhost, rport, ctx.engine, auth, self._tls if https else None)
        except OSError as exc:
            raise ListenError("--schema-registry-listen", listen, exc) from exc
        self.registry_port = self._registry_server.port

    async def _flush_logs(self) -> None:
        """Write the summaries of rate-limited warnings once their window is over."""
        while True:
            await asyncio.sleep(LOG_FLUSH_INTERVAL_S)
            flush_all()

    def _receiver(self, on_connected: Callable[[FrameReceiver], Coroutine[object, object, None]]) -> FrameReceiver:
        return FrameReceiver(self.request_bytes.connection(), self.metrics, on_connected)

    async def _on_connection(self, receiver: FrameReceiver, listener: Listener) -> None:
        transport = receiver.transport
        assert transport is not None
        if len(self._connections) >= self.config.max_connections:
            self.metrics.connections_rejected += 1
            self.limited.warning("max_connections", "refusing connection: %d connections open (max_connections)", len(self._connections))
            receiver.held.close()
            transport.close()
            return
        advertised = next((adv for lst, adv in self.endpoints if lst.protocol == listener.protocol), (listener.host, listener.port))
        bound = next((lst for lst, _ in self.endpoints if lst.protocol == listener.protocol), listener)
        security = SecurityContext(bound, advertised)
        if listener.tls:
            try:
                assert self._tls is not None
                if not await handshake_or_close(
                    receiver, self._tls, security, self._principals, self.metrics.protocol_errors, self.limited
                ):
                    receiver.held.close()
                    return
            except asyncio.CancelledError:  # shutdown during the handshake: see below
                receiver.held.close()
                if receiver.transport is not None:
                    receiver.transport.abort()
                return
        assert receiver.transport is not None
        writer = asyncio.StreamWriter(receiver.transport, receiver, None, asyncio.get_running_loop())
        conn = Connection(self, receiver, writer, security)
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
        if self._ctx is not None:
            self._ctx.groups.close()
            self._ctx.txn.close()
        if self._metrics_server is not None:
            self._metrics_server.close()
        if self._registry_server is not None:
            self._registry_server.close()
        if self.engine is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.engine.close)
        if self._off_loop is not None:
            self._off_loop.shutdown()
        if self._log_flusher is not None:
            self._log_flusher.cancel()
        flush_all(force=True)
        log.info("shutdown complete")


def run_server(
    config: BrokerConfig,
    engine: Engine,
    stores: CoordinatorStores | None = None,
    on_listening: Callable[[Listener, tuple[str, int]], None] | None = None,
) -> int:
    """Run the broker over `engine` until SIGTERM/SIGINT; returns the process exit code."""
    import signal

    if config.event_loop == "uvloop":  # validate() checked that it is installed
        import uvloop

        uvloop.install()
    log.info("event loop: %s", config.event_loop)

    async def main() -> int:
        server = BrokerServer(config, engine, stores)
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
