"""How a failed S3 request is judged: retry it, report the object missing, or give up.

`classify` turns one failed attempt (a botocore ClientError with S3's error code and HTTP status,
a transport exception, or a body shorter than its headers promised) into a `Verdict`;
`S3StoreError` is what an operation raises when the verdict is final or retries ran out.
"""

from __future__ import annotations

import http.client
from typing import Any, NamedTuple

import botocore.exceptions
import botocore.parsers
import urllib3.exceptions

from loglake.errors import StorageError

__all__ = [
    "HANDLED_EXCEPTIONS",
    "TRANSIENT_EXCEPTIONS",
    "S3StoreError",
    "ShortBodyError",
    "UnsatisfiableRangeError",
    "Verdict",
    "classify",
    "error_code",
]

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


class ShortBodyError(Exception):
    """A response body ended before (or ran past) the bytes its headers promised."""


#: Transport-level failures: a later attempt can succeed.
TRANSIENT_EXCEPTIONS: tuple[type[BaseException], ...] = (
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
HANDLED_EXCEPTIONS: tuple[type[BaseException], ...] = (
    botocore.exceptions.ClientError,
    botocore.exceptions.BotoCoreError,
    OSError,
    ShortBodyError,
    *TRANSIENT_EXCEPTIONS,
)


_CREDENTIALS_MISSING = (
    botocore.exceptions.NoCredentialsError,
    botocore.exceptions.PartialCredentialsError,
    botocore.exceptions.CredentialRetrievalError,
)
_UNREACHABLE = (
    botocore.exceptions.EndpointConnectionError,
    botocore.exceptions.ConnectTimeoutError,
    urllib3.exceptions.NewConnectionError,
    ConnectionRefusedError,
)


def hint_of(cause: BaseException) -> str | None:
    """What the user can do about an S3 failure caused by `cause`, when that is clear: the `hint:`
    line `loglake serve` and the commands print under the error (docs/S3.md)."""
    if isinstance(cause, _CREDENTIALS_MISSING):
        return (
            "give the broker S3 credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile (AWS_PROFILE, "
            'or profile=NAME in the store URL) or an instance role (docs/S3.md, "Credentials")'
        )
    if isinstance(cause, _UNREACHABLE):
        return (
            "nothing answered at the S3 endpoint: check the store URL's endpoint_url (and region), and that the "
            "endpoint is up and reachable from this machine"
        )
    code, _status = error_code(cause)
    if code == "NoSuchBucket":
        return "create the bucket first, or correct its name in the store URL"
    if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"):
        return "the S3 endpoint refused the credentials: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or the profile)"
    if code == "AccessDenied":
        return "the credentials may not use this bucket: allow them to list, read, write and delete objects in it (docs/S3.md)"
    return None


class S3StoreError(StorageError):
    """A failed S3 operation. `op`, `path` (the key or prefix), `retriable` and `cause` as in
    StorageError; also `attempts` made, the S3 error `code` and HTTP `status` when known, and a
    `hint` (what to do about it) when the cause says."""

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
        self.code, self.status = error_code(cause)
        self.reason = reason
        self.hint = hint_of(cause)
        hint = "a later retry may succeed" if retriable else "not retriable"
        self.args = (
            f"s3 {op} {key!r} in {url}: {reason} after {attempts} attempt(s) ({hint}): "
            f"{type(cause).__name__}: {cause}",
        )


class Verdict(NamedTuple):
    action: str  # "retry", "fail", "not_found" or "bucket_gone"
    reason: str


class UnsatisfiableRangeError(Exception):
    """HTTP 416: the object exists but the requested range has no byte in it."""


def error_code(exc: BaseException) -> tuple[str, int]:
    if isinstance(exc, botocore.exceptions.ClientError):
        response: Any = exc.response
        code = str(response.get("Error", {}).get("Code", ""))
        status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        return code, status
    return "", 0


def classify(exc: BaseException) -> Verdict:
    """What one failed attempt means for the operation."""
    if isinstance(exc, botocore.exceptions.ClientError):
        code, status = error_code(exc)
        if code == "NoSuchBucket":
            return Verdict("bucket_gone", "bucket does not exist (NoSuchBucket)")
        if code in ("NoSuchKey", "NotFound", "404") or (status == 404 and code != "NoSuchUpload"):
            return Verdict("not_found", f"not found ({code or status})")
        if code in _THROTTLE_CODES or status in (429, 503):
            return Verdict("retry", f"throttled ({code or status})")
        if code in _TRANSIENT_CODES or status in _RETRY_STATUSES or status >= 500:
            return Verdict("retry", f"server error ({code or 'HTTP'} {status})")
        return Verdict("fail", f"request refused ({code or 'HTTP'} {status})")
    if isinstance(exc, ShortBodyError):
        return Verdict("retry", "short response body")
    if isinstance(exc, TRANSIENT_EXCEPTIONS):
        return Verdict("retry", f"transport error ({type(exc).__name__})")
    if isinstance(exc, OSError):
        return Verdict("retry", f"transport error ({type(exc).__name__})")
    return Verdict("fail", f"client error ({type(exc).__name__})")
