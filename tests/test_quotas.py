"""Client quotas without a broker: Kafka's precedence, rates and throttle times, validation and
filters, the metadata record and checkpoint, and the throttle stamped on responses."""

from __future__ import annotations

import asyncio
import json
import math
import time
from types import SimpleNamespace
from typing import Any

import pytest

from loglake.broker.protocol.fetch import FetchResponseData
from loglake.broker.security.mutation_quota import MutationQuotas
from loglake.broker.security.quotas import (
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    QuotaManager,
    QuotaRequestError,
    Rate,
    TimedHandler,
    entity_text,
    parse_filter,
    precedence,
    principal_user,
    resolve,
    set_throttle,
    validate_entity,
    validate_value,
)
from loglake.kafka_errors import ErrorCode
from loglake.meta.checkpoint import capture, decode_checkpoint, encode_checkpoint
from loglake.meta.records import ClientQuota
from loglake.meta.state import MetaState

from ctxkit import HandlerConn

U, C = "user", "client-id"

# ---- precedence ----------------------------------------------------------------------------------------

#: Kafka's eight levels, highest first, as entity keys for user alice and client app.
LEVELS = [
    ((C, "app"), (U, "alice")),
    ((C, None), (U, "alice")),
    ((U, "alice"),),
    ((C, "app"), (U, None)),
    ((C, None), (U, None)),
    ((U, None),),
    ((C, "app"),),
    ((C, None),),
]


def test_precedence_is_kafkas_order() -> None:
    assert [e for e, _ in precedence("alice", "app")] == LEVELS
    assert [entity_text(e) for e in LEVELS] == [
        "/users/alice/clients/app",
        "/users/alice/clients/<default>",
        "/users/alice",
        "/users/<default>/clients/app",
        "/users/<default>/clients/<default>",
        "/users/<default>",
        "/clients/app",
        "/clients/<default>",
    ]


@pytest.mark.parametrize("level", range(len(LEVELS)))
def test_each_level_beats_every_lower_one(level: int) -> None:
    """With this level and every lower one set, this level's value applies; dropping it hands
    the quota to the next one."""
    configs = {LEVELS[i]: {PRODUCER_BYTE_RATE: float(1000 + i)} for i in range(level, len(LEVELS))}
    found = resolve(configs, PRODUCER_BYTE_RATE, "alice", "app")
    assert found is not None and found[0] == 1000 + level
    del configs[LEVELS[level]]
    found = resolve(configs, PRODUCER_BYTE_RATE, "alice", "app")
    assert (found[0] if found else None) == (1000 + level + 1 if level + 1 < len(LEVELS) else None)


def test_each_key_resolves_on_its_own() -> None:
    configs = {((U, "alice"),): {PRODUCER_BYTE_RATE: 10.0}, ((C, "app"),): {CONSUMER_BYTE_RATE: 20.0}}
    assert resolve(configs, PRODUCER_BYTE_RATE, "alice", "app") == (10.0, ("alice", ""))
    assert resolve(configs, CONSUMER_BYTE_RATE, "alice", "app") == (20.0, ("", "app"))
    assert resolve(configs, REQUEST_PERCENTAGE, "alice", "app") is None
    assert resolve(configs, PRODUCER_BYTE_RATE, "bob", "app") is None


def test_who_shares_a_rate() -> None:
    """A user quota is shared by the user's client ids, a client-id quota by every user with that
    client id, the <default> ones too; /users/U/clients/<default> is per (user, client)."""
    m = QuotaManager(window_num=2, window_size_s=1.0)
    m.load({((U, None),): {PRODUCER_BYTE_RATE: 100.0}})
    m.record(PRODUCER_BYTE_RATE, "alice", "a", 150, now=0.0)
    assert m.record(PRODUCER_BYTE_RATE, "alice", "b", 100, now=0.0) > 0  # alice's clients share
    assert m.record(PRODUCER_BYTE_RATE, "bob", "a", 100, now=0.0) == 0  # bob has his own
    m.load({((C, None), (U, "carol")): {PRODUCER_BYTE_RATE: 100.0}})
    m.record(PRODUCER_BYTE_RATE, "carol", "a", 150, now=0.0)
    assert m.record(PRODUCER_BYTE_RATE, "carol", "b", 100, now=0.0) == 0  # one quota per client id
    m.load({((C, "shared"),): {PRODUCER_BYTE_RATE: 100.0}})
    m.record(PRODUCER_BYTE_RATE, "dave", "shared", 150, now=0.0)
    assert m.record(PRODUCER_BYTE_RATE, "erin", "shared", 100, now=0.0) > 0  # users share a client id's


