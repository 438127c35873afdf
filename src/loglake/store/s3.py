"""`S3Store`: segment objects in an S3 bucket (AWS S3, MinIO, Ceph RGW, moto, ...).

Every key lives under an optional `prefix` inside the bucket; keys given to and returned by the
store are relative to it (as LocalStore's are relative to its root folder).

Behaviour shared with the other backends (see `loglake.store.base`): `put` publishes a whole
object atomically (one PutObject, or a multipart upload that S3 makes visible only on
CompleteMultipartUpload), reads of a missing object raise ObjectNotFoundError, `delete` is
idempotent, `list` is sorted.

Failures: boto3's own retries are disabled; each operation retries by itself under a bounded
`RetryPolicy` (6 attempts, exponential backoff with full jitter, 0.1 s first ceiling, 5 s cap)
on 5xx, throttling (SlowDown, 503, 429, RequestLimitExceeded, ...), timeouts and connection
errors, logging a WARNING per retry (at most one per operation kind and attempt number every 30 s
per store, the rest counted in a summary line: a 5xx storm does not flood the log). Final errors (403, 400, bad credentials) are raised at
once. A missing bucket (NoSuchBucket) is not retried here but raised as retriable, so callers
know a later try may succeed. Every raised error is an `ObjectNotFoundError` or an
`S3StoreError` (a `StorageError`) naming the operation, the key and whether a retry can help,
with the original exception as `cause` and `__cause__`.

Downloads stream the body in chunks; when the connection breaks mid-body, the next attempt asks
for the rest only (a ranged GET from the first byte not yet received, pinned to the same object
version with If-Match), so a large read never starts over because of one reset.

boto3 is imported here only; `loglake.store` does not need it unless s3:// URLs are used.
"""

from __future__ import annotations

import base64
import bisect
import builtins
import collections
import http.client
import io
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

import boto3
import botocore.config
import botocore.exceptions
import botocore.loaders
import botocore.parsers
import botocore.session
import crc32c
import urllib3.exceptions

from loglake.errors import ConfigError, StorageError
from loglake.fs.base import FileSystem
from loglake.logsafe import RateLimitedLog
from loglake.store.base import (
    BytesLike,
    InvalidObjectKeyError,
    ObjectNotFoundError,
    ObjectStore,
    check_key,
    check_prefix,
    check_range,
)
from loglake.store.retry import (
    DEFAULT_BASE_DELAY,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_DELAY,
    RetryPolicy,
)

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_LIST_PAGE_SIZE",
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_MULTIPART_THRESHOLD",
    "DEFAULT_PART_SIZE",
    "DEFAULT_READ_TIMEOUT",
    "MIN_PART_SIZE",
    "RetryPolicy",
    "S3Store",
    "S3StoreError",
    "open_s3_store",
    "parse_s3_url",
    "register",
]

log = logging.getLogger(__name__)

MiB = 1024 * 1024

#: At most this many S3 requests of one store run at once (and as many pooled connections).
DEFAULT_MAX_CONCURRENCY = 16
#: Objects up to this size go up in one PutObject; larger ones as a multipart upload.
DEFAULT_MULTIPART_THRESHOLD = 64 * MiB
#: Size of each multipart part (the last one may be smaller).
DEFAULT_PART_SIZE = 16 * MiB
#: S3's smallest allowed part (all parts but the last).
MIN_PART_SIZE = 5 * MiB
#: S3's largest part count per upload; the part size grows to stay under it.
MAX_PARTS = 10_000
#: Seconds to establish a TCP connection, and to wait for each read from the socket.
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 30.0
#: Keys per ListObjectsV2 page (S3's maximum is 1000).
DEFAULT_LIST_PAGE_SIZE = 1000
#: Download bodies are read in chunks of this size (a reset loses at most the chunk in flight).
READ_CHUNK = 1 * MiB

#: Error codes that mean "too many requests, back off".
_THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "BandwidthLimitExceeded",
        "ProvisionedThroughputExceededException",
    }
)
#: Error codes (some sent with a 4xx status) that a later attempt can get past.
_TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "OperationAborted",
        "IDPCommunicationError",
        "XAmzContentSHA256Mismatch",
        "BadDigest",
        "InvalidDigest",
    }
)
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class _ShortBodyError(Exception):
    """A response body ended before (or ran past) the bytes its headers promised."""


