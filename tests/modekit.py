"""One broker or a three-broker cluster behind one face, for the suites that run against both
(issue 29: produce, fetch, groups, admin and idempotence, parametrised over `MODES`).

- "single": `loglake serve` on a data directory (tests/brokerkit.py), on a fixed port so that a
  restart comes back where the clients' bootstrap points.
- "cluster": three `loglake serve --cluster` brokers over etcd and moto's S3 server
  (tests/clusterkit.py), with a short lease and flush interval; `bootstrap` lists all three.

`serving(mode, tmp, ...)` yields a `Served` and checks at the end what `brokerkit.serving_broker`
checks: every broker still running, stopped cleanly, no traceback in any log. A suite's module
fixture is `@pytest.fixture(scope="module", params=MODES)` around it: pytest runs the module's
tests against one mode, then the other, one broker (or cluster) per mode.

What cluster mode refuses by design is `refuses(feature)` (loglake.cluster.shared_log.REFUSED,
answered with `FEATURE_CODES[feature]`): a test of such a feature asserts that refusal there.
Where a partition's leader or a group's coordinator matters, `leader(topic, p)` and
`coordinator_id(group)` say which broker it is (in single mode always the one broker).
"""

from __future__ import annotations

import contextlib
import inspect
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest

from clusterkit import Cluster, running_cluster
from etcdkit import ETCD_BINARY
from loglake.cluster.shared_log import REFUSED
from loglake.engine.partition_log import FEATURE_CODES, Feature
from test_broker_malformed import RawClient

from brokerkit import Broker, cluster_args, free_port, start_on_port

MODES = ("single", "cluster")
CLUSTER_BROKERS = 3
_QUICK = inspect.signature(cluster_args).parameters
#: A short lease and flush interval keep the cluster quick: brokerkit.cluster_args's values.
CLUSTER_ARGS = [
    "--cluster-lease-ttl-s", str(_QUICK["lease_ttl_s"].default),
    "--object-flush-ms", str(_QUICK["flush_ms"].default),
]  # fmt: skip
#: How long a partition may go without a live leader (a broker restarting, a lease running out).
LEADER_WAIT_S = 60.0
#: How long brokers may disagree about a change one of them committed (etcd's watch brings it to
#: the others within milliseconds; a loaded machine needs slack).
AGREE_WAIT_S = 30.0

T = TypeVar("T")


