"""The transaction and SASL state tables (`loglake.meta.txn_states`, `loglake.broker.security.sasl`).

Each table is the one owner of its states: the code makes every transition of it and no other
(a spy on the one function that moves a state, while the coordinator and the SASL handlers are
driven through every path), a move outside it raises, no other module of `src/` spells a state
(an AST scan, as tests/test_kafka_errors.py does for error codes), and a ``txn`` record or
checkpoint written by the release before the enum still loads.
"""

from __future__ import annotations

import ast
import asyncio
import base64
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

import loglake
from loglake.broker.config import BrokerConfig
from loglake.broker.groups import GroupState
from loglake.broker.handlers.sasl import sasl_authenticate, sasl_handshake
from loglake.broker.listeners import SASL_PLAINTEXT, Listener
from loglake.broker.security.sasl import (
    VALID_PREVIOUS_SASL_STATES,
    IllegalSaslTransition,
    SaslAuthenticator,
    SaslSession,
    SaslState,
    SaslStats,
)
from loglake.broker.security.tls import SecurityContext
from loglake.broker.txn import Txn, TxnCoordinator, TxnSettings
from loglake.broker.txn.id_store import TxnIdStore
from loglake.engine import Engine
from loglake.errors import CorruptionError
from loglake.fs.faulty import FaultyFileSystem
from loglake.kafka_errors import ErrorCode
from loglake.meta.checkpoint import capture, decode_checkpoint, encode_checkpoint
from loglake.meta.records import decode_record, encode_record
from loglake.meta.scram import TypicalShapes, typical_shapes
from loglake.meta.state import MetaState
from loglake.meta.txn_states import (
    KAFKA_NAMES,
    VALID_PREVIOUS_STATES,
    IllegalTxnTransition,
    TxnState,
    by_kafka_name,
)
from loglake.records.batch import BatchBuilder
from loglake.scram import ITERATIONS_MIN, ScramClient, make_credential

from ctxkit import HandlerConn
from enginekit import DATA_DIR, small_config

SRC = Path(loglake.__file__).parent
TXN_OWNER = SRC / "meta" / "txn_states.py"
SASL_OWNER = SRC / "broker" / "security" / "sasl.py"
#: The state names as every release wrote them into `txn` records and checkpoints.
ON_DISK_TXN_STATES = ["empty", "ongoing", "prepare_commit", "prepare_abort", "complete_commit", "complete_abort", "dead"]
#: Kafka's TransactionState names loglake has (not PrepareEpochFence: see txn_states' docstring).
KAFKA_TXN_STATE_NAMES = ["Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "Dead"]
#: What the scan looks for: the states' values, and Kafka's names of the transaction states
#: except those that are group state names too ("Empty", "Dead": the group code's own).
TXN_WORDS = {s.value for s in TxnState} | (set(KAFKA_NAMES.values()) - {g.value for g in GroupState})
SASL_WORDS = {s.value for s in SaslState}
#: Where a state is moved, and the functions allowed to assign it there.
MOVERS = {
    SRC / "broker" / "txn" / "coordinator.py": {"transition_to"},
    SRC / "broker" / "handlers" / "txn.py": set(),
    SASL_OWNER: {"transition_to", "__init__"},
    SRC / "broker" / "handlers" / "sasl.py": set(),
}
TOPIC = "t"
T = TypeVar("T")


def edges(table: dict[Any, frozenset[Any]]) -> set[tuple[Any, Any]]:
    return {(before, target) for target, befores in table.items() for before in befores}


# ---- the scan: nothing else spells a state -----------------------------------------------------


def state_literals(source: str, filename: str, words: set[str]) -> list[str]:
    """`file:line 'word'` for every string constant that is one of `words`; docstrings and the
    text of f-strings (messages, not states) aside."""
    tree = ast.parse(source, filename)
    prose: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            prose.add(id(node.value))
        elif isinstance(node, ast.JoinedStr):
            prose.update(id(n) for n in ast.walk(node))
    return [
        f"{filename}:{node.lineno} {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in words and id(node) not in prose
    ]


@pytest.mark.parametrize(("owner", "words"), [(TXN_OWNER, TXN_WORDS), (SASL_OWNER, SASL_WORDS)], ids=["txn", "sasl"])
def test_no_module_outside_the_owner_spells_a_state(owner: Path, words: set[str]) -> None:
    found: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        if path != owner:
            found += state_literals(path.read_text(), str(path.relative_to(SRC)), words)
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        'if txn.state == "ongoing":\n    pass',
        'NAMES = {"prepare_commit": "PrepareCommit"}',
        'txn.state = "complete_abort" if commit else "dead"',
        'Txn("tid", 1, 0, 1000, "empty")',
        'x = b.get("state") in ("prepare_abort", "complete_commit")',
        'names = ["CompleteAbort"]',
    ],
)
def test_the_scan_sees_a_spelled_txn_state(source: str) -> None:
    assert state_literals(source, "m.py", TXN_WORDS)


