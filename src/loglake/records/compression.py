"""Compression codecs of Kafka v2 record batches (attribute bits 0-2), on top of ``cramjam``.

Wire formats, chosen to match what real Kafka clients write and read:

* gzip (1): a standard gzip stream (RFC 1952). Concatenated members are accepted on read.
* snappy (2): the Java client (snappy-java ``SnappyOutputStream``) and kafka-python write *xerial
  framing*: an 8-byte magic ``\\x82SNAPPY\\x00``, int32 version (1), int32 compatible version (1), then
  blocks of ``[int32 big-endian compressed length][raw snappy block]``. librdkafka writes one raw
  snappy block without framing. We write xerial framing; on read we detect the magic, else raw.
* lz4 (3): the standard LZ4 frame format with independent blocks (Kafka's ``KafkaLZ4BlockInputStream``
  rejects linked blocks). Not the broken header checksum of magic 0/1 messages.
* zstd (4): a standard zstd frame.

Decompression is always bounded by ``max_output_bytes`` so a small hostile batch cannot make us
allocate gigabytes; every failure of a codec surfaces as :class:`CorruptRecordError`.
"""

from __future__ import annotations

import struct
import zlib

import cramjam

from loglake.errors import ConfigError, CorruptRecordError

CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_SNAPPY = 2
CODEC_LZ4 = 3
CODEC_ZSTD = 4

CODEC_NAMES: dict[str, int] = {
    "none": CODEC_NONE,
    "gzip": CODEC_GZIP,
    "snappy": CODEC_SNAPPY,
    "lz4": CODEC_LZ4,
    "zstd": CODEC_ZSTD,
}
_NAMES_BY_CODEC: dict[int, str] = {v: k for k, v in CODEC_NAMES.items()}

#: Largest decompressed size of one batch we accept. Kafka bounds a *compressed* batch by
#: message.max.bytes (1 MiB default, rarely above 100 MiB); 256 MiB leaves room for very compressible
#: data while stopping decompression bombs from exhausting memory.
MAX_DECOMPRESSED_BATCH_BYTES = 256 * 1024 * 1024

#: xerial snappy stream header: magic, then int32 version and int32 minimum compatible version.
XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_VERSIONS = struct.Struct(">ii")
XERIAL_HEADER = XERIAL_MAGIC + _XERIAL_VERSIONS.pack(1, 1)
_XERIAL_BLOCK_LEN = struct.Struct(">i")
#: Uncompressed bytes per xerial block; snappy-java's default block size (32 KiB).
XERIAL_BLOCK_SIZE = 32 * 1024

#: Kafka's default compression levels (compression.gzip.level / compression.zstd.level).
GZIP_LEVEL = 6
ZSTD_LEVEL = 3

#: First output buffer for codecs whose frame need not state the decompressed size (lz4, zstd): at
#: least this many bytes, or ``_FIRST_GUESS_RATIO`` times the input; grown by ``_GROWTH`` up to the cap.
_FIRST_GUESS_BYTES = 64 * 1024
_FIRST_GUESS_RATIO = 8
_GROWTH = 4
#: cramjam's message when the output buffer passed to ``decompress_into`` is too small. Pinned by a
#: test (large highly-compressible payloads must still decode), so a wording change is caught.
_OUTPUT_FULL_MESSAGE = "failed to write whole buffer"


def codec_from_name(name: str) -> int:
    """Map a ``compression.type`` value (case-insensitive) to the codec id."""
    try:
        return CODEC_NAMES[name.strip().lower()]
    except KeyError:
        raise ConfigError(
            f"unknown compression type {name!r}; expected one of {', '.join(CODEC_NAMES)}"
        ) from None


def codec_name(codec: int) -> str:
    """Inverse of :func:`codec_from_name` (``"unknown(5)"`` for ids outside 0-4)."""
    return _NAMES_BY_CODEC.get(codec, f"unknown({codec})")


# --------------------------------------------------------------------------- compress


def _snappy_xerial_compress(data: bytes) -> bytes:
    parts: list[bytes] = [XERIAL_HEADER]
    view = memoryview(data)
    pack_len = _XERIAL_BLOCK_LEN.pack
    for start in range(0, len(view), XERIAL_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + XERIAL_BLOCK_SIZE]))
        parts.append(pack_len(len(block)))
        parts.append(block)
    return b"".join(parts)


def _lz4_compress(data: bytes) -> bytes:
    compressor = cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
    compressor.compress(data)
    return bytes(compressor.finish())


def compress(codec: int, data: bytes) -> bytes:
    """Compress ``data`` into the wire format of ``codec`` (see module docstring)."""
    if codec == CODEC_NONE:
        return bytes(data)
    if codec == CODEC_GZIP:
        return bytes(cramjam.gzip.compress(data, level=GZIP_LEVEL))
    if codec == CODEC_SNAPPY:
        return _snappy_xerial_compress(data)
    if codec == CODEC_LZ4:
        return _lz4_compress(data)
    if codec == CODEC_ZSTD:
        return bytes(cramjam.zstd.compress(data, level=ZSTD_LEVEL))
    raise ConfigError(f"unknown compression codec {codec}")


# --------------------------------------------------------------------------- decompress


