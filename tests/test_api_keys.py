"""One table of Kafka API keys (`loglake.broker.protocol.api_keys.ApiKey`): nothing else in src/
spells an API key as a number, and the table is Kafka's (its JSON message schemas)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kafka.protocol.schemas.load_json import load_json

import loglake
from loglake.broker.handlers import ADVERTISED, HANDLERS
from loglake.broker.protocol import SUPPORTED, ApiKey, request_class, response_class, schemas
from loglake.broker.protocol.messages import MESSAGES
from loglake.broker.security.acl_rules import API_ACLS

SRC = Path(loglake.__file__).parent
TABLE = SRC / "broker" / "protocol" / "api_keys.py"
#: Names that hold an API key: a request's field and the parameters and fields named after it.
KEY_NAMES = {"api_key"}
#: Tables keyed by API key by their name: handler tables, ACL rules, exemption sets.
TABLE_NAME = re.compile(r"(^|_)APIS?(_|$)|HANDLERS")
#: A constant named after an API, with or without a suffix saying it is its key.
CONSTANT_SUFFIXES = ("", "_KEY", "_API_KEY", "_API")


def _int_literals(node: ast.expr | None) -> list[int]:
    """The int literals `node` is or holds (a tuple, list or set display, or ``frozenset({...})``)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [n for elt in node.elts for n in _int_literals(elt)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set"):
        return [n for arg in node.args for n in _int_literals(arg)]
    return []


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_key(node: ast.AST) -> bool:
    return _name(node) in KEY_NAMES


@dataclass
class Signatures:
    """Where src/'s functions, methods and record classes take an API key, by callee name."""

    #: callee -> argument positions of the key (a method's as called on an object, without self).
    positions: dict[str, set[int]] = field(default_factory=dict)
    #: Names that are looked up with an API key somewhere (``STRICT_FROM.get(req.api_key)``).
    tables: set[str] = field(default_factory=set)

    def add(self, name: str, index: int) -> None:
        self.positions.setdefault(name, set()).add(index)

    def learn(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                params = [a.arg for a in node.args.posonlyargs + node.args.args]
                if params[:1] in (["self"], ["cls"]):
                    params = params[1:]
                for i, p in enumerate(params):
                    if p in KEY_NAMES:
                        self.add(node.name, i)
            elif isinstance(node, ast.ClassDef):
                fields = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
                init = next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
                if init is not None:
                    fields = [a.arg for a in init.args.args[1:]]
                for i, f in enumerate(fields):
                    if f in KEY_NAMES:
                        self.add(node.name, i)
            elif isinstance(node, ast.Compare):
                if isinstance(node.ops[0], ast.In | ast.NotIn) and _is_key(node.left):
                    table = _name(node.comparators[0])
                    if table is not None:
                        self.tables.add(table)
            elif isinstance(node, ast.Subscript) and _is_key(node.slice):
                table = _name(node.value)
                if table is not None:
                    self.tables.add(table)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and node.args
                and _is_key(node.args[0])
            ):
                table = _name(node.func.value)
                if table is not None:
                    self.tables.add(table)

    def is_table(self, name: str | None) -> bool:
        return name is not None and (name in self.tables or bool(TABLE_NAME.search(name)))


def _learned() -> Signatures:
    sig = Signatures()
    for path in sorted(SRC.rglob("*.py")):
        sig.learn(ast.parse(path.read_text(), str(path)))
    return sig


SIGNATURES = _learned()


def _constant_name(name: str) -> bool:
    return any(name.endswith(s) and name[: len(name) - len(s)] in ApiKey.__members__ for s in CONSTANT_SUFFIXES)


def key_literals(source: str, filename: str, sig: Signatures = SIGNATURES) -> list[str]:
    """`file:line what` for every API key spelled as a number in `source`."""
    found: list[str] = []

    def hit(node: ast.AST, what: str, numbers: list[int]) -> None:
        found.extend(f"{filename}:{getattr(node, 'lineno', 0)} {what} {n}" for n in numbers)

    tree = ast.parse(source, filename)
    # Class bodies are other enums' members (AclOperation.DESCRIBE_CONFIGS = 10), not constants.
    members = {id(s) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for s in c.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_key(s) for s in sides):
                hit(node, "compared with api_key:", [n for s in sides for n in _int_literals(s)])
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                pairs = (
                    list(zip(target.elts, node.value.elts, strict=False))
                    if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                    else [(target, node.value)]
                )
                for t, v in pairs:
                    name = _name(t)
                    if name is not None and id(node) not in members and _constant_name(name) and isinstance(v, ast.Constant):
                        hit(t, f"{name} =", _int_literals(v))
                    if sig.is_table(name):
                        keys = v.keys if isinstance(v, ast.Dict) else [v]
                        hit(t, f"{name} keyed by", [n for k in keys if k is not None for n in _int_literals(k)])
                    if isinstance(t, ast.Subscript) and sig.is_table(_name(t.value)):
                        hit(t, f"{_name(t.value)}[...] =", _int_literals(t.slice))
        elif isinstance(node, ast.Subscript) and sig.is_table(_name(node.value)):
            hit(node, f"{_name(node.value)}[...]", _int_literals(node.slice))
        elif isinstance(node, ast.Call):
            callee = _name(node.func)
            if callee == "get" and isinstance(node.func, ast.Attribute) and sig.is_table(_name(node.func.value)):
                hit(node, f"{_name(node.func.value)}.get", _int_literals(node.args[0]) if node.args else [])
            for i in sig.positions.get(callee or "", ()):
                if 0 <= i < len(node.args):
                    hit(node, f"{callee}() api_key", _int_literals(node.args[i]))
            for kw in node.keywords:
                if kw.arg in KEY_NAMES:
                    hit(node, f"{callee}() {kw.arg}=", _int_literals(kw.value))
        elif isinstance(node, ast.For) and isinstance(node.target, ast.Tuple):
            # for module, key in ((produce, 0), ...): TABLE[key] = ... pairs handlers with numbers
            names = [_name(t) for t in node.target.elts]
            used = {
                _name(n.slice)
                for n in ast.walk(ast.Module(body=node.body, type_ignores=[]))
                if isinstance(n, ast.Subscript) and sig.is_table(_name(n.value))
            }
            rows = node.iter.elts if isinstance(node.iter, ast.Tuple | ast.List) else []
            for row in rows:
                if isinstance(row, ast.Tuple):
                    for name, elt in zip(names, row.elts, strict=False):
                        if name in used:
                            hit(row, f"{name} of a loop over", _int_literals(elt))
    return found


def test_no_module_outside_the_table_spells_an_api_key() -> None:
    found: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        if path != TABLE:
            found += key_literals(path.read_text(), str(path.relative_to(SRC)))
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        "if req.api_key == 18:\n    pass",
        "ok = exc.api_key in (17, 36)",
        "HANDLERS = {0: handle}",
        "HANDLERS: dict[int, Any] = {ApiKey.PRODUCE: a, 1: b}",
        "PRE_AUTH_APIS = frozenset({18, 17, 36})",
        "SASL_HANDSHAKE = 17",
        "PRODUCE_KEY: int = 0",
        "SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36",
        "def f() -> None:\n    API_VERSIONS = 18",
        "for module, key in ((produce, 0), (fetch, 1)):\n    HANDLERS[key] = module.handle",
        "HANDLERS[22] = init_producer_id.handle",
        "make_response(3, 12, topics=[])",
        "cls = request_class(api_key=18)",
        "conn.request(17, 1, mechanism='PLAIN')",
        "call(bootstrap, 48, 1, components=[])",
        "raise UnknownApiError(42, correlation_id)",
        "STRICT_FROM = {19: 6, 20: 5}\nstrict = STRICT_FROM.get(req.api_key, 1)",
        "API_ACLS = {0: 'WRITE topic'}",
    ],
)
def test_the_scan_sees_a_spelled_key(source: str) -> None:
    assert len(key_literals(source, "m.py")) >= 1, source


