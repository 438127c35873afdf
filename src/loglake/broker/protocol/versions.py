"""The API versions loglake advertises in its ApiVersions response.

Floors follow KIP-896 (Apache Kafka 4.0 removed every version older than the 2.1 baseline);
kafka-python 3.0.12 ships Kafka's own 4.x JSON schemas whose ``validVersions`` already carry these
floors, and `tests/test_protocol_versions.py` checks this table against them. Maxima are the
schemas' maxima except where noted. Keys and names are `api_keys.ApiKey`'s. See docs/_protocol.md for the reasoning per API.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple

from loglake.broker.protocol.api_keys import ApiKey


class ApiVersionRange(NamedTuple):
    api_key: ApiKey
    #: Kafka's message name (``ApiVersions``), from `ApiKey.kafka_name`.
    name: str
    min_version: int
    max_version: int
    #: The minimum put in the ApiVersions response when it differs from `min_version`.
    #: Produce advertises 0 like Kafka 4.0 (KAFKA-18659): librdkafka < 2.8 otherwise turns
    #: compression off; versions below `min_version` are still rejected on receipt.
    advertised_min: int


def _r(api_key: ApiKey, lo: int, hi: int, advertised_min: int | None = None) -> ApiVersionRange:
    return ApiVersionRange(api_key, api_key.kafka_name, lo, hi, lo if advertised_min is None else advertised_min)


#: api_key -> range. Notes on maxima:
#: - Produce 12: v13 replaces topic names with topic ids (Kafka 4.1); no common client needs it.
#: - Fetch 18: v13+ address topics by id only, so handlers must map topic ids (the engine has them)
#:   and Metadata must return real topic ids; librdkafka 2.x sends v16, kafka-python 3 sends v12.
#: - OffsetCommit / OffsetFetch 9: v10 is the KIP-848 topic-id form only.
#: - ConsumerGroupHeartbeat / ConsumerGroupDescribe 68/69 (KIP-848): schemas are loglake's own
#:   (protocol/schemas/), kafka-python 3.0.12 has none.
#: - ShareGroupHeartbeat/ShareGroupDescribe/ShareFetch/ShareAcknowledge 76-79 (KIP-932): v1 only, the
#:   stable version of Kafka 4.1 (v0 was 4.0's early access); schemas are loglake's own (kip932.py).
#:   ShareFetch/ShareAcknowledge v2 (KIP-1206/1222 acquire modes, Renew) are not served.
#:   Describe/Alter/DeleteShareGroupOffsets 90-92: v0, Kafka 4.1's.
#: - SaslHandshake 0 is accepted only to refuse it clearly (v0 means raw SASL tokens without
#:   SaslAuthenticate, clients before Kafka 1.0); loglake.broker.security.sasl.
#: - EndTxn 4: v5 is KIP-890 part 2 (an epoch bump per transaction, transaction.version 2), which
#:   loglake does not finalize; the other transaction APIs' newest versions only add error codes.
SUPPORTED: dict[int, ApiVersionRange] = {
    r.api_key: r
    for r in (
        _r(ApiKey.PRODUCE, 3, 12, advertised_min=0),
        _r(ApiKey.FETCH, 4, 18),
        _r(ApiKey.LIST_OFFSETS, 1, 11),
        _r(ApiKey.METADATA, 0, 13),
        _r(ApiKey.OFFSET_COMMIT, 2, 9),
        _r(ApiKey.OFFSET_FETCH, 1, 9),
        _r(ApiKey.FIND_COORDINATOR, 0, 6),
        _r(ApiKey.JOIN_GROUP, 0, 9),
        _r(ApiKey.HEARTBEAT, 0, 4),
        _r(ApiKey.LEAVE_GROUP, 0, 5),
        _r(ApiKey.SYNC_GROUP, 0, 5),
        _r(ApiKey.DESCRIBE_GROUPS, 0, 6),
        _r(ApiKey.LIST_GROUPS, 0, 5),
        _r(ApiKey.SASL_HANDSHAKE, 0, 1),
        _r(ApiKey.API_VERSIONS, 0, 4),
        _r(ApiKey.CREATE_TOPICS, 2, 7),
        _r(ApiKey.DELETE_TOPICS, 1, 6),
        _r(ApiKey.DELETE_RECORDS, 0, 2),
        _r(ApiKey.INIT_PRODUCER_ID, 0, 6),
        _r(ApiKey.OFFSET_FOR_LEADER_EPOCH, 2, 4),
        _r(ApiKey.ADD_PARTITIONS_TO_TXN, 0, 5),
        _r(ApiKey.ADD_OFFSETS_TO_TXN, 0, 4),
        _r(ApiKey.END_TXN, 0, 4),
        _r(ApiKey.TXN_OFFSET_COMMIT, 0, 5),
        _r(ApiKey.DESCRIBE_ACLS, 1, 3),
        _r(ApiKey.CREATE_ACLS, 1, 3),
        _r(ApiKey.DELETE_ACLS, 1, 3),
        _r(ApiKey.DESCRIBE_CONFIGS, 1, 4),
        _r(ApiKey.ALTER_CONFIGS, 0, 2),
        _r(ApiKey.DESCRIBE_LOG_DIRS, 1, 5),
        _r(ApiKey.SASL_AUTHENTICATE, 0, 2),
        _r(ApiKey.CREATE_PARTITIONS, 0, 3),
        _r(ApiKey.DELETE_GROUPS, 0, 2),
        _r(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, 1),
        _r(ApiKey.OFFSET_DELETE, 0, 0),
        _r(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, 0),
        _r(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, 0),
        _r(ApiKey.DESCRIBE_CLIENT_QUOTAS, 0, 1),
        _r(ApiKey.ALTER_CLIENT_QUOTAS, 0, 1),
        _r(ApiKey.DESCRIBE_CLUSTER, 0, 2),
        _r(ApiKey.DESCRIBE_PRODUCERS, 0, 0),
        _r(ApiKey.DESCRIBE_TRANSACTIONS, 0, 0),
        _r(ApiKey.LIST_TRANSACTIONS, 0, 2),
        _r(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, 1),
        _r(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, 1),
        _r(ApiKey.SHARE_GROUP_HEARTBEAT, 1, 1),
        _r(ApiKey.SHARE_GROUP_DESCRIBE, 1, 1),
        _r(ApiKey.SHARE_FETCH, 1, 1),
        _r(ApiKey.SHARE_ACKNOWLEDGE, 1, 1),
        _r(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 0, 0),
        _r(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, 0),
        _r(ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, 0),
    )
}


class VersionTable:
    """An immutable view of supported ranges; `capped` derives a narrower table."""

    __slots__ = ("_ranges",)

    def __init__(self, ranges: Mapping[int, ApiVersionRange] = SUPPORTED) -> None:
        self._ranges = dict(ranges)

    def get(self, api_key: int) -> ApiVersionRange | None:
        return self._ranges.get(api_key)

    def __contains__(self, api_key: object) -> bool:
        return api_key in self._ranges

    def __iter__(self) -> Iterator[ApiVersionRange]:
        return iter(sorted(self._ranges.values()))

    def __len__(self) -> int:
        return len(self._ranges)

    def supports(self, api_key: int, api_version: int) -> bool:
        r = self._ranges.get(api_key)
        return r is not None and r.min_version <= api_version <= r.max_version

    def capped(self, max_versions: Mapping[int, int]) -> VersionTable:
        """A table with lower maxima, e.g. ``capped({ApiKey.FETCH: 12})`` to serve topics by name only."""
        ranges = dict(self._ranges)
        for key, hi in max_versions.items():
            r = ranges[key]
            if not r.min_version <= hi <= r.max_version:
                raise ValueError(f"cap {hi} outside {r.name} {r.min_version}..{r.max_version}")
            ranges[key] = r._replace(max_version=hi)
        return VersionTable(ranges)

    def without(self, *api_keys: int) -> VersionTable:
        """A table that does not advertise these keys (APIs the server has no handler for)."""
        return VersionTable({k: r for k, r in self._ranges.items() if k not in api_keys})

    def api_versions_entries(self) -> list[tuple[int, int, int]]:
        """(api_key, min_version, max_version) as advertised in the ApiVersions response."""
        return [(r.api_key, r.advertised_min, r.max_version) for r in self]


DEFAULT_TABLE = VersionTable()

__all__ = [
    "DEFAULT_TABLE",
    "SUPPORTED",
    "ApiVersionRange",
    "VersionTable",
]
