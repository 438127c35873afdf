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

import builtins
import collections
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import botocore.exceptions

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
from loglake.store.retry import RetryPolicy
from loglake.store.s3_errors import (
    HANDLED_EXCEPTIONS,
    S3StoreError,
    ShortBodyError,
    UnsatisfiableRangeError,
    Verdict,
    classify,
    error_code,
)
from loglake.store.s3_url import parse_s3_url
from loglake.store.s3_wire import PartsReader, crc32c_b64, make_client, span_of

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

T = TypeVar("T")


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
        verdict = Verdict("retry", "object changed during the read") if force_retry else classify(exc)
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
        sse: str | None = None,
        sse_kms_key_id: str | None = None,
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
        #: Server-side encryption asked for on every upload (PutObject, CreateMultipartUpload);
        #: reads need nothing (S3 decrypts SSE-S3 and SSE-KMS objects for an authorized caller).
        self._sse_args: dict[str, str] = {}
        if sse is not None:
            self._sse_args["ServerSideEncryption"] = sse
        if sse_kms_key_id is not None:
            self._sse_args["SSEKMSKeyId"] = sse_kms_key_id
        self._sleep = sleep
        self._client: Any = client
        if self._client is None:
            try:
                self._client = make_client(
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
            except HANDLED_EXCEPTIONS as exc:
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
            checksum = crc32c_b64(views, 0, total)

            def attempt(_: _Attempts) -> None:
                with self._slots:
                    self._request(
                        "PutObject",
                        Bucket=self.bucket,
                        Key=s3_key,
                        Body=PartsReader(views, 0, total),
                        ContentLength=total,
                        ChecksumAlgorithm="CRC32C",
                        ChecksumCRC32C=checksum,
                        **self._sse_args,
                    )

            self._retrying("put", key, attempt)
            self._count_bytes(sent=total)
        else:
            self._put_multipart(key, s3_key, views, total)

    def _put_multipart(self, key: str, s3_key: str, views: Sequence[memoryview], total: int) -> None:
        part_size = max(self.part_size, math.ceil(total / MAX_PARTS))
        created = self._call(
            "put",
            key,
            "CreateMultipartUpload",
            Bucket=self.bucket,
            Key=s3_key,
            ChecksumAlgorithm="CRC32C",
            **self._sse_args,
        )
        upload_id = str(created["UploadId"])
        try:
            done: list[dict[str, Any]] = []
            for number, lo in enumerate(range(0, total, part_size), start=1):
                hi = min(total, lo + part_size)
                checksum = crc32c_b64(views, lo, hi)

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
                            Body=PartsReader(views, lo, hi),
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
                    if attempts.count > 1 and error_code(exc)[0] == "NoSuchUpload":
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
        Raises UnsatisfiableRangeError on HTTP 416.
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
                        span = span_of(response)
                        if resuming:
                            if span[0] != first + len(buf) or span[1] != end:
                                raise ShortBodyError(f"resumed GET answered bytes {span[0]}..{span[1]}")
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
                    raise ShortBodyError(f"got {len(buf)} of {end - first} bytes")
                return bytes(buf), first, size
            except botocore.exceptions.ClientError as exc:
                code = error_code(exc)[0]
                if code == "InvalidRange" and not resuming:
                    raise UnsatisfiableRangeError(str(exc)) from exc
                if code == "PreconditionFailed" and resuming:
                    # Replaced since the first response: start over on the new object.
                    buf.clear()
                    etag = None
                    first = end = size = 0
                    attempts.failed(exc, force_retry=True)
                    continue
                attempts.failed(exc)
            except HANDLED_EXCEPTIONS as exc:
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
        except UnsatisfiableRangeError:
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
        except UnsatisfiableRangeError:
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


def open_s3_store(url: str, fs: FileSystem | None = None) -> S3Store:
    """The `open_store` factory for s3:// URLs (`fs` is unused: S3 is not a filesystem)."""
    return S3Store(**parse_s3_url(url))


def register() -> None:
    """Make `open_store` serve s3:// URLs (idempotent)."""
    from loglake.store import register_scheme

    register_scheme("s3", open_s3_store)
