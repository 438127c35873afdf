"""Client quotas with Kafka's semantics (KIP-13, KIP-55, KIP-124, KIP-219, KIP-546).

Configs
-------
A quota entity is a user, a client id, or a user and a client id; either part may be the
default entity (Kafka's ``<default>``, a null name). Each carries any of `QUOTA_KEYS`. They live
in the metadata log (``client_quota`` records, loglake.meta.quotas), are set and read with
AlterClientQuotas / DescribeClientQuotas (loglake.broker.handlers.client_quotas) and take effect
at once on every open connection: limits are looked up per request.

Which quota applies
-------------------
For a connection of user U (its principal's name: ``User:alice`` is ``alice``, an
unauthenticated one ``ANONYMOUS``) with client id C, each quota key separately takes the value of
the first of these entities that sets it (Kafka's DefaultQuotaCallback order, `precedence`):

    /users/U/clients/C, /users/U/clients/<default>, /users/U,
    /users/<default>/clients/C, /users/<default>/clients/<default>, /users/<default>,
    /clients/C, /clients/<default>

The entity found also says who shares the rate (Kafka's metric tags, `Tags`): a /users/U quota
is shared by all of U's client ids, a /clients/C quota by every user's connections with C, and
quotas that name both (or a default in place of either) are per (U, C).

How it is enforced
------------------
Rates are Kafka's `Rate` over sampled windows (`Rate`: `quota_window_num` samples of
`quota_window_size_seconds`). A request is recorded, then if the rate is over the limit the
throttle time is Kafka's ``(rate - limit) / limit x window`` (the request quota's bounded by one
sample window, as Kafka's ClientRequestQuotaManager does; any throttle by the whole quota window,
after which every sample the request was counted in has expired). The request is answered at once with
`throttle_time_ms` set, and the connection is muted: nothing more is read from it until the
throttle time has passed (KIP-219; `Connection` waits before reading and before handling).

* ``producer_byte_rate``: Produce request bytes, counted when the request arrives;
* ``consumer_byte_rate``: Fetch response record bytes. A fetch is capped at what the quota allows
  in one window (Kafka's getMaxValueInQuotaWindow), and a fetch that would go over the quota is
  answered empty with the throttle time, its bytes not counted (Kafka's unrecord), so a consumer
  never gets more than the quota;
* ``request_percentage``: the time the event loop spent on the client's requests, in percent of
  one thread per second (100 = a whole core), for every API but the SASL handshakes. Work a
  request hands to the I/O threads (disk reads of cold segments, fsync waits) is not counted;
* ``controller_mutation_rate``: partitions created and deleted per second, a token bucket
  (loglake.broker.security.mutation_quota, Kafka's KIP-599).

Every response whose version has `throttle_time_ms` carries the larger of the quota throttle and
anything already there (Produce's memory-pressure throttle, loglake.broker.overload).

Bounds: `CLIENT_QUOTA_ENTITIES_MAX` entities; `QUOTA_SENSORS_MAX` rate sensors (least recently
used dropped past it; one idle for `SENSOR_IDLE_S` is dropped, as Kafka expires inactive sensors),
which also bounds the label sets on /metrics.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from loglake.broker.conn import Conn
from loglake.broker.protocol.api_keys import ApiKey
from loglake.broker.protocol.codec import DecodedRequest
from loglake.kafka_errors import ErrorCode
from loglake.meta.quotas import EntityKey

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"
PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
#: Kafka's quota keys of user and client-id entities and their config types (QuotaConfig).
QUOTA_KEYS: dict[str, type] = {
    PRODUCER_BYTE_RATE: int,
    CONSUMER_BYTE_RATE: int,
    REQUEST_PERCENTAGE: float,
    CONTROLLER_MUTATION_RATE: float,
}
#: Keys measured on windowed rates here (controller_mutation_rate is a token bucket:
#: loglake.broker.security.mutation_quota).
ENFORCED_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)
#: Most quota entities kept (each is a metadata record and a checkpoint entry); setting a further
#: one is refused with POLICY_VIOLATION.
CLIENT_QUOTA_ENTITIES_MAX = 10_000
#: Most rate sensors (quota key x who shares the rate) kept; past it the least recently used goes.
#: It bounds the label sets of the loglake_quota_* families on /metrics too.
QUOTA_SENSORS_MAX = 1_000
#: A sensor not recorded for this long is dropped (Kafka's InactiveSensorExpirationTimeSeconds).
SENSOR_IDLE_S = 3600.0
#: SaslHandshake and SaslAuthenticate: answered by Kafka's authenticator, never request-quota'd.
REQUEST_QUOTA_EXEMPT_APIS = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
#: Longest entity name accepted (the metadata record stays small).
ENTITY_NAME_CHARS_MAX = 1_000
#: The user a connection no mechanism authenticated is (Kafka's KafkaPrincipal.ANONYMOUS).
ANONYMOUS = "ANONYMOUS"


class QuotaRequestError(Exception):
    """A quota entity, filter, key or value Kafka refuses; `code` is the Kafka error code."""

    def __init__(self, message: str, code: int = ErrorCode.INVALID_REQUEST) -> None:
        super().__init__(message)
        self.code = int(code)


# ---- configs: validation, precedence, filters -------------------------------------------------------


def validate_entity(parts: list[tuple[str, str | None]]) -> EntityKey:
    """The entity's canonical key, or QuotaRequestError with Kafka's message (ClientQuotaControlManager)."""
    if not parts:
        raise QuotaRequestError("Invalid empty client quota entity")
    seen: dict[str, str | None] = {}
    for etype, name in parts:
        if etype in seen:
            raise QuotaRequestError(f"Invalid empty client quota entity, duplicate entity entry {etype}")
        if etype == IP:
            raise QuotaRequestError("ip quotas (connection_creation_rate) are not supported by loglake")
        if etype not in (USER, CLIENT_ID):
            raise QuotaRequestError(f"Unhandled client quota entity type: {etype}")
        if name is not None and not name:
            raise QuotaRequestError(f"Empty {etype} not supported")
        if name is not None and len(name) > ENTITY_NAME_CHARS_MAX:
            raise QuotaRequestError(f"{etype} name is longer than {ENTITY_NAME_CHARS_MAX} characters")
        seen[etype] = name
    return tuple(sorted(seen.items()))


def validate_value(key: str, value: float) -> float:
    """`value` for quota `key`, or QuotaRequestError with Kafka's message (validateQuotaKeyValue)."""
    kind = QUOTA_KEYS.get(key)
    if kind is None:
        raise QuotaRequestError(f"Invalid configuration key {key[:ENTITY_NAME_CHARS_MAX]}")
    if not value > 0.0:  # NaN too
        raise QuotaRequestError(f"Quota {key} must be greater than 0")
    if math.isinf(value):
        raise QuotaRequestError(
            f"Proposed value for {key} is too large for a {'LONG' if kind is int else 'DOUBLE'}."
        )
    if kind is int:
        if value > 2**63 - 1:
            raise QuotaRequestError(f"Proposed value for {key} is too large for a LONG.")
        if value - math.floor(value) > 1e-8:
            raise QuotaRequestError(f"{key} cannot be a fractional value.")
    return float(value)


