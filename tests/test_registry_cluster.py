"""One schema registry served by every broker of a 3-broker cluster (real etcd, a shared folder):
a schema registered through one broker is read through the others, registrations racing on
different brokers get distinct versions and ids, and a record serialized through one broker's
registry is produced into the cluster and decoded through another's.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from clusterkit import running_cluster
from etcdkit import needs_etcd

import brokerkit

pytestmark = [needs_etcd]

T = TypeVar("T")

USER = json.dumps({"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"}]})
WAIT_S = 30.0


def until(fn: Callable[[], T], timeout_s: float = WAIT_S) -> T:
    """fn()'s first answer that is not an error (a broker applies etcd's records a moment later)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return fn()
        except SchemaRegistryError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_every_broker_serves_one_registry(tmp_path: Path) -> None:
    ports = [brokerkit.free_port() for _ in range(3)]
    with running_cluster(tmp_path, brokers=0, cold_store="file") as cluster:
        for node, port in enumerate(ports, start=1):
            cluster.add_broker(node, ["--schema-registry-listen", f"127.0.0.1:{port}"])
        clients = [SchemaRegistryClient({"url": f"http://127.0.0.1:{p}"}) for p in ports]
        first = clients[0].register_schema("users-value", Schema(USER, "AVRO"))
        for c in clients[1:]:
            assert until(lambda c=c: c.get_latest_version("users-value")).schema_id == first

        # racing registrations of different schemas on two brokers: one version and id each
        clients[0].set_compatibility("race", "NONE")
        until(lambda: clients[2].get_compatibility("race"))
        ids: list[int] = []
        errors: list[BaseException] = []

        def register(client: SchemaRegistryClient, n: int) -> None:
            try:
                for i in range(5):
                    ids.append(client.register_schema("race", Schema(json.dumps({"type": "enum", "name": "E", "symbols": [f"S{n}_{i}"]}), "AVRO")))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=register, args=(clients[n], n)) for n in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert len(set(ids)) == 10
        deadline = time.monotonic() + WAIT_S
        # broker 1 applies the registrations the other two made a moment later (404 until the first)
        while until(lambda: clients[0].get_versions("race")) != list(range(1, 11)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert clients[0].get_versions("race") == list(range(1, 11))

        # serialized through broker 3's registry, produced into the cluster, decoded through broker 1's
        topic = "users"
        cluster.create_topic(topic, 1)
        ctx = SerializationContext(topic, MessageField.VALUE)
        raw = AvroSerializer(clients[2], USER)({"name": "ada"}, ctx)
        assert raw is not None
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
        producer.produce(topic, raw)
        assert producer.flush(WAIT_S) == 0
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"})
        consumer.subscribe([topic])
        value = None
        try:
            deadline = time.monotonic() + WAIT_S
            while value is None and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    value = msg.value()
        finally:
            consumer.close()
        assert value is not None
        assert AvroDeserializer(SchemaRegistryClient({"url": f"http://127.0.0.1:{ports[0]}"}))(value, ctx) == {"name": "ada"}
