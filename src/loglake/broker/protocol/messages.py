"""kafka-python's schema-generated message classes, by api key, and helpers to build responses.

kafka-python 3 generates one class per Kafka message from Kafka's JSON schemas
(``kafka/protocol/schemas/resources``). ``SomeResponse[version]`` is a version-bound subclass;
instances are slotted containers whose attributes are the schema fields in snake_case, and whose
nested structs are classes reachable as attributes of the message class, named like the schema
types (``MetadataResponse.MetadataResponseTopic``). Fields not given take the schema default.

`make_response(api_key, version, {...})` builds a response from plain dicts/lists (nested dicts
become the nested struct classes), which is what handlers should use.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    AlterConfigsRequest,
    AlterConfigsResponse,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    CreateAclsRequest,
    CreateAclsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from loglake.broker.protocol.errors import ResponseEncodingError
from loglake.broker.protocol.kafka_types import KafkaClass, KafkaField, KafkaStruct
from loglake.broker.protocol.kip848 import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
)
from loglake.broker.protocol.kip932 import (
    AlterShareGroupOffsetsRequest,
    AlterShareGroupOffsetsResponse,
    DeleteShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsResponse,
    DescribeShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsResponse,
    ShareAcknowledgeRequest,
    ShareAcknowledgeResponse,
    ShareFetchRequest,
    ShareFetchResponse,
    ShareGroupDescribeRequest,
    ShareGroupDescribeResponse,
    ShareGroupHeartbeatRequest,
    ShareGroupHeartbeatResponse,
)

#: api_key -> (request class, response class); the primary (unversioned) kafka-python classes.
MESSAGES: dict[int, tuple[KafkaClass, KafkaClass]] = {
    req.API_KEY: (req, resp)
    for req, resp in (
        (ProduceRequest, ProduceResponse),
        (FetchRequest, FetchResponse),
        (ListOffsetsRequest, ListOffsetsResponse),
        (MetadataRequest, MetadataResponse),
        (OffsetCommitRequest, OffsetCommitResponse),
        (OffsetFetchRequest, OffsetFetchResponse),
        (FindCoordinatorRequest, FindCoordinatorResponse),
        (JoinGroupRequest, JoinGroupResponse),
        (HeartbeatRequest, HeartbeatResponse),
        (LeaveGroupRequest, LeaveGroupResponse),
        (SyncGroupRequest, SyncGroupResponse),
        (DescribeGroupsRequest, DescribeGroupsResponse),
        (ListGroupsRequest, ListGroupsResponse),
        (ApiVersionsRequest, ApiVersionsResponse),
        (CreateTopicsRequest, CreateTopicsResponse),
        (DeleteTopicsRequest, DeleteTopicsResponse),
        (DeleteRecordsRequest, DeleteRecordsResponse),
        (InitProducerIdRequest, InitProducerIdResponse),
        (DescribeAclsRequest, DescribeAclsResponse),
        (CreateAclsRequest, CreateAclsResponse),
        (DeleteAclsRequest, DeleteAclsResponse),
        (DescribeConfigsRequest, DescribeConfigsResponse),
        (AlterConfigsRequest, AlterConfigsResponse),
        (CreatePartitionsRequest, CreatePartitionsResponse),
        (DeleteGroupsRequest, DeleteGroupsResponse),
        (IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse),
        (DescribeClusterRequest, DescribeClusterResponse),
        (DescribeClientQuotasRequest, DescribeClientQuotasResponse),
        (AlterClientQuotasRequest, AlterClientQuotasResponse),
        (OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse),
        (DescribeLogDirsRequest, DescribeLogDirsResponse),
        (OffsetDeleteRequest, OffsetDeleteResponse),
        (DescribeProducersRequest, DescribeProducersResponse),
        (ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse),
        (ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse),
        (ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse),
        (ShareGroupDescribeRequest, ShareGroupDescribeResponse),
        (ShareFetchRequest, ShareFetchResponse),
        (ShareAcknowledgeRequest, ShareAcknowledgeResponse),
        (DescribeShareGroupOffsetsRequest, DescribeShareGroupOffsetsResponse),
        (AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsResponse),
        (DeleteShareGroupOffsetsRequest, DeleteShareGroupOffsetsResponse),
        (AddPartitionsToTxnRequest, AddPartitionsToTxnResponse),
        (AddOffsetsToTxnRequest, AddOffsetsToTxnResponse),
        (EndTxnRequest, EndTxnResponse),
        (TxnOffsetCommitRequest, TxnOffsetCommitResponse),
        (DescribeTransactionsRequest, DescribeTransactionsResponse),
        (ListTransactionsRequest, ListTransactionsResponse),
        (SaslHandshakeRequest, SaslHandshakeResponse),
        (SaslAuthenticateRequest, SaslAuthenticateResponse),
        (DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse),
        (AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse),
    )
}


def request_class(api_key: int) -> KafkaClass:
    """The primary kafka-python request class of this api key (KeyError if not served)."""
    return MESSAGES[api_key][0]


def response_class(api_key: int, version: int | None = None) -> KafkaClass:
    """The kafka-python response class; with `version`, the version-bound class ``Cls[version]``."""
    cls = MESSAGES[api_key][1]
    return cls if version is None else cls[version]


def schema_versions(api_key: int) -> tuple[int, int]:
    """(min, max) valid versions in kafka-python's schema (Kafka's ``validVersions``)."""
    lo, hi = request_class(api_key).valid_versions
    return int(lo), int(hi)


def is_flexible(api_key: int, version: int) -> bool:
    return bool(request_class(api_key).flexible_version_q(version))


def _convert(struct: KafkaField, version: int, values: Mapping[str, object], path: str) -> dict[str, object]:
    """Field values with nested dicts turned into the struct's kafka-python classes."""
    fields = struct.fields  # snake_case name -> field
    out: dict[str, object] = {}
    for name, value in values.items():
        field = fields.get(name)
        if field is None:
            raise ResponseEncodingError(f"{path}: unknown field {name!r} (fields: {', '.join(fields)})")
        if isinstance(value, Iterable) and field.is_struct_array():
            value = [
                _nested(field, version, v, f"{path}.{name}[{i}]") if isinstance(v, Mapping) else v
                for i, v in enumerate(value)
            ]
        elif value is not None and field.is_struct() and isinstance(value, Mapping):
            value = _nested(field, version, value, f"{path}.{name}")
        out[name] = value
    return out


