"""One table of Kafka error codes (`loglake.kafka_errors`): nothing else in src/ spells a number."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import ModuleType

import confluent_kafka
import kafka.errors as kp_errors
import pytest

import loglake
import loglake.errors
from loglake.broker.groups import errors as group_errors
from loglake.broker.handlers import admin_common
from loglake.broker.handlers import errors as handler_errors
from loglake.broker.protocol import errors as protocol_errors
from loglake.kafka_errors import ErrorCode

SRC = Path(loglake.__file__).parent
TABLE = SRC / "kafka_errors.py"
#: Names that hold a Kafka error code besides the table's own: the typed errors' attribute.
CODE_ATTRIBUTES = {"kafka_code"}
#: kafka-python names some codes differently from Kafka's Errors table.
KP_NAMES = {
    "UNKNOWN_SERVER_ERROR": "UNKNOWN",
    "NONE": "NO_ERROR",
    "NOT_LEADER_OR_FOLLOWER": "NOT_LEADER_FOR_PARTITION",
    "MESSAGE_TOO_LARGE": "MESSAGE_SIZE_TOO_LARGE",
    "INVALID_TOPIC_EXCEPTION": "INVALID_TOPIC",
    "INVALID_REPLICA_ASSIGNMENT": "INVALID_REPLICATION_ASSIGNMENT",
}
#: Kafka's CorruptRecordException is a RetriableException; kafka-python does not retry it.
KP_RETRIABLE_DIFFERS = {"CORRUPT_MESSAGE"}
#: Codes kafka-python 3.0.12 does not list yet (Kafka 4.0's INVALID_REGULAR_EXPRESSION, KIP-848).
NEWER_THAN_KAFKA_PYTHON = {128, 133}


def _int_literal(node: ast.expr) -> int | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_literal(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _pairs(target: ast.expr, value: ast.expr) -> list[tuple[ast.expr, ast.expr]]:
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
        return [p for t, v in zip(target.elts, value.elts, strict=True) for p in _pairs(t, v)]
    return [(target, value)]


def code_literals(source: str, filename: str) -> list[str]:
    """`file:line name = number` for every int literal assigned to an error-code name."""
    watched = set(ErrorCode.__members__) | CODE_ATTRIBUTES
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Assign):
            pairs = [p for t in node.targets for p in _pairs(t, node.value)]
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            pairs = [(node.target, node.value)]
        else:
            continue
        for target, value in pairs:
            name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)
            number = _int_literal(value)
            if name in watched and number is not None:
                found.append(f"{filename}:{target.lineno} {name} = {number}")
    return found


def test_no_module_outside_the_table_spells_a_code() -> None:
    found: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        if path != TABLE:
            found += code_literals(path.read_text(), str(path.relative_to(SRC)))
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        "NOT_COORDINATOR = 16",
        "UNKNOWN_SERVER_ERROR: int = -1",
        "class E(Exception):\n    kafka_code = 3",
        "NONE, INVALID_REQUEST = 0, 42",
        "self.kafka_code = 56",
    ],
)
def test_the_scan_sees_a_spelled_code(source: str) -> None:
    assert len(code_literals(source, "m.py")) >= 1


def test_the_scan_ignores_other_numbers() -> None:
    assert code_literals("NONE = ErrorCode.NONE\nCODEC_NONE = 0\nkafka_code = ErrorCode.INVALID_CONFIG", "m.py") == []


def test_table_agrees_with_kafka_python() -> None:
    """Numbers, names and retriable flags checked against an independent copy of Kafka's table."""
    theirs = {
        cls.errno: cls
        for _, cls in inspect.getmembers(kp_errors, inspect.isclass)
        if issubclass(cls, kp_errors.BrokerResponseError) and isinstance(getattr(cls, "errno", None), int)
    }
    for code in ErrorCode:
        if code.value in NEWER_THAN_KAFKA_PYTHON:  # checked against librdkafka's table instead
            assert getattr(confluent_kafka.KafkaError, code.name) == code.value, code
            continue
        kp = theirs[code.value]
        assert kp.message == KP_NAMES.get(code.name, code.name), code
        if code.name not in KP_RETRIABLE_DIFFERS:
            assert kp.retriable == code.retriable, code
        assert code.message.endswith("."), code


def test_codes_are_unique_ints() -> None:
    assert len({int(c) for c in ErrorCode}) == len(ErrorCode)
    assert ErrorCode.UNKNOWN_TOPIC_OR_PARTITION == 3 and str(ErrorCode.NOT_COORDINATOR) == "16"


@pytest.mark.parametrize("module", [handler_errors, group_errors, admin_common])
def test_reexported_names_are_the_table(module: ModuleType) -> None:
    names = [n for n in vars(module) if n in ErrorCode.__members__]
    assert names
    for name in names:
        assert getattr(module, name) is ErrorCode[name]


@pytest.mark.parametrize("module", [loglake.errors, protocol_errors])
def test_typed_errors_carry_table_codes(module: ModuleType) -> None:
    classes = [c for _, c in inspect.getmembers(module, inspect.isclass) if hasattr(c, "kafka_code")]
    assert classes
    for cls in classes:
        assert isinstance(cls.kafka_code, ErrorCode), cls