@pytest.mark.parametrize(
    "source",
    ['if s.state == "scram_final":\n    pass', 'session.state = "done"', 'ok = state not in ("handshake", "failed")'],
)
def test_the_scan_sees_a_spelled_sasl_state(source: str) -> None:
    assert state_literals(source, "m.py", SASL_WORDS)


def test_the_scan_ignores_prose_and_the_enum() -> None:
    source = '''
"""A transaction is ongoing until prepare_commit."""
def f(a: list[str]) -> str:
    """empty"""
    x = TxnState.ONGOING
    g = "Empty" if a else "Dead"  # group state names
    return f"{'unknown' if a else 'empty'}; {x} is ongoing"
'''
    assert state_literals(source, "m.py", TXN_WORDS) == []


@pytest.mark.parametrize("path", sorted(MOVERS), ids=lambda p: str(p.relative_to(SRC)))
def test_a_state_is_assigned_only_by_the_transition_function(path: Path) -> None:
    allowed = MOVERS[path]
    found: list[str] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr == "state" and function not in allowed:
                found.append(f"{path.name}:{node.lineno} in {function}")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(path.read_text()), "<module>")
    assert found == []


# ---- transactions ------------------------------------------------------------------------------


def test_txn_state_values_are_the_on_disk_names() -> None:
    assert [s.value for s in TxnState] == ON_DISK_TXN_STATES
    assert [KAFKA_NAMES[s] for s in TxnState] == KAFKA_TXN_STATE_NAMES
    assert all(by_kafka_name(KAFKA_NAMES[s]) is s for s in TxnState)
    assert by_kafka_name("PrepareEpochFence") is None and by_kafka_name("ongoing") is None
    assert set(VALID_PREVIOUS_STATES) == set(TxnState)


def test_a_txn_move_outside_the_table_raises_and_changes_nothing() -> None:
    illegal = [(a, b) for b in TxnState for a in TxnState if a not in VALID_PREVIOUS_STATES[b]]
    assert len(illegal) == len(TxnState) ** 2 - len(edges(VALID_PREVIOUS_STATES))
    for current, target in illegal:
        txn = Txn("tid-1", 1, 0, 1000, current)
        with pytest.raises(IllegalTxnTransition, match=f"'tid-1': {current.value} -> {target.value} "):
            txn.transition_to(target)
        assert txn.state is current
    for current, target in edges(VALID_PREVIOUS_STATES):
        txn = Txn("tid-1", 1, 0, 1000, current)
        txn.transition_to(target)
        assert txn.state is target


async def _off_loop(fn: Callable[..., T], *args: Any) -> T:
    await asyncio.sleep(0)  # a hop, as the real one to a thread is
    return fn(*args)


def _engine(seed: int) -> tuple[Engine, FaultyFileSystem]:
    fs = FaultyFileSystem(seed=seed)
    engine = Engine(DATA_DIR, small_config(), fs=fs, start_background=False)
    engine.open()
    return engine, fs


