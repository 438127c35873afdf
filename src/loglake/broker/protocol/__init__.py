"""Sans-IO Kafka wire protocol codec: frames in, requests out; responses in, buffers out.

No sockets, no asyncio. The server feeds received bytes to a `FrameDecoder`, hands each frame to
`decode_request`, and writes the buffers `encode_response` returns (``sendfile`` for file ranges).
See docs/_protocol.md.
"""

from loglake.broker.protocol.api_keys import ApiKey
from loglake.broker.protocol.codec import (
    DecodedRequest,
    api_versions_body,
    decode_request,
    encode_response,
    encode_unsupported_api_versions,
    join,
)
from loglake.broker.protocol.errors import (
    FrameTooLargeError,
    MalformedRequestError,
    ProtocolError,
    ResponseEncodingError,
    UnknownApiError,
    UnsupportedVersionError,
)
from loglake.broker.protocol.fetch import (
    BATCH_HEAD,
    AbortedTransaction,
    Chunk,
    EpochEndOffset,
    FetchPartition,
    FetchResponseData,
    FetchTopic,
    FileRangeLike,
    FileSlice,
    LeaderIdAndEpoch,
    NodeEndpoint,
    OutBuffer,
    SnapshotId,
    batch_bytes,
    buffers_len,
    encode_fetch_response,
    fetch_limit_violations,
)
from loglake.broker.protocol.framing import DEFAULT_MAX_FRAME_BYTES, FRAME_PREFIX_BYTES, FrameDecoder
from loglake.broker.protocol.messages import make_response, request_class, response_class
from loglake.broker.protocol.produce import ProducePartitionData, ProduceRequestData, ProduceTopicData
from loglake.broker.protocol.versions import DEFAULT_TABLE, SUPPORTED, ApiVersionRange, VersionTable

__all__ = [
    "BATCH_HEAD",
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_TABLE",
    "FRAME_PREFIX_BYTES",
    "SUPPORTED",
    "AbortedTransaction",
    "ApiKey",
    "ApiVersionRange",
    "Chunk",
    "DecodedRequest",
    "EpochEndOffset",
    "FetchPartition",
    "FetchResponseData",
    "FetchTopic",
    "FileRangeLike",
    "FileSlice",
    "FrameDecoder",
    "FrameTooLargeError",
    "LeaderIdAndEpoch",
    "MalformedRequestError",
    "NodeEndpoint",
    "OutBuffer",
    "ProducePartitionData",
    "ProduceRequestData",
    "ProduceTopicData",
    "ProtocolError",
    "ResponseEncodingError",
    "SnapshotId",
    "UnknownApiError",
    "UnsupportedVersionError",
    "VersionTable",
    "api_versions_body",
    "batch_bytes",
    "buffers_len",
    "decode_request",
    "encode_fetch_response",
    "encode_response",
    "encode_unsupported_api_versions",
    "fetch_limit_violations",
    "join",
    "make_response",
    "request_class",
    "response_class",
]
