"""EtcdMetaStore against real etcd (tests/etcdkit.py), and the contract it shares with LocalMetaStore.

The contract tests run over both stores: records appended are applied and replayed after a
reopen, a checkpoint plus the log after it equals the state, watchers see every record in order.
The etcd-only tests cover what one node never meets: two stores appending to one log, a
conditional append with a stale guard, a checkpoint larger than one etcd request, a 3-member etcd
losing a member, and etcd going away and coming back.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

import etcdkit
from etcdkit import EtcdCluster, needs_etcd
from loglake.cluster import etcd as etcd_store
from loglake.cluster import etcd_client as ec
from loglake.cluster.etcd import (
    CHECKPOINT_CHUNK_BYTES,
    TXN_RECORDS_MAX,
    EtcdMetaStore,
    Guard,
    _batchable,
    _Pending,
)
from loglake.cluster.etcd_client import EtcdClient
from loglake.errors import ConfigError, EtcdUnavailableError, MetaFencedError
from loglake.fs.os_fs import OsFileSystem
from loglake.meta.checkpoint import capture
from loglake.meta.etcd_url import parse_cluster_url
from loglake.meta.log import LocalMetaStore
from loglake.meta.records import Cluster, OffsetCommit, RecordKind, TopicCreated
from loglake.meta.state import MetaState

pytestmark = needs_etcd
etcd1 = etcdkit.etcd1
etcd3 = etcdkit.etcd3

Opener = Callable[..., Any]


def image(state: MetaState) -> Any:
    img = capture(state)
    return img.seq, img.doc, b"".join(img.tables)


def topic_record(i: int, partitions: int = 2) -> TopicCreated:
    return TopicCreated(f"t{i}", f"{i:032x}", partitions, {}, i)


CLUSTER = Cluster("c1")


def commit_record(group: str, offset: int) -> OffsetCommit:
    return OffsetCommit(group, [("t0", 0, offset, -1, "", offset)])


@pytest.fixture(params=["local", "etcd"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """A function opening a store over the same place each call (kwargs: checkpoint thresholds)."""
    opened: list[Any] = []
    if request.param == "local":

        def open_local(**kw: Any) -> Any:
            store = LocalMetaStore(OsFileSystem(), str(tmp_path / "meta"), **kw)
            store.open()
            opened.append(store)
            return store

        yield open_local
    else:
        cluster: EtcdCluster = request.getfixturevalue("etcd1")
        prefix = f"/loglake-test/{uuid.uuid4().hex[:8]}"

        def open_etcd(**kw: Any) -> Any:
            store = EtcdMetaStore(EtcdClient(",".join(cluster.endpoints)), prefix, **kw)
            store.open()
            opened.append(store)
            return store

        yield open_etcd
    for store in opened:
        store.close()


# ---- the shared contract ------------------------------------------------------------------------


def test_records_apply_and_replay_after_reopen(opener: Opener) -> None:
    store = opener()
    futures = [store.append(CLUSTER), store.append(topic_record(0))]
    futures += [store.append(commit_record("g", i)) for i in range(20)]
    assert [f.result(timeout=30) for f in futures] == list(range(22))
    store.sync()
    assert store.state.groups["g"].offsets[("t0", 0)][0] == 19
    assert store.state.topic_by_name("t0") is not None
    before = image(store.state)
    store.close()
    again = opener()
    assert image(again.state) == before


def test_checkpoint_then_log_equals_the_state(opener: Opener) -> None:
    store = opener(checkpoint_records=5)
    store.append(CLUSTER)
    for i in range(12):
        store.append(topic_record(i)).result(timeout=30)
        store.append(commit_record("g", i)).result(timeout=30)
        store.maybe_checkpoint()
    store.append(commit_record("h", 99)).result(timeout=30)  # after the last checkpoint
    before = image(store.state)
    store.close()
    again = opener(checkpoint_records=5)
    assert again.report.checkpoint_seq is not None and again.report.checkpoint_seq < before[0]
    assert image(again.state) == before


def test_watchers_see_every_record_in_order(opener: Opener) -> None:
    store = opener()
    seen: list[tuple[int, str]] = []
    store.watch(lambda seq, kind, body, raw: seen.append((seq, kind)))
    kinds = [RecordKind.CLUSTER]
    store.append(CLUSTER)
    for i in range(10):
        record = topic_record(i) if i % 3 == 0 else commit_record("g", i)
        kinds.append(record.kind)
        store.append(record)
    store.sync()
    assert seen == list(enumerate(kinds))


def test_cluster_urls_parse_or_are_refused_with_a_config_error() -> None:
    assert parse_cluster_url("etcd://127.0.0.1:2379,[::1]:22379/loglake/prod") == (
        [("127.0.0.1", 2379), ("::1", 22379)],
        "/loglake/prod",
    )
    for bad in (
        "http://h:1/p",
        "etcd://h:1",
        "etcd://h:1/",
        "etcd://h/p",
        "etcd://h:99999/p",
        "etcd://h:1/a//b",
    ):
        with pytest.raises(ConfigError):
            parse_cluster_url(bad)


# ---- etcd only ------------------------------------------------------------------------------


def _etcd_store(cluster: EtcdCluster, prefix: str, **kw: Any) -> EtcdMetaStore:
    store = EtcdMetaStore(EtcdClient(",".join(cluster.endpoints), **kw.pop("client", {})), prefix, **kw)
    store.open()
    return store


def test_two_stores_appending_concurrently_serialize_without_loss_or_duplicate(etcd1: EtcdCluster) -> None:
    a = _etcd_store(etcd1, "/c")
    b = _etcd_store(etcd1, "/c")
    seen: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}
    a.watch(lambda seq, kind, body, raw: seen["a"].append((seq, body["rows"][0][2])))
    b.watch(lambda seq, kind, body, raw: seen["b"].append((seq, body["rows"][0][2])))
    per_writer = 150
    results: dict[str, list[Future[int]]] = {}

    def writer(name: str, store: EtcdMetaStore, base: int) -> None:
        results[name] = [store.append(commit_record(name, base + i)) for i in range(per_writer)]

    threads = [
        threading.Thread(target=writer, args=("a", a, 0)),
        threading.Thread(target=writer, args=("b", b, 10_000)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seqs = sorted(f.result(timeout=60) for fs in results.values() for f in fs)
    assert seqs == list(range(2 * per_writer))  # every record once, no gap
    a.sync()
    b.sync()
    assert seen["a"] == seen["b"]  # both stores applied one order
    values = [v for _s, v in seen["a"]]
    assert sorted(values) == sorted(list(range(per_writer)) + list(range(10_000, 10_000 + per_writer)))
    assert [v for v in values if v < 10_000] == list(range(per_writer))  # each writer's order kept
    assert image(a.state) == image(b.state)
    a.close()
    b.close()


def test_conditional_append_with_a_stale_guard_is_refused(etcd1: EtcdCluster) -> None:
    leader = _etcd_store(etcd1, "/c")
    usurper = _etcd_store(etcd1, "/c")
    epoch_key = "epochs/t0/0"
    leader.append_if(
        commit_record("g", 1), guards=[Guard(epoch_key, mod_revision=0)], sets={epoch_key: b"1"}
    ).result(timeout=30)
    assert leader.get_key(epoch_key)[0] == b"1"
    # A new leader bumps the epoch; the old one still believes in epoch 1.
    usurper.append_if(
        commit_record("g", 2), guards=[Guard(epoch_key, value=b"1")], sets={epoch_key: b"2"}
    ).result(timeout=30)
    stale = leader.append_if(commit_record("g", 3), guards=[Guard(epoch_key, value=b"1")])
    with pytest.raises(MetaFencedError):
        stale.result(timeout=30)
    leader.sync()
    assert leader.state.groups["g"].offsets[("t0", 0)][0] == 2  # the fenced record is nowhere
    assert leader.state.seq == 1
    current = leader.append_if(commit_record("g", 4), guards=[Guard(epoch_key, value=b"2")])
    assert current.result(timeout=30) == 2
    leader.close()
    usurper.close()


def test_guarded_appends_are_group_committed_and_a_broken_guard_fails_only_its_records(etcd1: EtcdCluster) -> None:
    """Offset commits of ten groups, each guarded by its own claim key, queued while a transaction
    is in flight: they go in one transaction comparing all ten claims. One claim was taken by
    another coordinator, so that transaction fails; exactly that group's record is fenced, and the
    other nine commit together in the next one."""
    store = _etcd_store(etcd1, "/c")
    groups = [f"g{i}" for i in range(10)]
    for g in groups:
        owner = b"other" if g == "g3" else b"me"
        store.client.txn([], [ec.op_put(store.keys.key(f"claims/{g}"), owner)], [])
    real_call = store.client.call
    release = threading.Event()
    txns: list[int] = []

    def held(path: str, payload: dict[str, Any], **kw: Any) -> dict[str, Any]:
        if path == "kv/txn":
            txns.append(len(payload.get("compare", [])))
            release.wait(30)  # the first transaction waits until every commit is queued
        return real_call(path, payload, **kw)

    store.client.call = held  # type: ignore[method-assign]
    first = store.append(CLUSTER)
    while not txns:
        time.sleep(0.01)
    futures = {g: store.append_if(commit_record(g, 7), [Guard(f"claims/{g}", value=b"me")]) for g in groups}
    release.set()
    assert first.result(timeout=30) == 0
    with pytest.raises(MetaFencedError, match="claims/g3"):
        futures.pop("g3").result(timeout=30)
    seqs = sorted(f.result(timeout=30) for f in futures.values())
    assert seqs == list(range(1, 10))  # nine records, one after another
    # the cluster record alone, then the ten compared at once (head + 10 claims), then the nine
    assert txns == [1, 11, 10]
    store.client.call = real_call  # type: ignore[method-assign]
    assert sorted(store.state.groups) == sorted(g for g in groups if g != "g3")
    store.close()


def test_only_consistent_guards_without_sets_share_a_transaction() -> None:
    def pending(*guards: Guard, sets: tuple[tuple[str, bytes], ...] = ()) -> _Pending:
        return _Pending(RecordKind.OFFSET_COMMIT, {}, b"", Future(), guards, sets)

    a, b = Guard("claims/a", value=b"me"), Guard("claims/b", value=b"me")
    assert _batchable([pending()], pending(a))
    assert _batchable([pending(a)], pending(b)) and _batchable([pending(a)], pending(a))
    assert not _batchable([pending(a)], pending(Guard("claims/a", value=b"other")))
    assert not _batchable([pending(a)], pending(Guard("claims/a", mod_revision=0)))
    assert not _batchable([pending(a)], pending(b, sets=(("epoch", b"2"),)))
    assert not _batchable([pending(a, sets=(("epoch", b"2"),))], pending(b))
    many = [pending(Guard(f"claims/{i}", value=b"me")) for i in range(TXN_RECORDS_MAX)]
    assert not _batchable(many, pending(Guard("claims/one-more", value=b"me")))
    assert _batchable(many, pending(Guard("claims/0", value=b"me")))


def test_synchronous_committers_are_gathered_into_one_transaction(
    etcd1: EtcdCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four clients each committing again as soon as they are answered (a consumer's
    commit(asynchronous=False) loop). Taking what is queued when a transaction returns would split
    them into two cohorts alternating for good (1, 3, 1, 3...); the writer gathers the ones it
    answered, so from the second transaction on every one carries all four (the last excepted)."""
    monkeypatch.setattr(etcd_store, "GATHER_WAIT_MAX_S", 30.0)  # bounded by the transaction's time
    store = _etcd_store(etcd1, "/c")
    store.append(CLUSTER).result(timeout=30)
    real_call = store.client.call
    carried: list[int] = []  # the records each transaction put (its puts but the head)

    def slow(path: str, payload: dict[str, Any], **kw: Any) -> dict[str, Any]:
        if path == "kv/txn":
            carried.append(len(payload["success"]) - 1)
            time.sleep(0.5)  # gathering waits as long: time enough for a loaded machine's clients
        return real_call(path, payload, **kw)

    store.client.call = slow  # type: ignore[method-assign]
    rounds, clients = 4, 4

    def client(i: int) -> None:
        for n in range(rounds):
            guard = Guard(f"claims/g{i}", mod_revision=0)
            store.append_if(commit_record(f"g{i}", n), [guard]).result(timeout=60)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    store.client.call = real_call  # type: ignore[method-assign]
    assert sum(carried) == rounds * clients
    # The first carries whoever came first, and then the clients one round ahead finish a
    # transaction early ([1, 4, 4, 4, 3] as well as [4, 4, 4, 4]); every one between carries all
    # four. Two cohorts alternating would take 2 x rounds transactions of 1 and 3.
    assert len(carried) <= rounds + 1, carried
    assert all(c == clients for c in carried[1:-1]), carried
    assert {g: store.state.groups[f"g{g}"].offsets[("t0", 0)][0] for g in range(clients)} == dict.fromkeys(
        range(clients), rounds - 1
    )
    store.close()


