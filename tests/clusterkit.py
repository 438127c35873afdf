"""Real processes for the cluster-mode tests and benchmark: etcd, moto's S3 server behind a fault
proxy (or one folder the brokers share: `cold_store="file"`), and N brokers
`loglake serve --cluster ...`.

- etcd: `etcdkit.EtcdCluster` (1 or 3 members; a member can be stopped and restarted).
- S3: moto's server as its own process (`MotoProcess`: the brokers' PUTs do not share the test's
  interpreter), reached only through an `s3kit.FaultProxy` in the test process. The proxy is the
  switch for bucket outages — `blackhole` holds every request unanswered, as a network partition
  does, `storm` answers 503s — and it counts requests (foreground flush PUTs and merge PUTs are
  told apart by key). moto keeps its data in memory across an outage, since it never stops.
- Brokers: `brokerkit.Broker` with the cluster flags, each on a fixed port chosen at start so a
  restart comes back where clients' bootstrap lists point. `kill()` (SIGKILL), `pause()` /
  `resume()` (SIGSTOP / SIGCONT), `restart(wipe=...)` with the same node id, its data dir kept or
  wiped. Logs stay in the test's tmp dir.
- `Cluster` ties them together; `running_cluster(...)` is a context manager that prints every
  process's log tail when the body raised (pytest shows it with the failure) and always stops
  every process it started, brokers first.

Skips (with the reason) when etcd is not installed, as etcdkit does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import etcdkit
import netkit
import s3kit

import brokerkit

#: How long moto's server may take to accept connections.
MOTO_START_TIMEOUT_S = 30.0
#: How long a broker may take to start (a restarted node re-registers, acquires partitions).
BROKER_START_TIMEOUT_S = 60.0
#: Characters of each process log printed when a cluster test fails.
LOG_TAIL_CHARS = 6000
#: Key fragment of the flush objects (foreground PUTs); every other PUT under the cluster's
#: prefix is background work (merged segments, checkpoints of metadata kept in the bucket).
FLUSH_KEY_PART = "/flush/"


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class MotoProcess:
    """moto's S3 server in a child process on 127.0.0.1 and a fixed free port."""

    def __init__(self, tmp: Path) -> None:
        self.port = brokerkit.free_port()
        self.log_path = tmp / "moto.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoProcess:
        env = {**os.environ, **s3kit.DUMMY_ENV}
        for k in s3kit.UNSET_ENV:
            env.pop(k, None)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + MOTO_START_TIMEOUT_S
        while not _port_open(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto server did not start: {self.log_tail()}")
            time.sleep(0.1)
        return self

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ClusterBroker:
    """One `loglake serve --cluster` process with a node id, a data dir and a fixed port."""

    def __init__(
        self,
        node_id: int,
        data_dir: Path,
        port: int,
        args: list[str],
        env: dict[str, str],
        host: netkit.Host | None = None,
    ) -> None:
        self.node_id = node_id
        self.port = port
        self.data_dir = data_dir
        self.args = args
        self.env = env
        self.paused = False
        #: Its own network namespace (network-partition tests), or None: the test's.
        self.host = host
        self.ip = "127.0.0.1" if host is None else host.ip
        self.broker = brokerkit.Broker(data_dir, self._cmd_args(), env)
        self.broker.host = self.ip
        self.broker.wrap = [] if host is None else host.wrap()
        self.starts = 0

    def _cmd_args(self) -> list[str]:
        return ["--listen", f"{self.ip}:{self.port}", "--node-id", str(self.node_id), *self.args]

    @property
    def bootstrap(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.broker.proc is None else self.broker.proc.pid

    def alive(self) -> bool:
        return self.broker.proc is not None and self.broker.proc.poll() is None

    def start(self) -> ClusterBroker:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        old = brokerkit.START_TIMEOUT_S
        brokerkit.START_TIMEOUT_S = BROKER_START_TIMEOUT_S
        deadline = time.monotonic() + BROKER_START_TIMEOUT_S
        try:
            while True:
                try:
                    brokerkit.start_on_port(self.broker, self.port)
                    break
                except RuntimeError as exc:
                    # Restarted within the lease of its killed self: the node id frees when
                    # that lease runs out (a few seconds), so wait for it like an operator would.
                    if "is held by a live broker" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        finally:
            brokerkit.START_TIMEOUT_S = old
        self.starts += 1
        self.paused = False
        return self

    def kill(self) -> None:
        """kill -9: no goodbye to etcd, buffered appends lost with the process."""
        if self.alive():
            self.broker.stop(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets and its lease runs out while it sleeps."""
        if self.alive():
            assert self.broker.proc is not None
            self.broker.proc.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.alive() and self.paused:
            assert self.broker.proc is not None
            self.broker.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def stop(self, timeout: float = 30.0) -> int | None:
        """A graceful stop (SIGTERM, SIGKILL after `timeout`); the exit code, None if not running."""
        if not self.alive():
            return None
        self.resume()
        return self.broker.stop(signal.SIGTERM, timeout)

    def restart(self, *, wipe: bool = False, kill: bool = False) -> ClusterBroker:
        """Same node id and port; `wipe` empties the data dir first (it is a cache only)."""
        if kill:
            self.kill()
        else:
            self.stop()
        if wipe:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        return self.start()

    def log_text(self) -> str:
        return self.broker.log_text()


class Cluster:
    """etcd + moto behind a fault proxy + `brokers` brokers, all real processes."""

    def __init__(
        self,
        tmp: Path,
        brokers: int = 3,
        etcd_members: int = 1,
        broker_args: list[str] | None = None,
        broker_env: dict[str, str] | None = None,
        netns: bool = False,
        cold_store: str = "s3",
    ) -> None:
        """`netns`: each broker on a host of its own (tests/netkit.py), so the network between it
        and etcd or the bucket can be cut while its clients still reach it. `cold_store`: "s3"
        (moto behind the fault proxy) or "file" (one folder under `tmp` that every broker
        shares, as brokers on one host do: no moto, no proxy)."""
        if etcdkit.ETCD_BINARY is None:
            import pytest

            pytest.skip("etcd is not installed (Debian package etcd-server; .ci/run installs it)")
        self.tmp = tmp
        self.n_brokers = brokers
        self.netns = netns
        self.listen_host = "0.0.0.0" if netns else "127.0.0.1"
        self.etcd = etcdkit.EtcdCluster(tmp, etcd_members, listen_host=self.listen_host)
        self._subnets = netkit.subnets(16) if netns else []
        self.moto = MotoProcess(tmp)
        self.proxy: s3kit.FaultProxy | None = None
        assert cold_store in ("s3", "file"), cold_store
        self.cold_store = cold_store
        self.shared_dir = tmp / "shared"
        self.bucket = f"cluster-{uuid.uuid4().hex[:12]}"
        self.prefix = f"loglake/{uuid.uuid4().hex[:8]}"
        self.broker_args = list(broker_args or [])
        self.broker_env = {**s3kit.DUMMY_ENV, **(broker_env or {})}
        self.brokers: list[ClusterBroker] = []
        self._saved_env: dict[str, str | None] = {}

    # ---- the URLs a broker is started with ----------------------------------------------------

    @property
    def etcd_url(self) -> str:
        return f"etcd://{','.join(self.etcd.endpoints)}/{self.prefix}"

    @property
    def cold_store_url(self) -> str:
        if self.cold_store == "file":
            return f"file://{self.shared_dir}"
        assert self.proxy is not None
        return s3kit.store_url(self.proxy.endpoint, self.bucket, "data")

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)

    def by_node(self, node_id: int) -> ClusterBroker:
        return next(b for b in self.brokers if b.node_id == node_id)

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Cluster:
        # The test process talks to moto too (boto3 clients, the stores of checks): dummy
        # credentials while the cluster runs, restored by `stop`.
        self._saved_env = {k: os.environ.get(k) for k in (*s3kit.DUMMY_ENV, *s3kit.UNSET_ENV)}
        os.environ.update(s3kit.DUMMY_ENV)
        for k in s3kit.UNSET_ENV:
            os.environ.pop(k, None)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.etcd.start()
        if self.cold_store == "s3":
            self.moto.start()
            self.proxy = s3kit.FaultProxy(("127.0.0.1", self.moto.port), listen_host=self.listen_host).start()
            s3kit.raw_client(self.moto.endpoint).create_bucket(Bucket=self.bucket)
        for i in range(self.n_brokers):
            self.add_broker(i + 1)
        return self

    def add_broker(self, node_id: int, extra_args: list[str] | None = None) -> ClusterBroker:
        etcd_url, cold_store_url, host = self.etcd_url, self.cold_store_url, None
        if self.netns:
            assert self.proxy is not None
            host = netkit.Host(self._subnets.pop(0)).up()
            etcd_ip = host.service_ip("etcd")
            etcd_url = f"etcd://{','.join(f'{etcd_ip}:{m.client_port}' for m in self.etcd.members)}/{self.prefix}"
            bucket_endpoint = f"http://{host.service_ip('bucket')}:{self.proxy.port}"
            cold_store_url = s3kit.store_url(bucket_endpoint, self.bucket, "data")
            # a private test address, but not loopback: the broker asks for the flag that says so
            extra_args = ["--allow-unauthenticated-public-listener", *(extra_args or [])]
        args = [
            "--cluster", etcd_url,
            "--cold-store", cold_store_url,
            *self.broker_args,
            *(extra_args or []),
        ]  # fmt: skip
        b = ClusterBroker(node_id, self.tmp / f"node{node_id}", brokerkit.free_port(), args, self.broker_env, host)
        self.brokers.append(b)
        return b.start()

    def stop(self) -> None:
        """Stop everything this cluster started; never raises (it runs in `finally`)."""
        for b in self.brokers:
            with contextlib.suppress(Exception):
                b.resume()
                if b.alive():
                    b.broker.stop(signal.SIGTERM, timeout=10.0)
        if self.proxy is not None:
            with contextlib.suppress(Exception):
                self.proxy.clear()  # releases blackholed requests
                self.proxy.stop()
        with contextlib.suppress(Exception):
            self.moto.stop()
        with contextlib.suppress(Exception):
            self.etcd.stop()
        for b in self.brokers:
            if b.host is not None:
                b.host.down()
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env = {}

    def logs(self) -> str:
        parts = []
        for b in self.brokers:
            parts.append(f"===== broker node {b.node_id} (port {b.port}, starts {b.starts}) =====")
            parts.append(b.log_text()[-LOG_TAIL_CHARS:])
        for i, m in enumerate(self.etcd.members):
            parts.append(f"===== etcd {m.name} =====\n{self.etcd.log_tail(i)}")
        if self.cold_store == "s3":
            parts.append(f"===== moto =====\n{self.moto.log_tail()}")
        return "\n".join(parts)

    def etcd_leader(self) -> int:
        """Index of the etcd member that leads the raft group now (from any member's status)."""
        ids: dict[str, int] = {}
        leader = None
        for i, m in enumerate(self.etcd.members):
            if m.proc is None:
                continue
            try:
                req = urllib.request.Request(
                    f"{m.client_url}/v3/maintenance/status", data=b"{}", method="POST"
                )
                with urllib.request.urlopen(req, timeout=2.0) as resp:
                    status = json.loads(resp.read())
            except (OSError, ValueError):
                continue
            ids[status["header"]["member_id"]] = i
            leader = status.get("leader", leader)
        if leader is None or leader not in ids:
            raise RuntimeError(f"no etcd member names a leader it knows: {leader}, {ids}")
        return ids[leader]

    # ---- S3 request counts (through the proxy) ------------------------------------------------

    def put_counts(self) -> dict[str, int]:
        """PUT requests the proxy forwarded since the last `proxy.clear()`: flush objects
        (foreground) and everything else (background: merged segments and the like)."""
        assert self.proxy is not None
        puts = [s for s in self.proxy.requests("PUT") if s.path.count("/") > 1]
        flush = sum(1 for s in puts if FLUSH_KEY_PART in s.path)
        return {"flush": flush, "other": len(puts) - flush}

    # ---- what clients see -----------------------------------------------------------------------

    def leaders(self, topic: str, timeout_s: float = 10.0) -> dict[int, int]:
        """partition -> leader node id, from any live broker's Metadata."""
        from confluent_kafka.admin import AdminClient

        # a broker cut off from etcd or the bucket answers from a view that may be stale
        live = [b for b in self.brokers if b.alive() and not b.paused and not (b.host and b.host.cuts)]
        admin = AdminClient({"bootstrap.servers": ",".join(b.bootstrap for b in live)})
        md = admin.list_topics(topic, timeout=timeout_s)
        t = md.topics[topic]
        if t.error is not None:
            raise RuntimeError(f"metadata of {topic}: {t.error}")
        return {p: pm.leader for p, pm in t.partitions.items()}

    def create_topic(
        self, topic: str, partitions: int, timeout_s: float = 30.0, config: dict[str, str] | None = None
    ) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        new = NewTopic(topic, partitions, 1, config=config or {})
        fut = admin.create_topics([new], operation_timeout=timeout_s)[topic]
        fut.result(timeout_s)
        self.wait_leaders(topic, partitions, timeout_s)

    def wait_leaders(
        self, topic: str, partitions: int, timeout_s: float = 30.0, avoid: int | None = None
    ) -> dict[int, int]:
        """Wait until every partition has a live leader (other than node `avoid`)."""
        live_ids = {b.node_id for b in self.brokers if b.alive() and not b.paused}
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.leaders(topic)
            except Exception as exc:  # a broker just died: ask again
                last = exc
            else:
                if len(last) == partitions and all(n in live_ids and n != avoid for n in last.values()):
                    return dict(last)
            time.sleep(0.2)
        raise AssertionError(f"{topic}: no live leader for every partition after {timeout_s} s: {last}")


@contextlib.contextmanager
def running_cluster(tmp: Path, **kwargs: Any) -> Iterator[Cluster]:
    cluster = Cluster(tmp, **kwargs)
    try:
        cluster.start()
        yield cluster
    except BaseException:
        sys.stderr.write(cluster.logs() + "\n")
        raise
    finally:
        cluster.stop()