def test_the_coordinator_makes_every_transition_of_the_table_and_no_other(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[TxnState, TxnState]] = []
    move = Txn.transition_to

    def spy(txn: Txn, target: TxnState) -> None:
        before = txn.state
        move(txn, target)
        made.append((before, target))

    monkeypatch.setattr(Txn, "transition_to", spy)
    engine, _fs = _engine(seed=11)
    engine.create_topic(TOPIC, 1)
    now = [1_000.0]
    part = (TOPIC, 0)

    async def run() -> None:
        coord = TxnCoordinator(engine, None, TxnSettings(id_expiration_ms=60_000), off_loop=_off_loop, clock=lambda: now[0])

        async def init(tid: str) -> tuple[int, int]:
            code, pid, epoch = await coord.init_producer_id(tid, 10_000, -1, -1, 4)
            assert code == ErrorCode.NONE
            return pid, epoch

        async def add(tid: str, pid: int, epoch: int) -> None:
            assert await coord.add_partitions(tid, pid, epoch, [part], 3) == {part: ErrorCode.NONE}

        async def end(tid: str, pid: int, epoch: int, commit: bool) -> None:
            assert await coord.end_txn(tid, pid, epoch, commit, 3) == ErrorCode.NONE

        pid, epoch = await init("a")  # a new id starts empty: no transition
        pid, epoch = await init("a")  # empty -> empty
        await add("a", pid, epoch)  # empty -> ongoing
        await end("a", pid, epoch, True)  # ongoing -> prepare_commit -> complete_commit
        assert await coord.add_offsets("a", pid, epoch, "g", 3) == ErrorCode.NONE  # complete_commit -> ongoing
        await end("a", pid, epoch, False)  # ongoing -> prepare_abort -> complete_abort
        pid, epoch = await init("a")  # complete_abort -> empty
        await add("a", pid, epoch)
        await end("a", pid, epoch, True)
        pid, epoch = await init("a")  # complete_commit -> empty
        await add("a", pid, epoch)
        pid, epoch = await init("a")  # a new instance aborts the ongoing one: ... -> complete_abort -> empty
        await add("a", pid, epoch)
        await end("a", pid, epoch, False)
        await add("a", pid, epoch)  # complete_abort -> ongoing
        await end("a", pid, epoch, True)
        await init("b")
        pid, epoch = await init("c")
        await add("c", pid, epoch)
        await end("c", pid, epoch, False)
        now[0] += 61  # every id idle past transactional.id.expiration.ms
        await coord.sweep()  # empty / complete_commit / complete_abort -> dead
        assert coord.txns == {} and coord.by_pid == {}

    try:
        asyncio.run(run())
        assert TxnIdStore.of(engine).states() == {}  # the dead records removed every id
    finally:
        engine.close()
    assert set(made) == edges(VALID_PREVIOUS_STATES)


def test_requests_that_waited_while_the_sweep_forgot_the_id_make_no_transition(monkeypatch: pytest.MonkeyPatch) -> None:
    """InitProducerId and AddOffsetsToTxn queued on the lock of an id the sweep is forgetting find
    it dead: a retriable answer (the retry starts a new id) and the mapping error, never a move
    out of dead. An id whose dead record failed is forgotten all the same."""
    engine, _fs = _engine(seed=13)
    now = [1_000.0]

    async def run() -> None:
        coord = TxnCoordinator(engine, None, TxnSettings(id_expiration_ms=60_000), off_loop=_off_loop, clock=lambda: now[0])
        _, pid, epoch = await coord.init_producer_id("x", 10_000, -1, -1, 4)
        now[0] += 61
        sweep = asyncio.create_task(coord.sweep())
        await asyncio.sleep(0)  # the sweep holds the id's lock, waiting for its dead record
        assert coord.txns["x"].lock.locked() and coord.txns["x"].state is TxnState.DEAD
        init = asyncio.create_task(coord.init_producer_id("x", 10_000, -1, -1, 4))
        offsets = asyncio.create_task(coord.add_offsets("x", pid, epoch, "g", 3))
        await sweep
        assert await init == (ErrorCode.CONCURRENT_TRANSACTIONS, -1, -1)
        assert await offsets == ErrorCode.INVALID_PRODUCER_ID_MAPPING
        code, new_pid, _ = await coord.init_producer_id("x", 10_000, -1, -1, 4)  # the client's retry
        assert code == ErrorCode.NONE and new_pid != pid and coord.txns["x"].state is TxnState.EMPTY

        def refuse_dead(body: dict[str, Any]) -> Any:
            if body["state"] == TxnState.DEAD:
                raise CorruptionError("meta", 0, "the metadata store refused the record")
            return record(body)

        record = coord.ids.record
        monkeypatch.setattr(coord.ids, "record", refuse_dead)
        now[0] += 61
        with pytest.raises(CorruptionError):
            await coord.sweep()
        assert coord.txns == {} and coord.by_pid == {}  # nothing left dead in memory
        assert (await coord.init_producer_id("x", 10_000, -1, -1, 4))[0] == ErrorCode.NONE

    try:
        asyncio.run(run())
    finally:
        engine.close()


