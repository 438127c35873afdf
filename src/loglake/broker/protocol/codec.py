"""Request decoding and response encoding (sans-IO: frames in, buffers out).

``decode_request(frame)`` takes one frame without its size prefix (see `framing.FrameDecoder`)
and returns a `DecodedRequest`. Its ``body`` is:

- Produce: a `produce.ProduceRequestData` (records stay opaque memoryview slices of the frame);
- every other API: the kafka-python request object (``kafka.protocol...XRequest``) decoded by
  kafka-python's schema-generated decoder, with attributes named as the schema fields in
  snake_case (``body.topics[0].name``).

``encode_response(req, response)`` returns the framed response (size prefix, response header,
body) as a list of buffers to write in order. ``response`` is a kafka-python response object
(see `messages.make_response`), a plain mapping of its fields, or for Fetch a
`fetch.FetchResponseData` (zero-copy path).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kafka.protocol.schemas.fields import ArrayField, SimpleField, StructArrayField, StructField
from kafka.protocol.schemas.fields.codecs import Bytes, EncodeBuffer, String
from kafka.protocol.schemas.fields.codegen import CodegenContext

from loglake.broker.protocol._wire import I32, WireError, read_string, skip_tagged_fields
from loglake.broker.protocol.api_keys import ApiKey
from loglake.broker.protocol.errors import (
    MalformedRequestError,
    ResponseEncodingError,
    UnknownApiError,
    UnsupportedVersionError,
)
from loglake.broker.protocol.fetch import FetchResponseData, OutBuffer, encode_fetch_response
from loglake.broker.protocol.kafka_types import KafkaField, KafkaStruct
from loglake.broker.protocol.messages import make_response, request_class, response_class
from loglake.broker.protocol.produce import (
    ProduceRequestData,
    ProduceResponseData,
    decode_produce_body,
    encode_produce_response,
)
from loglake.broker.protocol.versions import DEFAULT_TABLE, VersionTable
from loglake.kafka_errors import ErrorCode

#: A response as a handler gives it to `encode_response`: a mapping of its fields (the usual
#: form), a kafka-python response object, or Fetch's FetchResponseData and Produce's
#: ProduceResponseData (the hot paths, encoded without kafka-python's objects).
Response = Mapping[str, object] | FetchResponseData | ProduceResponseData | KafkaStruct


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    #: Request header version: 1, or 2 for flexible versions (tagged fields in the header).
    header_version: int
    #: Produce: ProduceRequestData; others: the kafka-python request object.
    body: KafkaStruct
    #: Bytes of the request frame (after the length prefix): what a produce byte-rate quota counts.
    size: int = 0

    @property
    def flexible(self) -> bool:
        return self.header_version >= 2

    @property
    def response_header_version(self) -> int:
        """0, or 1 for flexible versions; ApiVersions responses always use header v0."""
        return 1 if self.flexible and self.api_key != ApiKey.API_VERSIONS else 0

    @property
    def expects_response(self) -> bool:
        """False only for Produce with acks=0."""
        return not (self.api_key == ApiKey.PRODUCE and self.body.acks == 0)


# --- generic body decoding ------------------------------------------------------------------


class _TagReader:
    """What kafka-python's tagged-field decoder reads from, over the frame without copying it.

    kafka-python's generated code does ``BytesIO(bytes(data[pos:]))`` whenever a tagged-field
    section is not empty: a copy of the rest of the frame per section, quadratic in the number of
    sections. The generated source is patched to use this reader instead.
    """

    __slots__ = ("_data", "_pos", "_start")

    def __init__(self, data: memoryview, pos: int) -> None:
        self._data = data
        self._start = pos
        self._pos = pos

    def read(self, n: int = -1) -> bytes:
        end = len(self._data) if n < 0 else self._pos + n
        if end > len(self._data):
            raise WireError(f"tagged field past end at {self._pos}")
        out = bytes(self._data[self._pos : end])
        self._pos = end
        return out

    def tell(self) -> int:
        return self._pos - self._start


_COPYING_LINE = "_BytesIO(bytes(data[pos:]))"
#: A generated decoder: (frame, position of the body) -> (the request object, position after it).
_Decode = Callable[[memoryview, int], tuple[KafkaStruct, int]]
_decoders: dict[tuple[int, int], _Decode] = {}


def _compile_decoder(api_key: int, version: int) -> _Decode:
    """kafka-python's generated decoder for this request, with the tagged-field copy removed."""
    cls = request_class(api_key)
    flexible = bool(cls.flexible_version_q(version))
    st = cls._struct
    ctx = CodegenContext()
    ctx.lines.append("def _decode(data, pos):")
    saved = st._data_class  # a weakref proxy; the generated code needs the class itself
    st._data_class = cls
    try:
        st.emit_decode_from(ctx, "obj", "    ", version=version, compact=flexible, tagged=flexible)
    finally:
        st._data_class = saved
    ctx.emit("    ", "return obj, pos")
    source = ctx.source().replace(_COPYING_LINE, "_TagReader(data, pos)")
    if "_BytesIO" in source:  # kafka-python changed its generated code: refuse rather than copy
        raise RuntimeError("unexpected kafka-python generated decoder; update codec._compile_decoder")
    ctx.globs["_TagReader"] = _TagReader
    exec(compile(source, f"<loglake:{cls.name}_v{version}>", "exec"), ctx.globs)
    decode: _Decode = ctx.globs["_decode"]
    return decode


