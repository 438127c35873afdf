"""Incremental fetch sessions (KIP-227): the broker remembers a consumer's partitions between fetches.

A Fetch request names its session with (session_id, session_epoch):

* ``(0, -1)``: sessionless full fetch (every Fetch before v7). Nothing here is touched.
* ``(id, -1)``: close session `id`, then a sessionless full fetch.
* ``(any, 0)``: full fetch; session `id` (if any) is closed, and a new session is created from the
  request's partitions when the cache has room (`maybe_create`); the response carries its id, or
  0 when no session was made (the client keeps sending full fetches).
* ``(id, n > 0)``: incremental fetch. The request holds only the partitions that are new or whose
  fetch offset / limits changed, plus ``forgotten_topics_data``; the session's partitions, in the
  session's order, are what is read. The response holds only partitions with records, an error,
  or a high watermark / log start offset / last stable offset that changed since the session last
  told the client (Kafka's `CachedPartition.maybeUpdateResponseData`, plus the LSO, which moves
  with the high watermark anyway). A partition that returned records moves to the end of the
  session's order, so that under `max_bytes` the later partitions are not starved (Kafka does the
  same). An unknown id answers FETCH_SESSION_ID_NOT_FOUND, an epoch other than the session's
  INVALID_FETCH_SESSION_EPOCH, a session made with topic names used with topic ids (v13+) or the
  other way round FETCH_SESSION_TOPIC_ID_ERROR; all three with no partitions and session id 0, and
  the client starts over with a full fetch.

Bounds (broker settings): at most `max_incremental_fetch_session_cache_slots` sessions (Kafka's
name and default, 1000) and `fetch_session_max_partitions` partitions per session (loglake's: a full
fetch of more makes no session; an incremental fetch that grows a session past it closes the
session with FETCH_SESSION_ID_NOT_FOUND). Eviction is Kafka's (`FetchSessionCache.tryEvict`): when
a new session needs a slot, the least recently used session is evicted if it has been idle longer
than `min_incremental_fetch_session_eviction_ms`; otherwise the "least valuable" evictable session
(ordered by privileged, then partition count, then id) is evicted if the new session is worth at
least as much, i.e. has more partitions. A session can only be displaced that way once it is older
than the eviction time, so new sessions do not thrash; follower sessions (replica_id >= 0) are
privileged and only displaced by other privileged sessions. Unlike Kafka, idle sessions are also
dropped as soon as any fetch finds them idle past the eviction time (so idle memory is freed even
without pressure). Sessions live in the broker process only: after a restart clients get
FETCH_SESSION_ID_NOT_FOUND and start over, as with Kafka.

Everything runs on the event loop: no locks. A request waiting in a long poll holds its session;
when it answers, the session's epoch is checked again (a duplicate request answered meanwhile
makes this one INVALID_FETCH_SESSION_EPOCH, as Kafka does).
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from loglake.broker.config import BrokerConfig
from loglake.broker.protocol import FetchPartition, FetchResponseData, FetchTopic
from loglake.broker.protocol.kafka_types import KafkaStruct
from loglake.kafka_errors import ErrorCode
from loglake.logsafe import RateLimitedLog

log = logging.getLogger(__name__)
_limited = RateLimitedLog(log)

#: Kafka's max.incremental.fetch.session.cache.slots default.
CACHE_SLOTS_DEFAULT = 1000
#: Kafka's min.incremental.fetch.session.eviction.ms default.
EVICTION_MS_DEFAULT = 120_000
#: Most partitions one session may hold (loglake's bound; Kafka has none).
SESSION_PARTITIONS_DEFAULT = 10_000
#: Session ids are positive int32s; 0 means "no session".
INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
_INT32_MAX = 2**31 - 1
#: The first Fetch version with session fields.
SESSIONS_FROM_VERSION = 7
TOPIC_ID_FROM_VERSION = 13


def next_epoch(epoch: int) -> int:
    """The epoch after `epoch` (Kafka's FetchMetadata.nextEpoch: wraps to 1, never back to 0)."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == _INT32_MAX else epoch + 1


#: A session's topic: its name (Fetch v7-v12) or its id (v13+; kafka-python decodes the zero id as None).
TopicKey = str | uuid.UUID | None


class CachedPartition:
    """One partition of a session: the request fields the client last sent (so it reads like a
    request partition to the Fetch handler) and what the client was last told."""

    __slots__ = (
        "current_leader_epoch",
        "fetch_offset",
        "high_watermark",
        "last_fetched_epoch",
        "last_stable_offset",
        "local_log_start",
        "log_start_offset",
        "partition",
        "partition_max_bytes",
        "topic_key",
    )

    def __init__(self, topic_key: TopicKey, req: KafkaStruct) -> None:
        self.topic_key = topic_key
        self.partition = int(req.partition)
        self.high_watermark = self.local_log_start = self.last_stable_offset = -1
        self.update(req)

    def update(self, req: KafkaStruct) -> None:
        self.fetch_offset = req.fetch_offset
        self.partition_max_bytes = req.partition_max_bytes
        self.current_leader_epoch = getattr(req, "current_leader_epoch", -1)
        self.last_fetched_epoch = getattr(req, "last_fetched_epoch", -1)
        self.log_start_offset = getattr(req, "log_start_offset", -1)

    def must_respond(self, p: FetchPartition) -> bool:
        """Whether response partition `p` goes to the client, remembering what it is told."""
        respond = bool(p.records) or p.preferred_read_replica >= 0
        respond = respond or p.diverging_epoch is not None or p.current_leader is not None
        if (p.high_watermark, p.log_start_offset, p.last_stable_offset) != (
            self.high_watermark, self.local_log_start, self.last_stable_offset
        ):
            respond = True
            self.high_watermark, self.local_log_start = p.high_watermark, p.log_start_offset
            self.last_stable_offset = p.last_stable_offset
        if p.error_code != 0:
            self.high_watermark = -1  # resent once the error is gone
            respond = True
        return respond


@dataclass(eq=False)
class FetchSession:
    id: int
    privileged: bool
    uses_topic_ids: bool
    created_ms: float
    last_used_ms: float
    epoch: int = 1
    #: (topic key, partition) -> CachedPartition, in the session's order.
    partitions: dict[tuple[TopicKey, int], CachedPartition] = field(default_factory=dict)

    def evictable_key(self) -> tuple[bool, int, int]:
        return (self.privileged, len(self.partitions), self.id)


@dataclass
class SessionStats:
    created: int = 0
    closed: int = 0
    #: Sessions evicted, by reason: "idle" (past the eviction time) or "displaced" (by a bigger one).
    evicted: dict[str, int] = field(default_factory=lambda: {"idle": 0, "displaced": 0})
    #: Full fetches that wanted a session and got none (cache full, or too many partitions).
    not_created: int = 0
    incremental_fetches: int = 0
    #: Session errors answered, by Kafka error name.
    errors: dict[str, int] = field(default_factory=dict)


class _Topic:
    """A topic of an incremental fetch as the Fetch handler reads it (a request topic's fields)."""

    __slots__ = ("partitions", "topic", "topic_id")

    def __init__(self, key: TopicKey, by_id: bool) -> None:
        self.topic = None if by_id else key
        self.topic_id = key if by_id else None
        self.partitions: list[CachedPartition] = []


class _SessionBody:
    """The request body with `topics` replaced by the session's partitions."""

    def __init__(self, body: KafkaStruct, topics: list[_Topic]) -> None:
        self._body = body
        self.topics = topics

    def __getattr__(self, name: str) -> KafkaStruct:
        return getattr(self._body, name)


class FetchPlan:
    """What one Fetch does with sessions: `body` to read (`None`: answer `error`), then `finish`."""

    def __init__(self, cache: FetchSessionCache, body: KafkaStruct, *, error: int = 0, session: FetchSession | None = None,
                 create: bool = False, privileged: bool = False, by_id: bool = False) -> None:
        self.cache, self.body, self.error, self.session = cache, body, error, session
        self._create, self._privileged, self._by_id = create, privileged, by_id
        self._epoch = session.epoch if session is not None else 0

    def error_response(self) -> FetchResponseData:
        return FetchResponseData(error_code=self.error, session_id=INVALID_SESSION_ID)

    def throttled_session_id(self) -> int:
        """The session id of a throttled answer (Kafka's getThrottledResponse): an incremental
        fetch keeps its session; a full fetch creates none."""
        return self.session.id if self.session is not None and not self._create else 0

    def finish(self, response: FetchResponseData) -> FetchResponseData:
        """Stamp the session id on `response` (creating the session for a full fetch), and for an
        incremental fetch keep only the partitions the client must hear about."""
        if self._create:
            response.session_id = self.cache.maybe_create(self.body, response, self._privileged, self._by_id)
            return response
        session = self.session
        if session is None:
            return response
        if session.epoch != self._epoch:  # a duplicate request moved the session on meanwhile
            return FetchResponseData(error_code=ErrorCode.INVALID_FETCH_SESSION_EPOCH, session_id=session.id)
        rotate: list[CachedPartition] = []
        kept: list[FetchTopic] = []
        for topic, req_topic in zip(response.responses, self.body.topics, strict=True):
            parts = []
            for p, cached in zip(topic.partitions, req_topic.partitions, strict=True):
                if cached.must_respond(p):
                    parts.append(p)
                    if p.records:
                        rotate.append(cached)
            if parts:
                topic.partitions = parts
                kept.append(topic)
        for cached in rotate:  # Kafka: partitions that returned data go to the back of the line
            key = (cached.topic_key, cached.partition)
            if session.partitions.pop(key, None) is not None:
                session.partitions[key] = cached
        response.responses = kept
        response.session_id = session.id
        return response


class FetchSessionCache:
    """The broker's fetch sessions (see the module doc); `clock` gives milliseconds."""

    def __init__(
        self,
        slots: int = CACHE_SLOTS_DEFAULT,
        eviction_ms: int = EVICTION_MS_DEFAULT,
        max_partitions: int = SESSION_PARTITIONS_DEFAULT,
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.slots, self.eviction_ms, self.max_partitions = slots, eviction_ms, max_partitions
        self._clock = clock or (lambda: time.monotonic() * 1000.0)
        self._rng = rng or random.Random()
        #: Sessions by id, least recently used first.
        self.sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self.stats = SessionStats()

    @classmethod
    def from_config(cls, config: BrokerConfig) -> FetchSessionCache:
        return cls(
            config.max_incremental_fetch_session_cache_slots,
            config.min_incremental_fetch_session_eviction_ms,
            config.fetch_session_max_partitions,
        )

    def partitions_cached(self) -> int:
        return sum(len(s.partitions) for s in self.sessions.values())

    # -- requests -------------------------------------------------------------------------------

    def begin(self, body: KafkaStruct, version: int) -> FetchPlan | None:
        """The plan for one Fetch request, or None for a sessionless fetch with no session to close."""
        session_id = getattr(body, "session_id", INVALID_SESSION_ID) if version >= SESSIONS_FROM_VERSION else 0
        epoch = getattr(body, "session_epoch", FINAL_EPOCH) if version >= SESSIONS_FROM_VERSION else FINAL_EPOCH
        if session_id == INVALID_SESSION_ID and epoch == FINAL_EPOCH:
            return None
        now = self._clock()
        self._drop_idle(now)
        by_id = version >= TOPIC_ID_FROM_VERSION
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != INVALID_SESSION_ID and self.sessions.pop(session_id, None) is not None:
                self.stats.closed += 1
            if epoch == FINAL_EPOCH:
                return None
            return FetchPlan(self, body, create=True, privileged=_is_follower(body), by_id=by_id)
        session = self.sessions.get(session_id)
        if session is None:
            return self._error(body, ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
        if session.epoch != epoch:
            return self._error(body, ErrorCode.INVALID_FETCH_SESSION_EPOCH)
        if session.uses_topic_ids != by_id:
            return self._error(body, ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR)
        self._update(session, body, by_id)
        if not session.partitions:  # Kafka: an emptied session closes; the (empty) fetch goes on sessionless
            self._remove(session.id)
            self.stats.closed += 1
            return None
        if len(session.partitions) > self.max_partitions:
            self._remove(session.id)
            self.stats.closed += 1
            return self._error(body, ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
        session.epoch = next_epoch(session.epoch)
        self._touch(session, now)
        self.stats.incremental_fetches += 1
        return FetchPlan(self, _SessionBody(body, _topics(session.partitions.values(), by_id)), session=session)

    def _error(self, body: KafkaStruct, code: ErrorCode) -> FetchPlan:
        self.stats.errors[code.name] = self.stats.errors.get(code.name, 0) + 1
        return FetchPlan(self, None, error=int(code))

    @staticmethod
    def _update(session: FetchSession, body: KafkaStruct, by_id: bool) -> None:
        parts = session.partitions
        for topic in body.topics:
            key = topic.topic_id if by_id else topic.topic
            for p in topic.partitions:
                cached = parts.get((key, p.partition))
                if cached is None:
                    parts[(key, p.partition)] = CachedPartition(key, p)
                else:
                    cached.update(p)
        for forgotten in getattr(body, "forgotten_topics_data", None) or ():
            key = forgotten.topic_id if by_id else forgotten.topic
            for partition in forgotten.partitions:
                parts.pop((key, partition), None)

    # -- the cache ------------------------------------------------------------------------------

    def maybe_create(self, body: KafkaStruct, response: FetchResponseData, privileged: bool, by_id: bool) -> int:
        """A new session from a full fetch and its response, or INVALID_SESSION_ID without room."""
        partitions: dict[tuple[TopicKey, int], CachedPartition] = {}
        for topic, resp_topic in zip(body.topics, response.responses, strict=True):
            key = topic.topic_id if by_id else topic.topic
            for p, rp in zip(topic.partitions, resp_topic.partitions, strict=True):
                cached = CachedPartition(key, p)
                cached.must_respond(rp)
                partitions.pop((key, cached.partition), None)
                partitions[(key, cached.partition)] = cached
        now = self._clock()
        if len(partitions) > self.max_partitions:
            self.stats.not_created += 1
            return INVALID_SESSION_ID
        if len(self.sessions) >= self.slots and not self._try_evict(privileged, len(partitions), now):
            self.stats.not_created += 1
            _limited.info(
                "cache_full", "fetch session cache full (max_incremental_fetch_session_cache_slots=%d, none "
                "evictable): full fetches go on without a session", self.slots,
            )
            return INVALID_SESSION_ID
        session_id = self._new_id()
        session = FetchSession(session_id, privileged, by_id, now, now, next_epoch(INITIAL_EPOCH), partitions)
        self.sessions[session_id] = session
        self.stats.created += 1
        return session_id

    def _new_id(self) -> int:
        while True:
            candidate = self._rng.randint(1, _INT32_MAX)
            if candidate not in self.sessions:
                return candidate

    def _touch(self, session: FetchSession, now: float) -> None:
        session.last_used_ms = now
        self.sessions.move_to_end(session.id)

    def _remove(self, session_id: int) -> None:
        self.sessions.pop(session_id, None)

    def _drop_idle(self, now: float) -> None:
        while self.sessions:
            oldest = next(iter(self.sessions.values()))
            if now - oldest.last_used_ms <= self.eviction_ms:
                return
            self._remove(oldest.id)
            self.stats.evicted["idle"] += 1

    def _try_evict(self, privileged: bool, size: int, now: float) -> bool:
        """Kafka's FetchSessionCache.tryEvict: the stale LRU session, else the least valuable
        evictable one if the new session (privileged, size, id 0) is worth at least as much."""
        if not self.sessions:
            return False
        oldest = next(iter(self.sessions.values()))
        if now - oldest.last_used_ms > self.eviction_ms:
            self._remove(oldest.id)
            self.stats.evicted["idle"] += 1
            return True
        old_enough = [s for s in self.sessions.values() if now - s.created_ms > self.eviction_ms]
        if privileged:
            old_enough += [s for s in self.sessions.values() if not s.privileged and now - s.created_ms <= self.eviction_ms]
        if not old_enough:
            return False
        victim = min(old_enough, key=FetchSession.evictable_key)
        if (privileged, size, 0) < victim.evictable_key():
            return False
        self._remove(victim.id)
        self.stats.evicted["displaced"] += 1
        return True


def _is_follower(body: KafkaStruct) -> bool:
    replica_id = getattr(body, "replica_id", -1)
    state = getattr(body, "replica_state", None)
    if state is not None and getattr(state, "replica_id", -1) >= 0:
        return True
    return isinstance(replica_id, int) and replica_id >= 0


def _topics(parts: Iterable[CachedPartition], by_id: bool) -> list[_Topic]:
    """The session's partitions as request topics: consecutive partitions of one topic together
    (a topic split by the rotation appears more than once, as in Kafka's responses)."""
    topics: list[_Topic] = []
    current: _Topic | None = None
    for cached in parts:
        if current is None or (current.topic_id if by_id else current.topic) != cached.topic_key:
            current = _Topic(cached.topic_key, by_id)
            topics.append(current)
        current.partitions.append(cached)
    return topics


__all__ = [
    "CACHE_SLOTS_DEFAULT",
    "EVICTION_MS_DEFAULT",
    "SESSION_PARTITIONS_DEFAULT",
    "CachedPartition",
    "FetchPlan",
    "FetchSession",
    "FetchSessionCache",
    "next_epoch",
]