def _old_record(state: str, pid: int, topic_hex: str, extra: str = "") -> bytes:
    """A ``txn`` metadata record as the release before TxnState encoded it (version 1, kind 18)."""
    body = (
        f'{{"tid":"old","pid":{pid},"epoch":0,"state":"{state}","timeout_ms":60000,"start_ms":1,"last_ms":1,'
        f'"parts":[["{topic_hex}",0,0]],"names":["{TOPIC}"],"groups":[],"offsets":{{}}{extra}}}'
    )
    return b"\x01\x12" + body.encode()


def test_txn_records_of_the_previous_release_still_apply() -> None:
    engine, fs = _engine(seed=12)
    engine.create_topic(TOPIC, 1)
    plain = BatchBuilder()
    for i in range(10):  # the aborted entry's marker below must lie inside the log to survive recovery
        plain.append(1_000 + i, None, b"v", [])
    engine.append_batch(TOPIC, 0, bytearray(plain.build())).result()
    topic_hex = engine.topic_id_of(TOPIC).hex()
    pid = engine.allocate_producer_id()
    pm = engine.catalog.partition(TOPIC, 0).meta

    def apply(raw: bytes) -> None:
        kind, body = decode_record(raw, where="test", position=0)
        assert kind == "txn"
        TxnIdStore.of(engine).record(body).result()

    for state in ("empty", "ongoing", "prepare_abort"):
        apply(_old_record(state, pid, topic_hex))
    assert pm.txn_open == {pid: 0}
    apply(_old_record("complete_abort", pid, topic_hex, f',"markers":[["{topic_hex}",0,7]]'))
    assert pm.txn_open == {} and pm.aborted_txns == [[pid, 0, 7]]
    apply(_old_record("ongoing", pid, topic_hex))
    apply(_old_record("prepare_commit", pid, topic_hex))  # a crash in EndTxn(commit)
    engine.close()

    engine = Engine(DATA_DIR, small_config(), fs=fs.crash(), start_background=False)
    engine.open()  # replays the old records
    try:
        assert engine.catalog.partition(TOPIC, 0).meta.aborted_txns == [[pid, 0, 7]]
        coord = TxnCoordinator(engine, None, TxnSettings(), off_loop=_off_loop)
        asyncio.run(coord.start_once())  # finishes the old prepare_commit
        txn = coord.txns["old"]
        assert txn.state is TxnState.COMPLETE_COMMIT and txn.pid == pid
        assert TxnIdStore.of(engine).states()["old"]["state"] == "complete_commit"
        assert engine.catalog.partition(TOPIC, 0).meta.txn_open == {}
        assert b'"state":"complete_commit"' in encode_record("txn", txn.body())  # the same bytes as before
    finally:
        engine.close()


def _state_with(txn_state: str) -> MetaState:
    state = MetaState("c1")
    state.txns["old"] = {"tid": "old", "pid": 7, "epoch": 0, "state": txn_state, "timeout_ms": 60000, "parts": []}
    return state


def test_a_checkpoint_of_the_previous_release_loads_and_an_unknown_state_is_corruption() -> None:
    for name in ON_DISK_TXN_STATES:
        loaded = decode_checkpoint(b"".join(encode_checkpoint(capture(_state_with(name)))), path="ck")
        assert Txn.from_body(loaded.txns["old"]).state is TxnState(name)
    data = b"".join(encode_checkpoint(capture(_state_with("committing"))))
    with pytest.raises(CorruptionError, match=r"ck @ byte .*unknown transaction state 'committing'"):
        decode_checkpoint(data, path="ck")