#: Transport-level failures: a later attempt can succeed.
_TRANSIENT_EXCEPTIONS: tuple[type[BaseException], ...] = (
    botocore.exceptions.HTTPClientError,  # ReadTimeoutError, ConnectionClosedError, ResponseStreamingError
    botocore.exceptions.ConnectionError,  # EndpointConnectionError, ConnectTimeoutError, ProxyConnectionError
    botocore.exceptions.IncompleteReadError,
    botocore.exceptions.ChecksumError,
    botocore.exceptions.CredentialRetrievalError,  # e.g. the instance metadata service hiccuped
    botocore.exceptions.MetadataRetrievalError,
    botocore.parsers.ResponseParserError,  # a garbled (e.g. cut-off) XML answer
    urllib3.exceptions.HTTPError,
    http.client.HTTPException,
    ConnectionError,
    TimeoutError,
)
#: Everything the retry loop handles (what is not transient is final).
_HANDLED_EXCEPTIONS: tuple[type[BaseException], ...] = (
    botocore.exceptions.ClientError,
    botocore.exceptions.BotoCoreError,
    OSError,
    _ShortBodyError,
    *_TRANSIENT_EXCEPTIONS,
)

T = TypeVar("T")


class S3StoreError(StorageError):
    """A failed S3 operation. `op`, `path` (the key or prefix), `retriable` and `cause` as in
    StorageError; also `attempts` made, the S3 error `code` and HTTP `status` when known."""

    def __init__(
        self,
        op: str,
        key: str,
        cause: BaseException,
        *,
        retriable: bool,
        attempts: int,
        url: str,
        reason: str,
    ) -> None:
        super().__init__(op, key, cause, retriable=retriable)
        self.attempts = attempts
        self.code, self.status = _error_code(cause)
        self.reason = reason
        hint = "a later retry may succeed" if retriable else "not retriable"
        self.args = (
            f"s3 {op} {key!r} in {url}: {reason} after {attempts} attempt(s) ({hint}): "
            f"{type(cause).__name__}: {cause}",
        )


class _Verdict(NamedTuple):
    action: str  # "retry", "fail", "not_found" or "bucket_gone"
    reason: str


class _UnsatisfiableRangeError(Exception):
    """HTTP 416: the object exists but the requested range has no byte in it."""


def _error_code(exc: BaseException) -> tuple[str, int]:
    if isinstance(exc, botocore.exceptions.ClientError):
        response: Any = exc.response
        code = str(response.get("Error", {}).get("Code", ""))
        status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        return code, status
    return "", 0


def _classify(exc: BaseException) -> _Verdict:
    """What one failed attempt means for the operation."""
    if isinstance(exc, botocore.exceptions.ClientError):
        code, status = _error_code(exc)
        if code == "NoSuchBucket":
            return _Verdict("bucket_gone", "bucket does not exist (NoSuchBucket)")
        if code in ("NoSuchKey", "NotFound", "404") or (status == 404 and code != "NoSuchUpload"):
            return _Verdict("not_found", f"not found ({code or status})")
        if code in _THROTTLE_CODES or status in (429, 503):
            return _Verdict("retry", f"throttled ({code or status})")
        if code in _TRANSIENT_CODES or status in _RETRY_STATUSES or status >= 500:
            return _Verdict("retry", f"server error ({code or 'HTTP'} {status})")
        return _Verdict("fail", f"request refused ({code or 'HTTP'} {status})")
    if isinstance(exc, _ShortBodyError):
        return _Verdict("retry", "short response body")
    if isinstance(exc, _TRANSIENT_EXCEPTIONS):
        return _Verdict("retry", f"transport error ({type(exc).__name__})")
    if isinstance(exc, OSError):
        return _Verdict("retry", f"transport error ({type(exc).__name__})")
    return _Verdict("fail", f"client error ({type(exc).__name__})")


