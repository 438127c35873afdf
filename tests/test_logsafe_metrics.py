"""Units of the operating helpers: the rate-limited log (`loglake.logsafe`), the foreign-protocol sniffing of
frame prefixes, and `Metrics` (its own registry, error names, escaping)."""

from __future__ import annotations

import logging

import pytest

from loglake.broker.metrics import error_name, response_error
from loglake.broker.sniff import HTTP_HINT, TLS_HINT, foreign_protocol, prefix_bytes
from loglake.logsafe import RateLimitedLog, flush_all


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "logsafe-test"]


def test_repeats_are_counted_and_summarised_once_the_window_is_over(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limited = RateLimitedLog(logging.getLogger("logsafe-test"), interval_s=30, clock=clock)
    with caplog.at_level(logging.WARNING, "logsafe-test"):
        assert limited.warning(("too_large", "10.0.0.1"), "closing %s: too large", "10.0.0.1:1")
        for port in range(2, 237):
            clock.now += 0.1
            assert not limited.warning(("too_large", "10.0.0.1"), "closing %s: too large", f"10.0.0.1:{port}")
        assert limited.warning(("too_large", "10.0.0.2"), "closing %s: too large", "10.0.0.2:1")  # another peer
        assert limited.flush() == 0  # the window is not over yet
        clock.now += 30
        assert limited.flush() == 1
        assert limited.flush() == 0
    assert messages(caplog) == [
        "closing 10.0.0.1:1: too large",
        "closing 10.0.0.2:1: too large",
        "closing 10.0.0.1:236: too large (235 more in the last 30 s)",
    ]
    assert len(limited) == 0  # windows that are over are dropped, with or without repeats


def test_a_repeat_after_the_window_writes_the_summary_first(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limited = RateLimitedLog(logging.getLogger("logsafe-test"), interval_s=30, clock=clock)
    with caplog.at_level(logging.WARNING, "logsafe-test"):
        limited.warning("k", "disk slow")
        clock.now += 5
        limited.warning("k", "disk slow")
        clock.now += 40
        assert limited.warning("k", "disk slow again")
        clock.now += 2.5
        limited.warning("k", "disk slow")
        assert flush_all(force=True) >= 1
    assert messages(caplog) == [
        "disk slow",
        "disk slow (1 more in the last 30 s)",
        "disk slow again",
        "disk slow (1 more in the last 2.5 s)",
    ]


def test_tracked_keys_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limited = RateLimitedLog(logging.getLogger("logsafe-test"), interval_s=30, max_keys=3, clock=clock)
    with caplog.at_level(logging.WARNING, "logsafe-test"):
        limited.warning("a", "a")
        limited.warning("a", "a")
        for key in "bcdefg":
            limited.warning(key, key)
        assert len(limited) == 3
    # "a" was the oldest key: its repeat was written out when it was dropped, not lost.
    assert messages(caplog)[:5] == ["a", "b", "c", "a (1 more in the last 0.0 s)", "d"]


def test_http_and_tls_prefixes_are_recognised() -> None:
    for line in (b"GET / HTTP/1.1", b"POST /x", b"HEAD /", b"PUT /a", b"PRI * HTTP/2.0"):
        size = int.from_bytes(line[:4], "big", signed=True)
        assert prefix_bytes(size) == line[:4]
        assert foreign_protocol(prefix_bytes(size)) == HTTP_HINT
    for version in range(5):
        assert foreign_protocol(bytes([0x16, 0x03, version, 0x20])) == TLS_HINT
    assert foreign_protocol(prefix_bytes(200 * 1024 * 1024)) is None
    assert foreign_protocol(prefix_bytes(-1)) is None


def test_response_error_takes_the_first_error_that_is_not_none() -> None:
    ok = {"responses": [{"name": "t", "partition_responses": [{"index": 0, "error_code": 0}]}], "throttle_time_ms": 0}
    assert response_error(ok) == 0
    bad = {"responses": [{"name": "t", "partition_responses": [{"index": 0, "error_code": 0}, {"index": 1, "error_code": 3}]}]}
    assert response_error(bad) == 3
    assert response_error({"error_code": 16, "responses": []}) == 16
    assert error_name(3) == "UNKNOWN_TOPIC_OR_PARTITION" and error_name(0) == "NONE" and error_name(9999) == "9999"


@pytest.mark.parametrize("codes", [[], [[0]], [[0, 0], [0]], [[0, 3], [7]], [[0], [0, 45, 3]], [[6]]])
def test_a_produce_response_finds_the_error_the_generic_walk_finds(codes: list[list[int]]) -> None:
    """ProduceResponseData answers response_error without the walk; the walk over the same
    response (as the mapping it encodes) is the reference."""
    from loglake.broker.protocol.produce import (
        ProducePartitionResponse,
        ProduceResponseData,
        ProduceTopicResponse,
    )

    typed = ProduceResponseData(
        [ProduceTopicResponse(f"t{t}", [ProducePartitionResponse(i, c) for i, c in enumerate(cs)]) for t, cs in enumerate(codes)]
    )
    walked = {"responses": [{"partition_responses": [{"error_code": c} for c in cs]} for cs in codes]}
    assert response_error(typed) == response_error(walked) == next((c for cs in codes for c in cs if c), 0)


def test_each_metrics_has_its_own_registry() -> None:
    from prometheus_client import REGISTRY, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from loglake.broker.metrics import Metrics

    a, b = Metrics(), Metrics()
    a.observe("Produce", 0.002, 10)
    a.protocol_errors['odd "kind"\n'] += 1
    pages = [{f.name: f for f in text_string_to_metric_families(m.render())} for m in (a, b)]
    produced = [[s for s in page["loglake_requests"].samples if s.name == "loglake_requests_total"] for page in pages]
    assert [(s.labels, s.value) for s in produced[0]] == [({"api": "Produce", "error": "MESSAGE_TOO_LARGE"}, 1.0)]
    assert produced[1] == []
    assert pages[0]["loglake_protocol_errors"].samples[0].labels == {"kind": 'odd "kind"\n'}
    assert b"loglake_" not in generate_latest(REGISTRY)
