"""What the ACL tests on a real broker share (tests/test_broker_acls*.py): a broker with an SSL
listener that requires client certificates, principals from them (tests/tlskit.py: CN=admin is
the super user, CN=bob is granted what the tests need, CN=eve nothing), a Kafka-protocol client
over TLS, and the bindings every module starts from (`granted`).

With client authentication on, allow.everyone.if.no.acl.found defaults to false, so eve is
refused everything no binding allows her. Each test module wraps `acl_pki`, `acl_broker`,
`open_clients` and `grant` in module-scoped fixtures, so it gets a broker of its own.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest
from kafka.protocol.admin import (
    CreateAclsRequest,
    CreateTopicsRequest,
    DescribeAclsRequest,
)
from kafka.protocol.consumer import OffsetCommitRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.parser import KafkaProtocol
from kafka.protocol.producer import ProduceRequest

from loglake.kafka_errors import ErrorCode as E
from loglake.records.batch import BatchBuilder
from tlskit import Pki, make_pki, ssl_args

from brokerkit import InProcessBroker, serving_in_process

AUTH_ERRORS = {E.TOPIC_AUTHORIZATION_FAILED, E.GROUP_AUTHORIZATION_FAILED, E.CLUSTER_AUTHORIZATION_FAILED,
               E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
#: Kafka's codes (confluent_kafka's enums carry the same numbers).
TOPIC, GROUP, CLUSTER, TXN_ID = 2, 3, 4, 5
LITERAL, PREFIXED = 3, 4
ALL, READ, WRITE, DESCRIBE = 2, 3, 4, 8
DENY, ALLOW = 2, 3
MAPPING = "RULE:^CN=([^,]+),.*$/$1/,DEFAULT"


def acl_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), clients=("admin", "bob", "eve"))


def acl_broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[InProcessBroker]:
    conf = tmp_path_factory.mktemp("conf") / "broker.toml"
    conf.write_text(f'ssl_principal_mapping_rules = "{MAPPING}"\n')
    args = ["--listen", "SSL://127.0.0.1:0", *ssl_args(pki, client_auth="required"), "--super-users", "User:admin",
            "--config", str(conf)]
    with serving_in_process(tmp_path_factory.mktemp("acls") / "data", args) as b:
        yield b


class TlsClient:
    """One TLS socket speaking the Kafka protocol through kafka-python's protocol classes, as
    the principal of `who`'s client certificate."""

    def __init__(self, port: int, pki: Pki, who: str) -> None:
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        pair = pki.clients[who]
        ctx.load_cert_chain(str(pair.cert), str(pair.key))
        raw = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.sock = ctx.wrap_socket(raw, server_hostname="localhost")
        self.proto = KafkaProtocol(client_id=f"acl-{who}")
        self._ready: deque[tuple[int, Any]] = deque()

    def request(self, request: Any) -> Any:
        corr = self.proto.send_request(request)
        self.sock.sendall(self.proto.send_bytes())
        while not self._ready:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("broker closed the connection")
            self._ready.extend(self.proto.receive_bytes(data))
        got, response = self._ready.popleft()
        assert got == corr
        return response

    def close(self) -> None:
        self.sock.close()


def open_clients(broker: InProcessBroker, pki: Pki) -> Iterator[dict[str, TlsClient]]:
    out = {who: TlsClient(broker.port, pki, who) for who in ("admin", "bob", "eve")}
    yield out
    for c in out.values():
        c.close()


def create_acls(c: TlsClient, *bindings: tuple[int, str, int, str, int, int]) -> list[int]:
    C = CreateAclsRequest.AclCreation
    resp = c.request(CreateAclsRequest[3](creations=[
        C(resource_type=t, resource_name=n, resource_pattern_type=p, principal=who, host="*", operation=op, permission_type=perm)
        for t, n, p, who, op, perm in bindings
    ]))
    return [r.error_code for r in resp.results]


def create_topic(c: TlsClient, name: str, partitions: int = 1) -> int:
    T = CreateTopicsRequest.CreatableTopic
    resp = c.request(CreateTopicsRequest[5](topics=[T(name=name, num_partitions=partitions, replication_factor=1)], timeout_ms=10_000))
    return int(resp.topics[0].error_code)


def grant(clients: dict[str, TlsClient]) -> None:
    """bob: everything on topics prefixed pub-, but no WRITE on pub-denied; his group and
    transactional ids; DESCRIBE on the cluster. eve: nothing."""
    admin = clients["admin"]
    assert create_acls(
        admin,
        (TOPIC, "pub-", PREFIXED, "User:bob", ALL, ALLOW),
        (TOPIC, "pub-denied", LITERAL, "User:bob", WRITE, DENY),
        (GROUP, "g-bob", LITERAL, "User:bob", ALL, ALLOW),
        (TXN_ID, "tx-bob", PREFIXED, "User:bob", ALL, ALLOW),
        (CLUSTER, "kafka-cluster", LITERAL, "User:bob", DESCRIBE, ALLOW),
    ) == [0] * 5
    for name in ("pub-t", "pub-denied"):
        assert create_topic(admin, name) in (0, E.TOPIC_ALREADY_EXISTS)


def batch(pid: int = -1, epoch: int = -1, seq: int = -1, transactional: bool = False) -> bytes:
    b = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=transactional)
    b.append(int(time.time() * 1000), None, b"v", [])
    return bytes(b.build())


def produce(c: TlsClient, topic: str, records: bytes, tid: str | None = None, partitions: tuple[int, ...] = (0,)) -> list[int]:
    P = ProduceRequest.TopicProduceData
    resp = c.request(ProduceRequest[9](
        transactional_id=tid, acks=-1, timeout_ms=10_000,
        topic_data=[P(name=topic, partition_data=[P.PartitionProduceData(index=i, records=records) for i in partitions])],
    ))
    return [p.error_code for t in resp.responses for p in t.partition_responses]


def offset_commit(c: TlsClient) -> int:
    T = OffsetCommitRequest.OffsetCommitRequestTopic
    resp = c.request(OffsetCommitRequest[8](group_id="g-bob", generation_id_or_member_epoch=-1, member_id="", topics=[
        T(name="pub-t", partitions=[T.OffsetCommitRequestPartition(partition_index=0, committed_offset=0)])]))
    return int(resp.topics[0].partitions[0].error_code)


def describe_acls(c: TlsClient) -> int:
    return int(c.request(DescribeAclsRequest[3](
        resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1, principal_filter=None, host_filter=None,
        operation=1, permission_type=1)).error_code)

def metadata_names(c: TlsClient, names: list[str] | None, create: bool = False) -> dict[str, int]:
    topics = None if names is None else [MetadataRequest.MetadataRequestTopic(name=n) for n in names]
    resp = c.request(MetadataRequest[12](topics=topics, allow_auto_topic_creation=create, include_topic_authorized_operations=True))
    return {t.name: t.error_code for t in resp.topics}