class _Attempts:
    """The retry budget of one operation; `failed(exc)` sleeps and returns, or raises."""

    def __init__(self, store: S3Store, op: str, key: str) -> None:
        self.store = store
        self.op = op
        self.key = key
        self.count = 1

    def failed(self, exc: BaseException, *, force_retry: bool = False) -> None:
        """Call in an `except` block of attempt `count`: returns when another attempt should be
        made (after the backoff sleep), else raises the operation's error from `exc`."""
        store, policy = self.store, self.store.retry
        verdict = _Verdict("retry", "object changed during the read") if force_retry else _classify(exc)
        if verdict.action == "not_found":
            raise ObjectNotFoundError(self.key, store.url) from exc
        if verdict.action == "retry" and self.count < policy.max_attempts:
            delay = policy.delay(self.count)
            # One line per operation kind and attempt number per interval: a 5xx storm retries
            # every upload and read many times over, the log gets a line and a count of the rest.
            store._retry_log.warning(
                (self.op, self.count),
                "s3 %s %r: attempt %d/%d failed: %s: %s; retrying in %.3fs",
                self.op,
                self.key,
                self.count,
                policy.max_attempts,
                verdict.reason,
                exc,
                delay,
            )
            store._count_retry(self.op)
            if delay > 0:
                store._sleep(delay)
            self.count += 1
            return
        retriable = verdict.action in ("retry", "bucket_gone")
        reason = "retries exhausted: " + verdict.reason if verdict.action == "retry" else verdict.reason
        raise S3StoreError(
            self.op, self.key, exc, retriable=retriable, attempts=self.count, url=store.url, reason=reason
        ) from exc


class _PartsReader(io.RawIOBase):
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


def _crc32c_b64(views: Sequence[memoryview], start: int, end: int) -> str:
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


def _span_of(response: dict[str, Any]) -> tuple[int, int, int]:
    """(first byte, end exclusive, object size) of a GetObject response."""
    length = int(response.get("ContentLength", 0))
    content_range = response.get("ContentRange")
    if not content_range:
        return 0, length, length
    m = _CONTENT_RANGE.match(str(content_range).strip())
    if m is None:
        raise _ShortBodyError(f"unparseable Content-Range {content_range!r}")
    first, last = int(m.group(1)), int(m.group(2))
    size = int(m.group(3)) if m.group(3) != "*" else last + 1
    if last - first + 1 != length:
        raise _ShortBodyError(f"Content-Range {content_range!r} disagrees with Content-Length {length}")
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