def test_principal_user() -> None:
    assert principal_user("User:alice") == "alice"
    assert principal_user("User:CN=a,O=b") == "CN=a,O=b"
    assert principal_user("ANONYMOUS") == "ANONYMOUS"


# ---- rates and throttle time -------------------------------------------------------------------------------


def test_rate_counts_at_least_samples_minus_one_windows() -> None:
    r = Rate(11, 1.0)
    r.record(1000, now=100.0)
    assert r.window(100.0) == pytest.approx(10.0)
    assert r.measure(100.0) == pytest.approx(100.0)
    r.record(1000, now=115.5)  # elapsed past 11 windows: the first sample expired
    assert r.window(115.5) == pytest.approx(10.0)
    assert r.measure(115.5) == pytest.approx(100.0)
    for t in range(12):
        r.record(100, now=200.0 + t)
    # the oldest kept sample began at 201 (11 samples): 11 windows of data
    assert r.window(211.0) == pytest.approx(10.0)
    assert r.measure(211.5) == pytest.approx(1100 / 10.5)


def test_throttle_time_is_kafkas() -> None:
    """(rate - quota) / quota x window, on the rate after recording (QuotaUtils.throttleTime)."""
    m = QuotaManager(window_num=11, window_size_s=1.0)
    m.load({((C, "app"),): {PRODUCER_BYTE_RATE: 1000.0}})
    assert m.record(PRODUCER_BYTE_RATE, "u", "app", 10_000, now=50.0) == 0  # 10000 / 10 s = the quota
    # 15000 over 10.5 s (0.5 s into the first sample, plus the 10 s floor): (15000 / 10.5 - 1000)
    # / 1000 x 10.5 s = 4.5 s, the time until 15000 bytes is the quota's worth
    assert m.record(PRODUCER_BYTE_RATE, "u", "app", 5_000, now=50.5) == 4500
    assert m.record(PRODUCER_BYTE_RATE, "u", "other", 1e9, now=50.5) == 0  # no entity sets one for it
    m.set(((C, "app"),), {PRODUCER_BYTE_RATE: 3000.0})  # dynamic: the next request sees it
    assert m.record(PRODUCER_BYTE_RATE, "u", "app", 1, now=50.6) == 0


def test_byte_rate_throttle_is_bounded_by_the_whole_window() -> None:
    """A request far over what the window holds is throttled until its samples expired, no longer."""
    m = QuotaManager(window_num=11, window_size_s=1.0)
    m.load({((C, "c"),): {PRODUCER_BYTE_RATE: 1.0}})
    assert m.record(PRODUCER_BYTE_RATE, "u", "c", 100 * 1024 * 1024, now=0.0) == 11_000


def test_request_quota_throttle_is_bounded_by_one_window() -> None:
    m = QuotaManager(window_num=11, window_size_s=1.0)
    m.load({((U, "alice"),): {REQUEST_PERCENTAGE: 1.0}})
    assert m.record(REQUEST_PERCENTAGE, "alice", "c", 1000.0, now=0.0) == 1000  # 10 s of CPU: 1 s cap


def test_fetch_is_capped_and_a_throttled_fetch_is_not_counted() -> None:
    m = QuotaManager(window_num=11, window_size_s=1.0)
    m.load({((C, "c"),): {CONSUMER_BYTE_RATE: 100.0}})
    conn = HandlerConn()
    conn.security.principal = "User:u"
    req = SimpleNamespace(client_id="c", api_key=1, size=0)
    assert m.fetch_cap(conn, req) == 1000  # quota x (samples - 1) windows
    assert m.fetched(conn, req, 1000) == 0
    ms = m.fetched(conn, req, 500)
    assert ms > 0 and conn.muted_until > time.monotonic()
    sensor = next(iter(m._sensors.values()))
    assert sum(v for _, v in sensor.rate._samples) == 1000  # the throttled 500 were taken back
    assert sensor.throttled == 1 and sensor.throttle_ms == ms