def test_gathering_never_holds_other_records(etcd1: EtcdCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a transaction that answered three offset commits the writer waits for three more, but
    a record of any other kind (a produce's flush, a topic) and a sync() go at once."""
    monkeypatch.setattr(etcd_store, "GATHER_WAIT_MAX_S", 30.0)
    store = _etcd_store(etcd1, "/c")
    real_call = store.client.call
    release = threading.Event()
    slow = threading.Event()
    slow.set()

    def held(path: str, payload: dict[str, Any], **kw: Any) -> dict[str, Any]:
        if path == "kv/txn" and slow.is_set():
            release.wait(30)  # the first transaction waits until the three commits are queued
            time.sleep(3.0)  # and each takes 3 s, so the gather after them would wait as long
        return real_call(path, payload, **kw)

    store.client.call = held  # type: ignore[method-assign]
    first = store.append(CLUSTER)
    commits = [store.append(commit_record(f"g{i}", 1)) for i in range(3)]
    release.set()
    first.result(timeout=60)
    for f in commits:
        f.result(timeout=60)
    slow.clear()
    started = time.monotonic()
    store.append(topic_record(1)).result(timeout=30)
    store.sync()
    assert time.monotonic() - started < 1.5  # not the 3 s the gather would wait for commits
    store.client.call = real_call  # type: ignore[method-assign]
    store.close()


def test_the_store_does_not_read_back_its_own_commits(etcd1: EtcdCluster) -> None:
    """The watch on the head reports this store's own commits too; those need no catch-up read
    (it knows the head's revision from its transaction), while another store's commit still wakes
    it at once (the poll is an hour away here)."""
    store = _etcd_store(etcd1, "/c", poll_interval_s=3600.0)
    store.append(CLUSTER).result(timeout=30)
    time.sleep(0.5)  # the watch's own connect wake-up has been handled
    real_call = store.client.call
    reads: list[str] = []

    def counted(path: str, payload: dict[str, Any], **kw: Any) -> dict[str, Any]:
        if path == "kv/range":
            reads.append(path)
        return real_call(path, payload, **kw)

    store.client.call = counted  # type: ignore[method-assign]
    for i in range(5):
        store.append(commit_record("g", i)).result(timeout=30)
        time.sleep(0.3)  # the watch reports the commit meanwhile
    assert len(reads) <= 1, reads  # one for the watch reconnecting, at most; not one per commit
    other = _etcd_store(etcd1, "/c")
    other.append(commit_record("h", 9)).result(timeout=30)
    deadline = time.monotonic() + 10
    while "h" not in store.state.groups and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "h" in store.state.groups
    store.client.call = real_call  # type: ignore[method-assign]
    other.close()
    store.close()


def test_a_checkpoint_larger_than_an_etcd_request_is_chunked(etcd1: EtcdCluster) -> None:
    store = _etcd_store(etcd1, "/big", checkpoint_records=1_000_000)
    store.append(CLUSTER)
    for i in range(40):
        store.append(topic_record(i, partitions=1000))
    store.sync()
    seq = store.checkpoint()
    assert seq == 40
    store.append(commit_record("g", 1)).result(timeout=30)
    chunks, _ = store.client.range_all(b"/big/meta/ckpt/", b"/big/meta/ckpt0")
    assert len(chunks) >= 2 and all(len(kv.value) <= CHECKPOINT_CHUNK_BYTES for kv in chunks)
    before = image(store.state)
    store.close()
    again = _etcd_store(etcd1, "/big")
    assert again.report.checkpoint_seq == 40 and image(again.state) == before
    again.close()


def test_a_3_member_etcd_losing_a_member_keeps_serving_appends(etcd3: EtcdCluster) -> None:
    store = _etcd_store(etcd3, "/c")
    store.append(CLUSTER).result(timeout=30)
    etcd3.stop_member(0)  # the one the client talks to first
    assert [store.append(commit_record("g", i)).result(timeout=60) for i in range(5)] == [1, 2, 3, 4, 5]
    other = _etcd_store(etcd3, "/c")  # a broker starting now opens through the two left
    assert image(other.state) == image(store.state)
    etcd3.start_member(0)
    other.close()
    store.close()


def test_a_hung_etcd_member_is_failed_over(etcd3: EtcdCluster) -> None:
    """A member that accepts connections and answers nothing (SIGSTOP) costs one request timeout,
    then the client stays on a member that answers."""
    store = _etcd_store(etcd3, "/c")
    store.append(CLUSTER).result(timeout=30)
    etcd3.pause_member(0)  # the one the client talks to first
    try:
        assert [store.append(commit_record("g", i)).result(timeout=60) for i in range(5)] == [1, 2, 3, 4, 5]
        store.sync()
    finally:
        etcd3.resume_member(0)
    store.close()


def test_etcd_down_is_a_typed_error_and_the_store_recovers(
    etcd1: EtcdCluster, caplog: pytest.LogCaptureFixture
) -> None:
    store = _etcd_store(etcd1, "/c", client={"unavailable_s": 2.0})
    store.append(CLUSTER).result(timeout=30)
    etcd1.stop_member(0)
    failed = store.append(commit_record("g", 1))
    with pytest.raises(EtcdUnavailableError) as info:
        failed.result(timeout=60)
    assert info.value.retriable
    with pytest.raises(EtcdUnavailableError):
        store.sync()
    etcd1.start_member(0)
    assert store.append(commit_record("g", 2)).result(timeout=60) >= 1
    store.sync()
    assert store.state.groups["g"].offsets[("t0", 0)][0] == 2
    unreachable = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert 1 <= len(unreachable) <= 3, [r.getMessage() for r in caplog.records]  # no flood over the outage
    store.close()


def test_a_commit_whose_answer_was_lost_is_recognised_not_written_twice(etcd1: EtcdCluster) -> None:
    """The client retries a transaction whose answer it never got; the first try had committed.
    The retry's compare fails, and the store must find its own batch in the log instead of
    appending it a second time."""
    store = _etcd_store(etcd1, "/c")
    store.append(CLUSTER).result(timeout=30)
    real_call = store.client.call
    lost = []

    def answer_lost_once(path: str, payload: dict[str, Any], **kw: Any) -> dict[str, Any]:
        if path == "kv/txn" and not lost:
            lost.append(real_call(path, payload, **kw))  # committed; its answer never arrives
        return real_call(path, payload, **kw)  # the retry

    store.client.call = answer_lost_once  # type: ignore[method-assign]
    futures = [store.append(commit_record("g", i)) for i in range(3)]
    assert [f.result(timeout=30) for f in futures] == [1, 2, 3]
    assert lost and lost[0]["succeeded"]
    store.client.call = real_call  # type: ignore[method-assign]
    store.sync()
    records, _ = store.client.range_all(b"/c/meta/log/", b"/c/meta/log0")
    assert len(records) == 4  # the cluster record and the three, each once
    assert store.state.seq == 3
    store.close()


def test_stores_appending_and_checkpointing_at_once_agree_and_reopen_to_the_same_state(
    etcd1: EtcdCluster,
) -> None:
    """Three brokers append while each takes checkpoints as often as it can: the manifest swaps
    race, logs are deleted under readers, and still every store ends with one state, which a
    fourth store opening afterwards rebuilds exactly."""
    stores = [_etcd_store(etcd1, "/c", checkpoint_records=7) for _ in range(3)]
    stores[0].append(CLUSTER).result(timeout=30)
    futures: list[Future[int]] = []
    lock = threading.Lock()

    def work(index: int, store: EtcdMetaStore) -> None:
        for i in range(80):
            f = store.append(commit_record(f"g{index}", i))
            with lock:
                futures.append(f)
            if i % 5 == 0:
                f.result(timeout=60)
                store.maybe_checkpoint()

    threads = [threading.Thread(target=work, args=(i, s)) for i, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seqs = sorted(f.result(timeout=60) for f in futures)
    assert seqs == list(range(1, 241))
    for s in stores:
        s.sync()
    assert image(stores[0].state) == image(stores[1].state) == image(stores[2].state)
    for index in range(3):
        assert stores[0].state.groups[f"g{index}"].offsets[("t0", 0)][0] == 79
    late = _etcd_store(etcd1, "/c")
    assert late.report.checkpoint_seq is not None and image(late.state) == image(stores[0].state)
    for s in [*stores, late]:
        s.close()


def test_a_store_lagging_past_the_logs_compaction_reloads_from_the_checkpoint(
    etcd1: EtcdCluster, caplog: pytest.LogCaptureFixture
) -> None:
    writer = _etcd_store(etcd1, "/c", checkpoint_records=5)
    writer.append(CLUSTER).result(timeout=30)
    laggard = _etcd_store(etcd1, "/c", poll_interval_s=3600)
    assert laggard._watch is not None
    laggard._watch.stop()  # deaf: it hears of nothing until it is asked to sync
    for i in range(30):
        writer.append(commit_record("g", i)).result(timeout=30)
        writer.maybe_checkpoint()  # two or more checkpoints: the log the laggard needs is gone
    oldest, _ = writer.client.range(b"/c/meta/log/", b"/c/meta/log0", limit=1)[:2]
    assert int(oldest[0].key.rsplit(b"/", 1)[1]) > 1
    laggard.sync()
    assert image(laggard.state) == image(writer.state)
    assert len([r for r in caplog.records if "fell behind" in r.getMessage()]) == 1
    writer.close()
    laggard.close()


def _overtake_once(store: EtcdMetaStore, writer: EtcdMetaStore, first: int) -> None:
    """Make `store`'s next checkpoint load be overtaken: right after it reads the checkpoint,
    `writer` appends and checkpoints twice, which deletes the log the loaded one needs."""
    load = store._load_checkpoint

    def overtaken() -> MetaState:
        state = load()
        store._load_checkpoint = load  # type: ignore[method-assign]
        for round_ in range(2):
            for i in range(3):
                writer.append(commit_record("g", first + 3 * round_ + i)).result(timeout=30)
            assert writer.checkpoint() is not None
        return state

    store._load_checkpoint = overtaken  # type: ignore[method-assign]


@pytest.mark.parametrize("when", ["open", "reload"])
def test_a_checkpoint_overtaken_while_it_is_read_is_started_over_not_taken_for_damage(
    etcd1: EtcdCluster, when: str
) -> None:
    """Another broker checkpoints twice between this store's checkpoint load and its read of the
    log after it, so the records it needs are gone: that is not corruption (the store used to
    fail for good with 'metadata record N is missing'); it starts over from the newer checkpoint."""
    writer = _etcd_store(etcd1, "/c")
    writer.append(CLUSTER).result(timeout=30)
    for i in range(3):
        writer.append(commit_record("g", i)).result(timeout=30)
    assert writer.checkpoint() is not None
    if when == "open":
        store = EtcdMetaStore(EtcdClient(",".join(etcd1.endpoints)), "/c")
        _overtake_once(store, writer, 3)
        store.open()
        assert store.report.attempts == 2
    else:
        store = _etcd_store(etcd1, "/c", poll_interval_s=3600)
        assert store._watch is not None
        store._watch.stop()  # deaf: it hears of nothing until it is asked to sync
        for round_ in range(2):  # it falls behind the log's compaction: sync reloads
            for i in range(3):
                writer.append(commit_record("g", 3 + 3 * round_ + i)).result(timeout=30)
            assert writer.checkpoint() is not None
        _overtake_once(store, writer, 9)
        store.sync()
        assert store.failure is None
    assert image(store.state) == image(writer.state)
    assert store.state.groups["g"].offsets[("t0", 0)][0] == writer.state.seq - 1
    writer.close()
    store.close()


def test_kept_alive_connections_survive_a_member_restart_quietly(
    etcd1: EtcdCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The client keeps its HTTP connections to a member open between calls; when the member
    restarts, the next call finds its kept connection closed and goes again on a new one, without
    an "unreachable" warning; and a gateway refusal keeps its etcd3gw type and etcd's message."""
    client = EtcdClient(",".join(etcd1.endpoints), unavailable_s=20.0)
    try:
        threads = [threading.Thread(target=client.put, args=(b"/k%d" % i, b"v")) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        [endpoint] = client._endpoints
        assert 1 <= len(endpoint._idle) <= ec.IDLE_CONNECTIONS_MAX  # kept, and no more than the bound
        etcd1.stop_member(0)
        etcd1.start_member(0)
        caplog.clear()
        assert client.get(b"/k3")[0] is not None
        assert not [r for r in caplog.records if "unreachable" in r.getMessage()]
        with pytest.raises(EtcdUnavailableError, match="etcd refused kv/txn"):
            client.txn([{"target": "NOPE", "key": ec.b64(b"/k1")}], [])
    finally:
        client.close()
    assert not endpoint._idle
