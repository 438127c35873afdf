"""The asyncio shell around the sans-IO protocol codec.

Theory of operation
-------------------
One `Connection` per client socket. Its read loop feeds bytes to a `FrameDecoder` (which
enforces the frame-size limit from the 4-byte prefix alone), decodes each frame and starts a
handler task for it at once; the task goes into a bounded queue (`max_inflight_per_connection`,
so a client that pipelines without reading stops being read). Request bytes read and not yet
handled are bounded across all connections (`queued_max_request_bytes`, `overload.RequestBytes`):
while that is spent no connection starts reading a new frame, and one in the middle of a frame
first reserves the frame's whole declared size, as Kafka's queued.max.request.bytes pool does.
A writer loop takes tasks from the queue in arrival order and writes each response when its task
is done — requests are answered in order while their work (fsync waits, long-poll fetches) overlaps.

Produce requests of one connection append in arrival order: the produce handler takes the
connection's `append_lock` while it hands batches to the engine and releases it before waiting
for durability.

Anything a client sends that cannot be answered (a frame over the limit, garbage, an unknown API
key, an unsupported version of anything but ApiVersions) closes that connection with a log line
that says why; the broker and every other connection go on. Those lines are rate-limited per
condition and peer address (`loglake.logsafe`): a client that reconnects and sends the same thing
again is logged once, then summarised ("... 234 more in the last 30 s").

Listeners (`loglake.broker.listeners`): one asyncio server per listener. On an SSL listener the
connection is accepted as TCP and upgraded with `StreamWriter.start_tls` before the first Kafka
byte is read, so a failed handshake (plaintext sent to the TLS port, an untrusted or expired
client certificate, TLS 1.1, a truncated or stalled handshake) is one rate-limited log line and a
closed socket. Every connection carries a `SecurityContext` (`loglake.broker.tls`): its listener,
what that listener advertises (Metadata answers with it), and its principal. Fetch data goes out
with sendfile on PLAINTEXT; TLS has to encrypt in user space, so there it is read and written in
buffered chunks (`loglake.broker.file_send`). On a SASL listener a connection carries a
`SaslSession` (`conn.sasl`, loglake.broker.sasl) that admits only the SASL APIs, with smaller
frames, until it authenticates; `close_after_write` closes a connection once a refusal has been
sent.

Client quotas (`loglake.broker.quotas`): a response over a quota carries `throttle_time_ms` and
sets `muted_until`; the read loop neither reads nor hands frames to handlers before it (KIP-219).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

from loglake.broker import cluster, overload
from loglake.broker.authorized import CURRENT_API
from loglake.broker.authorizer import broker_authorizer
from loglake.broker.config import BrokerConfig, parse_host_port
from loglake.broker.context import BrokerContext
from loglake.broker.dynamic_config import BrokerConfigs
from loglake.broker.fetch_sessions import FetchSessionCache
from loglake.broker.file_send import send_file_range
from loglake.broker.group_configs import GroupConfigStore, group_config_bounds
from loglake.broker.handlers import ADVERTISED, HANDLERS, api_name
from loglake.broker.listeners import (
    PLAINTEXT,
    WILDCARD_HOSTS,
    Listener,
    canonical_host_name,
    is_loopback,
    match_advertised,
)
from loglake.broker.metrics import Metrics, response_error, serve_metrics
from loglake.broker.protocol import (
    DecodedRequest,
    FrameDecoder,
    FrameTooLargeError,
    MalformedRequestError,
    ProtocolError,
    UnknownApiError,
    UnsupportedVersionError,
    encode_response,
    encode_unsupported_api_versions,
)
from loglake.broker.quotas import QuotaManager, handle_request, wait_unmuted
from loglake.broker.sasl import SASL_MAX_RECEIVE_BYTES, SaslAuthenticator, SaslSession
from loglake.broker.sniff import foreign_protocol, prefix_bytes
from loglake.broker.tls import PrincipalMapper, SecurityContext, handshake_or_close, server_context
from loglake.broker.txn import TxnCoordinator, TxnSettings
from loglake.broker.users_inbox import serve_inbox
from loglake.engine import Engine
from loglake.engine.types import FileRange
from loglake.errors import ListenError, UnknownTopicError
from loglake.kafka_errors import ErrorCode
from loglake.logsafe import RateLimitedLog, flush_all

log = logging.getLogger("loglake.broker")

#: Bytes read from a socket per call (loglake.broker.overload counts it into CONNECTION_BYTES).
READ_CHUNK_BYTES = overload.READ_CHUNK_BYTES
#: How long shutdown waits for in-flight requests before closing connections anyway.
SHUTDOWN_GRACE_S = 10.0
#: How often rate-limited log lines whose window is over get their summary written.
LOG_FLUSH_INTERVAL_S = 1.0
API_VERSIONS = 18

Handler = Callable[[BrokerContext, "Connection", DecodedRequest], Awaitable[Any]]


class Connection:
    def __init__(
        self,
        server: BrokerServer,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        security: SecurityContext | None = None,
    ) -> None:
        self.server = server
        self.ctx = server.ctx
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        #: The peer without its port: what rate-limited warnings are keyed by (reconnects share it).
        self.peer_host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        #: Listener, advertised endpoint and principal of this connection (ACLs and quotas key on it).
        self.security = security or SecurityContext.plaintext(server.ctx.advertised_host, server.ctx.advertised_port)
        self.security.peer_host = self.peer_host
        self.append_lock = asyncio.Lock()
        self._queue: asyncio.Queue[tuple[DecodedRequest | None, asyncio.Future[Any], int] | None] = asyncio.Queue(
            self.ctx.config.max_inflight_per_connection
        )
        self.busy = 0  # requests being handled (shutdown waits for these)
        self.closing = False
        #: SASL state on SASL listeners (loglake.broker.sasl); seconds to wait after the next response, then close.
        self.sasl = SaslSession(self) if self.security.listener.sasl else None
        self.close_after_write: float | None = None
        #: Nothing is read or handled before this (time.monotonic): a quota's throttle (KIP-219).
        self.muted_until = 0.0

    async def run(self) -> None:
        writer_task = asyncio.create_task(self._write_loop())
        decoder = self.decoder = FrameDecoder(self.ctx.config.max_frame_bytes)
        if self.sasl is not None:  # until authenticated (the session lifts it)
            decoder.max_frame_bytes = min(SASL_MAX_RECEIVE_BYTES, decoder.max_frame_bytes)
        gate = self.server.request_bytes
        partial = 0  # bytes of the frame in progress counted in `gate` (its declared size once reserved)
        try:
            while not self.closing:
                if decoder.buffered == 0:
                    await gate.wait_for_room()
                else:
                    whole = decoder.buffered + decoder.bytes_needed()
                    if partial < whole:  # reserve the rest of the frame before reading it
                        await gate.wait_for_room()
                        gate.add(whole - partial)
                        partial = whole
                await wait_unmuted(self)
                idle_s = self.ctx.config.idle_timeout_ms / 1000.0  # connections.max.idle.ms is dynamic
                try:
                    data = await asyncio.wait_for(self.reader.read(READ_CHUNK_BYTES), idle_s)
                except TimeoutError:
                    log.info("closing %s: idle for %.0f s", self.peer, idle_s)
                    break
                if not data:
                    break
                self.ctx.metrics.bytes_in += len(data)
                if decoder.buffered == 0 and gate.full:
                    # It passed the gate before this arrived: hold the chunk (CONNECTION_BYTES
                    # counts it) undecoded until there is room, and read nothing more meanwhile.
                    await gate.wait_for_room()
                try:
                    frames = decoder.feed(data)
                except FrameTooLargeError as exc:
                    self._protocol_error("frame_too_large", exc)
                    break
                # A completed frame's bytes are counted by _dispatch; the next one's as they arrive.
                if frames or decoder.buffered > partial:
                    gate.add(decoder.buffered - partial)
                    partial = decoder.buffered
                stop = False
                for frame in frames:
                    await wait_unmuted(self)  # pipelined requests wait out a quota throttle, as in Kafka
                    if not await self._dispatch(frame):
                        stop = True
                        break
                if stop:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if self.sasl is not None:
                self.sasl.close()
            gate.add(-partial)
            await self._queue.put(None)
            try:
                await writer_task
            finally:
                self._drain_queue()  # whatever the reader queued after the writer stopped
                self._close_transport()

    async def _dispatch(self, frame: bytes | bytearray | memoryview) -> bool:
        """Decode one frame and queue its handling; False when the connection must close."""
        try:
            req = decode_request(frame)
        except UnsupportedVersionError as exc:
            if exc.api_key == API_VERSIONS:
                # KIP-511: answer with a v0 body listing what we support; the client retries.
                done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                done.set_result([encode_unsupported_api_versions(exc.correlation_id, ADVERTISED)])
                self.server.request_bytes.add(len(frame))
                await self._queue.put((None, done, len(frame)))
                return True
            self._protocol_error("unsupported_version", exc)
            return False
        except (UnknownApiError, MalformedRequestError, ProtocolError) as exc:
            self._protocol_error(type(exc).__name__, exc)
            return False
        if self.sasl is not None and self.sasl.refuse_request(req.api_key, api_name(req.api_key)):
            return False
        task = asyncio.ensure_future(self._handle(req))
        self.server.request_bytes.add(len(frame))
        await self._queue.put((req, task, len(frame)))
        return True

    async def _handle(self, req: DecodedRequest) -> list[Any] | None:
        handler = HANDLERS.get(req.api_key)
        name = api_name(req.api_key)
        CURRENT_API.set(name)  # this request's task only: the audit log names the API
        started = time.perf_counter()
        self.busy += 1
        error = int(ErrorCode.UNKNOWN_SERVER_ERROR)  # unless the handler's answer is made
        try:
            if handler is None:  # advertised nowhere, so a client should not send it
                raise UnknownApiError(req.api_key, req.correlation_id)
            response = await handle_request(handler, self.ctx, self, req)  # the request quota
            if response is None or not req.expects_response:
                error = 0 if response is None else response_error(response)
                return None
            encoded = encode_response(req, response)
            error = response_error(response)  # the first error it answers with (metrics' error label)
            return encoded
        except asyncio.CancelledError:
            error = 0  # the connection went away before the answer: no error of the request's
            raise
        finally:
            self.busy -= 1
            self.ctx.metrics.observe(name, time.perf_counter() - started, error)

    async def _write_loop(self) -> None:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            req, task, size = item
            try:
                buffers = await task
            except Exception as exc:
                what = f"{api_name(req.api_key)} v{req.api_version}" if req else "request"
                log.exception("closing %s: handling %s failed: %s", self.peer, what, exc)
                self.closing = True
                self._drain_queue()
                return
            finally:
                # The request is handled: its frame is released (the response is the writer's,
                # one at a time per connection), so a client that does not read its responses
                # holds no more than max_inflight_per_connection of them.
                self.server.request_bytes.add(-size)
            if not buffers:
                continue
            try:
                for buf in buffers:
                    if isinstance(buf, FileRange) or hasattr(buf, "path"):
                        await send_file_range(self, buf)
                        self.ctx.metrics.bytes_out += buf.length
                    else:
                        self._write(buf)
                        self.ctx.metrics.bytes_out += len(buf)
                await self.writer.drain()
                if self.close_after_write is not None:  # a refused SASL handshake or authentication
                    await asyncio.sleep(self.close_after_write)
                    self.closing = True
                    self._close_transport()
                    return
            except (ConnectionError, OSError) as exc:
                self.server.limited.info(("write_failed", self.peer_host), "closing %s: write failed: %s", self.peer, exc)
                self.closing = True
                self._drain_queue()
                return

    def _write(self, data: Any) -> None:
        # A closed TLS transport (shutdown closed it while a response was on its way) fails writes
        # with AttributeError in Python 3.11's sslproto rather than a ConnectionError: say it as one.
        if self.writer.transport.is_closing():
            raise ConnectionResetError("connection closed")
        self.writer.write(data)

    def _drain_queue(self) -> None:
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is not None:
                item[1].cancel()
                self.server.request_bytes.add(-item[2])

    def _protocol_error(self, kind: str, exc: BaseException) -> None:
        self.ctx.metrics.protocol_errors[kind] += 1
        limited = self.server.limited
        if isinstance(exc, FrameTooLargeError):
            hint = foreign_protocol(prefix_bytes(exc.size))
            if hint is not None:
                kind = "http" if "HTTP" in hint else "tls"
                limited.warning((kind, self.peer_host), "closing %s: %s", self.peer, hint)
                return
            if self.sasl is not None and self.sasl.frame_too_large(exc.size):
                return
            if exc.size > exc.limit:
                limited.warning(
                    (kind, self.peer_host),
                    "closing %s: %s: a request over max_frame_bytes (Kafka's socket.request.max.bytes); "
                    "lower the client's message.max.bytes / batch size or raise max_frame_bytes",
                    self.peer, exc,
                )
                return
        limited.warning((kind, self.peer_host), "closing %s: %s", self.peer, exc)

    def _close_transport(self) -> None:
        try:
            self.writer.close()
        except Exception:  # already closed by the peer
            pass


def decode_request(frame: bytes | bytearray | memoryview) -> DecodedRequest:
    from loglake.broker.protocol import decode_request as decode

    return decode(frame, ADVERTISED)


class BrokerServer:
    def __init__(self, config: BrokerConfig) -> None:
        config.validate()
        self.config = config
        self.engine: Engine | None = None
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
        engine = cluster.make_engine(self.config)
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
                    lambda: self.metrics.render(self.engine, getattr(self.ctx, "coordinator", None))
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
        # cluster mode: register with the advertised listeners, lead, move group coordinators
        await cluster.join(self.ctx, [lst.url(*adv) for lst, adv in self.endpoints], lambda: self._make_coordinator(engine))
        self.ctx.sasl = SaslAuthenticator(self.config, engine, self.metrics.sasl)
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
        self.ctx.quotas.load(engine.client_quotas())
        self.metrics.registry.register(self.ctx.quotas)
        self.ctx.group_configs = GroupConfigStore(engine, lambda: group_config_bounds(self.config))
        self.ctx.group_configs.load()
        self.ctx.authorizer = broker_authorizer(self.config, engine)
        self.ctx.coordinator = self._make_coordinator(engine)
        self.ctx.txn = TxnCoordinator(
            engine,
            self.ctx.coordinator,
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

    def _make_coordinator(self, engine: Engine) -> Any:
        try:
            groups: Any = importlib.import_module("loglake.broker.groups")
        except ModuleNotFoundError:
            log.warning("consumer groups are not available in this build")
            return None

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
        store = groups.EngineGroupStore(engine)
        if self.ctx.cluster is not None:  # only the groups this broker coordinates
            store = cluster.owned_groups_only(store, self.ctx.cluster)
        return groups.GroupCoordinator(
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
        coordinator = getattr(getattr(self, "ctx", None), "coordinator", None)
        if coordinator is not None:
            coordinator.close()
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


def run_server(config: BrokerConfig, on_listening: Callable[[Listener, tuple[str, int]], None] | None = None) -> int:
    """Run the broker until SIGTERM/SIGINT; returns the process exit code."""
    import signal

    if config.event_loop == "uvloop":  # validate() checked that it is installed
        import uvloop

        uvloop.install()
    log.info("event loop: %s", config.event_loop)

    async def main() -> int:
        server = BrokerServer(config)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await server.start()
        except BaseException:
            await server.shutdown()  # a half-started broker releases what it took (lock, ports)
            raise
        if on_listening is not None:
            for listener, advertised in server.endpoints:
                on_listening(listener, advertised)
        await stop.wait()
        await server.shutdown()
        return 0

    return asyncio.run(main())
