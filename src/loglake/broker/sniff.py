"""What a size prefix that is over the frame limit says about the client that sent it.

A Kafka request starts with its 4-byte big-endian size. An HTTP request line ("GET /...") or a
TLS ClientHello (record type 0x16, version 0x03 0x0X) read as such a size is hundreds of MiB to
GiB, so it ends up as "frame too large". `foreign_protocol` names the likely cause instead.
"""

from __future__ import annotations

import struct

#: First four bytes of HTTP/1.x request lines (and the HTTP/2 preface "PRI * HTTP/2.0").
HTTP_PREFIXES = (b"GET ", b"POST", b"HEAD", b"PUT ", b"DELE", b"OPTI", b"PATC", b"CONN", b"TRAC", b"PRI ")
#: TLS record content type of a handshake (a ClientHello comes first).
TLS_HANDSHAKE = 0x16

HTTP_HINT = "looks like an HTTP request: is a web client pointed at the Kafka port?"
TLS_HINT = "looks like a TLS handshake: the client uses SSL but this listener is PLAINTEXT"


def prefix_bytes(size: int) -> bytes:
    """The four bytes a size prefix was decoded from."""
    return struct.pack(">i", size) if -(2**31) <= size < 2**31 else b""


def foreign_protocol(prefix: bytes) -> str | None:
    """A hint when `prefix` (the first bytes of a frame) is HTTP or TLS rather than Kafka."""
    if len(prefix) >= 3 and prefix[0] == TLS_HANDSHAKE and prefix[1] == 0x03 and prefix[2] <= 0x04:
        return TLS_HINT
    if prefix[:4] in HTTP_PREFIXES:
        return HTTP_HINT
    return None


__all__ = ["HTTP_HINT", "TLS_HINT", "foreign_protocol", "prefix_bytes"]
