"""`s3://bucket[/prefix]?option=value&...` URLs: what each option means for an `S3Store`."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from loglake.errors import ConfigError
from loglake.store.retry import (
    DEFAULT_BASE_DELAY,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_DELAY,
    RetryPolicy,
)

__all__ = ["SSE_MODES", "parse_s3_url"]

#: S3's server-side encryption modes (the x-amz-server-side-encryption header): keys S3 manages
#: (AES256), keys in AWS KMS (aws:kms), and KMS with two layers (aws:kms:dsse). Customer-provided
#: keys (SSE-C) are left out on purpose: the key would have to travel in every URL and log line.
SSE_MODES = ("AES256", "aws:kms", "aws:kms:dsse")

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
    part_size, list_page_size sse, sse_kms_key_id (see docs/S3.md). Unknown options are a ConfigError.
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
        elif name == "sse":
            if value not in SSE_MODES:
                raise ConfigError(f"s3 URL option sse={value!r}: expected one of {', '.join(SSE_MODES)}")
            kwargs["sse"] = value
        elif name == "sse_kms_key_id":
            if not value:
                raise ConfigError("s3 URL option sse_kms_key_id is empty")
            kwargs["sse_kms_key_id"] = value
        else:
            raise ConfigError(f"store URL {url!r}: unknown s3 option {name!r}")
    if "sse_kms_key_id" in kwargs and kwargs.get("sse") not in ("aws:kms", "aws:kms:dsse"):
        raise ConfigError(f"store URL {url!r}: sse_kms_key_id needs sse=aws:kms or sse=aws:kms:dsse")
    if retry:
        kwargs["retry"] = RetryPolicy(
            max_attempts=retry.get("max_attempts", DEFAULT_MAX_ATTEMPTS),
            base_delay=retry.get("base_delay", DEFAULT_BASE_DELAY),
            max_delay=retry.get("max_delay", DEFAULT_MAX_DELAY),
        )
    return kwargs
