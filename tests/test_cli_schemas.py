"""`loglake schemas` (loglake.cli.schemas) as a subprocess against real brokers serving the
schema registry: register from files, list, show, check (exit codes), delete; export a registry as
Confluent's `_schemas` records (a file, a topic) and import them into another broker's registry
with the same ids, versions and configs; refused requests as one `error:` and one `hint:` line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from loglake.cli.schemas import Registry, State, _registry_state

from brokerkit import Broker, free_port, serving_broker

pytestmark = pytest.mark.timeout(180)


@dataclass
class Served:
    broker: Broker
    url: str


def _serve(stack: ExitStack, data_dir: Path) -> Served:
    port = free_port()
    broker = stack.enter_context(serving_broker(data_dir, ["--schema-registry-listen", f"127.0.0.1:{port}"]))
    return Served(broker, f"http://127.0.0.1:{port}")


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Served, Served]]:
    """A source registry and two empty ones to import into (from a file, from a topic)."""
    root = tmp_path_factory.mktemp("schemas-cli")
    with ExitStack() as stack:
        yield _serve(stack, root / "source"), _serve(stack, root / "target"), _serve(stack, root / "third")


def schemas(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "loglake.cli.main", "schemas", *args]
    if url is not None:
        cmd += ["--registry-url", url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def refused(result: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    """A command that failed as the CLI should: exit 1, exactly one error: line and one hint:
    line on stderr, no traceback; (error, hint)."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("error: ")]
    hints = [ln for ln in lines if ln.startswith("hint: ")]
    assert len(errors) == 1 and len(hints) == 1 and len(lines) == 2, result.stderr
    return errors[0], hints[0]


def avro(*fields: dict[str, Any]) -> str:
    return json.dumps({"type": "record", "name": "User", "namespace": "ex", "fields": list(fields)}, indent=2)


NAME = {"name": "name", "type": "string"}
AGE = {"name": "age", "type": "int", "default": 0}
EMAIL = {"name": "email", "type": "string"}
PROTO = 'syntax = "proto3";\npackage ex;\n\nmessage Order {\n  int64 id = 1;\n  string item = 2;\n}\n'
JSON_SCHEMA = json.dumps({"type": "object", "properties": {"sku": {"type": "string"}}})


def put(url: str, path: str, doc: dict[str, Any]) -> Any:
    request = urllib.request.Request(url + path, json.dumps(doc).encode(), {"Content-Type": "application/json"}, method="PUT")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def state_of(url: str) -> State:
    return _registry_state(Registry(url))


