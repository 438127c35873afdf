"""Run the real broker on 127.0.0.1 with a random port: `Broker` runs `loglake serve` as a child
process, `InProcessBroker` runs the same server (`BrokerServer` over `compose(config)`, configured
from the same flags) on an event loop and thread of its own inside the test process.

A test that only talks to the broker over TCP uses the in-process one: nothing to spawn, import
and recover per start. A test that needs a process (kill -9, SIGSTOP, exit codes, its
stdout/stderr, canaries or settings read from its environment at import, its memory, uvloop,
signals, the collector tuning `loglake serve` does) uses `Broker`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from portkit import free_port as free_port  # the tests import it from here too

if TYPE_CHECKING:
    from loglake.broker.config import BrokerConfig

#: How long a broker may take to print its listening line.
START_TIMEOUT_S = 30.0


class Broker:
    def __init__(
        self, data_dir: Path, extra_args: list[str] | None = None, env: dict[str, str] | None = None, log_level: str = "INFO"
    ) -> None:
        self.data_dir = data_dir
        self.extra_args = list(extra_args or [])
        self.env = env
        self.log_level = log_level
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        #: Every listener's port, in listener order (from --port-file).
        self.ports: list[int] = []
        self.log_path = log_path_of(data_dir)
        #: Where clients reach it, and the command prefix that runs it elsewhere (a network
        #: namespace: tests/netkit.py).
        self.host = "127.0.0.1"
        self.wrap: list[str] = []

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Broker:
        port_file = self.data_dir.parent / f"{self.data_dir.name}.port"
        if port_file.exists():
            port_file.unlink()
        log = open(self.log_path, "a")  # noqa: SIM115 - closed with the process
        cmd = [
            *self.wrap,
            sys.executable,
            "-m",
            "loglake.cli.main",
            "--log-level",
            self.log_level,
            "serve",
            "--data-dir",
            str(self.data_dir),
            # --listen repeats add listeners: the default one only when the test names none
            *([] if "--listen" in self.extra_args else ["--listen", "127.0.0.1:0"]),
            "--port-file",
            str(port_file),
            *self.extra_args,
        ]
        env = {**os.environ, **(self.env or {})}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("loglake listening on "):
                self.port = int(line.rsplit(":", 1)[1])
                self.ports = [int(p) for p in port_file.read_text().split()]
                return self
            if self.proc.poll() is not None:
                break
        raise RuntimeError(f"broker did not start: {line!r}; log:\n{self.log_path.read_text()[-4000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Stop the broker (SIGTERM: graceful; SIGKILL: crash). Returns its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return code

    def restart(self) -> Broker:
        self.stop()
        return self.start()

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


def log_path_of(data_dir: Path) -> Path:
    """Where a broker on `data_dir` logs (next to the directory: it survives restarts)."""
    return data_dir.parent / f"{data_dir.name}-broker.log"


#: The attribute naming the in-process broker a thread works for (see `_install_thread_hooks`).
_OWNER = "_brokerkit_owner"
_hooks_installed = False
_hooks_lock = threading.Lock()


def _owner(thread: threading.Thread | None) -> InProcessBroker | None:
    owner = getattr(thread, _OWNER, None)
    return owner if isinstance(owner, InProcessBroker) else None


def _install_thread_hooks() -> None:
    """Make every thread a broker's thread starts that broker's too (the engine's WAL, sealer,
    cleaner and executor threads are started from the broker's loop or executor threads), so its
    log lines go to its broker's log; and log an uncaught exception of such a thread there (a
    process broker writes it to its stderr, which is its log) before pytest's own hook sees it."""
    global _hooks_installed
    with _hooks_lock:
        if _hooks_installed:
            return
        _hooks_installed = True
    start = threading.Thread.start

    def start_owned(self: threading.Thread) -> None:
        owner = _owner(threading.current_thread())
        if owner is not None:
            setattr(self, _OWNER, owner)
        start(self)

    threading.Thread.start = start_owned  # type: ignore[method-assign]
    previous = threading.excepthook

    def excepthook(args: threading.ExceptHookArgs) -> None:
        if _owner(args.thread) is not None and args.exc_value is not None:
            logging.getLogger("loglake.brokerkit").error(
                "uncaught exception in thread %s", args.thread.name if args.thread else "?",
                exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
            )
        previous(args)

    threading.excepthook = excepthook


class _BrokerLog(logging.FileHandler):
    """The log file of one in-process broker: every record its threads emit, formatted as
    `loglake --log-level LEVEL serve` writes it to stderr."""

    def __init__(self, broker: InProcessBroker, level: int) -> None:
        from loglake.cli.main import log_formatter

        super().__init__(broker.log_path, mode="a", encoding="utf-8")
        self.setLevel(level)
        self.setFormatter(log_formatter())
        self.addFilter(lambda _record: _owner(threading.current_thread()) is broker)


#: The `log_level` of each running in-process broker (by id): the "loglake" logger runs at the
#: lowest while any runs (a broker process sets its root logger to its --log-level; the test
#: process's root logger stays at WARNING).
_levels_lock = threading.Lock()
_running_levels: dict[int, int] = {}
_saved_level: list[int] = []