def test_sensors_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("loglake.broker.security.quotas.QUOTA_SENSORS_MAX", 5)
    m = QuotaManager()
    m.load({((C, None),): {PRODUCER_BYTE_RATE: 1e9}})
    for i in range(20):
        m.record(PRODUCER_BYTE_RATE, "u", f"client-{i}", 1, now=1.0)
    assert len(m._sensors) == 5
    assert len(next(iter(m.collect())).samples) == 5
    m.set(((C, None),), None)  # the key is gone: so are its sensors
    assert not m._sensors and not m.enabled(PRODUCER_BYTE_RATE)


def test_no_quota_costs_no_sensor() -> None:
    m = QuotaManager()
    m.load({((U, "alice"),): {CONSUMER_BYTE_RATE: 5.0}})
    assert m.record(PRODUCER_BYTE_RATE, "alice", "c", 1e12) == 0
    assert m.record(CONSUMER_BYTE_RATE, "bob", "c", 1e12) == 0
    assert not m._sensors


# ---- validation (Kafka's messages) -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ([], "Invalid empty client quota entity"),
        ([(U, "a"), (U, "b")], "Invalid empty client quota entity, duplicate entity entry user"),
        ([("group", "g")], "Unhandled client quota entity type: group"),
        ([(U, "")], "Empty user not supported"),
        ([("ip", "10.0.0.1")], "ip quotas (connection_creation_rate) are not supported by loglake"),
    ],
)
def test_bad_entities(parts: list[tuple[str, str | None]], message: str) -> None:
    with pytest.raises(QuotaRequestError) as err:
        validate_entity(parts)
    assert str(err.value) == message and err.value.code == ErrorCode.INVALID_REQUEST


def test_entity_key_is_canonical() -> None:
    assert (
        validate_entity([(U, "a"), (C, None)])
        == validate_entity([(C, None), (U, "a")])
        == ((C, None), (U, "a"))
    )


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("bogus", 1.0, "Invalid configuration key bogus"),
        (PRODUCER_BYTE_RATE, 0.0, "Quota producer_byte_rate must be greater than 0"),
        (REQUEST_PERCENTAGE, -5.0, "Quota request_percentage must be greater than 0"),
        (CONSUMER_BYTE_RATE, math.nan, "Quota consumer_byte_rate must be greater than 0"),
        (CONSUMER_BYTE_RATE, 10.5, "consumer_byte_rate cannot be a fractional value."),
        (PRODUCER_BYTE_RATE, 1e30, "Proposed value for producer_byte_rate is too large for a LONG."),
    ],
)
def test_bad_values(key: str, value: float, message: str) -> None:
    with pytest.raises(QuotaRequestError, match=None) as err:
        validate_value(key, value)
    assert str(err.value) == message


def test_good_values() -> None:
    assert validate_value(REQUEST_PERCENTAGE, 0.5) == 0.5
    assert validate_value("controller_mutation_rate", 2.5) == 2.5
    assert validate_value(PRODUCER_BYTE_RATE, 1048576.0) == 1048576.0


# ---- filters ---------------------------------------------------------------------------------------------------

ENTITIES = [((U, "alice"),), ((U, None),), ((C, "app"), (U, "alice")), ((C, "app"),), ((C, None), (U, None))]


@pytest.mark.parametrize(
    ("components", "strict", "want"),
    [
        ([], False, ENTITIES),
        ([], True, []),
        ([(U, 0, "alice")], False, [ENTITIES[0], ENTITIES[2]]),
        ([(U, 0, "alice")], True, [ENTITIES[0]]),
        ([(U, 1, None)], False, [ENTITIES[1], ENTITIES[4]]),
        ([(U, 2, None)], True, [ENTITIES[0], ENTITIES[1]]),
        ([(C, 2, None)], False, [ENTITIES[2], ENTITIES[3], ENTITIES[4]]),
        ([(U, 0, "alice"), (C, 0, "app")], True, [ENTITIES[2]]),
        ([(U, 1, None), (C, 1, None)], True, [ENTITIES[4]]),
    ],
)
def test_filters_match_as_kafkas(
    components: list[tuple[str, int, str | None]], strict: bool, want: list[Any]
) -> None:
    f = parse_filter(components, strict)
    assert [e for e in ENTITIES if f.matches(e)] == want