def test_the_scan_ignores_other_numbers() -> None:
    source = (
        "GROUP_KEY, TRANSACTION_KEY = 0, 1\n"
        "MARKER_KEY = struct.Struct('>hh')\n"
        "HANDLERS = {ApiKey.PRODUCE: produce.handle}\n"
        "if req.api_version >= 3 and req.api_key == ApiKey.FETCH:\n    pass\n"
        "make_response(ApiKey.METADATA, 12, topics=[])\n"
        "conn.request(ApiKey.SASL_HANDSHAKE, 1)\n"
        "STRICT_FROM = {ApiKey.CREATE_TOPICS: 6}\n"
        "for name, value in (('a', 1),):\n    out[name] = value\n"
        "class AclOperation(IntEnum):\n    DESCRIBE_CONFIGS = 10\n"
    )
    assert key_literals(source, "m.py") == []


def test_the_scan_learned_src() -> None:
    """The signatures the scan relies on were found in src/ (a rename would blind it)."""
    for callee in ("make_response", "request_class", "response_class", "request", "call", "UnknownApiError"):
        assert SIGNATURES.positions.get(callee), callee
    assert {"HANDLERS", "STRICT_FROM", "REQUEST_QUOTA_EXEMPT_APIS", "PRE_AUTH_APIS"} <= SIGNATURES.tables


def _schema(name: str) -> dict[str, object]:
    """Kafka's JSON schema of this message: kafka-python's copy, or loglake's for the KIP-848 ones."""
    try:
        return load_json(name)
    except FileNotFoundError:
        return load_json(name, package=schemas)


@pytest.mark.parametrize("key", list(ApiKey), ids=lambda k: k.name)
def test_table_agrees_with_kafka_schemas(key: ApiKey) -> None:
    """Each member's number and name are those of Kafka's request and response schemas."""
    for kind in ("Request", "Response"):
        data = _schema(key.kafka_name + kind)
        assert data["apiKey"] == key.value, (key, kind)
        assert data["name"] == key.kafka_name + kind
        assert data["type"] == kind.lower()
    assert key.value == request_class(key).API_KEY == response_class(key).API_KEY


def test_kafka_name_is_kafka_spelling() -> None:
    assert ApiKey.API_VERSIONS.kafka_name == "ApiVersions"
    assert ApiKey.OFFSET_FOR_LEADER_EPOCH.kafka_name == "OffsetForLeaderEpoch"
    assert ApiKey.CONSUMER_GROUP_HEARTBEAT == 68 and str(ApiKey.PRODUCE) == "0"


def test_tables_are_keyed_by_the_enum() -> None:
    """What is served, advertised and ACL-ruled is named in the one table."""
    assert set(SUPPORTED) == set(ApiKey) == set(MESSAGES)
    for key, r in SUPPORTED.items():
        assert r.api_key is key and r.name == key.kafka_name
    for table in (HANDLERS, API_ACLS):
        assert all(type(k) is ApiKey for k in table), table
    assert {r.api_key for r in ADVERTISED} <= set(HANDLERS)


def test_members_look_up_plain_numbers() -> None:
    """Tables keyed by members answer the plain int a decoded request carries."""
    assert HANDLERS.get(int(ApiKey.PRODUCE)) is HANDLERS[ApiKey.PRODUCE]
    assert SUPPORTED[18].api_key is ApiKey.API_VERSIONS