def _decoder(api_key: int, version: int) -> _Decode:
    key = (api_key, version)
    fn = _decoders.get(key)
    if fn is None:
        fn = _decoders[key] = _compile_decoder(api_key, version)
    return fn


#: (field name, what to check inside it, whether it may be null): inside a struct its own checks;
#: `_ELEMENTS` for an array of strings or bytes (no element may be null); () for nothing.
_NullCheck = tuple[tuple[str, "_NullCheck | str", bool], ...]
_ELEMENTS = "elements"


def _can_be_null(f: KafkaField) -> bool:
    """Fields the generated decoder reads as None for a null length (strings, bytes, arrays, structs),
    or array elements it reads as None (strings, bytes)."""
    if isinstance(f, ArrayField | StructArrayField | StructField):
        return True
    return isinstance(f, SimpleField) and (isinstance(f._type, String) or f._type is Bytes)


def _null_checks(struct: KafkaField, version: int) -> _NullCheck:
    """(field, checks of its struct elements, may be null) for the fields a version carries."""
    out: list[tuple[str, _NullCheck | str, bool]] = []
    for f in struct.fields.values():
        if not f.for_version_q(version) or (f.tag is not None and f.tagged_field_q(version)):
            continue
        inner: _NullCheck | str = _null_checks(f, version) if isinstance(f, StructArrayField | StructField) else ()
        if isinstance(f, ArrayField) and not isinstance(f, StructArrayField) and _can_be_null(f.array_of):
            inner = _ELEMENTS  # an array of strings or bytes: no element may be null
        nullable = bool(f.nullable_for_version_q(version))
        if inner or (not nullable and _can_be_null(f)):
            out.append((f.name, inner, nullable))
    return tuple(out)


_null_check_cache: dict[tuple[int, int], _NullCheck] = {}


def _null_field(obj: KafkaStruct, checks: _NullCheck) -> str | None:
    """The first non-nullable field of `obj` (recursively) that decoded as null, if any."""
    for name, inner, nullable in checks:
        value = getattr(obj, name, None)
        if value is None:
            if not nullable:
                return name
            continue
        if inner is _ELEMENTS:
            if None in value:
                return f"{name}[{value.index(None)}]"
        elif isinstance(inner, tuple) and inner:
            for item in value if isinstance(value, list) else (value,):
                bad = _null_field(item, inner)
                if bad is not None:
                    return f"{name}.{bad}"
    return None


def _check_nulls(api_key: int, version: int, body: KafkaStruct) -> None:
    """Kafka refuses a request with null in a non-nullable field; kafka-python's decoder lets it
    through (a compact length of 0), so handlers would meet None where the schema promises a list."""
    key = (api_key, version)
    checks = _null_check_cache.get(key)
    if checks is None:
        checks = _null_check_cache[key] = _null_checks(request_class(api_key)._struct, version)
    bad = _null_field(body, checks)
    if bad is not None:
        raise WireError(f"non-nullable field {bad} is null")


