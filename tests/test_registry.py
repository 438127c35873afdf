"""The schema registry (loglake.registry) over a real engine's metadata store: registration,
ids, versions, deletes, config and mode, references, Confluent's error codes, compatibility
matrices for Avro, JSON Schema and Protobuf at every level, and the state surviving a crash and
a checkpoint. The REST API through a broker and confluent-kafka's clients: test_registry_broker.py.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import loglake
from loglake.engine import Engine
from loglake.errors import MetaRecordRejectedError
from loglake.fs.faulty import FaultyFileSystem
from loglake.meta.records import SchemaVersion
from loglake.registry.api import CONTENT_TYPE, RawText, RegistryApi
from loglake.registry.compat import Compatibility, check
from loglake.registry.errors import RegistryError, RegistryErrorCode
from loglake.registry.formats import InvalidSchemaError, SchemaType, parse_schema
from loglake.registry.service import RegisterRequest, SchemaRegistry

from enginekit import DATA_DIR, abandon, small_config


def _open(fs: FaultyFileSystem) -> Engine:
    engine = Engine(DATA_DIR, small_config(), fs=fs, start_background=False)
    engine.open()
    return engine


@pytest.fixture
def fs() -> FaultyFileSystem:
    return FaultyFileSystem()


@pytest.fixture
def engine(fs: FaultyFileSystem) -> Iterator[Engine]:
    engine = _open(fs)
    try:
        yield engine
    finally:
        engine.close()


def registry_of(engine: Engine) -> SchemaRegistry:
    return SchemaRegistry(engine.meta, engine._check_open)


def avro_record(*fields: dict[str, object], name: str = "User") -> str:
    return json.dumps({"type": "record", "name": name, "fields": list(fields)})


NAME = {"name": "name", "type": "string"}
AGE = {"name": "age", "type": "int"}
AGE_DEFAULT = {"name": "age", "type": "int", "default": 0}


def avro(text: str) -> RegisterRequest:
    return RegisterRequest(SchemaType.AVRO, text)


def code_of(exc: pytest.ExceptionInfo[RegistryError]) -> int:
    return int(exc.value.code)


# ---- the service -------------------------------------------------------------------------------


def test_register_gives_versions_and_one_global_id_per_schema(engine: Engine) -> None:
    r = registry_of(engine)
    assert r.register("users-value", avro(avro_record(NAME))) == {"id": 1}
    # the same schema again, whitespace aside: the version it is already
    assert r.register("users-value", avro(json.dumps(json.loads(avro_record(NAME)), indent=4))) == {"id": 1}
    assert r.register("users-value", avro(avro_record(NAME, AGE_DEFAULT))) == {"id": 2}
    # the same text under another subject keeps its id, and starts that subject at version 1
    assert r.register("other-value", avro(avro_record(NAME))) == {"id": 1}
    assert r.versions("users-value") == [1, 2] and r.subjects() == ["other-value", "users-value"]
    latest = r.version("users-value", "latest")
    assert (latest["version"], latest["id"], "schemaType" in latest) == (2, 2, False)
    assert json.loads(latest["schema"]) == json.loads(avro_record(NAME, AGE_DEFAULT))
    assert r.id_versions(1) == [{"subject": "other-value", "version": 1}, {"subject": "users-value", "version": 1}]
    assert r.lookup("users-value", avro(avro_record(NAME)))["version"] == 1


def test_confluent_error_codes(engine: Engine) -> None:
    r = registry_of(engine)
    r.register("s", avro(avro_record(NAME)))
    cases = [
        (lambda: r.versions("nope"), RegistryErrorCode.SUBJECT_NOT_FOUND),
        (lambda: r.version("s", "7"), RegistryErrorCode.VERSION_NOT_FOUND),
        (lambda: r.version("s", "0"), RegistryErrorCode.INVALID_VERSION),
        (lambda: r.version("s", "x"), RegistryErrorCode.INVALID_VERSION),
        (lambda: r.schema_by_id(99), RegistryErrorCode.SCHEMA_NOT_FOUND),
        (lambda: r.lookup("s", avro(avro_record(AGE))), RegistryErrorCode.SCHEMA_NOT_FOUND),
        (lambda: r.register("s", avro('{"type": "record"}')), RegistryErrorCode.INVALID_SCHEMA),
        (lambda: r.register("s", avro("not json")), RegistryErrorCode.INVALID_SCHEMA),
        (lambda: r.register("s", avro(avro_record(NAME, AGE))), RegistryErrorCode.INCOMPATIBLE_SCHEMA),
        (lambda: r.get_config("s", False), RegistryErrorCode.SUBJECT_LEVEL_COMPATIBILITY_NOT_CONFIGURED),
        (lambda: r.get_mode("s", False), RegistryErrorCode.SUBJECT_LEVEL_MODE_NOT_CONFIGURED),
        (lambda: r.set_config("s", {"compatibility": "SIDEWAYS"}), RegistryErrorCode.INVALID_COMPATIBILITY_LEVEL),
        (lambda: r.set_mode("s", {"mode": "SIDEWAYS"}), RegistryErrorCode.INVALID_MODE),
        (lambda: r.delete_subject("s", True), RegistryErrorCode.SUBJECT_NOT_SOFT_DELETED),
        (lambda: r.delete_version("s", "1", True), RegistryErrorCode.SCHEMAVERSION_NOT_SOFT_DELETED),
    ]
    for call, code in cases:
        with pytest.raises(RegistryError) as exc:
            call()
        assert exc.value.code is code, (code, exc.value.message)
    assert RegistryErrorCode.INCOMPATIBLE_SCHEMA.http_status == 409
    assert RegistryErrorCode.SUBJECT_NOT_FOUND.http_status == 404 and RegistryErrorCode.INVALID_SCHEMA.http_status == 422


def test_soft_then_hard_delete(engine: Engine) -> None:
    r = registry_of(engine)
    r.register("s", avro(avro_record(NAME)))
    r.register("s", avro(avro_record(NAME, AGE_DEFAULT)))
    assert r.delete_version("s", "1", permanent=False) == 1
    with pytest.raises(RegistryError) as exc:
        r.delete_version("s", "1", permanent=False)
    assert exc.value.code is RegistryErrorCode.SCHEMAVERSION_SOFT_DELETED
    assert r.versions("s") == [2] and r.versions("s", deleted=True) == [1, 2]
    assert r.schema_by_id(1)["schema"]  # a soft-deleted version's schema is still found by id
    assert r.delete_subject("s", permanent=False) == [2]
    with pytest.raises(RegistryError) as exc:
        r.versions("s")
    assert exc.value.code is RegistryErrorCode.SUBJECT_NOT_FOUND
    assert r.subjects() == [] and r.subjects(deleted=True) == ["s"]
    assert r.delete_subject("s", permanent=True) == [1, 2]
    assert r.subjects(deleted=True) == []
    with pytest.raises(RegistryError) as exc:
        r.schema_by_id(1)
    assert exc.value.code is RegistryErrorCode.SCHEMA_NOT_FOUND
    # ids are never handed out again
    assert r.register("s", avro(avro_record(AGE))) == {"id": 3}
    assert r.versions("s") == [1]


def test_config_mode_and_the_level_they_choose(engine: Engine) -> None:
    r = registry_of(engine)
    assert r.get_config("", False) == {"compatibilityLevel": "BACKWARD"}
    r.register("s", avro(avro_record(NAME)))
    assert r.set_config("", {"compatibility": "none"}) == {"compatibility": "NONE"}
    assert r.register("s", avro(avro_record(NAME, AGE))) == {"id": 2}  # NONE lets anything in
    assert r.set_config("s", {"compatibility": "FORWARD"}) == {"compatibility": "FORWARD"}
    assert r.get_config("s", False) == {"compatibilityLevel": "FORWARD"}
    with pytest.raises(RegistryError) as exc:  # FORWARD: the old schema must read the new one's data
        r.register("s", avro(avro_record(AGE)))
    assert exc.value.code is RegistryErrorCode.INCOMPATIBLE_SCHEMA
    assert r.delete_config("s") == {"compatibilityLevel": "FORWARD"}
    assert r.get_config("s", True) == {"compatibilityLevel": "NONE"}
    assert r.set_mode("s", {"mode": "READONLY"}) == {"mode": "READONLY"}
    with pytest.raises(RegistryError) as exc:
        r.register("s", avro(avro_record(AGE)))
    assert exc.value.code is RegistryErrorCode.OPERATION_NOT_PERMITTED
    assert r.register("s", avro(avro_record(NAME))) == {"id": 1}  # a lookup is no write
    assert r.delete_mode("s") == {"mode": "READONLY"} and r.get_mode("s", True) == {"mode": "READWRITE"}


def imported(text: str, schema_id: int | None = None, version: int | None = None) -> RegisterRequest:
    return RegisterRequest(SchemaType.AVRO, text, (), schema_id, version)


def test_import_mode_keeps_given_ids_and_versions(engine: Engine) -> None:
    """Confluent's IMPORT mode: a registration naming its id and version keeps them (no
    compatibility check: a history is replayed as it was), only in IMPORT mode; a plain one is
    refused there; IMPORT needs an empty registry or force; new ids go on above the imported."""
    r = registry_of(engine)
    r.register("live", avro(avro_record(NAME)))
    with pytest.raises(RegistryError) as exc:  # given an id outside IMPORT mode
        r.register("s", imported(avro_record(AGE), 10, 1))
    assert exc.value.code is RegistryErrorCode.OPERATION_NOT_PERMITTED and "not in import mode" in exc.value.message
    with pytest.raises(RegistryError) as exc:  # a registry holding subjects
        r.set_mode("", {"mode": "IMPORT"})
    assert exc.value.code is RegistryErrorCode.OPERATION_NOT_PERMITTED
    assert r.set_mode("s", {"mode": "IMPORT"}) == {"mode": "IMPORT"}  # an empty subject may
    assert r.set_mode("", {"mode": "IMPORT"}, force=True) == {"mode": "IMPORT"}
    assert r.register("s", imported(avro_record(NAME, AGE), 10, 3)) == {"id": 10}
    assert r.register("s", imported(avro_record(AGE), 12, 7)) == {"id": 12}  # incompatible: not checked
    assert r.register("s", imported(avro_record(AGE), 12, 7)) == {"id": 12}  # a replay: the same answer
    assert r.register("t", imported(avro_record(NAME, AGE), 10, 1)) == {"id": 10}  # the id's own schema
    assert [(v["version"], v["id"]) for v in (r.version("s", "3"), r.version("s", "7"), r.version("t", "1"))] == [
        (3, 10), (7, 12), (1, 10)
    ]
    r.delete_version("t", "1", permanent=False)
    assert r.register("t", imported(avro_record(NAME, AGE), 10, 1)) == {"id": 10}  # replayed over its soft delete
    cases = [
        (imported(avro_record(AGE_DEFAULT), 12, 8), RegistryErrorCode.ID_DOES_NOT_MATCH),  # id of another schema
        (imported(avro_record(NAME, AGE), 13, 8), RegistryErrorCode.ID_DOES_NOT_MATCH),  # the schema is id 10
        (imported(avro_record(AGE_DEFAULT), 5, 8), RegistryErrorCode.ID_DOES_NOT_MATCH),  # below the next free id
        (imported(avro_record(AGE_DEFAULT), 20, 6), RegistryErrorCode.INVALID_VERSION),  # not above version 7
        (avro(avro_record(AGE_DEFAULT)), RegistryErrorCode.OPERATION_NOT_PERMITTED),  # no id in IMPORT mode
    ]
    for req, code in cases:
        with pytest.raises(RegistryError) as exc:
            r.register("s", req)
        assert exc.value.code is code, (req, exc.value.message)
    with pytest.raises(RegistryError) as exc:
        RegisterRequest.from_json({"schema": avro_record(NAME), "id": 0})
    assert exc.value.code is RegistryErrorCode.ID_DOES_NOT_MATCH
    req = RegisterRequest.from_json({"schema": avro_record(NAME), "id": 4, "version": 2})
    assert (req.schema_id, req.version) == (4, 2)
    assert r.delete_mode("s") and r.set_mode("", {"mode": "READWRITE"})
    assert r.register("u", avro(avro_record(AGE_DEFAULT, name="Other"))) == {"id": 13}  # above every imported id


def test_normalize_makes_one_schema_of_two_spellings(engine: Engine) -> None:
    r = registry_of(engine)
    a = json.dumps({"type": "record", "name": "User", "namespace": "ex", "fields": [NAME]})
    b = json.dumps({"fields": [{"type": "string", "name": "name"}], "namespace": "ex", "name": "User", "type": "record"})
    assert r.register("s", avro(a), normalize=True) == r.register("s", avro(b), normalize=True) == {"id": 1}
    assert r.versions("s") == [1]
    assert r.register("s", avro(b)) == {"id": 2}  # as sent, the other key order is another text
    assert r.lookup("s", avro(a), normalize=True)["version"] == 1
    j1, j2 = '{"type": "object", "properties": {"a": {"type": "string"}}}', '{"properties": {"a": {"type": "string"}}, "type": "object"}'
    assert r.register("j", RegisterRequest(SchemaType.JSON, j1), normalize=True) == r.register(
        "j", RegisterRequest(SchemaType.JSON, j2), normalize=True
    )
    p1, p2 = 'syntax = "proto3";\nmessage M { int32 x = 1; }', 'syntax="proto3";  message M {\n  int32 x=1;\n}'
    assert r.register("p", RegisterRequest(SchemaType.PROTOBUF, p1), normalize=True) == r.register(
        "p", RegisterRequest(SchemaType.PROTOBUF, p2), normalize=True
    )
    assert r.test_compatibility("p", "latest", RegisterRequest(SchemaType.PROTOBUF, p2), normalize=True) == []


def test_avro_references_resolve_through_the_registry(engine: Engine) -> None:
    r = registry_of(engine)
    address = json.dumps({"type": "record", "name": "Address", "namespace": "ex", "fields": [NAME]})
    r.register("address", avro(address))
    user = json.dumps({"type": "record", "name": "User", "namespace": "ex", "fields": [{"name": "home", "type": "ex.Address"}]})
    with pytest.raises(RegistryError) as exc:  # unresolved without its reference
        r.register("user", avro(user))
    assert exc.value.code is RegistryErrorCode.INVALID_SCHEMA
    with_ref = RegisterRequest(SchemaType.AVRO, user, (("ex.Address", "address", 1),))
    assert r.register("user", with_ref) == {"id": 2}
    got = r.version("user", "1")
    assert got["references"] == [{"name": "ex.Address", "subject": "address", "version": 1}]
    assert r.referenced_by("address", "1") == [2]
    with pytest.raises(RegistryError) as exc:  # a referenced version is not deleted
        r.delete_version("address", "1", permanent=False)
    assert exc.value.code is RegistryErrorCode.REFERENCE_EXISTS


def test_json_schema_references(engine: Engine) -> None:
    r = registry_of(engine)
    r.register("addr", RegisterRequest(SchemaType.JSON, '{"type": "object"}'))
    doc = '{"type": "object", "properties": {"a": {"$ref": "addr.json"}}}'
    assert r.register("p", RegisterRequest(SchemaType.JSON, doc, (("addr.json", "addr", 1),))) == {"id": 2}
    for refs in ((("addr.json", "addr", 9),), ()):  # a reference not registered; a $ref with no reference
        with pytest.raises(RegistryError) as exc:
            r.register("q", RegisterRequest(SchemaType.JSON, doc, refs))
        assert exc.value.code is RegistryErrorCode.INVALID_SCHEMA
    local = '{"$defs": {"a": {"type": "string"}}, "properties": {"x": {"$ref": "#/$defs/a"}}}'
    assert r.register("local", RegisterRequest(SchemaType.JSON, local)) == {"id": 3}


def test_protobuf_imports_are_references(engine: Engine) -> None:
    r = registry_of(engine)
    common = 'syntax = "proto3";\npackage ex;\nmessage Money {\n  int64 cents = 1;\n}\n'
    r.register("money", RegisterRequest(SchemaType.PROTOBUF, common))
    order = (
        'syntax = "proto3";\npackage ex;\nimport "ex/money.proto";\nimport "google/protobuf/timestamp.proto";\n'
        "message Order {\n  Money total = 1;\n  google.protobuf.Timestamp at = 2;\n}\n"
    )
    with pytest.raises(RegistryError) as exc:  # its import is no reference
        r.register("order", RegisterRequest(SchemaType.PROTOBUF, order))
    assert exc.value.code is RegistryErrorCode.INVALID_SCHEMA
    assert r.register("order", RegisterRequest(SchemaType.PROTOBUF, order, (("ex/money.proto", "money", 1),))) == {"id": 2}
    assert r.version("order", "1")["schemaType"] == "PROTOBUF"


def test_the_registry_survives_a_crash_and_a_checkpoint(fs: FaultyFileSystem) -> None:
    engine = _open(fs)
    r = registry_of(engine)
    r.register("s", avro(avro_record(NAME)))
    r.register("t", RegisterRequest(SchemaType.JSON, '{"type": "string"}'))
    r.set_config("s", {"compatibility": "FULL"})
    r.set_mode("", {"mode": "READWRITE"})
    r.delete_version("t", "1", permanent=False)
    abandon(engine)
    fs = fs.crash()
    engine = _open(fs)
    try:
        r = registry_of(engine)
        assert r.versions("s") == [1] and r.versions("t", deleted=True) == [1] and r.subjects() == ["s"]
        assert r.get_config("s", False) == {"compatibilityLevel": "FULL"}
        assert engine.meta.checkpoint() is not None
    finally:
        engine.close()
    engine = _open(fs)
    try:
        r = registry_of(engine)
        assert r.version("s", "1")["id"] == 1 and r.get_mode("", False) == {"mode": "READWRITE"}
        assert r.register("u", avro(avro_record(AGE))) == {"id": 3}  # the next id came back too
    finally:
        engine.close()


def test_a_racing_register_decided_from_a_stale_state_is_refused_and_decided_again(engine: Engine) -> None:
    """Cluster mode: two brokers decide the same version or id; the state takes the first."""
    r = registry_of(engine)
    r.register("s", avro(avro_record(NAME)))
    with pytest.raises(MetaRecordRejectedError):  # version 1 is taken
        engine.meta.append(SchemaVersion("s", 1, 2, "AVRO", '"int"', ())).result()
    with pytest.raises(MetaRecordRejectedError):  # id 1 is another schema's
        engine.meta.append(SchemaVersion("s", 2, 1, "AVRO", '"int"', ())).result()
    with pytest.raises(MetaRecordRejectedError):  # the same schema under a second id
        engine.meta.append(SchemaVersion("x", 1, 5, "AVRO", json.dumps(json.loads(avro_record(NAME)), separators=(",", ":")), ())).result()
    # a writer whose view is one registration behind: its first try is refused, the second applies
    engine.meta.append(SchemaVersion("s", 2, 2, "AVRO", '"int"', ())).result()
    r.set_config("s", {"compatibility": "NONE"})
    assert r.register("s", avro('"long"')) == {"id": 3} and r.versions("s") == [1, 2, 3]


# ---- the API's routes ----------------------------------------------------------------------------


def test_the_api_answers_confluent_documents(engine: Engine) -> None:
    api = RegistryApi(registry_of(engine))
    body = json.dumps({"schema": avro_record(NAME)}).encode()
    assert api.handle("POST", "/subjects/a%2Fb/versions", {}, body) == (200, {"id": 1})
    assert api.handle("GET", "/subjects", {}, b"") == (200, ["a/b"])
    status, doc = api.handle("GET", "/subjects/a%2Fb/versions/latest/schema", {}, b"")
    assert status == 200 and isinstance(doc, RawText) and json.loads(doc) == json.loads(avro_record(NAME))
    assert api.handle("GET", "/schemas/ids/1/subjects", {}, b"") == (200, ["a/b"])
    assert api.handle("GET", "/schemas/types", {}, b"") == (200, ["AVRO", "JSON", "PROTOBUF"])
    assert api.handle("GET", "/subjects/x/versions", {}, b"") == (404, {"error_code": 40401, "message": "Subject 'x' not found."})
    assert api.handle("GET", "/nothing", {}, b"")[0] == 404
    assert api.handle("POST", "/subjects", {}, b"")[0] == 405
    assert api.handle("POST", "/subjects/a%2Fb/versions", {}, b"{")[1]["error_code"] == 400
    incompatible = json.dumps({"schema": avro_record(NAME, AGE)}).encode()
    status, doc = api.handle("POST", "/compatibility/subjects/a%2Fb/versions/latest", {"verbose": "true"}, incompatible)
    assert status == 200 and doc["is_compatible"] is False and doc["messages"]
    status, doc = api.handle("POST", "/subjects/a%2Fb/versions", {}, incompatible)
    assert status == 409 and doc["error_code"] == 409 and "incompatible" in doc["message"]
    assert api.handle("PUT", "/config", {}, b'{"compatibility": "FULL"}') == (200, {"compatibility": "FULL"})
    assert api.handle("GET", "/config", {}, b"") == (200, {"compatibilityLevel": "FULL"})
    assert api.handle("GET", "/mode/a%2Fb", {}, b"")[1]["error_code"] == 40409
    assert api.handle("DELETE", "/subjects/a%2Fb", {}, b"") == (200, [1])
    assert api.handle("DELETE", "/subjects/a%2Fb", {"permanent": "true"}, b"") == (200, [1])
    engine.close()  # a write the metadata store refuses is Confluent's store error, not a crash
    status, doc = api.handle("POST", "/subjects/c/versions", {}, body)
    assert (status, doc["error_code"]) == (500, 50001) and "closed" in doc["message"]


def test_the_error_codes_and_the_content_type_are_spelled_once() -> None:
    """One owner: Confluent's error codes are loglake.registry.errors', the content type
    loglake.registry.api's; no other module of src/ spells them."""
    root = Path(__file__).resolve().parents[1] / "src" / "loglake"
    codes = re.compile(r"\b(401\d\d|403\d\d|404\d\d|422\d\d|5000\d)\b")
    owners = {"registry/errors.py": codes, "registry/api.py": re.compile("application/vnd\\.schemaregistry")}
    found = []
    for path in root.rglob("*.py"):
        rel = str(path.relative_to(root))
        text = path.read_text()
        for owner, pattern in owners.items():
            if rel != owner and pattern.search(text):
                found.append((rel, pattern.pattern))
    assert not found
    assert RegistryErrorCode(40401).http_status == 404 and CONTENT_TYPE == "application/vnd.schemaregistry.v1+json"