class Served:
    """The brokers a suite talks to, by node id (single mode: node 0 only)."""

    def __init__(self, mode: str, brokers: dict[int, Broker], cluster: Cluster | None = None) -> None:
        self.mode = mode
        self.brokers = brokers
        self.cluster = cluster

    @property
    def is_cluster(self) -> bool:
        return self.cluster is not None

    @property
    def bootstrap(self) -> str:
        """Every broker, as a client's bootstrap.servers."""
        return ",".join(self.brokers[n].bootstrap for n in self.node_ids)

    @property
    def node_ids(self) -> list[int]:
        return sorted(self.brokers)

    @property
    def first(self) -> Broker:
        """The broker of the lowest node id (the one Metadata names controller)."""
        return self.brokers[self.node_ids[0]]

    def broker(self, node_id: int) -> Broker:
        return self.brokers[node_id]

    def log_text(self) -> str:
        """Every broker's log, one after the other."""
        return "\n".join(self.brokers[n].log_text() for n in self.node_ids)

    # ---- what cluster mode refuses ------------------------------------------------------------

    def refuses(self, feature: Feature) -> bool:
        return self.is_cluster and feature in REFUSED

    @staticmethod
    def refusal_code(feature: Feature) -> int:
        return int(FEATURE_CODES[feature])

    def agreed(self, ask: Callable[[Broker], T], timeout_s: float = AGREE_WAIT_S) -> T:
        """What every broker answers to `ask`, once they all answer alike. A change is committed
        through one broker, which applies it before it answers; the others apply it when etcd's
        watch tells them. So once all agree, all have it: a test asks this before reading what
        a client may read from any broker."""
        deadline = time.monotonic() + timeout_s
        while True:
            answers = {n: ask(self.brokers[n]) for n in self.node_ids}
            first = answers[self.node_ids[0]]
            if all(a == first for a in answers.values()):
                return first
            if time.monotonic() > deadline:
                raise AssertionError(f"brokers still disagree after {timeout_s} s: {answers}")
            time.sleep(0.05)

    # ---- who serves what ----------------------------------------------------------------------

    def leaders(self, topic: str, partitions: int, timeout_s: float = LEADER_WAIT_S) -> dict[int, int]:
        """partition -> leader node id, once every partition has a live leader."""
        if self.cluster is None:
            return dict.fromkeys(range(partitions), self.node_ids[0])
        return self.cluster.wait_leaders(topic, partitions, timeout_s)

    def leader(self, topic: str, partition: int = 0) -> Broker:
        """The broker leading the partition (Metadata, waited for until one is live)."""
        if self.cluster is None:
            return self.first
        deadline = time.monotonic() + LEADER_WAIT_S
        last: object = None
        while time.monotonic() < deadline:
            try:
                leaders = self.cluster.leaders(topic)
            except Exception as exc:  # not created everywhere yet, a broker restarting
                last = exc
            else:
                node = leaders.get(partition, -1)
                if node in self.brokers and self.cluster.by_node(node).alive():
                    return self.brokers[node]
                last = leaders
            time.sleep(0.1)
        raise AssertionError(f"{topic}-{partition}: no live leader after {LEADER_WAIT_S} s: {last}")

    def coordinator_id(self, group: str) -> int:
        """The node id of the broker coordinating `group` (FindCoordinator, asked of the first)."""
        if self.cluster is None:
            return self.node_ids[0]
        deadline = time.monotonic() + LEADER_WAIT_S
        resp = None
        while time.monotonic() < deadline:
            with RawClient(self.first.bootstrap) as raw:
                resp = raw.request(FindCoordinatorRequest[2](key=group, key_type=0))
            if resp.error_code == 0 and resp.node_id in self.brokers:
                return int(resp.node_id)
            time.sleep(0.1)
        raise AssertionError(f"group {group}: no coordinator after {LEADER_WAIT_S} s: {resp}")

    # ---- restarts -------------------------------------------------------------------------------

    def restart(self, node_id: int | None = None) -> None:
        """Restart one broker on the same port with its data kept; with `node_id` None stop every
        broker first, then start them all (nothing of the old processes' memory is left).
        Returns once they listen again."""
        nodes = self.node_ids if node_id is None else [node_id]
        for n in nodes:
            if self.cluster is not None:
                assert self.cluster.by_node(n).stop() == 0, f"node {n} did not stop cleanly"
            else:
                assert self.brokers[n].stop() == 0
        for n in nodes:
            if self.cluster is not None:
                self.cluster.by_node(n).start()
            else:
                start_on_port(self.brokers[n], self.brokers[n].port)
        if self.cluster is not None:  # and each one sees the others live again
            assert self.agreed(self.listed) == self.node_ids

    def listed(self, broker: Broker) -> list[int]:
        """The node ids `broker`'s Metadata lists (the brokers it sees live)."""
        with RawClient(broker.bootstrap) as raw:
            resp = raw.request(MetadataRequest[12](topics=[], allow_auto_topic_creation=False))
        return sorted(b.node_id for b in resp.brokers)


def _check_stopped(brokers: list[Broker]) -> None:
    for b in brokers:
        assert "Traceback" not in b.log_text(), b.log_text()[-5000:]


@contextlib.contextmanager
def serving(
    mode: str,
    tmp: Path,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    *,
    single_args: list[str] | None = None,
) -> Iterator[Served]:
    """One broker ("single") or three ("cluster") with `args` and `env`; `single_args` are
    flags only the single broker gets (a file:// cold store: a cluster's is its bucket)."""
    if mode == "single":
        port = free_port()
        b = Broker(tmp / "data", ["--listen", f"127.0.0.1:{port}", *(args or []), *(single_args or [])], env)
        start_on_port(b, port)
        try:
            yield Served(mode, {0: b})
            assert b.proc is not None and b.proc.poll() is None, "the broker process died"
        finally:
            if b.proc is not None and b.proc.poll() is None:
                assert b.stop() == 0
        _check_stopped([b])
        return
    assert mode == "cluster", mode
    if ETCD_BINARY is None:
        pytest.skip("etcd is not installed (Debian package etcd-server; .ci/run installs it)")
    with running_cluster(
        tmp, brokers=CLUSTER_BROKERS, broker_args=[*CLUSTER_ARGS, *(args or [])], broker_env=env
    ) as c:
        served = Served(mode, {cb.node_id: cb.broker for cb in c.brokers}, c)
        yield served
        dead = [cb.node_id for cb in c.brokers if not cb.alive()]
        assert not dead, f"brokers {dead} died"
        for cb in c.brokers:
            assert cb.broker.stop(signal.SIGTERM) == 0, f"node {cb.node_id} did not stop cleanly"
    _check_stopped([cb.broker for cb in c.brokers])
