"""S3Store through a fault-injecting HTTP proxy in front of moto (real HTTP on 127.0.0.1):
retries with backoff, timeouts, resumed downloads after a reset, a bucket that disappears for a
while, retry exhaustion, multipart failures, and the bound on concurrent requests."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("boto3", reason="the S3 store needs boto3 (the s3 extra)")
pytest.importorskip("moto", reason="the S3 store tests need moto[server] (the test extra)")

import s3kit
from loglake.errors import StorageError
from loglake.store.retry import RetryPolicy
from loglake.store.s3 import MIN_PART_SIZE, S3Store, S3StoreError
from s3kit import FaultProxy, make_store

# The kit's fixtures (one moto server per test module).
moto_endpoint = s3kit.moto_endpoint
s3_client = s3kit.s3_client
bucket = s3kit.bucket
fault_proxy = s3kit.fault_proxy
_proxy_server = s3kit._proxy_server

MiB = 1024 * 1024


def retry_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "loglake.store.s3" and r.levelno == logging.WARNING
    ]


@pytest.fixture
def store(fault_proxy: FaultProxy, bucket: str) -> S3Store:
    return make_store(fault_proxy.endpoint, bucket, "f")


def test_server_errors_then_success(
    store: S3Store, fault_proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="loglake.store.s3")
    fault_proxy.fail(3, 500, "InternalError", method="PUT")
    store.put("a/obj", [b"payload"])
    assert store.retries == {"put": 3}
    assert store.requests["PutObject"] == 4
    assert [r.status for r in fault_proxy.requests("PUT")] == [500, 500, 500, 200]
    warnings = retry_warnings(caplog)
    assert len(warnings) == 3
    assert "s3 put 'a/obj': attempt 1/6 failed" in warnings[0] and "InternalError" in warnings[0]
    assert "attempt 3/6" in warnings[2] and "retrying in" in warnings[2]

    fault_proxy.slow_down(2, method="GET")
    assert store.get_range("a/obj", 1, 3) == b"ayl"
    assert store.retries["get_range"] == 2 and "throttled (SlowDown)" in retry_warnings(caplog)[3]
    fault_proxy.fail(1, 503, "ServiceUnavailable")
    fault_proxy.fail(1, 502, "BadGateway")
    fault_proxy.fail(1, 429, "TooManyRequestsException")
    assert store.list("a/") == ["a/obj"]
    assert store.retries["list"] == 3
    fault_proxy.fail(2, 500, method="HEAD")
    assert store.head("a/obj") == 7
    fault_proxy.fail(1, 400, "RequestTimeout", method="DELETE")  # a 400 that S3 says to retry
    store.delete("a/obj")
    assert store.retries["delete"] == 1
    assert store.head("a/obj") is None


def test_slow_responses_within_read_timeout(store: S3Store, fault_proxy: FaultProxy) -> None:
    store.put("slow", [b"x" * 1000])
    fault_proxy.delay(0.3, times=3)
    t0 = time.monotonic()
    assert store.get("slow") == b"x" * 1000
    assert store.head("slow") == 1000
    assert store.get_tail("slow", 10) == (b"x" * 10, 1000)
    assert time.monotonic() - t0 >= 0.9
    assert sum(store.retries.values()) == 0


def test_response_slower_than_read_timeout_is_retried(
    fault_proxy: FaultProxy, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = make_store(fault_proxy.endpoint, bucket, read_timeout=0.3)
    store.put("k", [b"v"])
    fault_proxy.delay(1.0, times=1, method="GET")
    assert store.get("k") == b"v"
    assert store.retries == {"get": 1}
    assert "ReadTimeoutError" in retry_warnings(caplog)[0]


def test_reset_mid_body_resumes_from_first_missing_byte(
    store: S3Store, fault_proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    data = random.Random(5).randbytes(6 * MiB)
    store.put("big", [data])
    fault_proxy.clear()
    start, length, cut = 1 * MiB + 123, 4 * MiB, 2 * MiB + 500_000
    fault_proxy.reset(cut, times=1)
    got = store.get_range("big", start, length)
    assert got == data[start : start + length]
    gets = fault_proxy.requests("GET")
    assert len(gets) == 2
    assert gets[0].headers["range"] == f"bytes={start}-{start + length - 1}"
    resumed_at = int(gets[1].headers["range"].removeprefix("bytes=").split("-")[0])
    assert gets[1].headers["range"] == f"bytes={resumed_at}-{start + length - 1}"
    assert start < resumed_at <= start + cut  # only the missing bytes were asked for again
    assert gets[1].headers["if-match"]  # pinned to the same object version
    assert store.bytes_in == length  # no byte was downloaded twice
    assert store.retries == {"get_range": 1}
    assert "transport error" in retry_warnings(caplog)[0]


def test_reset_mid_body_of_get_and_get_tail(store: S3Store, fault_proxy: FaultProxy) -> None:
    data = random.Random(6).randbytes(3 * MiB)
    store.put("obj", [data])
    fault_proxy.reset(1 * MiB + 7, times=2)  # two resets in one read
    assert store.get("obj") == data
    gets = fault_proxy.requests("GET")
    assert len(gets) == 3 and "range" not in gets[0].headers
    assert all(g.headers["range"].endswith(f"-{len(data) - 1}") for g in gets[1:])
    fault_proxy.clear()
    fault_proxy.reset(100_000, times=1)
    assert store.get_tail("obj", 2 * MiB) == (data[-2 * MiB :], len(data))
    gets = fault_proxy.requests("GET")
    assert gets[0].headers["range"] == f"bytes=-{2 * MiB}"
    assert gets[1].headers["range"].endswith(f"-{len(data) - 1}")
    first = len(data) - 2 * MiB
    assert first < int(gets[1].headers["range"][6:].split("-")[0]) <= first + 100_000


def test_object_replaced_during_resume_restarts_whole(
    store: S3Store, fault_proxy: FaultProxy, s3_client: Any, bucket: str
) -> None:
    old = b"a" * (2 * MiB)
    new = b"b" * (3 * MiB)
    store.put("obj", [old])
    fault_proxy.reset(MiB + 5, times=1)
    swapped = threading.Event()

    def replace(**_: Any) -> None:  # before the resumed GET goes out, replace the object
        if not swapped.is_set() and store.requests["GetObject"] == 2:
            s3_client.put_object(Bucket=bucket, Key="f/obj", Body=new)
            swapped.set()

    store._client.meta.events.register("before-send.s3.GetObject", replace)
    assert store.get("obj") == new  # never a mix of the two versions
    assert swapped.is_set()
    statuses = [r.status for r in fault_proxy.requests("GET")]
    assert statuses == [200, 412, 200]


def test_bucket_gone_for_a_while(store: S3Store, fault_proxy: FaultProxy, bucket: str) -> None:
    store.put("seg", [b"data"])
    fault_proxy.bucket_gone(bucket)
    ops: dict[str, Callable[[], object]] = {
        "put": lambda: store.put("seg2", [b"x"]),
        "get": lambda: store.get("seg"),
        "get_range": lambda: store.get_range("seg", 0, 2),
        "get_tail": lambda: store.get_tail("seg", 2),
        "head": lambda: store.head("seg"),
        "list": lambda: store.list(""),
        "delete": lambda: store.delete("seg2"),
    }
    for op, call in ops.items():
        with pytest.raises(S3StoreError) as info:
            call()
        err = info.value
        assert (err.op, err.retriable) == (op, True), op
        assert "bucket does not exist" in str(err)
    assert sum(store.retries.values()) == 0  # not retried inside the store: the caller decides
    fault_proxy.bucket_back(bucket)
    assert store.get("seg") == b"data"
    store.put("seg2", [b"x"])
    assert store.list("") == ["seg", "seg2"]


def test_caller_retrying_outlives_a_bucket_outage(
    store: S3Store, fault_proxy: FaultProxy, bucket: str
) -> None:
    """What the engine does: keep retrying a retriable StorageError later."""
    fault_proxy.bucket_gone(bucket, seconds=0.5)
    failures = 0
    deadline = time.monotonic() + 10
    while True:
        try:
            store.put("late", [b"made it"])
            break
        except StorageError as exc:
            assert exc.retriable and time.monotonic() < deadline
            failures += 1
            time.sleep(0.05)
    assert failures >= 3
    assert store.get("late") == b"made it"


def test_retries_exhausted(fault_proxy: FaultProxy, bucket: str, caplog: pytest.LogCaptureFixture) -> None:
    store = make_store(fault_proxy.endpoint, bucket, "x", retry=RetryPolicy(max_attempts=4, base_delay=0.001))
    fault_proxy.slow_down(100)
    with pytest.raises(S3StoreError) as info:
        store.get("seg/00.seg")
    err = info.value
    assert (err.op, err.path, err.retriable, err.attempts) == ("get", "seg/00.seg", True, 4)
    assert (err.code, err.status) == ("SlowDown", 503)
    assert "get" in str(err) and "seg/00.seg" in str(err) and "retries exhausted" in str(err)
    assert err.__cause__ is err.cause
    assert len(fault_proxy.requests()) == 4
    assert len(retry_warnings(caplog)) == 3


def test_connection_refused_is_retriable(bucket: str) -> None:
    from portkit import free_port

    port = free_port()  # nothing listens there
    store = make_store(
        f"http://127.0.0.1:{port}", bucket, retry=RetryPolicy(max_attempts=3, base_delay=0.001)
    )
    with pytest.raises(S3StoreError) as info:
        store.head("k")
    assert info.value.retriable is True and info.value.attempts == 3
    assert "EndpointConnectionError" in str(info.value)


def test_multipart_part_retried(store: S3Store, fault_proxy: FaultProxy) -> None:
    mp = make_store(
        fault_proxy.endpoint, store.bucket, "mp", multipart_threshold=MIN_PART_SIZE, part_size=MIN_PART_SIZE
    )
    data = random.Random(8).randbytes(MIN_PART_SIZE + 1000)
    fault_proxy.fail(2, 500, method="PUT", path_contains="/mp/")
    mp.put("seg", [data[:100], data[100:]])
    assert mp.get("seg") == data
    assert mp.requests["UploadPart"] == 4 and mp.retries["put"] == 2
    parts = [r for r in fault_proxy.requests("PUT") if "partNumber=" in r.path and r.status == 200]
    assert [("partNumber=1" in r.path, r.headers["x-amz-checksum-crc32c"] != "") for r in parts] == [
        (True, True),
        (False, True),
    ]


def test_multipart_failure_aborts_and_publishes_nothing(
    store: S3Store, fault_proxy: FaultProxy, s3_client: Any
) -> None:
    mp = make_store(
        fault_proxy.endpoint, store.bucket, "mp", multipart_threshold=MIN_PART_SIZE, part_size=MIN_PART_SIZE
    )
    fault_proxy.fail(100, 503, "SlowDown", method="PUT", path_contains="/mp/seg", skip=1)  # part 2 fails
    with pytest.raises(S3StoreError) as info:
        mp.put("seg", [b"z" * (MIN_PART_SIZE + 1)])
    assert info.value.op == "put" and info.value.retriable is True
    assert mp.requests["UploadPart"] == 1 + 6
    assert mp.requests["AbortMultipartUpload"] == 1
    assert s3_client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", []) == []
    fault_proxy.clear()
    assert mp.head("seg") is None and mp.list("") == []


def test_lost_complete_answer_is_recognised(store: S3Store, fault_proxy: FaultProxy) -> None:
    mp = make_store(
        fault_proxy.endpoint, store.bucket, "mp", multipart_threshold=MIN_PART_SIZE, part_size=MIN_PART_SIZE
    )
    data = random.Random(9).randbytes(MIN_PART_SIZE + 10)
    # The first POST creates the upload; the second completes it: moto does, the answer is lost.
    fault_proxy.reset(0, times=1, method="POST", path_contains="/mp/seg", skip=1)
    mp.put("seg", [data])
    assert mp.get("seg") == data
    assert mp.requests["CompleteMultipartUpload"] == 2 and mp.retries["put"] == 1
    # moto completes the same upload twice; S3 may answer NoSuchUpload, then the store checks
    # with a HeadObject that the object is there with the right size.
    assert mp.requests["HeadObject"] in (0, 1)


def test_cut_off_list_answer_is_not_an_empty_list(
    store: S3Store, fault_proxy: FaultProxy, bucket: str
) -> None:
    store.put("a", [b"1"])
    store.put("b", [b"2"])
    for cut in (0, 60):  # nothing, or a part of the XML
        fault_proxy.reset(cut, times=1, method="GET", path_contains=f"/{bucket}")
        assert store.list("") == ["a", "b"]
    assert store.retries["list"] == 2


def test_concurrency_is_bounded(fault_proxy: FaultProxy, bucket: str) -> None:
    store = make_store(fault_proxy.endpoint, bucket, max_concurrency=3)
    assert store._client.meta.config.max_pool_connections == 3
    store.put("k", [b"v"])
    fault_proxy.clear()
    fault_proxy.delay(0.15)
    threads = [threading.Thread(target=store.head, args=("k",)) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fault_proxy.requests("HEAD")) == 12
    assert fault_proxy.max_in_flight == 3
