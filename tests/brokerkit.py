"""Run the real broker (`loglake serve`) as a child process on 127.0.0.1 with a random port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
        self.log_path = data_dir.parent / f"{data_dir.name}-broker.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Broker:
        port_file = self.data_dir.parent / f"{self.data_dir.name}.port"
        if port_file.exists():
            port_file.unlink()
        log = open(self.log_path, "a")  # noqa: SIM115 - closed with the process
        cmd = [
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


def free_port() -> int:
    """A port nothing listens on right now (for a broker that must come back on the same port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_on_port(broker: Broker, port: int, attempts: int = 50) -> None:
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


@contextmanager
def serving_broker(
    data_dir: Path, extra_args: list[str] | None = None, env: dict[str, str] | None = None, log_level: str = "INFO"
) -> Iterator[Broker]:
    """A broker for a test module: it must still be running at the end, stop cleanly, and have
    logged no traceback."""
    b = Broker(data_dir, extra_args, env, log_level).start()
    try:
        yield b
        assert b.proc is not None and b.proc.poll() is None, "the broker process died"
    finally:
        if b.proc is not None and b.proc.poll() is None:
            assert b.stop() == 0
    assert "Traceback" not in b.log_text(), b.log_text()[-5000:]


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