def _codec_error(codec: int, err: BaseException, where: str = "") -> CorruptRecordError:
    name = codec_name(codec)
    text = str(err)
    if not text.startswith(name):
        text = f"{name}: {text}"
    return CorruptRecordError(f"{text}{where}")


def _too_large(codec: int, limit: int) -> CorruptRecordError:
    return CorruptRecordError(f"{codec_name(codec)}: decompressed batch exceeds {limit} bytes")


def _gzip_decompress(data: bytes | memoryview, limit: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    rest: bytes | memoryview = data
    consumed = 0
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            chunk = d.decompress(rest, limit - total + 1)
        except zlib.error as e:
            raise _codec_error(CODEC_GZIP, e, f" (member at compressed byte {consumed})") from None
        total += len(chunk)
        if total > limit or d.unconsumed_tail:
            raise _too_large(CODEC_GZIP, limit)
        if not d.eof:
            raise CorruptRecordError(f"gzip: truncated stream (member at compressed byte {consumed})")
        parts.append(chunk)
        if not d.unused_data:
            break
        consumed += len(rest) - len(d.unused_data)
        rest = d.unused_data
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _snappy_raw_block(block: bytes | memoryview, budget: int, where: int, limit: int) -> bytes:
    try:
        size = cramjam.snappy.decompress_raw_len(block)
    except cramjam.DecompressionError as e:
        raise _codec_error(CODEC_SNAPPY, e, f" (block at compressed byte {where})") from None
    if size > budget:
        raise _too_large(CODEC_SNAPPY, limit)
    out = bytearray(size)
    try:
        n = cramjam.snappy.decompress_raw_into(block, out)
    except cramjam.DecompressionError as e:
        raise _codec_error(CODEC_SNAPPY, e, f" (block at compressed byte {where})") from None
    if n != size:
        raise CorruptRecordError(f"snappy: block at compressed byte {where} is shorter than its header says")
    return bytes(out)


def _snappy_decompress(data: bytes | memoryview, limit: int) -> bytes:
    view = memoryview(data)
    if len(view) < len(XERIAL_HEADER) or view[: len(XERIAL_MAGIC)] != XERIAL_MAGIC:
        return _snappy_raw_block(view, limit, 0, limit)
    # xerial framing; version/compat are ignored like kafka-python does (some producers get them wrong)
    parts: list[bytes] = []
    total = 0
    pos = len(XERIAL_HEADER)
    end = len(view)
    while pos < end:
        if end - pos < _XERIAL_BLOCK_LEN.size:
            raise CorruptRecordError(f"snappy: truncated xerial block length at compressed byte {pos}")
        (n,) = _XERIAL_BLOCK_LEN.unpack_from(view, pos)
        pos += _XERIAL_BLOCK_LEN.size
        if n < 0 or n > end - pos:
            raise CorruptRecordError(
                f"snappy: xerial block length {n} at compressed byte {pos - 4} exceeds the {end - pos} "
                "bytes left"
            )
        chunk = _snappy_raw_block(view[pos : pos + n], limit - total, pos, limit)
        total += len(chunk)
        parts.append(chunk)
        pos += n
    return b"".join(parts)


def _framed_decompress(codec: int, module: object, data: bytes | memoryview, limit: int) -> bytes:
    """lz4/zstd: decompress into a fixed buffer, growing it until the output fits or hits ``limit``.

    ``decompress_into`` stops writing when the buffer is full, so the work and memory spent on a
    decompression bomb are bounded by ``limit``.
    """
    decompress_into = module.decompress_into  # type: ignore[attr-defined]
    size = min(limit, max(_FIRST_GUESS_BYTES, len(data) * _FIRST_GUESS_RATIO))
    while True:
        out = bytearray(size)
        try:
            n: int = decompress_into(data, out)
        except cramjam.DecompressionError as e:
            if _OUTPUT_FULL_MESSAGE not in str(e):
                raise _codec_error(codec, e) from None
            if size >= limit:
                raise _too_large(codec, limit) from None
            size = min(limit, size * _GROWTH)
            continue
        # (``del out[n:]`` would be far slower: shrinking a large bytearray copies it element-wise)
        with memoryview(out) as view:
            return view[:n].tobytes()


def decompress(
    codec: int, data: bytes | memoryview, max_output_bytes: int = MAX_DECOMPRESSED_BATCH_BYTES
) -> bytes:
    """Decompress one batch's record data; raise CorruptRecordError on any codec failure or if the
    output would exceed ``max_output_bytes``."""
    if codec == CODEC_NONE:
        if len(data) > max_output_bytes:
            raise _too_large(codec, max_output_bytes)
        return bytes(data)
    if codec == CODEC_GZIP:
        return _gzip_decompress(data, max_output_bytes)
    if codec == CODEC_SNAPPY:
        return _snappy_decompress(data, max_output_bytes)
    if codec == CODEC_LZ4:
        return _framed_decompress(codec, cramjam.lz4, data, max_output_bytes)
    if codec == CODEC_ZSTD:
        return _framed_decompress(codec, cramjam.zstd, data, max_output_bytes)
    raise CorruptRecordError(f"unknown compression codec {codec} in batch attributes")