def _raise_loglake_level(key: int, level: int) -> None:
    with _levels_lock:
        logger = logging.getLogger("loglake")
        if not _running_levels:
            _saved_level[:] = [logger.level]
        _running_levels[key] = level
        logger.setLevel(min(_running_levels.values()))


def _restore_loglake_level(key: int) -> None:
    with _levels_lock:
        if _running_levels.pop(key, None) is None:
            return
        logger = logging.getLogger("loglake")
        logger.setLevel(min(_running_levels.values()) if _running_levels else _saved_level[0])


class InProcessBroker:
    """The broker `loglake serve` runs, inside the test process: `BrokerServer(config, engine)`
    on an asyncio loop of its own in a thread of its own, where `config` is what `serve` makes of
    the same flags (`loglake.cli.serve.config_of`: a test's `extra_args` and `env` work as for
    `Broker`) and `engine` what `serve` composes from it (`compose`).

    Logs: every record of the broker's threads (its loop thread and every thread started from
    them, transitively: `_install_thread_hooks`) at `log_level` or above goes to `log_path`, as
    a process broker's stderr does; records of other threads (the test's, other brokers') do
    not. Several in-process brokers may run at once, each with its own log; what they share is
    what the process has once: the "loglake" logger's level (the lowest `log_level` of those
    running; the test process's root logger stays at WARNING) and the rate limiters of
    loglake.logsafe (a summary of a warning repeated on two brokers in one window may land in
    either's log; the tests that count summaries use `LOGLAKE_LOG_RATE_LIMIT_MS=0` or one broker).

    What a process broker does that this one does not: signals, an exit code of its own (`stop`
    returns 0 after a clean shutdown and 1 otherwise), uvloop, freezing its start-up objects
    out of the collector's reach and timing collections (process-wide; the loglake_gc_* metrics
    are absent), reading settings or canaries from an environment of its own at import.
    """

    def __init__(
        self, data_dir: Path, extra_args: list[str] | None = None, env: dict[str, str] | None = None, log_level: str = "INFO"
    ) -> None:
        self.data_dir = data_dir
        self.extra_args = list(extra_args or [])
        self.env = env
        self.log_level = log_level
        self.port = 0
        #: Every listener's port, in listener order.
        self.ports: list[int] = []
        self.log_path = log_path_of(data_dir)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._handler: _BrokerLog | None = None
        self._code = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._stop is not None and not self._stop.is_set()

    def start(self) -> InProcessBroker:
        from loglake.cli.serve import config_of
        from loglake.logsafe import flush_all

        assert not self.running, "already running"
        args = [
            "--data-dir",
            str(self.data_dir),
            *([] if "--listen" in self.extra_args else ["--listen", "127.0.0.1:0"]),
            *self.extra_args,
        ]
        config = config_of(args, {**os.environ, **(self.env or {})})
        if config.event_loop != "asyncio":
            raise ValueError(f"event_loop={config.event_loop}: an in-process broker runs on asyncio (use Broker)")
        if not _running_levels:
            # A broker process starts with no rate-limited warning pending: close the windows
            # earlier users of the process-wide limiters left open (not while another broker runs:
            # its pending summaries are its own).
            flush_all(force=True)
        _install_thread_hooks()
        level = getattr(logging, self.log_level.upper())
        self._handler = _BrokerLog(self, level)
        logging.getLogger().addHandler(self._handler)
        _raise_loglake_level(id(self), level)
        self._code = 0
        self._loop = self._stop = None
        started: concurrent.futures.Future[list[int]] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(config, started), name=f"broker-{self.data_dir.name}", daemon=True)
        setattr(self._thread, _OWNER, self)
        self._thread.start()
        try:
            self.ports = started.result(START_TIMEOUT_S)
        except BaseException as exc:
            self._signal_stop()  # still starting after START_TIMEOUT_S: shut down once started
            self._finish(timeout=START_TIMEOUT_S)
            raise RuntimeError(f"broker did not start: {exc}; log:\n{self.log_text()[-4000:]}") from exc
        self.port = self.ports[0]
        return self

    def _run(self, config: BrokerConfig, started: concurrent.futures.Future[list[int]]) -> None:
        try:
            asyncio.run(self._serve(config, started))
        except BaseException:
            logging.getLogger("loglake.brokerkit").exception("the broker's event loop failed")
            self._code = 1
            if not started.done():
                started.set_exception(RuntimeError("the broker's event loop failed"))

    async def _serve(self, config: BrokerConfig, started: concurrent.futures.Future[list[int]]) -> None:
        from loglake.broker.server import BrokerServer
        from loglake.cli.serve import compose

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            engine, group_stores = compose(config)
            server = BrokerServer(config, engine, group_stores)
        except BaseException as exc:
            started.set_exception(exc)
            return
        try:
            await server.start()
        except BaseException as exc:
            await server.shutdown()  # as run_server: a half-started broker releases its lock and ports
            started.set_exception(exc)
            return
        started.set_result([lst.port for lst, _ in server.endpoints])
        await self._stop.wait()
        try:
            await server.shutdown()
        except BaseException:
            logging.getLogger("loglake.brokerkit").exception("shutdown failed")
            self._code = 1

    def stop(self, timeout: float = 30.0) -> int:
        """Shut down as SIGTERM does (stop accepting, finish in-flight requests, seal, release the
        data directory) and wait until every thread of the broker ended. Returns 0 if it all went
        cleanly, 1 otherwise (written to the log)."""
        assert self._thread is not None, "not started"
        self._signal_stop()
        return self._finish(timeout)

    def _signal_stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass  # the loop closed meanwhile: the broker is down already

    def _finish(self, timeout: float) -> int:
        assert self._thread is not None
        deadline = time.monotonic() + timeout
        self._thread.join(timeout)
        while True:  # the engine's and executors' threads end after the loop's
            left = [t for t in threading.enumerate() if _owner(t) is self]
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        if left:
            self._code = 1
            with open(self.log_path, "a") as fh:
                fh.write(f"brokerkit: threads still running {timeout:.0f} s after shutdown: {[t.name for t in left]}\n")
        _restore_loglake_level(id(self))
        if self._handler is not None:
            logging.getLogger().removeHandler(self._handler)
            self._handler.close()
            self._handler = None
        return self._code

    def restart(self) -> InProcessBroker:
        assert self.stop() == 0, self.log_text()[-5000:]
        return self.start()

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


