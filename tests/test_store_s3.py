"""S3Store against a moto S3 server: the same store contract as LocalStore/MemoryStore, plus
prefixes, pagination, multipart uploads, suffix-range tails, s3:// URLs and error mapping."""

from __future__ import annotations

import base64
import inspect
import math
import random
from collections.abc import Callable, Iterator
from typing import Any

import crc32c
import pytest

pytest.importorskip("boto3", reason="the S3 store needs boto3 (the s3 extra)")
pytest.importorskip("moto", reason="the S3 store tests need moto[server] (the test extra)")

import loglake.store as store_pkg
import s3kit
import test_store as contract
from loglake.errors import ConfigError, StorageError
from loglake.fs.os_fs import OsFileSystem
from loglake.store import ObjectNotFoundError, ObjectStore, open_store
from loglake.store.base import BytesLike
from loglake.store.retry import DEFAULT_MAX_ATTEMPTS, RetryPolicy
from loglake.store.s3 import (
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MULTIPART_THRESHOLD,
    MIN_PART_SIZE,
    S3Store,
    S3StoreError,
    open_s3_store,
    parse_s3_url,
)
from s3kit import FaultProxy, make_store, seed_objects, store_url

# The kit's fixtures (one moto server per test module).
moto_endpoint = s3kit.moto_endpoint
s3_client = s3kit.s3_client
bucket = s3kit.bucket
fault_proxy = s3kit.fault_proxy
_proxy_server = s3kit._proxy_server

MiB = 1024 * 1024

# ---- the shared contract ----------------------------------------------------------------------
# Every test of tests/test_store.py that takes the `store` fixture runs here again, unchanged,
# with `store` an S3Store on moto (with and without a key prefix).


def _contract_tests() -> dict[str, Callable[..., Any]]:
    found = {}
    for name, fn in vars(contract).items():
        if name.startswith("test_") and callable(fn) and "store" in inspect.signature(fn).parameters:
            found[name] = fn
    return found


CONTRACT_TESTS = _contract_tests()
globals().update({f"{name}_s3": fn for name, fn in CONTRACT_TESTS.items()})


def test_contract_is_shared() -> None:
    assert len(CONTRACT_TESTS) >= 9
    assert "test_get_range_bounds" in CONTRACT_TESTS


@pytest.fixture(params=["", "pre/fix"], ids=["no-prefix", "prefix"])
def store(request: pytest.FixtureRequest, moto_endpoint: str, bucket: str) -> Iterator[ObjectStore]:
    s = make_store(moto_endpoint, bucket, request.param)
    yield s
    s.close()


# ---- S3 specifics -----------------------------------------------------------------------------


def test_prefix_maps_keys_inside_the_bucket(moto_endpoint: str, bucket: str, s3_client: Any) -> None:
    a = make_store(moto_endpoint, bucket, "/tenants/a/")
    sibling = make_store(moto_endpoint, bucket, "tenants/ab")
    root = make_store(moto_endpoint, bucket)
    assert a.prefix == "tenants/a/" and a.url == f"s3://{bucket}/tenants/a/"
    assert root.prefix == "" and root.url == f"s3://{bucket}/"
    a.put("t-1/0/00.seg", [b"abc"])
    sibling.put("x", [b"other"])
    listed = s3_client.list_objects_v2(Bucket=bucket)
    assert sorted(o["Key"] for o in listed["Contents"]) == ["tenants/a/t-1/0/00.seg", "tenants/ab/x"]
    assert a.list("") == ["t-1/0/00.seg"]  # relative to the store, the sibling prefix not seen
    assert sibling.list("") == ["x"]
    assert root.list("tenants/a") == ["tenants/a/t-1/0/00.seg", "tenants/ab/x"]
    assert root.get("tenants/a/t-1/0/00.seg") == b"abc"
    assert a.local_path("t-1/0/00.seg") is None
    with pytest.raises(ConfigError):
        make_store(moto_endpoint, bucket, "a/../b")
    with pytest.raises(ConfigError):
        make_store(moto_endpoint, bucket, profile="no-such-profile-here")


def test_list_skips_objects_that_are_not_valid_keys(moto_endpoint: str, bucket: str, s3_client: Any) -> None:
    for key in ("p/ok", "p//double", "p/upload.tmp", "p/x/"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=b"1")
    assert make_store(moto_endpoint, bucket, "p").list("") == ["ok"]


