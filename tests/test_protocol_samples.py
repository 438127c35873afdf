"""Schema-driven sample messages for the protocol tests (and a few tests of the generator).

`sample(cls, version, rng)` fills every field a version has (tagged ones included) with random
values of the field's type, using kafka-python's own schema objects, so every API and version
can be exercised without writing each message by hand.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
from kafka.protocol.parser import KafkaProtocol
from kafka.protocol.schemas.fields import ArrayField, SimpleField, StructArrayField, StructField
from kafka.protocol.schemas.fields.codecs import (
    UUID,
    BitField,
    Boolean,
    Bytes,
    Float64,
    Int8,
    Int16,
    Int32,
    Int64,
    String,
    UnsignedInt16,
)

from loglake.broker.protocol import SUPPORTED, request_class, response_class

_INT_RANGES = {Int8: 7, Int16: 15, Int32: 31, Int64: 63}


def _simple(field: Any, version: int, rng: random.Random, element: bool = False) -> Any:
    t = field._type
    if t in _INT_RANGES:
        bits = _INT_RANGES[t]
        return rng.choice([0, -1, 1, rng.randint(-(2**bits), 2**bits - 1)])
    if t is UnsignedInt16:
        return rng.randint(0, 65535)
    if t is Boolean:
        return rng.random() < 0.5
    if t is Float64:
        return rng.choice([0.0, 1.5, -2.25])
    if t is UUID:
        return None if rng.random() < 0.2 else uuid.UUID(int=rng.getrandbits(128))
    if t is BitField:
        return rng.choice([None, {0, 3}, {1}])
    # Array elements are never null in Kafka (nullableVersions is the array's own).
    nullable = field.nullable_for_version_q(version) and not element
    if isinstance(t, String):
        if nullable and rng.random() < 0.2:
            return None
        return rng.choice(["", "a", "topic-é", "x" * rng.randint(1, 40)])
    if t is Bytes:
        if nullable and rng.random() < 0.2:
            return None
        return rng.randbytes(rng.randint(0, 64))
    raise AssertionError(f"no sample for {field!r}")


def _value(field: Any, version: int, rng: random.Random, depth: int) -> Any:
    nullable = field.nullable_for_version_q(version)
    if isinstance(field, StructArrayField):
        if nullable and rng.random() < 0.2:
            return None
        n = rng.randint(0, 3 if depth < 2 else 1)
        return [_struct(field, version, rng, depth + 1) for _ in range(n)]
    if isinstance(field, ArrayField):
        if nullable and rng.random() < 0.2:
            return None
        return [_simple(field.array_of, version, rng, element=True) for _ in range(rng.randint(0, 3))]
    if isinstance(field, StructField):
        if (nullable or field.tag is not None) and rng.random() < 0.3:
            return None
        return _struct(field, version, rng, depth + 1)
    assert isinstance(field, SimpleField)
    return _simple(field, version, rng)


def _fields(struct: Any, version: int, rng: random.Random, depth: int) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for f in struct.fields.values():
        if not f.for_version_q(version):
            continue
        if f.tag is not None and f.tagged_field_q(version) and rng.random() < 0.4:
            continue  # leave some tagged fields at their default (not written)
        values[f.name] = _value(f, version, rng, depth)
    return values


def _struct(field: Any, version: int, rng: random.Random, depth: int) -> Any:
    return field.data_class(**_fields(field, version, rng, depth))


def sample(cls: Any, version: int, rng: random.Random) -> Any:
    """A version-bound kafka-python message with every field of `version` filled in."""
    return cls[version](**_fields(cls._struct, version, rng, 0))


def sample_request(api_key: int, version: int, seed: int = 0) -> Any:
    return sample(request_class(api_key), version, random.Random(f"{api_key}/{version}/{seed}"))


def sample_response(api_key: int, version: int, seed: int = 0) -> Any:
    return sample(response_class(api_key), version, random.Random(f"r{api_key}/{version}/{seed}"))


def client_bytes(request: Any, correlation_id: int = 1, client_id: str = "test-client") -> bytes:
    """Exactly what kafka-python's client sends for `request`: the framed request."""
    proto = KafkaProtocol(client_id=client_id)
    proto.send_request(request, correlation_id=correlation_id)
    return bytes(proto.send_bytes())


def all_versions() -> list[tuple[int, int]]:
    return [(r.api_key, v) for r in SUPPORTED.values() for v in range(r.min_version, r.max_version + 1)]


@pytest.mark.parametrize(("api_key", "version"), all_versions())
def test_samples_encode(api_key: int, version: int) -> None:
    req = sample_request(api_key, version)
    # Some bodies are legitimately empty (ListGroups v0).
    assert isinstance(req.encode(version=version), bytes | bytearray)
    resp = sample_response(api_key, version)
    assert isinstance(resp.encode(version=version), bytes | bytearray)