@pytest.mark.parametrize("bad", ["committing", "Ongoing", None, 3])
def test_a_record_with_an_unknown_state_is_refused_clearly(bad: object) -> None:
    state = MetaState("c1")
    body = {"tid": "x", "pid": 1, "epoch": 0, "state": bad, "timeout_ms": 1, "parts": []}
    with pytest.raises(ValueError, match=f"unknown transaction state {bad!r}"):
        state.apply("txn", body)  # the metadata log's replay reports it as a CorruptionError
    with pytest.raises(ValueError, match=f"unknown transaction state {bad!r}"):
        Txn.from_body(body)
    assert state.txns == {}


# ---- SASL --------------------------------------------------------------------------------------

PASSWORD = "alice-secret"


class _Credentials:
    """The credential lookup of SaslAuthenticator: alice has SCRAM-SHA-256 only."""

    def __init__(self) -> None:
        cred = make_credential("SCRAM-SHA-256", PASSWORD, ITERATIONS_MIN)
        self.doc = {
            "salt": base64.b64encode(cred.salt).decode(),
            "iterations": cred.iterations,
            "stored_key": base64.b64encode(cred.stored_key).decode(),
            "server_key": base64.b64encode(cred.server_key).decode(),
        }

    def credential(self, user: str, mechanism: str) -> dict[str, Any] | None:
        return self.doc if user == "alice" and mechanism == "SCRAM-SHA-256" else None

    def shapes(self) -> TypicalShapes:
        return typical_shapes({"alice": {"SCRAM-SHA-256": self.doc}})


class _Conn(HandlerConn):
    """A connection on a SASL listener, with its session (made in a running loop)."""

    def __init__(self) -> None:
        super().__init__(security=SecurityContext(Listener(SASL_PLAINTEXT, "127.0.0.1", 9092), ("127.0.0.1", 9092)),
                         off_loop=_off_loop)
        self.sasl: SaslSession = self.start_sasl()


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[Any]:
    """What the SASL handlers read of the context: the authenticator (here over fake credentials)."""
    config = BrokerConfig(
        sasl_enabled_mechanisms="PLAIN,SCRAM-SHA-256", connection_failed_authentication_delay_ms=0, data_dir=str(tmp_path)
    )
    yield SimpleNamespace(sasl=SaslAuthenticator(config, _Credentials(), SaslStats()))


def _handshake(ctx: Any, conn: _Conn, mechanism: str) -> Awaitable[dict[str, Any]]:
    return sasl_handshake(ctx, conn, SimpleNamespace(api_version=1, body=SimpleNamespace(mechanism=mechanism)))  # type: ignore[arg-type,return-value]


def _authenticate(ctx: Any, conn: _Conn, token: bytes) -> Awaitable[dict[str, Any]]:
    return sasl_authenticate(ctx, conn, SimpleNamespace(api_version=2, body=SimpleNamespace(auth_bytes=token)))  # type: ignore[arg-type,return-value]