def test_list_paginates(moto_endpoint: str, bucket: str) -> None:
    store = make_store(moto_endpoint, bucket, "many", list_page_size=100)
    keys = [f"k/{i:05d}" for i in range(1050)]
    seed_objects(bucket, ["many/" + k for k in keys[:-2]])
    store.put(keys[-2], [b"x"])
    store.put(keys[-1], [b"x"])
    assert store.get(keys[0]) == b"x"  # the seeded objects are real objects
    assert store.list("") == keys
    assert store.requests["ListObjectsV2"] == 11
    assert store.list("k/0099") == [f"k/{i:05d}" for i in range(990, 1000)]
    # S3's own page size (1000) too: two pages.
    big = make_store(moto_endpoint, bucket, "many")
    assert len(big.list("k/")) == 1050 and big.requests["ListObjectsV2"] == 2


def test_put_sends_crc32c(moto_endpoint: str, bucket: str, s3_client: Any) -> None:
    store = make_store(moto_endpoint, bucket)
    store.put("obj", [b"hello ", memoryview(b"world")])
    head = s3_client.head_object(Bucket=bucket, Key="obj", ChecksumMode="ENABLED")
    assert (
        head["ChecksumCRC32C"] == base64.b64encode(crc32c.crc32c(b"hello world").to_bytes(4, "big")).decode()
    )
    assert store.bytes_out == 11


def test_multipart_put_above_threshold(moto_endpoint: str, bucket: str, s3_client: Any) -> None:
    store = make_store(moto_endpoint, bucket, "mp", multipart_threshold=6 * MiB, part_size=MIN_PART_SIZE)
    rnd = random.Random(7)
    parts: list[BytesLike] = [
        rnd.randbytes(3 * MiB + 17),
        bytearray(rnd.randbytes(7 * MiB)),
        memoryview(rnd.randbytes(3 * MiB)),
    ]
    data = b"".join(parts)
    store.put("big.seg", parts)
    assert store.requests["CreateMultipartUpload"] == 1
    assert store.requests["UploadPart"] == math.ceil(len(data) / MIN_PART_SIZE) == 3
    assert store.requests["CompleteMultipartUpload"] == 1
    assert store.requests["PutObject"] == 0
    assert store.head("big.seg") == len(data)
    assert store.get("big.seg") == data
    assert store.get_range("big.seg", 5 * MiB - 3, 10) == data[5 * MiB - 3 : 5 * MiB + 7]
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    # At the threshold exactly: one PutObject.
    store.put("edge.seg", [data[: 6 * MiB]])
    assert store.requests["PutObject"] == 1 and store.requests["UploadPart"] == 3
    assert store.get("edge.seg") == data[: 6 * MiB]


def test_get_tail_is_one_suffix_range_request(moto_endpoint: str, bucket: str) -> None:
    store = make_store(moto_endpoint, bucket)
    data = bytes(range(256)) * 40
    store.put("t", [data])
    before = store.requests.copy()
    assert store.get_tail("t", 100) == (data[-100:], len(data))
    assert store.requests - before == {"GetObject": 1}
    assert store.get_tail("t", 10**6) == (data, len(data))
    store.put("empty", [])
    assert store.get_tail("empty", 5) == (b"", 0)
    assert store.get_tail("t", 0) == (b"", len(data))
    with pytest.raises(ObjectNotFoundError):
        store.get_tail("missing", 0)
    assert store.bytes_in == 100 + len(data)


def test_get_range_past_end_is_one_request(moto_endpoint: str, bucket: str) -> None:
    store = make_store(moto_endpoint, bucket)
    store.put("r", [b"0123456789"])
    before = store.requests.copy()
    assert store.get_range("r", 10, 5) == b""
    assert store.get_range("r", 8, 5) == b"89"
    assert store.requests - before == {"GetObject": 2}


