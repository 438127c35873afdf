"""Real etcd for tests: Debian's `etcd` binary on 127.0.0.1, free ports, a temp data dir.

- `EtcdCluster(tmp, members=1|3)`: starts every member, waits until each answers /health, and
  `stop()` kills them all (SIGKILL after a short SIGTERM grace). `stop_member(i)` /
  `start_member(i)` take one member down and bring it back on the same ports and data, for the
  member-loss and etcd-down tests; `pause_member(i)` / `resume_member(i)` hang one (SIGSTOP).
- Fixtures `etcd1` (one member) and `etcd3` (three): function-scoped and always stopped in the
  fixture's teardown, also when the test failed.

The tests skip, with the reason, when the binary is missing (a machine without Debian's
etcd-server package; .ci/run installs it), and fail so under CI (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from portkit import free_port as free_port  # the tests import it from here too

ETCD_BINARY = shutil.which("etcd")
#: How long a member may take to answer /health before the kit gives up (a 3-member cluster
#: elects a leader within a few election timeouts; a loaded 2-core machine needs slack).
START_TIMEOUT_S = 60.0
#: SIGTERM grace before SIGKILL when stopping a member.
STOP_GRACE_S = 5.0

#: Why the cluster tests skip here (tests/conftest.py turns the skip into a failure under CI).
ETCD_MISSING = "etcd is not installed (Debian package etcd-server; .ci/run installs it)"

needs_etcd = pytest.mark.skipif(ETCD_BINARY is None, reason=ETCD_MISSING)


class EtcdMember:
    def __init__(self, name: str, data_dir: Path, client_port: int, peer_port: int) -> None:
        #: Where clients are served: 127.0.0.1, or every address (network-partition tests reach
        #: it from other namespaces, tests/netkit.py).
        self.listen_host = "127.0.0.1"
        self.name = name
        self.data_dir = data_dir
        self.client_port = client_port
        self.peer_port = peer_port
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.with_suffix(".log")

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=1.0) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")
        except (OSError, ValueError):
            return False


class EtcdCluster:
    def __init__(self, tmp: Path, members: int = 1, listen_host: str = "127.0.0.1") -> None:
        assert ETCD_BINARY is not None
        self.members = [
            EtcdMember(f"m{i}", tmp / f"etcd-m{i}", free_port(), free_port()) for i in range(members)
        ]
        for m in self.members:
            m.listen_host = listen_host
        self.initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        self._started: set[int] = set()

    @property
    def endpoints(self) -> list[str]:
        """HOST:PORT of every member (what `loglake.cluster.etcd_client.EtcdClient` takes)."""
        return [f"127.0.0.1:{m.client_port}" for m in self.members]

    def start(self) -> EtcdCluster:
        for i in range(len(self.members)):
            self._spawn(i, new=True)
        self.wait_healthy(range(len(self.members)))
        return self

    def _spawn(self, i: int, *, new: bool) -> None:
        m = self.members[i]
        args = [
            str(ETCD_BINARY),
            "--name", m.name,
            "--data-dir", str(m.data_dir),
            "--listen-client-urls", f"http://{m.listen_host}:{m.client_port}",
            "--advertise-client-urls", m.client_url,
            "--listen-peer-urls", m.peer_url,
            "--initial-advertise-peer-urls", m.peer_url,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", "new" if new else "existing",
            "--initial-cluster-token", "loglake-test",
            "--log-level", "warn",
        ]  # fmt: skip
        log = open(m.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            m.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        self._started.add(i)

    def wait_healthy(self, which: Any) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        for i in which:
            m = self.members[i]
            while not m.healthy():
                if m.proc is not None and m.proc.poll() is not None:
                    raise RuntimeError(f"etcd {m.name} exited with {m.proc.returncode}: {self.log_tail(i)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"etcd {m.name} not healthy after {START_TIMEOUT_S} s: {self.log_tail(i)}"
                    )
                time.sleep(0.1)

    def log_tail(self, i: int) -> str:
        try:
            return self.members[i].log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def stop_member(self, i: int) -> None:
        m = self.members[i]
        proc, m.proc = m.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)  # a paused member would never act on SIGTERM
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()

    def pause_member(self, i: int) -> None:
        """SIGSTOP: the member keeps its sockets (connections are accepted by the kernel) but
        answers nothing, as a hung machine would."""
        proc = self.members[i].proc
        if proc is not None:
            proc.send_signal(signal.SIGSTOP)

    def resume_member(self, i: int) -> None:
        proc = self.members[i].proc
        if proc is not None:
            proc.send_signal(signal.SIGCONT)

    def start_member(self, i: int) -> None:
        """Restart a stopped member on its ports and data (it rejoins with what it had)."""
        self._spawn(i, new=False)
        self.wait_healthy([i])

    def stop(self) -> None:
        for i in range(len(self.members)):
            self.stop_member(i)


def _cluster(tmp_path: Path, members: int) -> Iterator[EtcdCluster]:
    if ETCD_BINARY is None:
        pytest.skip(ETCD_MISSING)
    cluster = EtcdCluster(tmp_path, members)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        if os.environ.get("LOGLAKE_KEEP_ETCD_LOGS") is None:
            for m in cluster.members:
                shutil.rmtree(m.data_dir, ignore_errors=True)


@pytest.fixture
def etcd1(tmp_path: Path) -> Iterator[EtcdCluster]:
    yield from _cluster(tmp_path, 1)


@pytest.fixture
def etcd3(tmp_path: Path) -> Iterator[EtcdCluster]:
    yield from _cluster(tmp_path, 3)