_TAGS_CALL = re.compile(r"(_tf\d+)\.encode_into\([^,]+, out, version=\d+\)")
#: A generated encoder: writes the response object's body into the buffer.
_Encode = Callable[[KafkaStruct, EncodeBuffer], None]
_encoders: dict[tuple[int, int], _Encode] = {}


def _compile_encoder(api_key: int, version: int) -> _Encode:
    """kafka-python's generated encoder for this response, with empty tagged sections inlined.

    The generated code calls ``TaggedFields.encode_into`` for every struct of a flexible version,
    which costs about 2 µs even when the struct has no tagged fields; where it has none, the call
    is replaced by writing the single 0 byte (the bytes are identical, the encode about 2x faster).
    """
    cls = response_class(api_key)
    flexible = bool(cls.flexible_version_q(version))
    ctx = cls._struct.encode_into__optimized_context(version, compact=flexible, tagged=flexible)

    def inline_empty(m: re.Match[str]) -> str:
        if ctx.globs[m.group(1)]._fields:
            return m.group(0)
        return "out.ensure(1); out.buf[out.pos] = 0; out.pos += 1"

    source = _TAGS_CALL.sub(inline_empty, ctx.source())
    exec(compile(source, f"<loglake:{cls.name}_v{version}>", "exec"), ctx.globs)
    encode: _Encode = ctx.globs["_encode"]
    return encode


def _encoder(api_key: int, version: int) -> _Encode:
    key = (api_key, version)
    fn = _encoders.get(key)
    if fn is None:
        fn = _encoders[key] = _compile_encoder(api_key, version)
    return fn


# kafka-python's generated decoders fail with whatever the bad bytes trigger.
_DECODE_ERRORS = (
    WireError,
    struct.error,
    IndexError,
    ValueError,  # includes UnicodeDecodeError
    TypeError,
    AssertionError,
    KeyError,
    AttributeError,
    OverflowError,
    MemoryError,
)


def decode_request(frame: bytes | bytearray | memoryview, table: VersionTable = DEFAULT_TABLE) -> DecodedRequest:
    """Decode one request frame (size prefix already removed).

    Raises `UnknownApiError`, `UnsupportedVersionError` (check ``api_key == ApiKey.API_VERSIONS`` to answer per
    KIP-511 with `encode_unsupported_api_versions`) or `MalformedRequestError`; nothing else.
    """
    data = memoryview(frame).cast("B") if not isinstance(frame, bytes) else memoryview(frame)
    if len(data) < 8:
        raise MalformedRequestError(f"frame of {len(data)} bytes is shorter than a request header")
    api_key, api_version = struct.unpack_from(">hh", data, 0)
    correlation_id = I32.unpack_from(data, 4)[0]
    versions = table.get(api_key)
    if versions is None:
        raise UnknownApiError(api_key, correlation_id)
    if not versions.min_version <= api_version <= versions.max_version:
        raise UnsupportedVersionError(api_key, api_version, correlation_id)
    cls = request_class(api_key)
    flexible = bool(cls.flexible_version_q(api_version))
    try:
        client_id, pos = read_string(data, 8, compact=False)
        if flexible:
            pos = skip_tagged_fields(data, pos)
        if api_key == ApiKey.PRODUCE:
            body: ProduceRequestData | KafkaStruct = decode_produce_body(data, pos, api_version)
        else:
            body, pos = _decoder(api_key, api_version)(data, pos)
            # The generated code skips __init__; ApiMessage's own slots must exist for encode().
            body._header = body._min_version = body._max_version = None
            _check_nulls(api_key, api_version, body)
            if pos > len(data):
                raise WireError("truncated")
            # Bytes after the body are ignored, as Kafka's broker does: librdkafka's v9+
            # "all topics" Metadata request carries stray trailing bytes (librdkafka#5049).
    except _DECODE_ERRORS as e:
        detail = str(e) or type(e).__name__
        raise MalformedRequestError(f"{cls.name} v{api_version}: {detail}", correlation_id) from e
    except RecursionError as e:  # pragma: no cover - schemas are shallow
        raise MalformedRequestError(f"{cls.name} v{api_version}: too deep", correlation_id) from e
    return DecodedRequest(api_key, api_version, correlation_id, client_id, 2 if flexible else 1, body, len(data))


