"""The broker's small stores over the metadata store (loglake.broker.meta_facts): ACL bindings,
SCRAM credentials, client quotas, dynamic configs, transactional ids.

Each store writes the records the engine wrote before them, byte for byte (the on-disk format is
unchanged); what a write acknowledged survives a crash; reads are copies; a write while the
engine is closed is EngineClosedError with nothing logged; a record the state refuses is
MetaRecordRejectedError (a ValueError) with nothing logged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from loglake.broker.config_store import ConfigStore
from loglake.broker.security.acl_store import AclStore
from loglake.broker.security.quota_store import QuotaStore
from loglake.broker.security.scram_store import ScramStore
from loglake.broker.txn.id_store import TxnIdStore
from loglake.engine import Engine
from loglake.errors import EngineClosedError, MetaRecordRejectedError
from loglake.fs.faulty import FaultyFileSystem
from loglake.meta.quotas import entity_key

from enginekit import DATA_DIR, abandon, small_config

CRED = {"salt": "c2FsdA==", "iterations": 4096, "stored_key": "AA==", "server_key": "AA=="}
ALICE = (("user", "alice"), ("client-id", None))
CREATED = [2, "t", 3, "User:alice", "*", 3, 3]
DELETED = [2, "u", 3, "User:bob", "*", 2, 3]
TXN = {"tid": "app", "pid": 1000, "epoch": 0, "state": "empty", "timeout_ms": 60000, "start_ms": 1, "last_ms": 2,
       "parts": [], "groups": [], "offsets": {}}


def _open(fs: FaultyFileSystem) -> Engine:
    engine = Engine(DATA_DIR, small_config(), fs=fs, start_background=False)
    engine.open()
    return engine


@pytest.fixture
def engine() -> Iterator[Engine]:
    engine = _open(FaultyFileSystem())
    try:
        yield engine
    finally:
        engine.close()


def _crash_and_reopen(engine: Engine, fs: FaultyFileSystem) -> Engine:
    """What was durable, and nothing else: the engine dies without closing."""
    abandon(engine)
    return _open(fs.crash())


def test_the_stores_write_the_records_of_the_previous_release_byte_for_byte(engine: Engine) -> None:
    """The literals are what `Engine.save_acls`, `save_scram_credential`, `save_client_quota`,
    `save_dynamic_configs` and `record_txn` logged before the stores took them over."""
    logged: list[bytes] = []
    engine.meta.watch(lambda _seq, _kind, _body, raw: logged.append(raw))
    AclStore.of(engine).save([CREATED], [DELETED])
    scram = ScramStore.of(engine)
    scram.save("alice", "SCRAM-SHA-256", dict(CRED))
    scram.save("alice", "SCRAM-SHA-256", None)
    quotas = QuotaStore.of(engine)
    quotas.save(ALICE, {"producer_byte_rate": 1024.0})
    quotas.save(ALICE, None)
    configs = ConfigStore.of(engine)
    configs.save_broker_configs("", {"log.retention.ms": "1000"})
    configs.save_group_configs("g", {"consumer.session.timeout.ms": "45000"})
    TxnIdStore.of(engine).record(dict(TXN)).result()
    assert logged == [
        b'\x01\x14{"created":[[2,"t",3,"User:alice","*",3,3]],"deleted":[[2,"u",3,"User:bob","*",2,3]]}',
        b'\x01\x15{"user":"alice","mechanism":"SCRAM-SHA-256","cred":{"salt":"c2FsdA==","iterations":4096,'
        b'"stored_key":"AA==","server_key":"AA=="}}',
        b'\x01\x15{"user":"alice","mechanism":"SCRAM-SHA-256","cred":null}',
        b'\x01\x16{"entity":[["user","alice"],["client-id",null]],"values":{"producer_byte_rate":1024.0}}',
        b'\x01\x16{"entity":[["user","alice"],["client-id",null]],"values":null}',
        b'\x01\x0f{"scope":"","configs":{"log.retention.ms":"1000"}}',
        b'\x01\x10{"g":"g","configs":{"consumer.session.timeout.ms":"45000"}}',
        b'\x01\x12{"tid":"app","pid":1000,"epoch":0,"state":"empty","timeout_ms":60000,"start_ms":1,"last_ms":2,'
        b'"parts":[],"groups":[],"offsets":{}}',
    ]


# ---- each store: durable on return, read back as copies -----------------------------------------


def test_acl_bindings_survive_a_crash_in_creation_order_and_deleted_ones_go() -> None:
    fs = FaultyFileSystem()
    engine = _open(fs)
    store = AclStore.of(engine)
    store.save([DELETED, CREATED], [])
    store.save([], [DELETED])
    engine = _crash_and_reopen(engine, fs)
    try:
        bindings = AclStore.of(engine).bindings()
        assert bindings == [tuple(CREATED)]
        bindings.clear()  # a copy: the state keeps its bindings
        assert AclStore.of(engine).bindings() == [tuple(CREATED)]
    finally:
        engine.close()


def test_scram_credentials_survive_a_crash_are_copies_and_a_removed_one_is_none() -> None:
    fs = FaultyFileSystem()
    engine = _open(fs)
    store = ScramStore.of(engine)
    store.save("alice", "SCRAM-SHA-256", dict(CRED))
    store.save("alice", "SCRAM-SHA-512", dict(CRED))
    store.save("bob", "SCRAM-SHA-512", dict(CRED))
    store.save("bob", "SCRAM-SHA-512", None)
    engine = _crash_and_reopen(engine, fs)
    try:
        store = ScramStore.of(engine)
        assert store.credentials() == {"alice": {"SCRAM-SHA-256": CRED, "SCRAM-SHA-512": CRED}}
        assert store.credential("alice", "SCRAM-SHA-512") == CRED
        assert store.credential("bob", "SCRAM-SHA-512") is None and store.credential("carol", "SCRAM-SHA-256") is None
        store.credentials()["alice"]["SCRAM-SHA-256"]["iterations"] = 1  # copies, all the way down
        doc = store.credential("alice", "SCRAM-SHA-256")
        assert doc is not None
        doc["iterations"] = 2
        assert store.credential("alice", "SCRAM-SHA-256") == CRED
    finally:
        engine.close()


def test_client_quotas_survive_a_crash_are_copies_and_none_removes_an_entity() -> None:
    fs = FaultyFileSystem()
    engine = _open(fs)
    store = QuotaStore.of(engine)
    default = (("client-id", None),)
    store.save(ALICE, {"producer_byte_rate": 1024.0, "consumer_byte_rate": 2048.0})
    store.save(default, {"request_percentage": 12.5})
    store.save(default, None)
    engine = _crash_and_reopen(engine, fs)
    try:
        store = QuotaStore.of(engine)
        alice = entity_key(ALICE)  # the canonical key the state keeps
        assert store.quotas() == {alice: {"producer_byte_rate": 1024.0, "consumer_byte_rate": 2048.0}}
        store.quotas()[alice]["producer_byte_rate"] = 1.0
        assert store.quotas()[alice]["producer_byte_rate"] == 1024.0
    finally:
        engine.close()


def test_dynamic_configs_survive_a_crash_per_kind_and_empty_configs_remove_a_scope() -> None:
    fs = FaultyFileSystem()
    engine = _open(fs)
    store = ConfigStore.of(engine)
    store.save_broker_configs("", {"log.retention.ms": "1000"})
    store.save_broker_configs("0", {"max.connections": "5"})
    store.save_broker_configs("0", {})
    store.save_group_configs("g", {"consumer.session.timeout.ms": "45000"})
    engine = _crash_and_reopen(engine, fs)
    try:
        store = ConfigStore.of(engine)
        assert store.broker_configs() == {"": {"log.retention.ms": "1000"}}
        assert store.group_configs() == {"g": {"consumer.session.timeout.ms": "45000"}}
        store.broker_configs()[""]["log.retention.ms"] = "1"
        store.group_configs()["g"].clear()
        assert store.broker_configs() == {"": {"log.retention.ms": "1000"}}
        assert store.group_configs() == {"g": {"consumer.session.timeout.ms": "45000"}}
    finally:
        engine.close()


def test_txn_ids_resolve_with_their_seq_survive_a_crash_and_a_dead_one_goes() -> None:
    fs = FaultyFileSystem()
    engine = _open(fs)
    store = TxnIdStore.of(engine)
    seq = store.record(dict(TXN)).result()
    assert seq == engine.meta.last_seq
    store.record(TXN | {"tid": "gone", "pid": 1001}).result()
    store.record(TXN | {"tid": "gone", "pid": 1001, "state": "dead"}).result()
    engine = _crash_and_reopen(engine, fs)
    try:
        store = TxnIdStore.of(engine)
        assert store.states() == {"app": TXN}
        store.states()["app"]["state"] = "ongoing"
        assert store.states()["app"]["state"] == "empty"
    finally:
        engine.close()


# ---- refusals ------------------------------------------------------------------------------------

WRITES: dict[str, Callable[[Engine], object]] = {
    "acls": lambda e: AclStore.of(e).save([CREATED], []),
    "scram_credential": lambda e: ScramStore.of(e).save("alice", "SCRAM-SHA-256", dict(CRED)),
    "client_quota": lambda e: QuotaStore.of(e).save(ALICE, {"producer_byte_rate": 1.0}),
    "broker_config": lambda e: ConfigStore.of(e).save_broker_configs("", {"log.retention.ms": "1000"}),
    "group_config": lambda e: ConfigStore.of(e).save_group_configs("g", {"consumer.session.timeout.ms": "45000"}),
    "txn": lambda e: TxnIdStore.of(e).record(dict(TXN)),
}


@pytest.mark.parametrize("kind", sorted(WRITES))
def test_a_write_while_the_engine_is_closed_is_engine_closed_and_logs_nothing(kind: str) -> None:
    fs = FaultyFileSystem()
    engine = Engine(DATA_DIR, small_config(), fs=fs, start_background=False)
    with pytest.raises(EngineClosedError, match="engine is closed"):
        WRITES[kind](engine)  # before open
    engine.open()
    last = engine.meta.last_seq
    engine.close()
    with pytest.raises(EngineClosedError, match="engine is closed"):
        WRITES[kind](engine)  # after close
    engine = _open(fs)
    try:
        assert engine.meta.last_seq == last  # nothing was logged, before open nor after close
    finally:
        engine.close()


REFUSED: dict[str, Callable[[Engine], object]] = {
    "acls": lambda e: AclStore.of(e).save([[2, 7, 3, "User:alice", "*", 3, 3]], []),  # a name that is no string
    "scram_credential": lambda e: ScramStore.of(e).save("alice", "MD5", dict(CRED)),
    "client_quota": lambda e: QuotaStore.of(e).save(ALICE, {"producer_byte_rate": -1.0}),
    "txn": lambda e: TxnIdStore.of(e).record(TXN | {"state": "committing"}),
}


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_a_record_the_state_refuses_is_meta_record_rejected_and_logs_nothing(engine: Engine, kind: str) -> None:
    last = engine.meta.last_seq
    with pytest.raises(MetaRecordRejectedError, match=f"metadata record {kind} does not apply") as info:
        REFUSED[kind](engine)
    assert isinstance(info.value, ValueError)  # what the handlers catch
    assert engine.meta.last_seq == last


def test_the_stores_copy_out_under_the_store_lock(engine: Engine) -> None:
    """Reads go through `meta.read`: a reader never sees the state object itself."""
    seen: list[Any] = []
    read = engine.meta.read

    def spy(fn: Callable[[Any], Any]) -> Any:
        out = read(fn)
        seen.append(out)
        return out

    engine.meta.read = spy  # type: ignore[method-assign]
    AclStore.of(engine).bindings()
    ScramStore.of(engine).credentials()
    QuotaStore.of(engine).quotas()
    ConfigStore.of(engine).broker_configs()
    ConfigStore.of(engine).group_configs()
    TxnIdStore.of(engine).states()
    state = engine.meta.state
    assert len(seen) == 6
    assert all(out is not table for out in seen for table in (
        state.acls, state.scram, state.client_quotas, state.broker_configs, state.group_configs, state.txns
    ))