def test_register_show_check_export_and_import(brokers: tuple[Served, Served, Served], tmp_path: Path) -> None:
    source, target, third = brokers
    files = {
        "v1.avsc": avro(NAME), "v2.avsc": avro(NAME, AGE), "bad.avsc": avro(NAME, EMAIL),
        "order.proto": PROTO, "sku.json": JSON_SCHEMA, "other.avsc": json.dumps({"type": "enum", "name": "E", "symbols": ["A"]}),
    }  # fmt: skip
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    s = source.url
    # ids are the registry's: the other subjects first, so users-value's ids are not 1 and 2
    assert ok(schemas("register", "orders-value", str(tmp_path / "order.proto"), url=s)) == "orders-value version 1 id 1\n"
    # id 2 is gone for good: the import must keep the ids after it, not number them again
    assert ok(schemas("register", "tmp-value", str(tmp_path / "v1.avsc"), url=s)) == "tmp-value version 1 id 2\n"
    ok(schemas("delete", "tmp-value", url=s))
    assert ok(schemas("delete", "tmp-value", "--permanent", url=s)) == "permanently deleted tmp-value 1 version: 1\n"
    assert ok(schemas("register", "sku-value", str(tmp_path / "sku.json"), url=s)) == "sku-value version 1 id 3\n"
    assert ok(schemas("register", "gone-value", str(tmp_path / "other.avsc"), url=s)) == "gone-value version 1 id 4\n"
    assert ok(schemas("register", "users-value", str(tmp_path / "v1.avsc"), url=s)) == "users-value version 1 id 5\n"
    assert ok(schemas("register", "users-value", str(tmp_path / "v2.avsc"), url=s)) == "users-value version 2 id 6\n"
    # the same schema again is the version it is (whitespace aside)
    assert ok(schemas("register", "users-value", str(tmp_path / "v2.avsc"), url=s)) == "users-value version 2 id 6\n"
    assert ok(schemas("list", url=s)).split() == ["gone-value", "orders-value", "sku-value", "users-value"]
    assert ok(schemas("list", "--prefix", "us", url=s)).split() == ["users-value"]
    latest = json.loads(ok(schemas("show", "users-value", url=s)))
    assert (latest["subject"], latest["version"], latest["id"]) == ("users-value", 2, 6)
    assert json.loads(latest["schema"]) == json.loads(files["v2.avsc"])
    assert json.loads(ok(schemas("show", "users-value", "--version", "1", url=s)))["id"] == 5
    by_id = json.loads(ok(schemas("show", "--id", "1", url=s)))
    assert by_id["schemaType"] == "PROTOBUF" and by_id["versions"] == [{"subject": "orders-value", "version": 1}]
    # check: 0 compatible, 1 not, with the registry's reasons
    assert ok(schemas("check", "users-value", str(tmp_path / "v2.avsc"), url=s)) == "compatible\n"
    bad = schemas("check", "users-value", str(tmp_path / "bad.avsc"), url=s)
    assert (bad.returncode, bad.stdout) == (1, "incompatible\n") and "email" in bad.stderr and "error:" not in bad.stderr
    assert schemas("check", "users-value", str(tmp_path / "bad.avsc"), "--version", "1", url=s).returncode == 1
    error, hint = refused(schemas("register", "users-value", str(tmp_path / "bad.avsc"), url=s))
    assert "incompatible" in error and "(error 409)" in error and "check" in hint
    # subject-level configs, a soft-deleted subject and a soft-deleted version travel too
    put(s, "/config/sku-value", {"compatibility": "NONE"})
    (tmp_path / "sku2.json").write_text(json.dumps({"type": "object", "properties": {"qty": {"type": "integer"}}}))
    assert ok(schemas("register", "sku-value", str(tmp_path / "sku2.json"), url=s)) == "sku-value version 2 id 7\n"
    assert ok(schemas("delete", "sku-value", "--version", "2", url=s)) == "deleted sku-value 1 version: 2\n"
    assert ok(schemas("delete", "gone-value", url=s)) == "deleted gone-value 1 version: 1\n"
    put(s, "/config/users-value", {"compatibility": "FULL"})
    put(s, "/config", {"compatibility": "FORWARD"})
    before = state_of(s)

    # export to a file: Confluent's _schemas records, one JSON line each
    out = tmp_path / "schemas.jsonl"
    ok(schemas("export", "--output", str(out), url=s))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    keys = [r["key"] for r in records]
    assert {"keytype": "CONFIG", "subject": None, "magic": 0} in keys
    assert {"keytype": "CONFIG", "subject": "users-value", "magic": 0} in keys
    v2 = next(r for r in records if r["key"] == {"keytype": "SCHEMA", "subject": "users-value", "version": 2, "magic": 1})
    assert v2["value"]["id"] == 6 and v2["value"]["deleted"] is False and "schemaType" not in v2["value"]
    proto = next(r["value"] for r in records if r["key"].get("subject") == "orders-value")
    assert proto["schemaType"] == "PROTOBUF" and proto["schema"] == PROTO
    gone = next(r["value"] for r in records if r["key"].get("subject") == "gone-value")
    assert gone["deleted"] is True

    # import into an empty registry: the same ids, versions, deletes and configs
    t = target.url
    ok(schemas("import", str(out), url=t))
    after = state_of(t)
    assert after.versions == before.versions and after.configs == before.configs
    assert json.loads(ok(schemas("show", "--id", "6", url=t)))["versions"] == [{"subject": "users-value", "version": 2}]
    client = SchemaRegistryClient({"url": t})
    assert client.get_schema(6).schema_str == SchemaRegistryClient({"url": s}).get_schema(6).schema_str
    assert client.get_latest_version("users-value").schema_id == 6
    with urllib.request.urlopen(t + "/mode", timeout=10) as answer:
        assert json.loads(answer.read()) == {"mode": "READWRITE"}  # given back
    # new ids go on above the imported ones
    (tmp_path / "v3.avsc").write_text(avro(NAME, AGE, {"name": "nick", "type": "string", "default": ""}))
    assert ok(schemas("register", "users-value", str(tmp_path / "v3.avsc"), url=t)) == "users-value version 3 id 8\n"
    # importing into a registry that holds subjects needs --force (Confluent's IMPORT mode)
    error, hint = refused(schemas("import", str(out), url=t))
    assert "Cannot import since found existing subjects" in error and "--force" in hint
    ok(schemas("import", str(out), "--force", url=t))  # run again: nothing registered twice
    again = state_of(t)
    assert again.versions.pop(("users-value", 3)).schema_id == 8 and again.versions == before.versions

    # to a _schemas topic, and from it into a third registry
    bootstrap = source.broker.bootstrap
    ok(schemas("export", "--to-topic", "_schemas", "--bootstrap-server", bootstrap, url=s))
    ok(schemas("import", "--from-topic", "_schemas", "--bootstrap-server", bootstrap, url=third.url))
    from_topic = state_of(third.url)
    assert from_topic.versions == before.versions and from_topic.configs == before.configs


def test_errors_are_one_error_line_and_one_hint(brokers: tuple[Served, Served, Served], tmp_path: Path) -> None:
    source = brokers[0].url
    nowhere = f"http://127.0.0.1:{free_port()}"
    error, hint = refused(schemas("list", url=nowhere))
    assert "cannot reach the schema registry" in error and "--schema-registry-listen" in hint
    error, hint = refused(schemas("show", "no-such-subject", url=source))
    assert "not found" in error and "(error 40401)" in error and "schemas list" in hint
    bad = tmp_path / "bad.avsc"
    bad.write_text("{not json")
    error, hint = refused(schemas("register", "x-value", str(bad), url=source))
    assert "is not JSON" in error
    error, hint = refused(schemas("register", "x-value", str(tmp_path / "missing.avsc"), url=source))
    assert "cannot read schema file" in error
    odd = tmp_path / "schema.txt"
    odd.write_text("{}")
    error, hint = refused(schemas("register", "x-value", str(odd), url=source))
    assert "--type" in hint
    invalid = tmp_path / "invalid.avsc"
    invalid.write_text('{"type": "record"}')  # JSON, not an Avro schema: the registry refuses it
    error, hint = refused(schemas("register", "x-value", str(invalid), url=source))
    assert "(error 42201)" in error
    junk = tmp_path / "junk.jsonl"
    junk.write_text("[1, 2]\n")
    error, hint = refused(schemas("import", str(junk), url=source))
    assert "line 1 is not a _schemas record" in error
    assert schemas("show", url=source).returncode == 2  # neither a subject nor --id: usage