# --- responses ------------------------------------------------------------------------------


def encode_response(req: DecodedRequest, response: Response) -> list[OutBuffer]:
    """The framed response to `req` as buffers to write in order.

    `response` is a kafka-python response object for ``req.api_key`` (its version is forced to
    ``req.api_version``), a mapping of its fields, or for Fetch a `FetchResponseData` and for
    Produce a `ProduceResponseData`.
    """
    if isinstance(response, FetchResponseData):
        if req.api_key != ApiKey.FETCH:
            raise ResponseEncodingError(f"FetchResponseData answering api key {req.api_key}")
        try:
            return encode_fetch_response(req.correlation_id, req.api_version, response)
        except (struct.error, TypeError, ValueError, AttributeError) as e:
            raise ResponseEncodingError(f"FetchResponse v{req.api_version}: {e}") from e
    if isinstance(response, ProduceResponseData):
        if req.api_key != ApiKey.PRODUCE:
            raise ResponseEncodingError(f"ProduceResponseData answering api key {req.api_key}")
        try:
            return [encode_produce_response(req.correlation_id, req.api_version, response)]
        except (struct.error, TypeError, ValueError, AttributeError, OverflowError, UnicodeEncodeError) as e:
            raise ResponseEncodingError(f"ProduceResponse v{req.api_version}: {e}") from e
    if isinstance(response, Mapping):
        response = make_response(req.api_key, req.api_version, response)
    cls = response_class(req.api_key)
    if not isinstance(response, cls):
        raise ResponseEncodingError(f"{type(response).__name__} does not answer {cls.name}")
    version = req.api_version
    if response.version != version:
        try:
            response.API_VERSION = version
        except ValueError as e:
            raise ResponseEncodingError(f"{cls.name} v{version}: {e}") from e
    head = 9 if req.response_header_version == 1 else 8
    out = EncodeBuffer(4096)
    out.pos = head
    try:
        _encoder(req.api_key, version)(response, out)
    except (struct.error, TypeError, ValueError, AttributeError, OverflowError, UnicodeEncodeError) as e:
        raise ResponseEncodingError(f"{cls.name} v{version}: {e}") from e
    buf = out.buf
    struct.pack_into(">ii", buf, 0, out.pos - 4, req.correlation_id)
    if head == 9:
        buf[8] = 0
    return [memoryview(buf)[: out.pos]]


def api_versions_body(table: VersionTable, version: int, error_code: int = ErrorCode.NONE) -> KafkaStruct:
    """An ApiVersionsResponse object listing `table` (for the ApiVersions handler)."""
    return make_response(
        ApiKey.API_VERSIONS,
        version,
        error_code=error_code,
        api_keys=[{"api_key": k, "min_version": lo, "max_version": hi} for k, lo, hi in table.api_versions_entries()],
        throttle_time_ms=0,
    )


def encode_unsupported_api_versions(correlation_id: int, table: VersionTable = DEFAULT_TABLE) -> bytes:
    """KIP-511: the framed ApiVersions v0 response with UNSUPPORTED_VERSION (35) and our ranges.

    The answer to an ApiVersions request whose version is above (or below) ours: clients
    (librdkafka, the Java client, kafka-python) read the v0 body, then retry with a version we
    list.
    """
    body = api_versions_body(table, 0, ErrorCode.UNSUPPORTED_VERSION).encode(version=0)
    return I32.pack(4 + len(body)) + I32.pack(correlation_id) + bytes(body)


def join(buffers: list[OutBuffer]) -> bytes:
    """Concatenate buffers that hold no file ranges (tests, small responses)."""
    out = bytearray()
    for b in buffers:
        if not isinstance(b, bytes | bytearray | memoryview):
            raise TypeError("join() cannot read file ranges; write them with sendfile")
        out += b
    return bytes(out)


__all__ = [
    "DecodedRequest",
    "api_versions_body",
    "decode_request",
    "encode_response",
    "encode_unsupported_api_versions",
    "join",
]
