"""KIP-227 fetch sessions over the wire against a real broker (kafka-python's Fetch classes on a raw
socket), and the session cache's eviction rules (Kafka's FetchSessionCache) with a fake clock."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import MetadataRequest

from loglake.broker.fetch_sessions import FetchSessionCache, next_epoch
from loglake.broker.protocol import FetchPartition, FetchResponseData, FetchTopic
from test_broker_malformed import RawClient

from brokerkit import InProcessBroker, serving_in_process

FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71
FETCH_SESSION_TOPIC_ID_ERROR = 106
PARTITIONS = 8
#: The broker of the full-cache test keeps at most this many sessions.
SLOTS = 2


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with serving_in_process(Path(tmp_path_factory.mktemp("fsess")) / "data") as b:
        yield b


_names = itertools.count()


def _topic(broker: InProcessBroker, partitions: int = PARTITIONS) -> str:
    name = f"fsess-{next(_names)}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def _produce(broker: InProcessBroker, topic: str, partition: int, n: int = 1) -> None:
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode(), partition=partition)
    assert p.flush(30) == 0


def _topic_id(client: RawClient, topic: str) -> uuid.UUID:
    meta = client.request(MetadataRequest[12](topics=None, allow_auto_topic_creation=False))
    return next(t.topic_id for t in meta.topics if t.name == topic)


def fetch(
    client: RawClient,
    session_id: int,
    epoch: int,
    parts: dict[int, int],
    *,
    topic: str,
    version: int = 12,
    topic_id: uuid.UUID | None = None,
    forgotten: list[int] | None = None,
    max_wait_ms: int = 0,
    min_bytes: int = 0,
    max_bytes: int = 50 << 20,
) -> Any:
    """Fetch `parts` ({partition: offset}) of one topic; by name below v13, by `topic_id` from v13."""
    req_cls = FetchRequest[version]
    ft = req_cls.FetchTopic
    key = {"topic": topic} if version < 13 else {"topic_id": topic_id}
    topics = [ft(**key, partitions=[ft.FetchPartition(partition=p, fetch_offset=o, partition_max_bytes=1 << 20)
                                    for p, o in parts.items()])] if parts else []
    forgot = [req_cls.ForgottenTopic(**key, partitions=forgotten)] if forgotten else []
    return client.request(req_cls(
        max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes, session_id=session_id,
        session_epoch=epoch, topics=topics, forgotten_topics_data=forgot,
    ))


def returned(resp: Any) -> dict[int, tuple[int, int, int]]:
    """{partition: (error, high watermark, record bytes)} of a response."""
    return {p.partition_index: (p.error_code, p.high_watermark, len(bytes(p.records or b"")))
            for t in resp.responses for p in t.partitions}


@pytest.mark.parametrize("version", [12, 13, 17])
def test_full_fetch_creates_a_session_and_incremental_fetches_carry_changes_only(broker: InProcessBroker, version: int) -> None:
    topic = _topic(broker)
    _produce(broker, topic, 0, 3)
    with RawClient(broker.bootstrap) as c:
        tid = _topic_id(c, topic) if version >= 13 else None
        kw: dict[str, Any] = {"topic": topic, "version": version, "topic_id": tid}
        full = fetch(c, 0, 0, dict.fromkeys(range(PARTITIONS), 0), **kw)
        assert full.error_code == 0 and full.session_id != 0
        assert len(returned(full)) == PARTITIONS and returned(full)[0][1] == 3 and returned(full)[0][2] > 0
        sid = full.session_id
        # Epoch 1: partition 0 moved to offset 3; nothing changed anywhere: an empty answer.
        inc = fetch(c, sid, 1, {0: 3}, **kw)
        assert inc.error_code == 0 and inc.session_id == sid and returned(inc) == {}
        # New data on partition 5 only: only partition 5 comes back (offset 0 still cached for it).
        _produce(broker, topic, 5, 2)
        inc = fetch(c, sid, 2, {}, **kw)
        assert set(returned(inc)) == {5} and returned(inc)[5][1] == 2 and returned(inc)[5][2] > 0
        # Epoch 3: the client moves 5 to offset 2; data on 5 again, partition 6 forgotten.
        _produce(broker, topic, 6, 1)
        inc = fetch(c, sid, 3, {5: 2}, forgotten=[6], **kw)
        assert returned(inc) == {}
        # A partition added to the session is always answered the first time.
        inc = fetch(c, sid, 4, {6: 0}, **kw)
        assert set(returned(inc)) == {6} and returned(inc)[6][2] > 0


def test_partitions_that_returned_data_go_to_the_back_so_none_starves(broker: InProcessBroker) -> None:
    """With max_bytes 1 each fetch returns one batch (KIP-74); the session's order rotates, so
    four fetches serve the four partitions, each once, and every response keeps the size rule."""
    topic = _topic(broker, 4)
    for p in range(4):
        _produce(broker, topic, p, 1)
    with RawClient(broker.bootstrap) as c:
        full = fetch(c, 0, 0, dict.fromkeys(range(4), 0), topic=topic, max_bytes=1)
        sid = full.session_id
        served = [p for p, (_e, _hw, size) in returned(full).items() if size]
        assert served == [0]
        moved = {0: 1}
        for epoch in range(1, 4):
            inc = fetch(c, sid, epoch, moved, topic=topic, max_bytes=1)
            with_data = [p for p, (_e, _hw, size) in returned(inc).items() if size]
            assert len(with_data) == 1
            served += with_data
            moved = {with_data[0]: 1}
        assert served == [0, 1, 2, 3]
        # Everyone is caught up: an empty answer.
        assert returned(fetch(c, sid, 4, moved, topic=topic, max_bytes=1)) == {}


def test_incremental_fetch_long_polls_until_a_session_partition_gets_data(broker: InProcessBroker) -> None:
    topic = _topic(broker)
    with RawClient(broker.bootstrap, timeout=30) as c:
        full = fetch(c, 0, 0, dict.fromkeys(range(PARTITIONS), 0), topic=topic)
        sid = full.session_id
        assert sid != 0
        # Sent without partitions: the session's are read, and the answer waits for data on one of them.
        corr = c.send(_fetch_request(sid, 1, max_wait_ms=20_000, min_bytes=1))
        _produce(broker, topic, 7, 1)
        got, resp = c.receive()
        assert got == corr and resp.session_id == sid
        assert set(returned(resp)) == {7} and returned(resp)[7][2] > 0


def _fetch_request(session_id: int, epoch: int, *, max_wait_ms: int, min_bytes: int) -> Any:
    return FetchRequest[12](max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=1 << 20, session_id=session_id,
                            session_epoch=epoch, topics=[], forgotten_topics_data=[])


def test_session_errors_and_closing(broker: InProcessBroker) -> None:
    topic = _topic(broker)
    parts = dict.fromkeys(range(PARTITIONS), 0)
    with RawClient(broker.bootstrap) as c:
        sid = fetch(c, 0, 0, parts, topic=topic).session_id
        assert sid != 0
        stale = fetch(c, sid, 5, {}, topic=topic)
        assert stale.error_code == INVALID_FETCH_SESSION_EPOCH and stale.responses == [] and stale.session_id == 0
        assert fetch(c, sid, 1, {}, topic=topic).error_code == 0  # the epoch error did not spend the epoch
        # A session made with names is not used with ids (v13+).
        tid = _topic_id(c, topic)
        mixed = fetch(c, sid, 2, {}, topic=topic, version=13, topic_id=tid)
        assert mixed.error_code == FETCH_SESSION_TOPIC_ID_ERROR
        unknown = fetch(c, 1 if sid != 1 else 2, 1, {}, topic=topic)
        assert unknown.error_code == FETCH_SESSION_ID_NOT_FOUND and unknown.responses == []
        # Epoch -1 closes the session and is a sessionless full fetch.
        closed = fetch(c, sid, -1, parts, topic=topic)
        assert closed.error_code == 0 and closed.session_id == 0 and len(returned(closed)) == PARTITIONS
        assert fetch(c, sid, 2, {}, topic=topic).error_code == FETCH_SESSION_ID_NOT_FOUND
        # Epoch 0 with a session id closes it and makes a new one.
        sid2 = fetch(c, 0, 0, parts, topic=topic).session_id
        sid3 = fetch(c, sid2, 0, parts, topic=topic).session_id
        assert sid3 not in (0, sid2)
        assert fetch(c, sid2, 1, {}, topic=topic).error_code == FETCH_SESSION_ID_NOT_FOUND
        # Forgetting every partition closes the session.
        empty = fetch(c, sid3, 1, {}, topic=topic, forgotten=list(range(PARTITIONS)))
        assert empty.error_code == 0 and empty.session_id == 0 and returned(empty) == {}
        assert fetch(c, sid3, 2, {}, topic=topic).error_code == FETCH_SESSION_ID_NOT_FOUND
        # A sessionless fetch (0, -1) answers session id 0 as before.
        assert fetch(c, 0, -1, parts, topic=topic).session_id == 0


def test_a_full_cache_makes_no_new_session_and_the_broker_keeps_working(tmp_path: Path) -> None:
    env = {"LOGLAKE_MAX_INCREMENTAL_FETCH_SESSION_CACHE_SLOTS": str(SLOTS)}
    with serving_in_process(tmp_path / "data", env=env) as b:
        topic = _topic(b)
        parts = dict.fromkeys(range(PARTITIONS), 0)
        with RawClient(b.bootstrap) as c:
            made = [fetch(c, 0, 0, parts, topic=topic).session_id for _ in range(SLOTS)]
            assert 0 not in made
            # Young sessions are not displaced (Kafka protects them for the eviction time): with the
            # cache full a full fetch gets session id 0 and is answered whole, sessionless.
            more = fetch(c, 0, 0, {**parts, 99: 0}, topic=topic)
            assert more.session_id == 0 and len(returned(more)) == PARTITIONS + 1
            for sid in made:
                assert fetch(c, sid, 1, {}, topic=topic).error_code == 0
            fetch(c, made[0], -1, {}, topic=topic)  # closing one frees its slot
            assert fetch(c, 0, 0, parts, topic=topic).session_id != 0


def test_sessions_do_not_survive_a_restart(tmp_path: Path) -> None:
    with serving_in_process(tmp_path / "data") as b:
        topic = _topic(b)
        with RawClient(b.bootstrap) as c:
            sid = fetch(c, 0, 0, {0: 0}, topic=topic).session_id
            assert sid != 0
        b.restart()
        with RawClient(b.bootstrap) as c:
            assert fetch(c, sid, 1, {}, topic=topic).error_code == FETCH_SESSION_ID_NOT_FOUND
            assert fetch(c, 0, 0, {0: 0}, topic=topic).session_id != 0


def test_idle_sessions_are_evicted(tmp_path: Path) -> None:
    env = {"LOGLAKE_MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS": "200"}
    with serving_in_process(tmp_path / "data", env=env) as b:
        topic = _topic(b)
        with RawClient(b.bootstrap) as c:
            sid = fetch(c, 0, 0, {0: 0}, topic=topic).session_id
            assert sid != 0
            time.sleep(0.5)  # idle past the eviction time (a precondition, not a measurement)
            assert fetch(c, sid, 1, {}, topic=topic).error_code == FETCH_SESSION_ID_NOT_FOUND


def test_describe_configs_names_the_limits_as_kafka_does(broker: InProcessBroker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ConfigResource.Type.BROKER, "0")
    entries = admin.describe_configs([resource])[resource].result(30)
    assert entries["max.incremental.fetch.session.cache.slots"].value == "1000"
    assert entries["min.incremental.fetch.session.eviction.ms"].value == "120000"
    assert entries["fetch_session_max_partitions"].value == "10000"


# ---- the cache's rules, with a fake clock ------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _P:
    def __init__(self, partition: int) -> None:
        self.partition, self.fetch_offset, self.partition_max_bytes = partition, 0, 1 << 20


class _T:
    def __init__(self, name: str, n: int) -> None:
        self.topic, self.topic_id = name, None
        self.partitions = [_P(i) for i in range(n)]


class _Body:
    def __init__(self, n: int, session_id: int = 0, epoch: int = 0, replica_id: int = -1) -> None:
        self.session_id, self.session_epoch, self.replica_id = session_id, epoch, replica_id
        self.topics = [_T("t", n)] if n else []
        self.forgotten_topics_data: list[Any] = []


def _open(cache: FetchSessionCache, n: int, replica_id: int = -1) -> int:
    body = _Body(n, replica_id=replica_id)
    plan = cache.begin(body, 12)
    assert plan is not None and plan.body is body
    response = FetchResponseData(responses=[FetchTopic(topic="t", partitions=[FetchPartition(i) for i in range(n)])])
    return plan.finish(response).session_id


def test_cache_evicts_the_least_valuable_session_only_when_the_new_one_has_more_partitions() -> None:
    clock = Clock()
    cache = FetchSessionCache(slots=2, eviction_ms=1000, clock=clock)
    small, big = _open(cache, 2), _open(cache, 5)
    assert small and big
    clock.now = 500
    assert _open(cache, 10) == 0  # both younger than the eviction time: protected
    assert cache.stats.not_created == 1
    clock.now = 1500
    cache._touch(cache.sessions[small], clock.now)
    cache._touch(cache.sessions[big], clock.now)
    assert _open(cache, 2) == 0  # as many partitions as the smallest: not worth more
    third = _open(cache, 3)
    assert third and small not in cache.sessions and big in cache.sessions
    assert cache.stats.evicted == {"idle": 0, "displaced": 1}


def test_cache_evicts_the_lru_session_once_it_is_idle_past_the_eviction_time() -> None:
    clock = Clock()
    cache = FetchSessionCache(slots=2, eviction_ms=1000, clock=clock)
    a = _open(cache, 50)
    clock.now = 800
    b = _open(cache, 50)
    clock.now = 1_500  # a idle for 1500 ms, b for 700 ms
    c = _open(cache, 1)
    assert c and a not in cache.sessions and b in cache.sessions
    assert cache.stats.evicted["idle"] == 1


def test_follower_sessions_are_privileged() -> None:
    clock = Clock()
    cache = FetchSessionCache(slots=1, eviction_ms=1000, clock=clock)
    follower = _open(cache, 1, replica_id=1)
    clock.now = 1001
    cache._touch(cache.sessions[follower], clock.now)
    assert _open(cache, 100) == 0  # a consumer never displaces a follower, however big
    consumer_cache = FetchSessionCache(slots=1, eviction_ms=1000, clock=clock)
    consumer = _open(consumer_cache, 100)
    assert _open(consumer_cache, 1, replica_id=1) not in (0, consumer)  # a follower displaces a young consumer


def test_per_session_partition_bound() -> None:
    cache = FetchSessionCache(max_partitions=4, clock=Clock())
    assert _open(cache, 5) == 0
    sid = _open(cache, 4)
    grow = _Body(0, session_id=sid, epoch=1)
    grow.topics = [_T("u", 1)]
    plan = cache.begin(grow, 12)
    assert plan is not None and plan.error == FETCH_SESSION_ID_NOT_FOUND and sid not in cache.sessions


def test_incremental_rotation_moves_partitions_with_data_to_the_back() -> None:
    cache = FetchSessionCache(clock=Clock())
    sid = _open(cache, 4)
    plan = cache.begin(_Body(0, session_id=sid, epoch=1), 12)
    assert plan is not None and [p.partition for t in plan.body.topics for p in t.partitions] == [0, 1, 2, 3]
    parts = [FetchPartition(i, high_watermark=-1, log_start_offset=-1, last_stable_offset=-1) for i in range(4)]
    parts[1].records = [b"x" * 70]
    out = plan.finish(FetchResponseData(responses=[FetchTopic(topic="t", partitions=parts)]))
    assert [p.partition_index for t in out.responses for p in t.partitions] == [1]
    plan = cache.begin(_Body(0, session_id=sid, epoch=2), 12)
    assert plan is not None
    assert [(t.topic, [p.partition for p in t.partitions]) for t in plan.body.topics] == [("t", [0, 2, 3, 1])]


def test_next_epoch_wraps_to_one() -> None:
    assert next_epoch(0) == 1 and next_epoch(2**31 - 1) == 1 and next_epoch(-1) == -1
