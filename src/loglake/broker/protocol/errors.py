"""Typed errors of the wire-protocol codec.

Decoding bytes from the network raises only `ProtocolError` subclasses, never `struct.error`,
`IndexError`, `UnicodeDecodeError` and the like. Each carries what the server needs to answer or
to close the connection: the correlation id when the request header got that far.
"""

from __future__ import annotations

from loglake.kafka_errors import ErrorCode


class ProtocolError(Exception):
    """Base of every error the protocol codec raises on purpose."""

    #: Kafka error code a broker would answer with (UNKNOWN_SERVER_ERROR unless known better).
    kafka_code: int = ErrorCode.UNKNOWN_SERVER_ERROR


class FrameTooLargeError(ProtocolError):
    """A size prefix is negative or above the frame limit (checked from the 4 prefix bytes)."""

    kafka_code = ErrorCode.INVALID_REQUEST

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame size {size} outside 0..{limit}")
        self.size = size
        self.limit = limit


class MalformedRequestError(ProtocolError):
    """The request frame does not decode (truncated, garbage, trailing bytes...)."""

    kafka_code = ErrorCode.INVALID_REQUEST

    def __init__(self, detail: str, correlation_id: int | None = None) -> None:
        where = "" if correlation_id is None else f" (correlation id {correlation_id})"
        super().__init__(f"malformed request{where}: {detail}")
        self.detail = detail
        self.correlation_id = correlation_id


class UnknownApiError(ProtocolError):
    """The api key is not one loglake serves."""

    kafka_code = ErrorCode.UNSUPPORTED_VERSION  # what Kafka answers for keys it does not know

    def __init__(self, api_key: int, correlation_id: int) -> None:
        super().__init__(f"unknown api key {api_key} (correlation id {correlation_id})")
        self.api_key = api_key
        self.correlation_id = correlation_id


class UnsupportedVersionError(ProtocolError):
    """The api key is served but not at this version.

    For ApiVersions (key 18) the server answers per KIP-511 with
    `codec.encode_unsupported_api_versions`; for other keys Kafka closes the connection.
    """

    kafka_code = ErrorCode.UNSUPPORTED_VERSION

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(
            f"api key {api_key} version {api_version} not supported (correlation id {correlation_id})"
        )
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


class ResponseEncodingError(ProtocolError):
    """A handler built a response that does not encode (wrong api, bad field values)."""


__all__ = [
    "FrameTooLargeError",
    "MalformedRequestError",
    "ProtocolError",
    "ResponseEncodingError",
    "UnknownApiError",
    "UnsupportedVersionError",
]
