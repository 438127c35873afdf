"""The `ClusterView` seam: which brokers are alive, who leads a partition, who coordinates a group.

The broker asks these questions and never which mode it runs in. Two implementations:

* `SingleNodeView` (here): one broker, always alive, leading every partition and coordinating
  every group — "me, always";
* cluster mode's view over etcd (loglake.cluster.view): brokers registered under leases, leaders
  from the shared partition state, group coordinators by rendezvous hashing over the live set.

`join(listeners)` is called once the broker's listeners are bound (they are what a broker
advertises); `on_change` listeners hear of every change of the live set (cluster mode moves group
coordinators then; a single node never calls them).

Replicas: a single node is every partition's one replica. In a cluster every live broker can
serve any partition's committed data from the bucket, so a topic of replication factor `rf`
reports `rf` of the live brokers as each partition's replicas and in-sync replicas: the leader
first, then the others in node-id order rotated by the partition index (`replicas_among`: the
same answer on every broker, and followers spread). A consumer that names its rack (KIP-392)
is sent by the leader to a replica in that rack (`read_replica_among`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

from loglake.errors import CorruptionError

__all__ = [
    "BrokerInfo",
    "ClusterView",
    "LiveListener",
    "SingleNodeView",
    "endpoint_of",
    "read_replica_among",
    "replicas_among",
]


@dataclass(frozen=True)
class BrokerInfo:
    """A broker as Metadata describes it: its node id, advertised listeners, rack."""

    node_id: int
    listeners: tuple[str, ...]  # advertised, as Kafka's advertised.listeners entries (PROTOCOL://HOST:PORT)
    rack: str | None = None

    def encode(self) -> bytes:
        return json.dumps({"node_id": self.node_id, "listeners": list(self.listeners), "rack": self.rack}).encode()

    @staticmethod
    def decode(raw: bytes, *, where: str) -> BrokerInfo:
        try:
            doc = json.loads(raw)
            rack = doc.get("rack")
            return BrokerInfo(
                int(doc["node_id"]),
                tuple(str(x) for x in doc["listeners"]),
                None if rack is None else str(rack),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptionError(where, 0, f"broker registration does not parse: {exc!r}") from None


#: Called with the live node ids whenever they change (from the view's own thread).
LiveListener = Callable[[set[int]], None]


class ClusterView(Protocol):
    @property
    def node_id(self) -> int:
        """This broker's node id."""
        ...

    def join(self, listeners: list[str]) -> None:
        """Start taking part, advertising `listeners` (PROTOCOL://HOST:PORT); blocking I/O."""
        ...

    def leave(self) -> None:
        """Stop taking part (partitions and groups move to the other brokers at once)."""
        ...

    def brokers(self) -> list[BrokerInfo]:
        """The live brokers, by node id."""
        ...

    def live_ids(self) -> set[int]:
        ...

    def leader_of(self, topic_id: bytes, partition: int) -> int:
        """The node id leading the partition, or -1 when no live broker does now."""
        ...

    def coordinator_of(self, key: str) -> int:
        """The node id coordinating a group (or transactional id); -1 when none is live."""
        ...

    def replicas_of(self, topic_id: bytes, partition: int, factor: int) -> list[int]:
        """The brokers reported as the partition's replicas (and ISR) for a topic of replication
        factor `factor`: the leader first; at most as many as are live."""
        ...

    def read_replica_for(self, topic_id: bytes, partition: int, factor: int, rack: str) -> int:
        """The replica a consumer in `rack` should fetch from instead of the leader (KIP-392's
        preferred read replica), -1 to stay with the leader."""
        ...

    def on_change(self, listener: LiveListener) -> None:
        """Call `listener(live node ids)` whenever the live set changes."""
        ...


class SingleNodeView:
    """One broker: alive, leading every partition, coordinating every group."""

    def __init__(self, node_id: int, rack: str | None = None) -> None:
        self._node_id = node_id
        self.rack = rack
        self._me = BrokerInfo(node_id, (), rack)

    @property
    def node_id(self) -> int:
        return self._node_id

    def join(self, listeners: list[str]) -> None:
        self._me = BrokerInfo(self._node_id, tuple(listeners), self.rack)

    def leave(self) -> None:
        return None  # nobody to hand anything to

    def brokers(self) -> list[BrokerInfo]:
        return [self._me]

    def live_ids(self) -> set[int]:
        return {self._node_id}

    def leader_of(self, topic_id: bytes, partition: int) -> int:
        return self._node_id

    def coordinator_of(self, key: str) -> int:
        return self._node_id

    def replicas_of(self, topic_id: bytes, partition: int, factor: int) -> list[int]:
        return [self._node_id]

    def read_replica_for(self, topic_id: bytes, partition: int, factor: int, rack: str) -> int:
        return -1  # the one replica is the leader

    def on_change(self, listener: LiveListener) -> None:
        return None  # the live set never changes


def replicas_among(leader: int, live: Collection[int], factor: int, partition: int) -> list[int]:
    """`factor` live brokers (fewer when fewer are live) reported as a partition's replicas: the
    leader first when it is live, then the other live brokers in node-id order rotated by
    `partition`, so that the followers of one leader's partitions spread over the rest."""
    ids = sorted(live)
    count = min(max(factor, 1), len(ids))
    head = [leader] if leader in ids else []
    others = [n for n in ids if n != leader]
    if others:
        k = partition % len(others)
        others = others[k:] + others[:k]
    return (head + others)[:count]


def read_replica_among(replicas: list[int], leader: int, brokers: list[BrokerInfo], rack: str, partition: int) -> int:
    """KIP-392's rack-aware choice: -1 (stay with the leader) when the client names no rack, the
    leader is in its rack, or no replica is; else one of the replicas in its rack (by partition
    index when several are, so a rack's reads spread over its brokers)."""
    if not rack:
        return -1
    racks = {b.node_id: b.rack for b in brokers}
    if racks.get(leader) == rack:
        return -1
    same = [n for n in replicas if n != leader and racks.get(n) == rack]
    return same[partition % len(same)] if same else -1


def endpoint_of(info: BrokerInfo, protocol: str) -> tuple[str, int] | None:
    """(host, port) a broker advertises for `protocol` (its first listener when none matches)."""
    chosen = None
    for url in info.listeners:
        proto, _, hostport = url.partition("://")
        host, _, port = hostport.rpartition(":")
        if not port.isdigit():
            continue
        if chosen is None or proto == protocol:
            chosen = (host.strip("[]"), int(port))
            if proto == protocol:
                break
    return chosen