def _make_client(
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
        raise _ShortBodyError(
            f"{operation_model.name} answer has {len(body)} of the {expected} bytes its Content-Length promised"
        )


class S3Store(ObjectStore):
    """Objects in `bucket` under `prefix`. Thread-safe; at most `max_concurrency` requests of
    one store are in flight at once.

    `calls` counts public calls per operation (like MemoryStore), `requests` counts S3 API
    requests (retries included) per API name, `retries` counts retries per operation;
    `bytes_in` / `bytes_out` count body bytes downloaded / uploaded (successful uploads only).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        path_style: bool = False,
        profile: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        retry: RetryPolicy | None = None,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        part_size: int = DEFAULT_PART_SIZE,
        list_page_size: int = DEFAULT_LIST_PAGE_SIZE,
        client: Any = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not bucket or "/" in bucket or any(c.isspace() for c in bucket):
            raise ConfigError(f"invalid S3 bucket name {bucket!r}")
        stripped = prefix.strip("/")
        if stripped:
            try:
                check_prefix(stripped + "/")
            except InvalidObjectKeyError as exc:
                raise ConfigError(f"invalid S3 key prefix {prefix!r}: {exc}") from exc
        if max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if part_size < MIN_PART_SIZE:
            raise ConfigError(f"part_size must be >= {MIN_PART_SIZE} (S3's minimum), got {part_size}")
        if multipart_threshold < 0:
            raise ConfigError(f"multipart_threshold must be >= 0, got {multipart_threshold}")
        if not 1 <= list_page_size <= 1000:
            raise ConfigError(f"list_page_size must be in 1..1000, got {list_page_size}")
        if connect_timeout <= 0 or read_timeout <= 0:
            raise ConfigError("connect_timeout and read_timeout must be > 0")
        self.bucket = bucket
        self.prefix = stripped + "/" if stripped else ""
        self.url = f"s3://{bucket}/{self.prefix}"
        self.endpoint_url = endpoint_url
        self.retry = retry if retry is not None else RetryPolicy()
        self._retry_log = RateLimitedLog(log)
        self.max_concurrency = max_concurrency
        self.multipart_threshold = multipart_threshold
        self.part_size = part_size
        self.list_page_size = list_page_size
        self._sleep = sleep
        self._client: Any = client
        if self._client is None:
            try:
                self._client = _make_client(
                    endpoint_url=endpoint_url,
                    region=region,
                    path_style=path_style,
                    profile=profile,
                    access_key_id=access_key_id,
                    secret_access_key=secret_access_key,
                    session_token=session_token,
                    connect_timeout=connect_timeout,
                    read_timeout=read_timeout,
                    max_pool_connections=max_concurrency,
                )
            except botocore.exceptions.BotoCoreError as exc:  # e.g. ProfileNotFound
                raise ConfigError(f"S3 store {self.url}: cannot create a client: {exc}") from exc
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._stats_lock = threading.Lock()
        self.calls: collections.Counter[str] = collections.Counter()
        self.requests: collections.Counter[str] = collections.Counter()
        self.retries: collections.Counter[str] = collections.Counter()
        self.bytes_in = 0
        self.bytes_out = 0

    def __repr__(self) -> str:
        where = f", endpoint_url={self.endpoint_url!r}" if self.endpoint_url else ""
        return f"S3Store({self.bucket!r}, {self.prefix!r}{where})"

    # ---- plumbing -------------------------------------------------------------------------

    def _count_call(self, op: str) -> None:
        with self._stats_lock:
            self.calls[op] += 1

    def _count_retry(self, op: str) -> None:
        with self._stats_lock:
            self.retries[op] += 1

    def _count_bytes(self, *, received: int = 0, sent: int = 0) -> None:
        with self._stats_lock:
            self.bytes_in += received
            self.bytes_out += sent

    def _s3_key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _request(self, api: str, **kwargs: Any) -> Any:
        """One S3 API request (boto3 method name in CamelCase); the caller holds a slot."""
        with self._stats_lock:
            self.requests[api] += 1
        method = re.sub(r"(?<!^)(?=[A-Z])", "_", api).lower()
        return getattr(self._client, method)(**kwargs)

    def _retrying(self, op: str, key: str, attempt_fn: Callable[[_Attempts], T]) -> T:
        """Run `attempt_fn` until it returns, retrying under the policy."""
        attempts = _Attempts(self, op, key)
        while True:
            try:
                return attempt_fn(attempts)
            except _HANDLED_EXCEPTIONS as exc:
                attempts.failed(exc)

    def _call(self, op: str, key: str, api: str, **kwargs: Any) -> Any:
        """One S3 request with retries, holding a concurrency slot during each attempt."""

        def attempt(_: _Attempts) -> Any:
            with self._slots:
                return self._request(api, **kwargs)

        return self._retrying(op, key, attempt)

    def _bucket_gone_check(self, op: str, key: str) -> None:
        """After a body-less 404 (HEAD): raise a retriable error if the bucket itself is gone."""
        try:
            self._call(op, key, "HeadBucket", Bucket=self.bucket)
        except S3StoreError as exc:
            if exc.status == 403:
                return  # no s3:ListBucket permission: trust the 404
            raise
        except ObjectNotFoundError as exc:
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            raise S3StoreError(
                op,
                key,
                cause,
                retriable=True,
                attempts=1,
                url=self.url,
                reason="bucket does not exist (HeadBucket 404)",
            ) from cause

    # ---- writes ---------------------------------------------------------------------------

    def put(self, key: str, parts: Sequence[BytesLike]) -> None:
        s3_key = self._s3_key(key)
        self._count_call("put")
        views = [memoryview(p).cast("B") for p in parts]
        total = sum(len(v) for v in views)
        if total <= self.multipart_threshold:
            checksum = _crc32c_b64(views, 0, total)

            def attempt(_: _Attempts) -> None:
                with self._slots:
                    self._request(
                        "PutObject",
                        Bucket=self.bucket,
                        Key=s3_key,
                        Body=_PartsReader(views, 0, total),
                        ContentLength=total,
                        ChecksumAlgorithm="CRC32C",
                        ChecksumCRC32C=checksum,
                    )

            self._retrying("put", key, attempt)
            self._count_bytes(sent=total)
        else:
            self._put_multipart(key, s3_key, views, total)

    def _put_multipart(self, key: str, s3_key: str, views: Sequence[memoryview], total: int) -> None:
        part_size = max(self.part_size, math.ceil(total / MAX_PARTS))
        created = self._call(
            "put", key, "CreateMultipartUpload", Bucket=self.bucket, Key=s3_key, ChecksumAlgorithm="CRC32C"
        )
        upload_id = str(created["UploadId"])
        try:
            done: list[dict[str, Any]] = []
            for number, lo in enumerate(range(0, total, part_size), start=1):
                hi = min(total, lo + part_size)
                checksum = _crc32c_b64(views, lo, hi)

                def upload(
                    _: _Attempts, number: int = number, lo: int = lo, hi: int = hi, crc: str = checksum
                ) -> Any:
                    with self._slots:
                        return self._request(
                            "UploadPart",
                            Bucket=self.bucket,
                            Key=s3_key,
                            UploadId=upload_id,
                            PartNumber=number,
                            Body=_PartsReader(views, lo, hi),
                            ContentLength=hi - lo,
                            ChecksumAlgorithm="CRC32C",
                            ChecksumCRC32C=crc,
                        )

                response = self._retrying("put", key, upload)
                done.append({"PartNumber": number, "ETag": response["ETag"], "ChecksumCRC32C": checksum})

            def complete(attempts: _Attempts) -> None:
                try:
                    with self._slots:
                        self._request(
                            "CompleteMultipartUpload",
                            Bucket=self.bucket,
                            Key=s3_key,
                            UploadId=upload_id,
                            MultipartUpload={"Parts": done},
                        )
                except botocore.exceptions.ClientError as exc:
                    # An earlier attempt may have completed it and only the answer got lost.
                    if attempts.count > 1 and _error_code(exc)[0] == "NoSuchUpload":
                        with self._slots:
                            head = self._request("HeadObject", Bucket=self.bucket, Key=s3_key)
                        if int(head["ContentLength"]) == total:
                            return
                    raise

            self._retrying("put", key, complete)
        except BaseException:
            self._abort_multipart(key, s3_key, upload_id)
            raise
        self._count_bytes(sent=total)

    def _abort_multipart(self, key: str, s3_key: str, upload_id: str) -> None:
        """Best effort: a failed abort leaves parts that a bucket lifecycle rule should expire."""
        try:
            self._call("put", key, "AbortMultipartUpload", Bucket=self.bucket, Key=s3_key, UploadId=upload_id)
        except (StorageError, ObjectNotFoundError) as exc:
            log.warning("s3 put %r: could not abort multipart upload %s: %s", key, upload_id, exc)

    def delete(self, key: str) -> None:
        s3_key = self._s3_key(key)
        self._count_call("delete")
        try:
            self._call("delete", key, "DeleteObject", Bucket=self.bucket, Key=s3_key)
        except ObjectNotFoundError:
            return

    # ---- reads ----------------------------------------------------------------------------

    def _download(self, op: str, key: str, first_range: str | None) -> tuple[bytes, int, int]:
        """(bytes, absolute offset of the first one, object size) of a GET with `first_range`.

        Resumes after a broken body with a ranged GET for the missing bytes, pinned to the
        first response's ETag; restarts whole if the object was replaced in between.
        Raises _UnsatisfiableRangeError on HTTP 416.
        """
        s3_key = self._s3_key(key)
        attempts = _Attempts(self, op, key)
        buf = bytearray()
        etag: str | None = None
        first = end = size = 0
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": s3_key}
            resuming = etag is not None
            if resuming:
                kwargs["Range"] = f"bytes={first + len(buf)}-{end - 1}"
                kwargs["IfMatch"] = etag
            elif first_range is not None:
                kwargs["Range"] = first_range
            try:
                with self._slots:
                    response = self._request("GetObject", **kwargs)
                    body = response["Body"]
                    try:
                        span = _span_of(response)
                        if resuming:
                            if span[0] != first + len(buf) or span[1] != end:
                                raise _ShortBodyError(f"resumed GET answered bytes {span[0]}..{span[1]}")
                        else:
                            first, end, size = span
                            etag = str(response.get("ETag") or "") or None
                        while True:
                            chunk = body.read(READ_CHUNK)
                            if not chunk:
                                break
                            buf += chunk
                            self._count_bytes(received=len(chunk))
                    finally:
                        body.close()
                if len(buf) != end - first:
                    raise _ShortBodyError(f"got {len(buf)} of {end - first} bytes")
                return bytes(buf), first, size
            except botocore.exceptions.ClientError as exc:
                code = _error_code(exc)[0]
                if code == "InvalidRange" and not resuming:
                    raise _UnsatisfiableRangeError(str(exc)) from exc
                if code == "PreconditionFailed" and resuming:
                    # Replaced since the first response: start over on the new object.
                    buf.clear()
                    etag = None
                    first = end = size = 0
                    attempts.failed(exc, force_retry=True)
                    continue
                attempts.failed(exc)
            except _HANDLED_EXCEPTIONS as exc:
                if etag is None:
                    buf.clear()  # no usable first response (e.g. a bad Content-Range): start over
                attempts.failed(exc)

    def get(self, key: str) -> bytes:
        check_key(key)
        self._count_call("get")
        data, _, _ = self._download("get", key, None)
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        check_key(key)
        check_range(start, length)
        self._count_call("get_range")
        if length == 0:  # no HTTP range is empty; still tell a missing object
            if self._head("get_range", key) is None:
                raise ObjectNotFoundError(key, self.url)
            return b""
        try:
            data, first, _ = self._download("get_range", key, f"bytes={start}-{start + length - 1}")
        except _UnsatisfiableRangeError:
            return b""  # start at or past the end (416 is only sent for an existing object)
        return data[start - first : start - first + length]

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        check_key(key)
        check_range(0, length)
        self._count_call("get_tail")
        if length == 0:
            size = self._head("get_tail", key)
            if size is None:
                raise ObjectNotFoundError(key, self.url)
            return b"", size
        try:
            data, first, size = self._download("get_tail", key, f"bytes=-{length}")
        except _UnsatisfiableRangeError:
            return b"", 0  # a suffix range is unsatisfiable only on an empty object
        start = max(0, size - length)
        return data[start - first :], size

    def head(self, key: str) -> int | None:
        check_key(key)
        self._count_call("head")
        return self._head("head", key)

    def _head(self, op: str, key: str) -> int | None:
        s3_key = self._s3_key(key)
        try:
            response = self._call(op, key, "HeadObject", Bucket=self.bucket, Key=s3_key)
        except ObjectNotFoundError:
            # A HEAD 404 has no body, so it cannot say whether the key or the bucket is missing.
            self._bucket_gone_check(op, key)
            return None
        return int(response["ContentLength"])

    def list(self, prefix: str) -> builtins.list[str]:
        check_prefix(prefix)
        self._count_call("list")
        full = self.prefix + prefix
        keys: builtins.list[str] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full, "MaxKeys": self.list_page_size}
            if token is not None:
                kwargs["ContinuationToken"] = token
            try:
                page = self._call("list", prefix, "ListObjectsV2", **kwargs)
            except ObjectNotFoundError as exc:  # a body-less 404 from a proxy: treat as bucket gone
                raise S3StoreError(
                    "list", prefix, exc, retriable=True, attempts=1, url=self.url, reason="bucket not found"
                ) from exc
            for item in page.get("Contents", ()):
                rel = str(item["Key"])[len(self.prefix) :]
                try:
                    keys.append(check_key(rel))
                except InvalidObjectKeyError:
                    log.debug("s3 list %r: skipping foreign object %r", prefix, item["Key"])
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
        keys.sort()
        return keys

    def close(self) -> None:
        close = getattr(self._client, "close", None)
        if close is not None:
            close()


# ---- URLs -------------------------------------------------------------------------------------

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _bool(name: str, value: str) -> bool:
    v = value.lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ConfigError(f"s3 URL option {name}={value!r}: expected true or false")


def _float(name: str, value: str, minimum: float) -> float:
    try:
        parsed = float(value)
    except ValueError:
        raise ConfigError(f"s3 URL option {name}={value!r}: not a number") from None
    if not parsed >= minimum:  # also rejects nan
        raise ConfigError(f"s3 URL option {name}={value!r}: must be >= {minimum}")
    return parsed


def _int(name: str, value: str, minimum: int) -> int:
    try:
        parsed = int(value)
    except ValueError:
        raise ConfigError(f"s3 URL option {name}={value!r}: not an integer") from None
    if parsed < minimum:
        raise ConfigError(f"s3 URL option {name}={value!r}: must be >= {minimum}")
    return parsed


def parse_s3_url(url: str) -> dict[str, Any]:
    """The S3Store keyword arguments for `s3://bucket[/prefix][?option=value&...]`.

    Options: endpoint_url, region, path_style, profile, connect_timeout, read_timeout,
    max_attempts, retry_base_delay, retry_max_delay, max_concurrency, multipart_threshold,
    part_size, list_page_size (see docs/_s3.md). Unknown options are a ConfigError.
    """
    parts = urlsplit(url)
    if parts.scheme.lower() != "s3":
        raise ConfigError(f"store URL {url!r}: not an s3:// URL")
    bucket = parts.netloc
    if not bucket or "@" in bucket or ":" in bucket:
        raise ConfigError(f"store URL {url!r}: expected s3://bucket[/prefix] (no user, password or port)")
    if parts.fragment:
        raise ConfigError(f"store URL {url!r}: unexpected #fragment")
    kwargs: dict[str, Any] = {"bucket": bucket, "prefix": unquote(parts.path).strip("/")}
    retry: dict[str, Any] = {}
    seen: set[str] = set()
    for name, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
        if name in seen:
            raise ConfigError(f"store URL {url!r}: option {name!r} given twice")
        seen.add(name)
        if name in ("endpoint_url", "endpoint"):
            if not value.startswith(("http://", "https://")):
                raise ConfigError(f"s3 URL option {name}={value!r}: expected http(s)://host[:port]")
            kwargs["endpoint_url"] = value
        elif name == "region":
            kwargs["region"] = value or None
        elif name == "profile":
            kwargs["profile"] = value or None
        elif name == "path_style":
            kwargs["path_style"] = _bool(name, value)
        elif name in ("connect_timeout", "read_timeout"):
            kwargs[name] = _float(name, value, 0.001)
        elif name == "max_attempts":
            retry["max_attempts"] = _int(name, value, 1)
        elif name == "retry_base_delay":
            retry["base_delay"] = _float(name, value, 0)
        elif name == "retry_max_delay":
            retry["max_delay"] = _float(name, value, 0)
        elif name in ("max_concurrency", "list_page_size"):
            kwargs[name] = _int(name, value, 1)
        elif name in ("multipart_threshold", "part_size"):
            kwargs[name] = _int(name, value, 0)
        else:
            raise ConfigError(f"store URL {url!r}: unknown s3 option {name!r}")
    if retry:
        kwargs["retry"] = RetryPolicy(
            max_attempts=retry.get("max_attempts", DEFAULT_MAX_ATTEMPTS),
            base_delay=retry.get("base_delay", DEFAULT_BASE_DELAY),
            max_delay=retry.get("max_delay", DEFAULT_MAX_DELAY),
        )
    return kwargs


def open_s3_store(url: str, fs: FileSystem | None = None) -> S3Store:
    """The `open_store` factory for s3:// URLs (`fs` is unused: S3 is not a filesystem)."""
    return S3Store(**parse_s3_url(url))


def register() -> None:
    """Make `open_store` serve s3:// URLs (idempotent)."""
    from loglake.store import register_scheme

    register_scheme("s3", open_s3_store)
