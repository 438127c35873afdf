"""The advertised version table against kafka-python's (Kafka's) schemas."""

from __future__ import annotations

import pytest

from loglake.broker.protocol import DEFAULT_TABLE, SUPPORTED, request_class, response_class
from loglake.broker.protocol.codec import api_versions_body
from loglake.broker.protocol.messages import schema_versions

# KIP-896 (Kafka 4.0) floors for the APIs we serve.
KIP_896_FLOORS = {0: 3, 1: 4, 2: 1, 3: 0, 8: 2, 9: 1, 19: 2, 20: 1, 23: 2, 32: 1, 35: 1}


@pytest.mark.parametrize("api_key", sorted(SUPPORTED))
def test_within_schema(api_key: int) -> None:
    r = SUPPORTED[api_key]
    lo, hi = schema_versions(api_key)
    assert lo <= r.min_version <= r.max_version <= hi
    assert r.min_version == lo  # floors are Kafka 4's validVersions
    assert request_class(api_key).name == r.name + "Request"
    assert response_class(api_key).valid_versions == request_class(api_key).valid_versions
    assert r.min_version >= KIP_896_FLOORS.get(api_key, 0)


def test_all_requested_apis_present() -> None:
    wanted = {18, 3, 0, 1, 2, 10, 11, 14, 12, 13, 8, 9, 16, 15, 42, 19, 20, 37, 32, 33, 44, 21, 22, 60, 23, 35, 47, 61, 68, 69}
    wanted |= {24, 25, 26, 28, 65, 66}  # transactions
    wanted |= {29, 30, 31}  # ACLs
    wanted |= {17, 36, 50, 51}  # SASL and SCRAM credentials
    wanted |= {48, 49}  # client quotas
    wanted |= {76, 77, 78, 79, 90, 91, 92}  # share groups (KIP-932)
    assert set(SUPPORTED) == wanted


def test_produce_advertised_from_zero() -> None:
    assert SUPPORTED[0].advertised_min == 0 and SUPPORTED[0].min_version == 3
    assert not DEFAULT_TABLE.supports(0, 2)
    assert DEFAULT_TABLE.supports(0, 3)


def test_capped_and_without() -> None:
    t = DEFAULT_TABLE.capped({1: 12})
    assert t.get(1) is not None and t.get(1).max_version == 12  # type: ignore[union-attr]
    assert DEFAULT_TABLE.get(1).max_version == 18  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        DEFAULT_TABLE.capped({1: 3})
    assert 60 not in DEFAULT_TABLE.without(60)


@pytest.mark.parametrize("version", range(5))
def test_api_versions_body_encodes(version: int) -> None:
    body = api_versions_body(DEFAULT_TABLE, version)
    assert len(body.encode(version=version)) > 6 * len(SUPPORTED)