def entity_text(key: EntityKey) -> str:
    """Kafka's path form: /users/alice/clients/<default>."""
    parts = dict(key)
    out = ""
    if USER in parts:
        out += f"/users/{parts[USER] if parts[USER] is not None else '<default>'}"
    if CLIENT_ID in parts:
        out += f"/clients/{parts[CLIENT_ID] if parts[CLIENT_ID] is not None else '<default>'}"
    return out


#: (user, client-id) who shares a rate: Kafka's quota metric tags ("" = not part of it).
Tags = tuple[str, str]


def precedence(user: str, client_id: str) -> list[tuple[EntityKey, Tags]]:
    """The entities that may set a quota of (user, client_id), first match wins, each with the
    tags of the rate it is measured on (Kafka's DefaultQuotaCallback.quotaMetricTags)."""
    u, c, both = (USER, user), (CLIENT_ID, client_id), (user, client_id)
    du, dc = (USER, None), (CLIENT_ID, None)
    return [
        ((c, u), both),
        ((dc, u), both),
        ((u,), (user, "")),
        ((c, du), both),
        ((dc, du), both),
        ((du,), (user, "")),
        ((c,), ("", client_id)),
        ((dc,), ("", client_id)),
    ]


def resolve(
    configs: dict[EntityKey, dict[str, float]], key: str, user: str, client_id: str
) -> tuple[float, Tags] | None:
    """The value of quota `key` for (user, client_id) and who shares it; None when nothing sets it."""
    for entity, tags in precedence(user, client_id):
        values = configs.get(entity)
        if values is not None and key in values:
            return values[key], tags
    return None


MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2


@dataclass(frozen=True)
class QuotaFilter:
    """DescribeClientQuotas' filter: exact names (None: the default entity), types that must be
    present with any name, and whether entities may have other parts (not strict)."""

    exact: dict[str, str | None]
    types: frozenset[str]
    strict: bool

    def matches(self, key: EntityKey) -> bool:
        parts = dict(key)
        if self.strict and len(parts) != len(self.exact) + len(self.types):
            return False
        for etype, name in self.exact.items():
            if etype not in parts or parts[etype] != name:
                return False
        return all(etype in parts for etype in self.types)


def parse_filter(components: list[tuple[str, int, str | None]], strict: bool) -> QuotaFilter:
    """Kafka's checks of a DescribeClientQuotas filter (ClientQuotasImage.describe)."""
    exact: dict[str, str | None] = {}
    types: set[str] = set()
    for etype, match_type, match in components:
        if not etype:
            raise QuotaRequestError("Invalid empty entity type.")
        if etype in exact or etype in types:
            raise QuotaRequestError(f"Entity type {etype} cannot appear more than once in the filter.")
        if etype not in (IP, USER, CLIENT_ID):
            raise QuotaRequestError(f"Unsupported entity type {etype}", ErrorCode.UNSUPPORTED_VERSION)
        if match_type == MATCH_EXACT:
            if match is None:
                raise QuotaRequestError("Request specified MATCH_TYPE_EXACT, but set match string to null.")
            exact[etype] = match
        elif match_type == MATCH_DEFAULT:
            if match is not None:
                raise QuotaRequestError(
                    "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."
                )
            exact[etype] = None
        elif match_type == MATCH_SPECIFIED:
            if match is not None:
                raise QuotaRequestError(
                    "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."
                )
            types.add(etype)
        else:
            raise QuotaRequestError(f"Unknown match type {match_type}", ErrorCode.UNSUPPORTED_VERSION)
    if (IP in exact or IP in types) and ({USER, CLIENT_ID} & (set(exact) | types)):
        raise QuotaRequestError(
            "Invalid entity filter component combination. IP filter component should not be used with "
            "user or clientId filter component."
        )
    return QuotaFilter(exact, frozenset(types), strict)


# ---- rates -----------------------------------------------------------------------------------------


class Rate:
    """Kafka's Rate over a SampledStat: `samples` slots of `window_s` each; a sample starts when
    the first value lands after the previous one's window; samples older than samples x window
    are dropped; the rate is their sum over the time since the oldest sample began, counted as at
    least (samples - 1) windows so that a new client is not measured over a sliver of time."""

    __slots__ = ("_samples", "samples", "window_s")

    def __init__(self, samples: int, window_s: float) -> None:
        self.samples = samples
        self.window_s = window_s
        self._samples: list[list[float]] = []  # [start, value], oldest first

    def record(self, value: float, now: float) -> None:
        self._purge(now)
        if not self._samples or now - self._samples[-1][0] >= self.window_s:
            self._samples.append([now, 0.0])
            if len(self._samples) > self.samples:
                del self._samples[0]
        self._samples[-1][1] += value

    def _purge(self, now: float) -> None:
        expire = self.samples * self.window_s
        while self._samples and now - self._samples[0][0] >= expire:
            del self._samples[0]

    def window(self, now: float) -> float:
        """Seconds the rate is measured over (Kafka's Rate.windowSize)."""
        self._purge(now)
        elapsed = now - self._samples[0][0] if self._samples else 0.0
        full = int(elapsed / self.window_s)
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_s
        return elapsed

    def measure(self, now: float) -> float:
        window = self.window(now)
        return sum(v for _, v in self._samples) / window if window > 0 else 0.0

    def unrecord(self, value: float) -> None:
        if self._samples:
            self._samples[-1][1] -= value