def cluster_args(
    etcd_endpoints: list[str],
    prefix: str,
    store_url: str,
    node_id: int,
    *,
    lease_ttl_s: int = 2,
    flush_ms: int = 50,
) -> list[str]:
    """`loglake serve` flags of one broker of a cluster (docs/CLUSTER.md): etcd at
    `etcd_endpoints` under `prefix`, the bucket at `store_url`; a short lease and flush interval
    keep tests quick (the defaults are 3 s and 500 ms)."""
    return [
        "--cluster",
        f"etcd://{','.join(etcd_endpoints)}/{prefix.strip('/')}",
        "--cold-store",
        store_url,
        "--node-id",
        str(node_id),
        "--cluster-lease-ttl-s",
        str(lease_ttl_s),
        "--object-flush-ms",
        str(flush_ms),
    ]


def start_on_port(broker: Broker | InProcessBroker, port: int, attempts: int = 50) -> None:
    """(Re)start `broker` on `port`; the old socket may linger a moment after a crash."""
    for _ in range(attempts):
        try:
            broker.start()
        except RuntimeError as exc:
            if "address already in use" not in str(exc).lower():
                raise
            time.sleep(0.2)
            continue
        assert broker.port == port
        return
    raise RuntimeError(f"could not listen on port {port} again")


@contextmanager
def running_broker(data_dir: Path, extra_args: list[str] | None = None) -> Iterator[Broker]:
    broker = Broker(data_dir, extra_args).start()
    try:
        yield broker
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.stop()


class Served(Protocol):
    """What `serving_broker` checks of either kind of broker."""

    @property
    def running(self) -> bool: ...

    def stop(self) -> int: ...

    def log_text(self) -> str: ...


@contextmanager
def _serving(b: Served) -> Iterator[None]:
    """It must still be running at the end, stop cleanly, and have logged no traceback."""
    try:
        yield
        assert b.running, "the broker died"
    finally:
        if b.running:
            assert b.stop() == 0, b.log_text()[-5000:]
    assert "Traceback" not in b.log_text(), b.log_text()[-5000:]


@contextmanager
def serving_broker(
    data_dir: Path, extra_args: list[str] | None = None, env: dict[str, str] | None = None, log_level: str = "INFO"
) -> Iterator[Broker]:
    """A broker process for a test module: it must still be running at the end, stop cleanly,
    and have logged no traceback."""
    b = Broker(data_dir, extra_args, env, log_level).start()
    with _serving(b):
        yield b


@contextmanager
def serving_in_process(
    data_dir: Path, extra_args: list[str] | None = None, env: dict[str, str] | None = None, log_level: str = "INFO"
) -> Iterator[InProcessBroker]:
    """`serving_broker` with an `InProcessBroker`: the same checks at the end."""
    b = InProcessBroker(data_dir, extra_args, env, log_level).start()
    with _serving(b):
        yield b


def consume_to_end(bootstrap: str, topic: str, partitions: int, isolation: str, want: int, wait_s: float = 60.0) -> list[bytes]:
    """Values of `topic`'s partitions from offset 0 with confluent-kafka at `isolation`, until at
    least `want` arrived and every partition reached its end (or `wait_s` passed)."""
    import uuid

    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "isolation.level": isolation, "enable.partition.eof": True}
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[bytes] = []
    eof: set[int] = set()
    deadline = time.monotonic() + wait_s
    try:
        while time.monotonic() < deadline and not (len(got) >= want and len(eof) == partitions):
            m = c.poll(0.2)
            if m is None:
                continue
            err = m.error()
            if err:
                if err.code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                    continue
                raise KafkaException(err)
            eof.discard(m.partition())
            got.append(m.value())
    finally:
        c.close()
    return got
