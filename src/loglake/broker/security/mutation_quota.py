"""Controller mutation quotas (Kafka's KIP-599): partitions created or deleted per second.

`controller_mutation_rate` on a user and/or client-id entity (the same eight-level precedence as
the other quotas, `loglake.broker.security.quotas.resolve`) bounds how many partitions CreateTopics,
CreatePartitions and DeleteTopics may create or delete per second. As in Kafka it is a token
bucket, not a windowed rate: it holds up to `rate x quota_window_num x quota_window_size_seconds`
partitions (a burst of a whole quota window), refills at `rate`, and a mutation is admitted while
the bucket is not below zero, even when it takes the bucket below zero — so one large topic is
never refused outright, and the time to wait is `-tokens / rate`.

Request versions decide what a client sees, as in Kafka:

* **strict** (CreateTopics v6+, DeleteTopics v5+, CreatePartitions v3+: clients that know
  THROTTLING_QUOTA_EXCEEDED): a topic arriving while the bucket is below zero fails with
  THROTTLING_QUOTA_EXCEEDED; the others in the request go on. Kafka's AdminClient retries those
  after the throttle time.
* **permissive** (older versions): every mutation is admitted and counted.

Either way the response carries `throttle_time_ms` (how long until the bucket is back at zero) and
the connection is muted for it (KIP-219). `validate_only` requests are checked but not counted.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from loglake.broker.conn import Conn
from loglake.broker.protocol.api_keys import ApiKey
from loglake.broker.protocol.codec import DecodedRequest
from loglake.broker.security.quotas import (
    CONTROLLER_MUTATION_RATE,
    QUOTA_SENSORS_MAX,
    SENSOR_IDLE_S,
    QuotaManager,
    Tags,
    identity,
    mute,
    resolve,
)

#: api key -> the first version that is strict (fails with THROTTLING_QUOTA_EXCEEDED).
STRICT_FROM: dict[int, int] = {ApiKey.CREATE_TOPICS: 6, ApiKey.DELETE_TOPICS: 5, ApiKey.CREATE_PARTITIONS: 3}
#: Largest throttle time answered (int32 milliseconds; a bucket deep below zero at a tiny rate).
THROTTLE_MS_MAX = 2**31 - 1


class TokenBucket:
    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.last = burst, now

    def refill(self, rate: float, burst: float, now: float) -> None:
        """Up to `now` at the old rate; then the (possibly changed) quota applies."""
        self.tokens = min(self.burst, self.tokens + max(now - self.last, 0.0) * self.rate)
        self.last = now
        self.rate, self.burst = rate, burst
        self.tokens = min(self.tokens, burst)

    def throttle_ms(self) -> int:
        if self.tokens >= 0:
            return 0
        return min(int(-self.tokens / self.rate * 1000.0 + 0.999), THROTTLE_MS_MAX)


class MutationQuotas:
    """One token bucket per (user, client-id) that a `controller_mutation_rate` applies to."""

    def __init__(self, quotas: QuotaManager, clock: Callable[[], float] = time.monotonic) -> None:
        self.quotas = quotas
        self.clock = clock
        self._buckets: OrderedDict[Tags, TokenBucket] = OrderedDict()

    def gate(self, conn: Conn, req: DecodedRequest) -> MutationGate | None:
        """The quota one request's mutations are checked against; None when none applies."""
        if not self.quotas.enabled(CONTROLLER_MUTATION_RATE):
            return None
        user, client = identity(conn, req)
        found = resolve(self.quotas.configs, CONTROLLER_MUTATION_RATE, user, client)
        if found is None:
            return None
        rate, tags = found
        now = self.clock()
        burst = rate * self.quotas.window_num * self.quotas.window_size_s
        bucket = self._buckets.get(tags)
        if bucket is None:
            self._expire(now)
            bucket = self._buckets[tags] = TokenBucket(rate, burst, now)
            while len(self._buckets) > QUOTA_SENSORS_MAX:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(tags)
            bucket.refill(rate, burst, now)
        strict = req.api_version >= STRICT_FROM.get(req.api_key, 1 << 15)
        return MutationGate(bucket, strict, conn)

    def _expire(self, now: float) -> None:
        while self._buckets:
            oldest = next(iter(self._buckets.values()))
            if now - oldest.last < SENSOR_IDLE_S:
                return
            self._buckets.popitem(last=False)


class MutationGate:
    """One request's view of its bucket: `admit` each topic, then `finish` the response."""

    def __init__(self, bucket: TokenBucket, strict: bool, conn: Conn) -> None:
        self.bucket, self.strict, self.conn = bucket, strict, conn

    def admit(self, partitions: int, validate_only: bool = False) -> bool:
        """Whether a mutation of `partitions` may go ahead (False: THROTTLING_QUOTA_EXCEEDED); an
        admitted one that really happens is counted."""
        if self.strict and self.bucket.tokens < 0:
            return False
        if not validate_only:
            self.bucket.tokens -= partitions
        return True

    def finish(self, response: dict[str, object]) -> dict[str, object]:
        ms = self.bucket.throttle_ms()
        if ms:
            before = response.get("throttle_time_ms")
            response["throttle_time_ms"] = max(before if isinstance(before, int) else 0, ms)
            mute(self.conn, ms)
        return response
