"""The boto3 plumbing under `S3Store`: its client, upload bodies made of the caller's buffers
without a copy, their CRC32C in S3's wire format, and the checks on what S3 answers."""

from __future__ import annotations

import base64
import bisect
import io
import re
import threading
from collections.abc import Sequence
from typing import Any

import boto3
import botocore.config
import botocore.loaders
import botocore.session
import crc32c

from loglake.store.s3_errors import ShortBodyError

__all__ = ["PartsReader", "crc32c_b64", "make_client", "span_of"]


class PartsReader(io.RawIOBase):
    """A seekable read-only file over bytes [start, end) of the concatenation of `views`,
    without copying them into one buffer (botocore reads it to sign and to send, and rewinds)."""

    def __init__(self, views: Sequence[memoryview], start: int, end: int) -> None:
        super().__init__()
        self._views = views
        self._offsets: list[int] = []  # absolute start of each view
        total = 0
        for v in views:
            self._offsets.append(total)
            total += len(v)
        if not 0 <= start <= end <= total:
            raise ValueError(f"bad span {start}..{end} of {total} bytes")
        self._start = start
        self._end = end
        self._pos = start

    def __len__(self) -> int:
        return self._end - self._start

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos - self._start

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = self._start + offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._end + offset
        else:
            raise ValueError(f"bad whence {whence}")
        if pos < self._start:
            raise ValueError("negative seek position")
        self._pos = min(pos, self._end)
        return self._pos - self._start

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        want = min(len(out), self._end - self._pos)
        done = 0
        while done < want:
            i = bisect.bisect_right(self._offsets, self._pos) - 1
            view = self._views[i]
            inner = self._pos - self._offsets[i]
            n = min(want - done, len(view) - inner)
            if n <= 0:  # an empty view: move on to the next one
                self._pos = self._offsets[i] + len(view)
                continue
            out[done : done + n] = view[inner : inner + n]
            done += n
            self._pos += n
        return done


def crc32c_b64(views: Sequence[memoryview], start: int, end: int) -> str:
    """Base64 of the big-endian CRC32C of bytes [start, end) of the views (S3's wire format)."""
    crc = 0
    pos = 0
    for v in views:
        lo, hi = max(start, pos), min(end, pos + len(v))
        if lo < hi:
            crc = crc32c.crc32c(v[lo - pos : hi - pos], crc)
        pos += len(v)
    return base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")


_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


def span_of(response: dict[str, Any]) -> tuple[int, int, int]:
    """(first byte, end exclusive, object size) of a GetObject response."""
    length = int(response.get("ContentLength", 0))
    content_range = response.get("ContentRange")
    if not content_range:
        return 0, length, length
    m = _CONTENT_RANGE.match(str(content_range).strip())
    if m is None:
        raise ShortBodyError(f"unparseable Content-Range {content_range!r}")
    first, last = int(m.group(1)), int(m.group(2))
    size = int(m.group(3)) if m.group(3) != "*" else last + 1
    if last - first + 1 != length:
        raise ShortBodyError(f"Content-Range {content_range!r} disagrees with Content-Length {length}")
    return first, last + 1, size


_loader: Any = None
_loader_lock = threading.Lock()


def _shared_loader() -> Any:
    """One botocore data loader for all stores: it caches the parsed S3 service model, which
    otherwise costs ~0.15 s per client. (Sessions stay per store: they cache credentials.)"""
    global _loader
    with _loader_lock:
        if _loader is None:
            _loader = botocore.loaders.create_loader()
        return _loader


def make_client(
    *,
    endpoint_url: str | None,
    region: str | None,
    path_style: bool,
    profile: str | None,
    access_key_id: str | None,
    secret_access_key: str | None,
    session_token: str | None,
    connect_timeout: float,
    read_timeout: float,
    max_pool_connections: int,
) -> Any:
    core = botocore.session.Session(profile=profile)
    core.register_component("data_loader", _shared_loader())
    session = boto3.session.Session(
        botocore_session=core,
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret_access_key,
        aws_session_token=session_token,
        region_name=region,
    )
    config = botocore.config.Config(
        region_name=region,
        signature_version="s3v4",
        s3={"addressing_style": "path" if path_style else "auto"},
        # We retry ourselves (bounded, logged, resuming downloads): one attempt per boto3 call.
        # (botocore's "max_attempts" key counts retries, not attempts: total_max_attempts is it.)
        retries={"mode": "standard", "total_max_attempts": 1},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        max_pool_connections=max_pool_connections,
        # We send our own CRC32C with uploads; no extra trailers or response-checksum modes.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        user_agent_extra="loglake",
    )
    client = session.client("s3", endpoint_url=endpoint_url, config=config)
    client.meta.events.register("before-parse.s3.*", _check_body_length)
    return client


def _check_body_length(operation_model: Any, response_dict: dict[str, Any], **_: Any) -> None:
    """Reject a non-streaming response body shorter than its Content-Length.

    botocore reads such bodies with urllib3's length check turned off, so a connection cut
    mid-answer would otherwise parse as a shorter or even empty (!) answer: an empty
    ListObjectsV2 page, or a CompleteMultipartUpload that seems to have succeeded.
    """
    body = response_dict.get("body")
    if not isinstance(body, bytes | bytearray) or operation_model.http.get("method") == "HEAD":
        return
    expected = response_dict.get("headers", {}).get("content-length")
    if expected is not None and str(expected).isdigit() and int(expected) != len(body):
        raise ShortBodyError(
            f"{operation_model.name} answer has {len(body)} of the {expected} bytes its Content-Length promised"
        )
