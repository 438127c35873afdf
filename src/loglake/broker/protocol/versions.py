"""The API versions loglake advertises in its ApiVersions response.

Floors follow KIP-896 (Apache Kafka 4.0 removed every version older than the 2.1 baseline);
kafka-python 3.0.12 ships Kafka's own 4.x JSON schemas whose ``validVersions`` already carry these
floors, and `tests/test_protocol_versions.py` checks this table against them. Maxima are the
schemas' maxima except where noted. See docs/_protocol.md for the reasoning per API.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple


class ApiVersionRange(NamedTuple):
    api_key: int
    name: str
    min_version: int
    max_version: int
    #: The minimum put in the ApiVersions response when it differs from `min_version`.
    #: Produce advertises 0 like Kafka 4.0 (KAFKA-18659): librdkafka < 2.8 otherwise turns
    #: compression off; versions below `min_version` are still rejected on receipt.
    advertised_min: int


def _r(api_key: int, name: str, lo: int, hi: int, advertised_min: int | None = None) -> ApiVersionRange:
    return ApiVersionRange(api_key, name, lo, hi, lo if advertised_min is None else advertised_min)


#: api_key -> range. Notes on maxima:
#: - Produce 12: v13 replaces topic names with topic ids (Kafka 4.1); no common client needs it.
#: - Fetch 18: v13+ address topics by id only, so handlers must map topic ids (the engine has them)
#:   and Metadata must return real topic ids; librdkafka 2.x sends v16, kafka-python 3 sends v12.
#: - OffsetCommit / OffsetFetch 9: v10 is the KIP-848 topic-id form only.
#: - ConsumerGroupHeartbeat / ConsumerGroupDescribe 68/69 (KIP-848): schemas are loglake's own
#:   (protocol/schemas/), kafka-python 3.0.12 has none.
#: - SaslHandshake 0 is accepted only to refuse it clearly (v0 means raw SASL tokens without
#:   SaslAuthenticate, clients before Kafka 1.0); loglake.broker.sasl.
#: - EndTxn 4: v5 is KIP-890 part 2 (an epoch bump per transaction, transaction.version 2), which
#:   loglake does not finalize; the other transaction APIs' newest versions only add error codes.
SUPPORTED: dict[int, ApiVersionRange] = {
    r.api_key: r
    for r in (
        _r(0, "Produce", 3, 12, advertised_min=0),
        _r(1, "Fetch", 4, 18),
        _r(2, "ListOffsets", 1, 11),
        _r(3, "Metadata", 0, 13),
        _r(8, "OffsetCommit", 2, 9),
        _r(9, "OffsetFetch", 1, 9),
        _r(10, "FindCoordinator", 0, 6),
        _r(11, "JoinGroup", 0, 9),
        _r(12, "Heartbeat", 0, 4),
        _r(13, "LeaveGroup", 0, 5),
        _r(14, "SyncGroup", 0, 5),
        _r(15, "DescribeGroups", 0, 6),
        _r(16, "ListGroups", 0, 5),
        _r(17, "SaslHandshake", 0, 1),
        _r(18, "ApiVersions", 0, 4),
        _r(19, "CreateTopics", 2, 7),
        _r(20, "DeleteTopics", 1, 6),
        _r(21, "DeleteRecords", 0, 2),
        _r(22, "InitProducerId", 0, 6),
        _r(23, "OffsetForLeaderEpoch", 2, 4),
        _r(24, "AddPartitionsToTxn", 0, 5),
        _r(25, "AddOffsetsToTxn", 0, 4),
        _r(26, "EndTxn", 0, 4),
        _r(28, "TxnOffsetCommit", 0, 5),
        _r(29, "DescribeAcls", 1, 3),
        _r(30, "CreateAcls", 1, 3),
        _r(31, "DeleteAcls", 1, 3),
        _r(32, "DescribeConfigs", 1, 4),
        _r(33, "AlterConfigs", 0, 2),
        _r(35, "DescribeLogDirs", 1, 5),
        _r(36, "SaslAuthenticate", 0, 2),
        _r(37, "CreatePartitions", 0, 3),
        _r(42, "DeleteGroups", 0, 2),
        _r(44, "IncrementalAlterConfigs", 0, 1),
        _r(47, "OffsetDelete", 0, 0),
        _r(50, "DescribeUserScramCredentials", 0, 0),
        _r(51, "AlterUserScramCredentials", 0, 0),
        _r(60, "DescribeCluster", 0, 2),
        _r(61, "DescribeProducers", 0, 0),
        _r(65, "DescribeTransactions", 0, 0),
        _r(66, "ListTransactions", 0, 2),
        _r(68, "ConsumerGroupHeartbeat", 0, 1),
        _r(69, "ConsumerGroupDescribe", 0, 1),
    )
}

API_VERSIONS_KEY = 18
PRODUCE_KEY = 0
FETCH_KEY = 1


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
        """A table with lower maxima, e.g. ``capped({FETCH_KEY: 12})`` to serve topics by name only."""
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
    "API_VERSIONS_KEY",
    "DEFAULT_TABLE",
    "FETCH_KEY",
    "PRODUCE_KEY",
    "SUPPORTED",
    "ApiVersionRange",
    "VersionTable",
]