# ---- compatibility matrices ------------------------------------------------------------------------

LEVELS = list(Compatibility)


def verdicts(schema_type: SchemaType, old: str, new: str) -> dict[str, bool]:
    o, n = parse_schema(schema_type, old), parse_schema(schema_type, new)
    return {level.value: not check(level, n, [o]) for level in LEVELS}


def expect(backward: bool, forward: bool) -> dict[str, bool]:
    return {
        "BACKWARD": backward, "BACKWARD_TRANSITIVE": backward, "FORWARD": forward, "FORWARD_TRANSITIVE": forward,
        "FULL": backward and forward, "FULL_TRANSITIVE": backward and forward, "NONE": True,
    }  # fmt: skip


#: (old, new, backward, forward): the verdicts Confluent's registry gives (Avro: the spec's
#: schema resolution).
AVRO_PAIRS = [
    (avro_record(NAME), avro_record(NAME, AGE_DEFAULT), True, True),  # optional field added
    (avro_record(NAME), avro_record(NAME, AGE), False, True),  # field without default added
    (avro_record(NAME, AGE), avro_record(NAME), True, False),  # field without default removed
    (avro_record(NAME, AGE_DEFAULT), avro_record(NAME), True, True),  # field with default removed
    (avro_record(AGE), avro_record({"name": "age", "type": "long"}), True, False),  # int promoted to long
    (avro_record(NAME), avro_record({"name": "name", "type": "int"}), False, False),  # type changed
    (
        json.dumps({"type": "enum", "name": "E", "symbols": ["A", "B"]}),
        json.dumps({"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}),
        True,
        False,
    ),
]


@pytest.mark.parametrize("old,new,backward,forward", AVRO_PAIRS)
def test_avro_compatibility_matrix(old: str, new: str, backward: bool, forward: bool) -> None:
    assert verdicts(SchemaType.AVRO, old, new) == expect(backward, forward)


def js(doc: object) -> str:
    return json.dumps(doc)


OBJ_OPEN = {"type": "object", "properties": {"a": {"type": "string"}}}
OBJ_CLOSED = {**OBJ_OPEN, "additionalProperties": False}
JSON_PAIRS = [
    # adding a property to an open content model: old data may hold it with any type
    (OBJ_OPEN, {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}, False, True),
    # adding an optional property to a closed one is backward compatible; the old one then refuses it
    (OBJ_CLOSED, {**OBJ_CLOSED, "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}, True, False),
    # a required property added
    (OBJ_OPEN, {**OBJ_OPEN, "required": ["a"]}, False, True),
    # integer widened to number
    ({"type": "integer"}, {"type": "number"}, True, False),
    ({"type": "string"}, {"type": "integer"}, False, False),
    ({"type": "string", "maxLength": 5}, {"type": "string", "maxLength": 10}, True, False),
    ({"enum": ["a", "b"]}, {"enum": ["a", "b", "c"]}, True, False),
    (OBJ_OPEN, OBJ_CLOSED, False, True),  # additionalProperties narrowed
    ({"type": "string"}, {"type": "string"}, True, True),
    # local $refs are followed into each document's $defs, recursive ones included
    (
        {"$defs": {"n": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/n"}}},
        {"$defs": {"n": {"type": "number"}}, "properties": {"x": {"$ref": "#/$defs/n"}}},
        True,
        False,
    ),
    (
        {"$defs": {"n": {"type": "string"}}, "properties": {"x": {"$ref": "#/$defs/n"}}},
        {"$defs": {"n": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/n"}}},
        False,
        False,
    ),
    (
        {"$defs": {"t": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}}}},
         "$ref": "#/$defs/t"},
        {"$defs": {"t": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}}}},
         "$ref": "#/$defs/t"},
        True,
        True,
    ),
]


@pytest.mark.parametrize("old,new,backward,forward", JSON_PAIRS)
def test_json_schema_compatibility_matrix(old: dict[str, object], new: dict[str, object], backward: bool, forward: bool) -> None:
    assert verdicts(SchemaType.JSON, js(old), js(new)) == expect(backward, forward)


PROTO_V1 = 'syntax = "proto3";\npackage ex;\nmessage User {\n  string name = 1;\n  int32 age = 2;\n}\n'
PROTO_PAIRS = [
    (PROTO_V1, PROTO_V1.replace("  int32 age = 2;\n", "  int32 age = 2;\n  string email = 3;\n"), True, True),
    (PROTO_V1, PROTO_V1.replace("  int32 age = 2;\n", ""), True, True),  # field removed
    (PROTO_V1, PROTO_V1.replace("int32 age", "int64 age"), True, True),  # wire-compatible scalars
    (PROTO_V1, PROTO_V1.replace("int32 age", "string age"), False, False),
    (PROTO_V1, PROTO_V1.replace("string name = 1", "string full_name = 1"), True, True),  # renamed
    (PROTO_V1, PROTO_V1.replace("package ex", "package other"), False, False),
    # a message added: backward compatible; Confluent's forward check sees it removed
    (PROTO_V1, PROTO_V1 + "message Extra {\n  int32 x = 1;\n}\n", True, False),
    (
        PROTO_V1,
        PROTO_V1.replace("  string name = 1;\n  int32 age = 2;\n", "  oneof who {\n    string name = 1;\n    int32 age = 2;\n  }\n"),
        False,
        True,
    ),  # several fields moved into a new oneof (the reverse, out of one, is no change it flags)
]


@pytest.mark.parametrize("old,new,backward,forward", PROTO_PAIRS)
def test_protobuf_compatibility_matrix(old: str, new: str, backward: bool, forward: bool) -> None:
    assert verdicts(SchemaType.PROTOBUF, old, new) == expect(backward, forward)


def test_transitive_levels_look_at_every_earlier_version() -> None:
    v1 = parse_schema(SchemaType.AVRO, avro_record(NAME))
    v2 = parse_schema(SchemaType.AVRO, avro_record(NAME, AGE_DEFAULT))
    v3 = parse_schema(SchemaType.AVRO, avro_record(AGE_DEFAULT))  # name removed, age's default kept
    # v3 reads v2's data, not v1's? both hold `name` it ignores: reading works; writing does not
    assert not check(Compatibility.BACKWARD, v3, [v1, v2])
    v3b = parse_schema(SchemaType.AVRO, avro_record(NAME, {"name": "age", "type": "int"}))  # default dropped
    assert not check(Compatibility.BACKWARD, v3b, [v1, v2])  # v2 always wrote age
    assert check(Compatibility.BACKWARD_TRANSITIVE, v3b, [v1, v2])  # v1 data has no age


def test_protobuf_as_confluent_kafka_sends_it_a_base64_descriptor() -> None:
    from google.protobuf import descriptor_pb2

    fd = descriptor_pb2.FileDescriptorProto(name="u.proto", package="ex", syntax="proto3")
    msg = fd.message_type.add(name="User")
    msg.field.add(name="name", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING, label=1)
    text = base64.b64encode(fd.SerializeToString()).decode()
    parsed = parse_schema(SchemaType.PROTOBUF, text)
    as_text = parse_schema(SchemaType.PROTOBUF, 'syntax = "proto3"; package ex; message User { string name = 1; }')
    assert parsed.parsed == as_text.parsed
    assert not check(Compatibility.FULL, parsed, [as_text])


@pytest.mark.parametrize(
    "schema_type,text",
    [
        (SchemaType.AVRO, '{"type": "nope"}'),
        (SchemaType.JSON, '{"type": 12}'),
        (SchemaType.JSON, "[1]"),
        (SchemaType.PROTOBUF, 'syntax = "proto3"; message A { int32 x = 1 '),
        (SchemaType.PROTOBUF, "not a schema at all {"),
    ],
)
def test_invalid_schemas_are_refused(schema_type: SchemaType, text: str) -> None:
    with pytest.raises(InvalidSchemaError):
        parse_schema(schema_type, text)


def test_a_disaster_recovery_from_the_bucket_restores_the_registry(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'bucket'}"
    with loglake.open(str(tmp_path / "a"), cold_store=url) as log:
        r = registry_of(log.engine)
        r.register("s", avro(avro_record(NAME)))
        r.register("s", avro(avro_record(NAME, AGE_DEFAULT)))
        r.set_config("s", {"compatibility": "FULL"})
        log.flush()
    with loglake.open(str(tmp_path / "b"), cold_store=url) as log:  # the data directory is gone
        report = log.recovery_report
        assert report is not None and report.restored_from == url
        r = registry_of(log.engine)
        assert r.versions("s") == [1, 2] and r.get_config("s", False) == {"compatibilityLevel": "FULL"}
        assert r.register("u", avro(avro_record(AGE))) == {"id": 3}