@pytest.mark.parametrize(
    ("components", "code"),
    [
        ([(U, 0, None)], ErrorCode.INVALID_REQUEST),
        ([(U, 1, "x")], ErrorCode.INVALID_REQUEST),
        ([(U, 2, "x")], ErrorCode.INVALID_REQUEST),
        ([(U, 7, None)], ErrorCode.UNSUPPORTED_VERSION),
        ([("group", 2, None)], ErrorCode.UNSUPPORTED_VERSION),
        ([("", 2, None)], ErrorCode.INVALID_REQUEST),
        ([(U, 2, None), (U, 0, "a")], ErrorCode.INVALID_REQUEST),
        ([("ip", 2, None), (U, 2, None)], ErrorCode.INVALID_REQUEST),
    ],
)
def test_bad_filters(components: list[tuple[str, int, str | None]], code: int) -> None:
    with pytest.raises(QuotaRequestError) as err:
        parse_filter(components, False)
    assert err.value.code == code


# ---- metadata ----------------------------------------------------------------------------------------------------


def test_record_and_checkpoint_round_trip() -> None:
    state = MetaState("c")
    alice = validate_entity([(U, "alice")])
    dflt = validate_entity([(C, None), (U, "bob")])
    state.apply(
        "client_quota", json.loads(json.dumps(ClientQuota(alice, {PRODUCER_BYTE_RATE: 1024.0}).body()))
    )
    state.apply("client_quota", json.loads(json.dumps(ClientQuota(dflt, {REQUEST_PERCENTAGE: 12.5}).body())))
    state.apply(
        "client_quota", json.loads(json.dumps(ClientQuota(alice, {CONSUMER_BYTE_RATE: 2048.0}).body()))
    )
    assert state.client_quotas == {alice: {CONSUMER_BYTE_RATE: 2048.0}, dflt: {REQUEST_PERCENTAGE: 12.5}}
    back = decode_checkpoint(b"".join(encode_checkpoint(capture(state))), path="ck")
    assert back.client_quotas == state.client_quotas
    state.apply("client_quota", ClientQuota(alice, None).body())
    assert list(state.client_quotas) == [dflt]


