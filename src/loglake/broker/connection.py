"""One client connection: the asyncio shell around the sans-IO protocol codec.

Theory of operation
-------------------
One `Connection` per client socket. The socket's protocol is a `FrameReceiver`
(`loglake.broker.receive`): the transport receives into its buffers, it frames in place (the
frame-size limit checked on the 4-byte prefix alone) and hands the read loop memoryviews of the
frames; the read loop decodes each and starts a handler task for it at once, in arrival order. Requests in flight are bounded per connection, so
a client that pipelines without reading stops being read: `max_inflight_per_connection` of them
other than Produce, `overload.PRODUCE_INFLIGHT_PER_CONNECTION` Produce requests (whose answers are
no larger than they are; they wait for durability, a cluster's object flush, in flight), and each
is charged `overload.REQUEST_OVERHEAD_BYTES` on top of its bytes. Request bytes read and not yet
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
connection is accepted as TCP and upgraded with `loop.start_tls` (the same `FrameReceiver`
over the TLS transport) before the first Kafka byte is read, so a failed handshake (plaintext sent to the TLS port, an untrusted or expired
client certificate, TLS 1.1, a truncated or stalled handshake) is one rate-limited log line and a
closed socket. Every connection carries a `SecurityContext` (`loglake.broker.security.tls`): its listener,
what that listener advertises (Metadata answers with it), and its principal. Fetch data goes out
with sendfile on PLAINTEXT; TLS has to encrypt in user space, so there it is read and written in
buffered chunks (`loglake.broker.file_send`). On a SASL listener a connection carries a
`SaslSession` (`conn.sasl`, loglake.broker.security.sasl) that admits only the SASL APIs, with smaller
frames, until it authenticates; `close_after_write` closes a connection once a refusal has been
sent.

Client quotas (`loglake.broker.security.quotas`): a response over a quota carries `throttle_time_ms` and
sets `muted_until`; the read loop neither reads nor hands frames to handlers before it (KIP-219).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from loglake.broker import overload
from loglake.broker.context import BrokerContext
from loglake.broker.file_send import send_file_range
from loglake.broker.handlers import ADVERTISED, HANDLERS, api_name
from loglake.broker.metrics import response_error
from loglake.broker.off_loop import OffLoop
from loglake.broker.protocol import (
    FRAME_PREFIX_BYTES,
    ApiKey,
    DecodedRequest,
    FrameTooLargeError,
    MalformedRequestError,
    OutBuffer,
    ProtocolError,
    UnknownApiError,
    UnsupportedVersionError,
    encode_response,
    encode_unsupported_api_versions,
)
from loglake.broker.receive import FrameReceiver, ReceiveTimeout
from loglake.broker.security.authorized import CURRENT_API
from loglake.broker.security.quotas import handle_request, wait_unmuted
from loglake.broker.security.sasl import SASL_MAX_RECEIVE_BYTES, SaslSession
from loglake.broker.security.tls import SecurityContext
from loglake.broker.sniff import foreign_protocol, prefix_bytes
from loglake.engine.types import FileRange
from loglake.errors import EngineClosedError
from loglake.kafka_errors import ErrorCode
from loglake.logsafe import RateLimitedLog

log = logging.getLogger("loglake.broker")

#: Bytes read from a socket per call (loglake.broker.overload counts it into CONNECTION_BYTES).
READ_CHUNK_BYTES = overload.READ_CHUNK_BYTES
SEND_CHUNK_BYTES = overload.SEND_CHUNK_BYTES


class ConnectionServer(Protocol):
    """What a connection uses of the server that accepted it: `loglake.broker.server.BrokerServer`,
    which imports this module."""

    @property
    def ctx(self) -> BrokerContext: ...
    @property
    def request_bytes(self) -> overload.RequestBytes: ...
    @property
    def limited(self) -> RateLimitedLog: ...


class Connection:
    def __init__(
        self,
        server: ConnectionServer,
        receiver: FrameReceiver,
        writer: asyncio.StreamWriter,
        security: SecurityContext | None = None,
    ) -> None:
        self.server = server
        self.ctx = server.ctx
        self.limited = server.limited
        #: The socket's protocol: frames in (loglake.broker.receive), flow control for `writer`.
        self.receiver = receiver
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        #: The peer without its port: what rate-limited warnings are keyed by (reconnects share it).
        self.peer_host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        #: Listener, advertised endpoint and principal of this connection (ACLs and quotas key on it).
        self.security = security or SecurityContext.plaintext(server.ctx.advertised_host, server.ctx.advertised_port)
        self.security.peer_host = self.peer_host
        self.append_lock = asyncio.Lock()
        #: Request bytes read and not yet answered (each frame's with its size prefix), in the
        #: shared bound (overload.RequestBytes); released as requests are answered.
        self.request_bytes = receiver.held
        # Bounded by the two semaphores: each queued request holds one of them (`_Item.slots`).
        self._queue: asyncio.Queue[_Item | None] = asyncio.Queue()
        self._others = asyncio.Semaphore(self.ctx.config.max_inflight_per_connection)
        self._produces = asyncio.Semaphore(overload.PRODUCE_INFLIGHT_PER_CONNECTION)
        self.busy = 0  # requests being handled (shutdown waits for these)
        self.closing = False
        #: SASL state on SASL listeners (loglake.broker.security.sasl); seconds to wait after the next response, then close.
        self.sasl = SaslSession(self) if self.security.listener.sasl else None
        self.close_after_write: float | None = None
        #: Nothing is read or handled before this (time.monotonic): a quota's throttle (KIP-219).
        self.muted_until = 0.0
        #: Where the frame limit is applied (the SASL session lowers it until authenticated).
        self.decoder = receiver
        receiver.max_frame_bytes = self.ctx.config.max_frame_bytes
        receiver.timeouts = self._timeouts
        if self.sasl is not None:  # until authenticated (the session lifts it)
            receiver.max_frame_bytes = min(SASL_MAX_RECEIVE_BYTES, receiver.max_frame_bytes)

    def _timeouts(self) -> tuple[float, float]:
        config = self.ctx.config  # connections.max.idle.ms is dynamic
        return config.idle_timeout_ms / 1000.0, config.frame_receive_timeout_ms / 1000.0

    @property
    def protocol_errors(self) -> dict[str, int]:
        """Connections closed for a protocol error, by kind (the broker's metrics)."""
        return self.ctx.metrics.protocol_errors

    @property
    def max_frame_bytes(self) -> int:
        """The frame limit after SASL authentication (max_frame_bytes is dynamic: read when it applies)."""
        return self.ctx.config.max_frame_bytes

    @property
    def send_buffered(self) -> int:
        """Response bytes in this connection's transport, not yet taken by the socket."""
        transport = self.writer.transport
        return 0 if transport.is_closing() else transport.get_write_buffer_size()

    @property
    def off_loop(self) -> OffLoop:
        return self.ctx.off_loop

    async def run(self) -> None:
        writer_task = asyncio.create_task(self._write_loop())
        receiver = self.receiver
        quotas = self.ctx.quotas

        async def unmuted() -> None:
            await wait_unmuted(self, quotas)

        try:
            while not self.closing:
                try:
                    frame = await receiver.next_frame(unmuted)
                except FrameTooLargeError as exc:
                    self._protocol_error("frame_too_large", exc)
                    break
                except ReceiveTimeout as timeout:
                    if timeout.frame:
                        self._frame_timed_out(int(timeout.seconds * 1000))
                    else:
                        log.info("closing %s: idle for %.0f s", self.peer, timeout.seconds)
                    break
                if frame is None:
                    break
                await wait_unmuted(self, quotas)  # pipelined requests wait out a quota throttle, as in Kafka
                if not await self._dispatch(frame):
                    break
                frame = None  # the receive block is reused in place once no frame of it is referenced
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if self.sasl is not None:
                self.sasl.close()
            await self._queue.put(None)
            try:
                await writer_task
            finally:
                self._drain_queue()  # whatever the reader queued after the writer stopped
                self.request_bytes.close()
                self._close_transport()

    def _frame_timed_out(self, timeout_ms: int) -> None:
        self.ctx.metrics.protocol_errors["frame_timeout"] += 1
        d = self.receiver
        self.limited.warning(
            ("frame_timeout", self.peer_host),
            "closing %s: a request of %d bytes had not arrived %d ms after its first byte (%d bytes came); "
            "a stalled or very slow client (frame_receive_timeout_ms)",
            self.peer, d.buffered + d.frame_left - 4, timeout_ms, max(d.buffered - 4, 0),
        )

    async def _dispatch(self, frame: bytes | bytearray | memoryview) -> bool:
        """Decode one frame and queue its handling; False when the connection must close."""
        try:
            req = decode_request(frame)
        except UnsupportedVersionError as exc:
            if exc.api_key == ApiKey.API_VERSIONS:
                # KIP-511: answer with a v0 body listing what we support; the client retries.
                done: asyncio.Future[list[OutBuffer] | None] = asyncio.get_running_loop().create_future()
                done.set_result([encode_unsupported_api_versions(exc.correlation_id, ADVERTISED)])
                await self._queue_item(None, done, len(frame))
                return True
            self._protocol_error("unsupported_version", exc)
            return False
        except (UnknownApiError, MalformedRequestError, ProtocolError) as exc:
            self._protocol_error(type(exc).__name__, exc)
            return False
        if self.sasl is not None and self.sasl.refuse_request(req.api_key, api_name(req.api_key), self.ctx.sasl.clock()):
            return False
        slots = self._produces if req.api_key == ApiKey.PRODUCE else self._others
        await slots.acquire()  # before the handler starts: what is bounded is work, not queue places
        self._put(_Item(req, asyncio.ensure_future(self._handle(req)), len(frame), slots))
        return True

    async def _queue_item(
        self, req: DecodedRequest | None, task: asyncio.Future[list[OutBuffer] | None], frame_bytes: int
    ) -> None:
        await self._others.acquire()
        self._put(_Item(req, task, frame_bytes, self._others))

    def _put(self, item: _Item) -> None:
        self.request_bytes.add(overload.REQUEST_OVERHEAD_BYTES)
        self._queue.put_nowait(item)

    async def _handle(self, req: DecodedRequest) -> list[OutBuffer] | None:
        handler = HANDLERS.get(req.api_key)
        name = api_name(req.api_key)
        CURRENT_API.set(name)  # this request's task only: the audit log names the API
        started = time.perf_counter()
        self.busy += 1
        error = int(ErrorCode.UNKNOWN_SERVER_ERROR)  # unless the handler's answer is made
        try:
            if handler is None:  # advertised nowhere, so a client should not send it
                raise UnknownApiError(req.api_key, req.correlation_id)
            response = await handle_request(self.ctx.quotas, self, req, handler(self.ctx, self, req))  # the request quota
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
            req, task = item.req, item.task
            try:
                buffers = await task
            except Exception as exc:
                what = f"{api_name(req.api_key)} v{req.api_version}" if req else "request"
                if isinstance(exc, EngineClosedError):  # the broker is stopping under this request
                    log.info("closing %s: %s not answered, the broker is stopping", self.peer, what)
                else:
                    log.exception("closing %s: handling %s failed: %s", self.peer, what, exc)
                self.closing = True
                self._drain_queue()
                return
            finally:
                # The request is handled: its frame is released (the response is the writer's,
                # one at a time per connection), so a client that does not read its responses
                # holds no more than its bounds of requests in flight.
                item.done(self.request_bytes)
            if not buffers:
                continue
            try:
                for buf in buffers:
                    if isinstance(buf, FileRange):
                        await send_file_range(self, buf)
                        self.ctx.metrics.bytes_out += buf.length
                    elif isinstance(buf, bytes | bytearray | memoryview):
                        await self._send(buf)
                        self.ctx.metrics.bytes_out += len(buf)
                    else:  # a file range the engine did not make: nothing opens it
                        raise TypeError(f"cannot send a {type(buf).__name__}")
                await self.writer.drain()
                if self.close_after_write is not None:  # a refused SASL handshake or authentication
                    await asyncio.sleep(self.close_after_write)
                    self.closing = True
                    self._close_transport()
                    return
            except (ConnectionError, OSError) as exc:
                self.limited.info(("write_failed", self.peer_host), "closing %s: write failed: %s", self.peer, exc)
                self.closing = True
                self._drain_queue()
                return

    async def _send(self, data: bytes | bytearray | memoryview) -> None:
        """Hand `data` to the transport SEND_CHUNK_BYTES at a time, each drained before the next:
        the transport copies what the socket does not take at once (Python 3.11), so a client that
        does not read holds one piece's copy, not the response's."""
        if len(data) <= SEND_CHUNK_BYTES:
            self._write(data)
            return
        view = memoryview(data).cast("B")
        for start in range(0, len(view), SEND_CHUNK_BYTES):
            self._write(view[start : start + SEND_CHUNK_BYTES])
            await self.writer.drain()

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        # A closed TLS transport (shutdown closed it while a response was on its way) fails writes
        # with AttributeError in Python 3.11's sslproto rather than a ConnectionError: say it as one.
        if self.writer.transport.is_closing():
            raise ConnectionResetError("connection closed")
        self.writer.write(data)

    def _drain_queue(self) -> None:
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is not None:
                item.task.cancel()
                item.done(self.request_bytes)

    def _protocol_error(self, kind: str, exc: BaseException) -> None:
        self.ctx.metrics.protocol_errors[kind] += 1
        limited = self.limited
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


class _Item:
    """A request in flight: its handling, the request bytes it holds (frame, size prefix,
    REQUEST_OVERHEAD_BYTES) and the in-flight slot it took."""

    __slots__ = ("req", "size", "slots", "task")

    def __init__(
        self,
        req: DecodedRequest | None,
        task: asyncio.Future[list[OutBuffer] | None],
        frame_bytes: int,
        slots: asyncio.Semaphore,
    ) -> None:
        self.req = req
        self.task = task
        self.size = FRAME_PREFIX_BYTES + frame_bytes + overload.REQUEST_OVERHEAD_BYTES
        self.slots = slots

    def done(self, held: overload.ConnectionBytes) -> None:
        """Answered or dropped: its bytes and its slot are free."""
        held.add(-self.size)
        self.slots.release()


def decode_request(frame: bytes | bytearray | memoryview) -> DecodedRequest:
    from loglake.broker.protocol import decode_request as decode

    return decode(frame, ADVERTISED)