def _nested(field: KafkaField, version: int, values: Mapping[str, object], path: str) -> KafkaStruct:
    # Binding the version makes the constructor store every default in its slot; unbound objects
    # resolve defaults through a slow __getattr__ on every encode (about 10x slower encoding).
    try:
        return field.data_class(**_convert(field, version, values, path), version=version)
    except (TypeError, ValueError) as e:
        raise ResponseEncodingError(f"{path}: {e}") from e


def make_response(api_key: int, version: int, fields: Mapping[str, object] | None = None, **kw: object) -> KafkaStruct:
    """A kafka-python response object bound to `version`, from plain values.

    Nested structs may be dicts or kafka-python struct objects; unknown field names raise
    `ResponseEncodingError`. Fields left out take the schema default (``[]`` for arrays, ``""``
    for strings, ``0``/``-1`` for numbers as the schema says). Example::

        make_response(ApiKey.METADATA, 12, throttle_time_ms=0, cluster_id="c", controller_id=1,
                      brokers=[{"node_id": 1, "host": "h", "port": 9092}], topics=[])
    """
    cls = response_class(api_key, version)
    values = {**(fields or {}), **kw}
    converted = _convert(cls._struct, version, values, cls.name)
    try:
        return cls(**converted)
    except (TypeError, ValueError) as e:
        raise ResponseEncodingError(f"{cls.name}: {e}") from e


__all__ = ["MESSAGES", "is_flexible", "make_response", "request_class", "response_class", "schema_versions"]