def test_counters(moto_endpoint: str, bucket: str) -> None:
    store = make_store(moto_endpoint, bucket)
    store.put("a", [b"12345"])
    store.get("a")
    store.get_range("a", 1, 2)
    store.head("a")
    store.head("nope")  # a miss costs a HeadBucket too (see docs/_s3.md)
    store.list("")
    store.delete("a")
    assert store.calls == {"put": 1, "get": 1, "get_range": 1, "head": 2, "list": 1, "delete": 1}
    assert store.requests == {
        "PutObject": 1,
        "GetObject": 2,
        "HeadObject": 2,
        "HeadBucket": 1,
        "ListObjectsV2": 1,
        "DeleteObject": 1,
    }
    assert (store.bytes_out, store.bytes_in) == (5, 7)
    assert sum(store.retries.values()) == 0


# ---- URLs -------------------------------------------------------------------------------------


def test_parse_s3_url_options() -> None:
    kw = parse_s3_url(
        "s3://my-bucket/some/prefix/?endpoint_url=http://127.0.0.1:9000&region=eu-west-1&path_style=true"
        "&profile=minio&connect_timeout=1.5&read_timeout=20&max_attempts=3&retry_base_delay=0.2"
        "&retry_max_delay=2&max_concurrency=4&multipart_threshold=10485760&part_size=5242880"
        "&list_page_size=500"
    )
    assert kw == {
        "bucket": "my-bucket",
        "prefix": "some/prefix",
        "endpoint_url": "http://127.0.0.1:9000",
        "region": "eu-west-1",
        "path_style": True,
        "profile": "minio",
        "connect_timeout": 1.5,
        "read_timeout": 20.0,
        "max_concurrency": 4,
        "multipart_threshold": 10 * MiB,
        "part_size": 5 * MiB,
        "list_page_size": 500,
        "retry": RetryPolicy(max_attempts=3, base_delay=0.2, max_delay=2.0),
    }
    assert parse_s3_url("s3://b") == {"bucket": "b", "prefix": ""}
    assert parse_s3_url("s3://b/p%20q")["prefix"] == "p q"


@pytest.mark.parametrize(
    "url",
    [
        "s3://",
        "s3:///prefix",
        "s3://user:pw@bucket/p",
        "s3://bucket:9000/p",
        "s3://b/p?unknown=1",
        "s3://b/p?path_style=maybe",
        "s3://b/p?max_attempts=0",
        "s3://b/p?read_timeout=-1",
        "s3://b/p?read_timeout=nan",
        "s3://b/p?max_concurrency=x",
        "s3://b/p?region=a&region=b",
        "s3://b/p?endpoint_url=127.0.0.1:9000",
        "s3://b/p#frag",
        "s3://b/a/../c",
        "s3://b/p?part_size=1024",
        "s3://b/p?list_page_size=5000",
        "s3://b/p?sse=aes256",
        "s3://b/p?sse=",
        "s3://b/p?sse=AES256&sse_kms_key_id=k",
        "s3://b/p?sse_kms_key_id=k",
        "s3://b/p?sse=aws:kms&sse_kms_key_id=",
    ],
)
def test_bad_s3_urls(url: str) -> None:
    with pytest.raises(ConfigError):
        open_s3_store(url)


def test_open_store_s3_url(moto_endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Registered for this test only: tests/test_store.py checks s3:// is unknown by default.
    monkeypatch.setitem(store_pkg._schemes, "s3", open_s3_store)
    url = store_url(moto_endpoint, bucket, "via/url", max_attempts=2, max_concurrency=3)
    store = open_store(url, OsFileSystem())
    assert isinstance(store, S3Store)
    assert store.url == f"s3://{bucket}/via/url/" and store.prefix == "via/url/"
    assert store.retry.max_attempts == 2 and store.max_concurrency == 3
    store.put("k", [b"v"])
    assert open_store(url, OsFileSystem()).get("k") == b"v"
    assert store_url(moto_endpoint, bucket) == (
        f"s3://{bucket}?endpoint_url=http%3A%2F%2F127.0.0.1%3A{moto_endpoint.rsplit(':', 1)[1]}"
        "&region=us-east-1&path_style=true"
    )
    store.close()


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"sse": "AES256"}, {"ServerSideEncryption": "AES256"}),
        (
            {"sse": "aws:kms", "sse_kms_key_id": "alias/loglake"},
            {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "alias/loglake"},
        ),
    ],
)
def test_server_side_encryption_on_every_upload(
    moto_endpoint: str, bucket: str, s3_client: Any, query: dict[str, str], expected: dict[str, str]
) -> None:
    """`?sse=` asks S3 to encrypt each object it stores, single PutObject and multipart alike."""
    kw = parse_s3_url(store_url(moto_endpoint, bucket, "enc", **query))
    assert {k: kw[k] for k in query} == query
    store = make_store(moto_endpoint, bucket, "enc", multipart_threshold=MIN_PART_SIZE, part_size=MIN_PART_SIZE,
                       sse=kw["sse"], sse_kms_key_id=kw.get("sse_kms_key_id"))
    small, large = b"x" * 100, b"y" * (MIN_PART_SIZE + 10)
    store.put("small", [small])
    store.put("large", [large])
    for key, body in (("small", small), ("large", large)):
        head = s3_client.head_object(Bucket=bucket, Key=f"enc/{key}")
        got = {k: head.get(k) for k in expected}
        assert got == expected, (key, head)
        assert store.get(key) == body
    assert store.requests["CreateMultipartUpload"] == 1
    store.close()


