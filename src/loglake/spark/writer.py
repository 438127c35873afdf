"""Executor-side writing: rows -> records produced to a running loglake broker (Kafka protocol).

confluent-kafka (librdkafka) is used rather than kafka-python: its idempotent producer is
mature (acks=all, enable.idempotence, retries without duplicates or reordering per partition),
batching and compression run in C off the Python thread, and delivery reports tell us exactly
which records the broker acknowledged. kafka-python's client code is not used anywhere in
loglake (only its protocol classes).

Semantics are Kafka's sink's: at-least-once. A task that fails after some of its records were
acknowledged is retried by Spark and produces them again; idempotence only removes duplicates
caused by the producer's own retries inside one task attempt.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from loglake.spark.options import WriteOptions

#: How long a task waits at its end for outstanding acknowledgements.
FLUSH_TIMEOUT_S = 120.0


class LoglakeWriteError(RuntimeError):
    """The broker did not acknowledge every record of a task."""


def _bytes(v: Any) -> bytes | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode("utf-8")
    return bytes(v)


def _timestamp_ms(v: Any) -> int:
    if v is None:
        return 0
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:
            v = v.astimezone()  # Spark gives naive local datetimes for TimestampType
        return int(v.timestamp() * 1000)
    return int(v)


def producer_config(opts: WriteOptions) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "linger.ms": 5,
        "compression.type": "lz4",
        **opts.producer_config,
        "bootstrap.servers": opts.bootstrap_servers,
    }
    # the guarantees the sink documents cannot be switched off
    conf["acks"] = "all"
    conf["enable.idempotence"] = True
    return conf


def produce_rows(opts: WriteOptions, rows: Iterator[Any]) -> int:
    """Produce every row; return how many the broker acknowledged (all, or raise)."""
    try:
        from confluent_kafka import KafkaException, Producer
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise LoglakeWriteError(
            "writing to loglake needs confluent-kafka on the executors (pip install confluent-kafka)"
        ) from exc

    producer = Producer(producer_config(opts))
    acked = 0
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        nonlocal acked
        if err is not None:
            errors.append(f"{msg.topic()}-{msg.partition()}: {err}")
        else:
            acked += 1

    fields: list[str] | None = None
    for sent, row in enumerate(rows, 1):
        if fields is None:
            fields = list(row.__fields__) if hasattr(row, "__fields__") else []
        rec = dict(zip(fields, row, strict=False))
        topic = opts.topic or rec.get("topic")
        if not topic:
            raise LoglakeWriteError("a row has no topic (null topic column and no topic option)")
        headers = rec.get("headers")
        kwargs: dict[str, Any] = {
            "value": _bytes(rec.get("value")),
            "key": _bytes(rec.get("key")),
            "on_delivery": delivered,
        }
        if rec.get("partition") is not None:
            kwargs["partition"] = int(rec["partition"])
        ts = _timestamp_ms(rec.get("timestamp"))
        if ts:
            kwargs["timestamp"] = ts
        if headers:
            kwargs["headers"] = [(h[0], _bytes(h[1])) for h in headers]
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.05)  # local queue full: serve delivery reports, then retry
            except KafkaException as exc:
                raise LoglakeWriteError(f"producing to {topic}: {exc}") from exc
        if sent % 1000 == 0:
            producer.poll(0)
        if errors:
            break
    left = producer.flush(FLUSH_TIMEOUT_S)
    if errors:
        raise LoglakeWriteError(f"{len(errors)} records were not acknowledged; first: {errors[0]}")
    if left:
        raise LoglakeWriteError(f"{left} records still unacknowledged after {FLUSH_TIMEOUT_S:.0f}s")
    return acked