@pytest.mark.parametrize(
    "body",
    [
        {"entity": [], "values": {"a": 1}},
        {"entity": [["user", "a"], ["user", "b"]], "values": {"a": 1}},
        {"entity": [["group", "a"]], "values": {"a": 1}},
        {"entity": [["user", 5]], "values": {"a": 1}},
        {"entity": [["user", "a"]], "values": {"a": "x"}},
        {"entity": [["user", "a"]], "values": {"a": -1}},
        {"entity": [["user", "a"]], "values": [1]},
    ],
)
def test_bad_records_are_refused(body: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        MetaState("c").apply("client_quota", body)


# ---- responses and timing ----------------------------------------------------------------------------------------


def test_set_throttle_keeps_the_larger() -> None:
    req = SimpleNamespace(api_key=3)
    response: dict[str, Any] = {"throttle_time_ms": 700}
    set_throttle(req, response, 300)
    assert response["throttle_time_ms"] == 700
    set_throttle(req, response, 900)
    assert response["throttle_time_ms"] == 900
    bare: dict[str, Any] = {}
    set_throttle(req, bare, 5)  # Metadata's schema has the field
    assert bare == {"throttle_time_ms": 5}
    fetch = FetchResponseData(throttle_time_ms=0)
    set_throttle(SimpleNamespace(api_key=1), fetch, 42)
    assert fetch.throttle_time_ms == 42


def test_timed_handler_counts_running_time_not_waiting() -> None:
    async def handler() -> str:
        await asyncio.sleep(0.3)
        return "done"

    async def main() -> tuple[str, float]:
        timed = TimedHandler(handler())
        return await timed, timed.seconds

    result, seconds = asyncio.run(main())
    assert result == "done" and seconds < 0.3


def test_timed_handler_passes_errors_and_cancellation() -> None:
    async def failing() -> None:
        await asyncio.sleep(0)
        raise KeyError("x")

    async def main() -> None:
        with pytest.raises(KeyError):
            await TimedHandler(failing())

        async def slow() -> None:
            await asyncio.sleep(10)

        async def run() -> None:
            await TimedHandler(slow())

        task = asyncio.ensure_future(run())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


# ---- authorization seam ----------------------------------------------------------------------------------------


def test_admin_apis_ask_the_authorization_seam(monkeypatch: pytest.MonkeyPatch) -> None:
    """Describe needs DESCRIBE_CONFIGS and Alter ALTER_CONFIGS on the cluster; refused, Describe is
    a top-level CLUSTER_AUTHORIZATION_FAILED and every Alter entry is, with nothing stored. (The
    authorizer is being built elsewhere: the seam is replaced here by a refusing one.)"""
    from loglake.broker.handlers import client_quotas as handlers
    from loglake.broker.security.authorized import AclOperation

    asked: list[AclOperation] = []

    def refuse(ctx: Any, conn: Any, operation: AclOperation) -> bool:
        asked.append(operation)
        return False

    monkeypatch.setattr(handlers, "cluster_allowed", refuse)
    ctx = SimpleNamespace(quotas=QuotaManager())
    req: Any = SimpleNamespace(body=SimpleNamespace(components=[], strict=False))
    resp = asyncio.run(handlers.describe_client_quotas(ctx, None, req))
    assert resp["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED and resp["entries"] is None
    op = SimpleNamespace(key=PRODUCER_BYTE_RATE, value=1.0, remove=False)
    entry = SimpleNamespace(entity=[SimpleNamespace(entity_type=U, entity_name="a")], ops=[op])
    req = SimpleNamespace(body=SimpleNamespace(validate_only=False, entries=[entry, entry]))
    resp = asyncio.run(handlers.alter_client_quotas(ctx, None, req))
    assert [e["error_code"] for e in resp["entries"]] == [ErrorCode.CLUSTER_AUTHORIZATION_FAILED] * 2
    assert not ctx.quotas.configs
    assert asked == [AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS]


# ---- controller_mutation_rate (KIP-599): a token bucket ----------------------------------------------


class _Req:
    def __init__(self, api_key: int, version: int, client_id: str = "c") -> None:
        self.api_key, self.api_version, self.client_id = api_key, version, client_id


def test_mutation_bucket_bursts_a_window_refills_at_the_rate_and_admits_while_not_below_zero() -> None:
    now = [100.0]
    q = QuotaManager(window_num=11, window_size_s=1.0)
    q.set(((CLIENT_ID, "c"),), {"controller_mutation_rate": 2.0})
    mq = MutationQuotas(q, clock=lambda: now[0])
    gate = mq.gate(HandlerConn(), _Req(19, 7))
    assert gate is not None and gate.strict
    assert gate.admit(22) and gate.bucket.tokens == 0  # the burst: 2/s x 11 windows of 1 s
    assert gate.admit(10)  # not below zero before it: admitted, and now 10 below
    assert not gate.admit(1)  # strict: refused while below zero
    assert gate.bucket.throttle_ms() == 5000  # 10 partitions at 2/s
    now[0] += 4.0
    assert not mq.gate(HandlerConn(), _Req(19, 7)).admit(1)  # still 2 below
    now[0] += 1.0
    late = mq.gate(HandlerConn(), _Req(19, 7))
    assert late.admit(1) and late.bucket.throttle_ms() == 500
    old = mq.gate(HandlerConn(), _Req(19, 5))  # CreateTopics v5: permissive
    assert not old.strict and old.admit(4) and old.admit(4)
    assert mq.gate(HandlerConn(), _Req(19, 7, client_id="other")) is None  # no quota for this client id
    response = old.finish({"throttle_time_ms": 0})
    assert response["throttle_time_ms"] == old.bucket.throttle_ms() > 0
    assert old.admit(3, validate_only=True) and old.bucket.tokens == -9  # checked, not counted
    q.set(((CLIENT_ID, "c"),), None)
    assert mq.gate(HandlerConn(), _Req(19, 7)) is None