@dataclass
class Sensor:
    rate: Rate
    limit: float
    last_s: float
    throttled: int = 0
    throttle_ms: int = 0


# ---- the manager -------------------------------------------------------------------------------------


def principal_user(principal: str) -> str:
    """The user entity name of a principal: ``User:alice`` -> ``alice`` (Kafka's getName)."""
    kind, sep, name = principal.partition(":")
    return name if sep else kind


class QuotaManager:
    """The broker's quota configs and rate sensors (one event loop)."""

    def __init__(
        self, window_num: int = 11, window_size_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_num = window_num
        self.window_size_s = window_size_s
        self.clock = clock
        self.configs: dict[EntityKey, dict[str, float]] = {}
        self._enabled: frozenset[str] = frozenset()
        self._sensors: OrderedDict[tuple[str, str, str], Sensor] = OrderedDict()

    def load(self, configs: dict[EntityKey, dict[str, float]]) -> None:
        self.configs = {k: dict(v) for k, v in configs.items() if v}
        self._changed()

    def set(self, key: EntityKey, values: dict[str, float] | None) -> None:
        """An entity's quotas changed (after the record is durable): open connections follow at once."""
        if values:
            self.configs[key] = dict(values)
        else:
            self.configs.pop(key, None)
        self._changed()

    def _changed(self) -> None:
        self._enabled = frozenset(k for values in self.configs.values() for k in values)
        # Sensors keep their rates across a change (as Kafka's do); their limits are looked up again
        # at the next request. Those of a key no entity sets any more are gone with it.
        for skey in [s for s in self._sensors if s[0] not in self._enabled]:
            del self._sensors[skey]

    def enabled(self, key: str) -> bool:
        return key in self._enabled

    def _sensor(self, key: str, tags: Tags, limit: float, now: float) -> Sensor:
        skey = (key, *tags)
        sensor = self._sensors.get(skey)
        if sensor is None:
            self._expire(now)
            sensor = self._sensors[skey] = Sensor(Rate(self.window_num, self.window_size_s), limit, now)
            while len(self._sensors) > QUOTA_SENSORS_MAX:
                self._sensors.popitem(last=False)
        else:
            self._sensors.move_to_end(skey)
        sensor.limit, sensor.last_s = limit, now
        return sensor

    def _expire(self, now: float) -> None:
        while self._sensors:
            oldest = next(iter(self._sensors.values()))
            if now - oldest.last_s < SENSOR_IDLE_S:
                return
            self._sensors.popitem(last=False)

    def record(self, key: str, user: str, client_id: str, value: float, now: float | None = None) -> int:
        """Record `value` on the rate quota `key` of (user, client_id) applies to; the throttle
        time in ms (0: within the quota, or no quota)."""
        if key not in self._enabled:
            return 0
        found = resolve(self.configs, key, user, client_id)
        if found is None:
            return 0
        now = self.clock() if now is None else now
        limit, tags = found
        sensor = self._sensor(key, tags, limit, now)
        sensor.rate.record(value, now)
        rate = sensor.rate.measure(now)
        if rate <= limit:
            return 0
        window = sensor.rate.window(now)
        ms = round((rate - limit) / limit * window * 1000.0)
        if key == REQUEST_PERCENTAGE:  # Kafka's ClientRequestQuotaManager bounds it by one window
            ms = min(ms, int(self.window_size_s * 1000))
        # Never past the whole quota window: by then every sample this request was counted in has
        # expired, so the rate is under the quota whatever it was (and throttle_time_ms is an int32).
        return max(min(ms, int(self.window_num * self.window_size_s * 1000)), 0)

    def unrecord(self, key: str, user: str, client_id: str, value: float) -> None:
        found = resolve(self.configs, key, user, client_id) if key in self._enabled else None
        if found is not None:
            sensor = self._sensors.get((key, *found[1]))
            if sensor is not None:
                sensor.rate.unrecord(value)

    def window_allowance(self, key: str, user: str, client_id: str) -> float | None:
        """The most one request may take of quota `key` (limit x (samples - 1) windows, Kafka's
        getMaxValueInQuotaWindow); None without a quota."""
        if key not in self._enabled:
            return None
        found = resolve(self.configs, key, user, client_id)
        return None if found is None else found[0] * (self.window_num - 1) * self.window_size_s

    def note_throttle(self, key: str, user: str, client_id: str, ms: int) -> None:
        found = resolve(self.configs, key, user, client_id)
        sensor = self._sensors.get((key, *found[1])) if found is not None else None
        if sensor is not None:
            sensor.throttled += 1
            sensor.throttle_ms += ms

    # ---- what the connection and the handlers call --------------------------------------------------

    def produce(self, conn: Conn, req: DecodedRequest) -> int:
        """Count a Produce request's bytes; the throttle time (the connection is muted for it)."""
        if PRODUCER_BYTE_RATE not in self._enabled:
            return 0
        user, client = identity(conn, req)
        ms = self.record(PRODUCER_BYTE_RATE, user, client, float(req.size))
        if ms:
            self.note_throttle(PRODUCER_BYTE_RATE, user, client, ms)
            mute(conn, ms)
        return ms

    def request_time(self, conn: Conn, req: DecodedRequest, seconds: float) -> int:
        """Count a request's handler time on the request quota; the throttle time (muted for it)."""
        if req.api_key in REQUEST_QUOTA_EXEMPT_APIS or REQUEST_PERCENTAGE not in self._enabled:
            return 0
        user, client = identity(conn, req)
        ms = self.record(REQUEST_PERCENTAGE, user, client, seconds * 100.0)
        if ms:
            self.note_throttle(REQUEST_PERCENTAGE, user, client, ms)
            mute(conn, ms)
        return ms

    def fetch_cap(self, conn: Conn, req: DecodedRequest) -> int | None:
        """The most record bytes this Fetch may return under the consumer quota (None: no quota)."""
        user, client = identity(conn, req)
        allowance = self.window_allowance(CONSUMER_BYTE_RATE, user, client)
        return None if allowance is None else max(int(allowance), 1)

    def fetched(self, conn: Conn, req: DecodedRequest, nbytes: int) -> int:
        """Count a Fetch response's bytes; when that goes over the quota, take them back (the
        response goes out empty, as Kafka's does), mute the connection and return the throttle time."""
        user, client = identity(conn, req)
        ms = self.record(CONSUMER_BYTE_RATE, user, client, float(nbytes))
        if ms:
            self.unrecord(CONSUMER_BYTE_RATE, user, client, float(nbytes))
            self.note_throttle(CONSUMER_BYTE_RATE, user, client, ms)
            mute(conn, ms)
        return ms

    def share_fetched(self, conn: Conn, req: DecodedRequest, nbytes: int) -> int:
        """Count a ShareFetch response's bytes; when that goes over the quota, mute the connection
        and return the throttle time. The response still goes out: its records are acquired for
        this member (Fetch's empty answer would leave them locked, undelivered, until their lock
        times out); `fetch_cap` kept it within what one quota window pays back."""
        user, client = identity(conn, req)
        ms = self.record(CONSUMER_BYTE_RATE, user, client, float(nbytes))
        if ms:
            self.note_throttle(CONSUMER_BYTE_RATE, user, client, ms)
            mute(conn, ms)
        return ms

    # ---- /metrics ---------------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        labels = ["quota", "user", "client_id"]
        rate = GaugeMetricFamily(
            "loglake_quota_rate",
            "Measured rate of a quota's users: bytes/s, or percent of a thread "
            "(request_percentage), over the quota window.",
            labels=labels,
        )
        limit = GaugeMetricFamily("loglake_quota_limit", "The quota the rate is held to.", labels=labels)
        throttled = CounterMetricFamily(
            "loglake_quota_throttled_total", "Responses throttled by the quota.", labels=labels
        )
        throttle_ms = CounterMetricFamily(
            "loglake_quota_throttle_ms_total", "Sum of the quota's throttle times.", labels=labels
        )
        for (key, user, client), sensor in list(self._sensors.items()):
            values = [key, user, client]
            rate.add_metric(values, sensor.rate.measure(now))
            limit.add_metric(values, sensor.limit if math.isfinite(sensor.limit) else 0.0)
            throttled.add_metric(values, sensor.throttled)
            throttle_ms.add_metric(values, sensor.throttle_ms)
        yield from (rate, limit, throttled, throttle_ms)


def identity(conn: Conn, req: DecodedRequest) -> tuple[str, str]:
    """(user, client id) of a request: the connection's principal's name and the header's client id."""
    principal = conn.security.principal or f"User:{ANONYMOUS}"
    return principal_user(principal), req.client_id or ""


def mute(conn: Conn, ms: int) -> None:
    """Read nothing more from `conn` for `ms` (KIP-219); `wait_unmuted` honours it."""
    until = time.monotonic() + ms / 1000.0
    if until > conn.muted_until:
        conn.muted_until = until


async def wait_unmuted(conn: Conn, quotas: QuotaManager) -> None:
    """Return once `conn` is not muted. With quotas configured it first lets the requests handed
    to handlers just before run up to their quota check, so that requests a client pipelined in
    one read wait out the throttle the first of them earns (Kafka reads one request at a time)."""
    if quotas.configs:
        await asyncio.sleep(0)
    while True:
        left = conn.muted_until - time.monotonic()
        if left <= 0:
            return
        await asyncio.sleep(left)


def set_throttle(req: DecodedRequest, response: object, ms: int) -> None:
    """Raise the response's throttle_time_ms to `ms` where the response's version carries one."""
    if ms <= 0 or response is None:
        return
    if isinstance(response, dict):
        if "throttle_time_ms" in response or _has_throttle_field(req.api_key):
            response["throttle_time_ms"] = max(int(response.get("throttle_time_ms") or 0), ms)
        return
    if hasattr(response, "throttle_time_ms"):  # a response object whose version carries one
        response.throttle_time_ms = max(int(response.throttle_time_ms or 0), ms)


_THROTTLE_FIELD: dict[int, bool] = {}


def _has_throttle_field(api_key: int) -> bool:
    known = _THROTTLE_FIELD.get(api_key)
    if known is None:
        from loglake.broker.protocol.messages import response_class

        try:
            known = "throttle_time_ms" in response_class(api_key)._struct.fields
        except (KeyError, AttributeError):
            known = False
        _THROTTLE_FIELD[api_key] = known
    return known


R = TypeVar("R")


async def handle_request(quotas: QuotaManager, conn: Conn, req: DecodedRequest, handling: Awaitable[R]) -> R:
    """Await a request's handler (`handling`: its coroutine); under a request quota, time it and
    throttle its response."""
    if not quotas.enabled(REQUEST_PERCENTAGE) or req.api_key in REQUEST_QUOTA_EXEMPT_APIS:
        return await handling
    timed = TimedHandler(handling)
    response = await timed
    if response is not None:  # Produce with acks=0 is exempt from the request quota (as in Kafka)
        set_throttle(req, response, quotas.request_time(conn, req, timed.seconds))
    return response


class TimedHandler(Generic[R]):
    """Awaits a handler coroutine and adds up the time the event loop spent running it (not the
    time it waited): what the request quota charges."""

    def __init__(self, handling: Awaitable[R]) -> None:
        self.handling = handling
        self.seconds = 0.0

    def __await__(self) -> Generator[object, object, R]:
        steps = self.handling.__await__()
        send: object = None
        throw: BaseException | None = None
        while True:
            started = time.perf_counter()
            try:
                yielded = steps.throw(throw) if throw is not None else steps.send(send)
            except StopIteration as stop:
                self.seconds += time.perf_counter() - started
                result: R = stop.value
                return result
            except BaseException:
                self.seconds += time.perf_counter() - started
                raise
            self.seconds += time.perf_counter() - started
            try:
                send, throw = (yield yielded), None
            except BaseException as exc:  # cancellation and errors thrown into the await
                send, throw = None, exc