def test_defaults() -> None:
    store = S3Store("bucket", region="us-east-1")
    assert store.retry.max_attempts == DEFAULT_MAX_ATTEMPTS == 6
    assert store.max_concurrency == DEFAULT_MAX_CONCURRENCY == 16
    assert store._client.meta.config.max_pool_connections == 16
    assert store._client.meta.config.retries == {"mode": "standard", "total_max_attempts": 1}
    assert store.multipart_threshold == DEFAULT_MULTIPART_THRESHOLD
    assert repr(store) == "S3Store('bucket', '')"
    store.close()


def test_retry_policy_full_jitter_is_bounded() -> None:
    policy = RetryPolicy(max_attempts=6, base_delay=0.1, max_delay=1.0, rng=random.Random(3))
    assert [policy.ceiling(n) for n in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    for n in range(1, 50):
        assert 0.0 <= policy.delay(n) <= policy.ceiling(n) <= 1.0
    assert policy.worst_case_total_delay() == pytest.approx(0.1 + 0.2 + 0.4 + 0.8 + 1.0)
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)


# ---- errors -----------------------------------------------------------------------------------


def test_missing_objects_and_bucket(moto_endpoint: str, bucket: str) -> None:
    store = make_store(moto_endpoint, bucket)
    with pytest.raises(ObjectNotFoundError) as nf:
        store.get("no/such")
    assert nf.value.key == "no/such" and store.url in str(nf.value)
    assert sum(store.retries.values()) == 0
    gone = make_store(moto_endpoint, bucket + "-missing")
    for op in (
        lambda: gone.get("k"),
        lambda: gone.get_range("k", 0, 4),
        lambda: gone.get_tail("k", 4),
        lambda: gone.head("k"),  # not None: the bucket itself is missing
        lambda: gone.list(""),
        lambda: gone.put("k", [b"x"]),
        lambda: gone.delete("k"),
    ):
        with pytest.raises(S3StoreError) as info:
            op()
        assert info.value.retriable is True and info.value.attempts == 1
    assert sum(gone.retries.values()) == 0


@pytest.mark.parametrize(
    ("status", "code"), [(403, "AccessDenied"), (403, "InvalidAccessKeyId"), (400, "InvalidArgument")]
)
def test_final_errors_are_not_retried(
    fault_proxy: FaultProxy, bucket: str, status: int, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = make_store(fault_proxy.endpoint, bucket)
    fault_proxy.fail(10, status, code)
    with pytest.raises(S3StoreError) as info:
        store.get("k")
    err = info.value
    assert isinstance(err, StorageError)
    assert (err.op, err.path, err.retriable, err.attempts, err.code, err.status) == (
        "get",
        "k",
        False,
        1,
        code,
        status,
    )
    assert err.__cause__ is err.cause
    assert len(fault_proxy.requests()) == 1
    assert not [r for r in caplog.records if r.name == "loglake.store.s3"]


def test_no_credentials_is_final(moto_endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    store = make_store(moto_endpoint, bucket)
    with pytest.raises(S3StoreError) as info:
        store.head("k")
    assert info.value.retriable is False and "NoCredentialsError" in str(info.value)
    # Explicit credentials override the (now empty) environment.
    explicit = make_store(moto_endpoint, bucket, access_key_id="id", secret_access_key="secret")
    assert explicit.head("k") is None