def test_sasl_sessions_make_every_transition_of_the_table_and_no_other(ctx: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[SaslState, SaslState]] = []
    move = SaslSession.transition_to

    def spy(session: SaslSession, target: SaslState) -> None:
        before = session.state
        move(session, target)
        made.append((before, target))

    monkeypatch.setattr(SaslSession, "transition_to", spy)

    async def session(mechanism: str, *tokens: bytes | Callable[[bytes], bytes]) -> tuple[_Conn, list[int]]:
        conn = _Conn()
        assert (await _handshake(ctx, conn, mechanism))["error_code"] == ErrorCode.NONE
        codes: list[int] = []
        answer = b""
        for token in tokens:
            out = await _authenticate(ctx, conn, token(answer) if callable(token) else token)
            codes.append(out["error_code"])
            answer = out["auth_bytes"]
        conn.sasl.close()
        return conn, codes

    async def run() -> None:
        conn, codes = await session("PLAIN", b"\0alice\0" + PASSWORD.encode())  # handshake -> authenticate -> done
        assert codes == [ErrorCode.NONE] and conn.sasl.state is SaslState.DONE
        assert conn.security.principal == "User:alice"
        conn, codes = await session("PLAIN", b"\0alice\0wrong")  # authenticate -> failed
        assert codes == [ErrorCode.SASL_AUTHENTICATION_FAILED] and conn.sasl.state is SaslState.FAILED
        good = ScramClient("SCRAM-SHA-256", "alice", PASSWORD)
        conn, codes = await session("SCRAM-SHA-256", good.first(), good.final)  # -> scram_final -> done
        assert codes == [ErrorCode.NONE, ErrorCode.NONE] and conn.sasl.state is SaslState.DONE
        bad = ScramClient("SCRAM-SHA-256", "alice", "wrong")
        conn, codes = await session("SCRAM-SHA-256", bad.first(), bad.final)  # scram_final -> failed
        assert codes == [ErrorCode.NONE, ErrorCode.SASL_AUTHENTICATION_FAILED] and conn.sasl.state is SaslState.FAILED
        conn, codes = await session("PLAIN", b"\0alice\0" + PASSWORD.encode())
        assert (await _handshake(ctx, conn, "PLAIN"))["error_code"] == ErrorCode.NONE  # done -> authenticate (KIP-368)
        assert conn.sasl.state is SaslState.AUTHENTICATE
        assert (await _authenticate(ctx, conn, b"\0alice\0" + PASSWORD.encode()))["error_code"] == ErrorCode.NONE
        assert conn.sasl.state is SaslState.DONE
        conn.sasl.close()

    asyncio.run(run())
    assert set(made) == edges(VALID_PREVIOUS_SASL_STATES)


def test_a_sasl_move_outside_the_table_raises_and_changes_nothing(ctx: Any) -> None:
    async def run() -> None:
        illegal = [(a, b) for b in SaslState for a in SaslState if a not in VALID_PREVIOUS_SASL_STATES[b]]
        assert len(illegal) == len(SaslState) ** 2 - len(edges(VALID_PREVIOUS_SASL_STATES))
        conn = _Conn()
        conn.sasl.close()
        for current, target in illegal:
            conn.sasl.state = current
            with pytest.raises(IllegalSaslTransition, match=f"{current.value} -> {target.value} "):
                conn.sasl.transition_to(target)
            assert conn.sasl.state is current

    asyncio.run(run())


@pytest.mark.parametrize(
    ("password", "first_code", "state", "close_after"),
    [
        (PASSWORD, ErrorCode.NONE, SaslState.DONE, 0.0),
        ("wrong", ErrorCode.SASL_AUTHENTICATION_FAILED, SaslState.FAILED, 0.25),  # the failure delay stays
    ],
    ids=["after-success", "after-failure"],
)
def test_pipelined_sasl_authenticates_take_turns(
    ctx: Any, password: str, first_code: ErrorCode, state: SaslState, close_after: float
) -> None:
    """The second of two SaslAuthenticate sent without waiting sees the state the first left,
    as Kafka answers them: authentication finished, so ILLEGAL_SASL_STATE and a close."""
    ctx.sasl.failure_delay_s = 0.25

    async def run() -> list[dict[str, Any]]:
        conn = _Conn()
        assert (await _handshake(ctx, conn, "PLAIN"))["error_code"] == ErrorCode.NONE
        first = b"\0alice\0" + password.encode()
        good = b"\0alice\0" + PASSWORD.encode()
        answers = await asyncio.gather(_authenticate(ctx, conn, first), _authenticate(ctx, conn, good))
        assert conn.sasl.state is state and conn.close_after_write == close_after
        conn.sasl.close()
        return answers

    first, second = asyncio.run(run())
    assert first["error_code"] == first_code
    assert second["error_code"] == ErrorCode.ILLEGAL_SASL_STATE
    assert second["error_message"] == "Unexpected SaslAuthenticate after authentication finished"
