"""`loglake schemas list|show|register|check|delete|export|import`: the schema registry of a broker.

It talks to the registry's REST API (`loglake serve --schema-registry-listen`, or any
Confluent-compatible registry) over HTTP(S) with the standard library: `--registry-url` (env
`REGISTRY_URL_ENV`, default `DEFAULT_REGISTRY_URL`), HTTP basic auth from `--user`/`--password`
or the URL's userinfo, `--ca-file` to verify an HTTPS registry.

export and import move a whole registry in the layout of Confluent's own store, the `_schemas`
topic (one record per fact; `key`/`value` JSON, `keytypes`): as JSON lines ``{"key": ...,
"value": ...}`` in a file, or as the records of a topic of a Kafka-compatible broker. import folds
the records into the state they describe (later records win, a null value deletes), puts the
registry into IMPORT mode, registers every version with its own id and version, soft-deletes what
was soft-deleted, sets the compatibility levels and subject modes, and gives the registry back
the global mode it had.

A refused request or bad input ends the command with one `error:` line, one `hint:` line and exit
code 1 (`check`: exit 1 also when the schema is not compatible, with the registry's reasons and
no error line); usage errors exit 2.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import typer

from loglake.cli.command_config import CommandConfigOption
from loglake.cli.common import CliError, note, plural

app = typer.Typer(
    help="The schema registry of a broker (loglake serve --schema-registry-listen): list, show, register, "
    "check, delete, export and import schemas.",
    no_args_is_help=True,
)

REGISTRY_URL_ENV = "LOGLAKE_SCHEMA_REGISTRY_URL"
DEFAULT_REGISTRY_URL = "http://127.0.0.1:8081"
#: How long one request to the registry may take (connecting included).
HTTP_TIMEOUT_S = 10.0
#: What each request accepts and sends (Confluent's v1 content type takes plain JSON too).
JSON_TYPE = "application/json"
#: Schema types by file extension, when --type is not given.
EXTENSIONS = {".avsc": "AVRO", ".avro": "AVRO", ".proto": "PROTOBUF", ".json": "JSON"}
SCHEMA_TYPES = ("AVRO", "PROTOBUF", "JSON")
#: The `keytype`s of Confluent's `_schemas` topic (NOOP, CONTEXT and CLEAR_SUBJECT records carry
#: no state an import replays: they are skipped).
KEYTYPES = ("SCHEMA", "CONFIG", "MODE", "DELETE_SUBJECT", "NOOP", "CONTEXT", "CLEAR_SUBJECT")
#: Key `magic`: 1 for SCHEMA and DELETE_SUBJECT keys, 0 for the others (Confluent's).
KEY_MAGIC = {"SCHEMA": 1, "DELETE_SUBJECT": 1}
#: The topic Confluent's registry keeps itself in.
SCHEMAS_TOPIC = "_schemas"

RegistryUrlOption = Annotated[
    str,
    typer.Option(
        "--registry-url", envvar=REGISTRY_URL_ENV, help=f"URL of the schema registry (env {REGISTRY_URL_ENV})."
    ),
]
UserOption = Annotated[str | None, typer.Option("--user", help="User for HTTP basic auth (or user:password@ in the URL).")]
PasswordOption = Annotated[str | None, typer.Option("--password", help="Password for HTTP basic auth.")]
CaFileOption = Annotated[
    Path | None, typer.Option("--ca-file", help="CA certificates (PEM) to verify an HTTPS registry with.")
]
VersionOption = Annotated[str, typer.Option("--version", help="A version number, or latest.")]

#: The hint of a refusal, by HTTP status (a code of its own is looked up first, in `_hint`).
STATUS_HINTS = {
    401: "give a SCRAM user of the broker with --user/--password (or user:password@ in --registry-url)",
    403: "the user needs an ACL on the subject or the registry (docs/SCHEMA_REGISTRY.md, \"ACLs\")",
    404: "`loglake schemas list` lists the subjects (--deleted: the soft-deleted ones too)",
    409: "`loglake schemas check SUBJECT FILE` prints why; the subject's level is `compatibilityLevel` of its config",
    422: "check the file is a schema of its --type (AVRO, PROTOBUF, JSON) and that its references are registered",
}


class RegistryRefused(CliError):
    """The registry answered with an error: Confluent's code and message."""

    def __init__(self, what: str, status: int, code: int, message: str) -> None:
        super().__init__(f"{what}: {message} (error {code})", hint=_hint(status, code))
        self.status = status
        self.code = code


def _hint(status: int, code: int) -> str:
    from loglake.registry.errors import RegistryErrorCode as C

    own = {
        C.VERSION_NOT_FOUND: "`loglake schemas show SUBJECT` shows the newest version; versions start at 1",
        C.SCHEMA_NOT_FOUND: "ids are global: `loglake schemas show SUBJECT` shows a subject's",
        C.SUBJECT_NOT_SOFT_DELETED: "delete it without --permanent first (a soft delete), then with --permanent",
        C.SCHEMAVERSION_NOT_SOFT_DELETED: "delete it without --permanent first (a soft delete), then with --permanent",
        C.SUBJECT_SOFT_DELETED: "it is soft-deleted already: --permanent removes it for good",
        C.SCHEMAVERSION_SOFT_DELETED: "it is soft-deleted already: --permanent removes it for good",
        C.OPERATION_NOT_PERMITTED: "the registry's or the subject's mode refuses it (GET /mode); import into an empty "
        "registry, or pass --force",
        C.REFERENCE_EXISTS: "another schema references it: delete that one first",
        C.ID_DOES_NOT_MATCH: "the registry holds another schema under that id: import into an empty registry",
    }
    try:
        return own[C(code)]
    except (ValueError, KeyError):
        return STATUS_HINTS.get(status, "the registry refused the request; its log says more")


@dataclass
class Registry:
    """A registry's REST API, one blocking request at a time."""

    url: str
    user: str | None = None
    password: str | None = None
    ca_file: Path | None = None
    _context: ssl.SSLContext | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url if "://" in self.url else f"http://{self.url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CliError(
                f"bad --registry-url {self.url!r}: not an http:// or https:// URL",
                hint=f"give the registry's address like {DEFAULT_REGISTRY_URL} (env {REGISTRY_URL_ENV})",
            )
        if parts.username is not None and self.user is None:  # user:password@ in the URL
            self.user, self.password = parts.username, parts.password or ""
        netloc = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
        if ":" in parts.hostname:
            netloc = f"[{parts.hostname}]" + ("" if parts.port is None else f":{parts.port}")
        self.url = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        if parts.scheme == "https":
            try:
                self._context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
            except (OSError, ssl.SSLError) as exc:
                raise CliError(f"cannot read --ca-file {self.ca_file}: {exc}", hint="give a PEM file of CA certificates") from None

    def call(self, method: str, path: str, what: str, body: Any = None, **query: str) -> Any:
        """The JSON answer of one request; RegistryRefused for an error answer, CliError when the
        registry cannot be reached."""
        url = self.url + path + (f"?{urlencode(query)}" if query else "")
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", JSON_TYPE)
        if data is not None:
            request.add_header("Content-Type", JSON_TYPE)
        if self.user is not None:
            token = base64.b64encode(f"{self.user}:{self.password or ''}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S, context=self._context) as answer:
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                doc = json.loads(raw)
                code, message = int(doc["error_code"]), str(doc["message"])
            except (ValueError, KeyError, TypeError):
                code, message = exc.code, raw.decode(errors="replace").strip()[:200] or str(exc.reason)
            raise RegistryRefused(what, exc.code, code, message) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CliError(
                f"cannot reach the schema registry at {self.url}: {reason}",
                hint=f"start the broker with --schema-registry-listen HOST:PORT, or pass --registry-url "
                f"(env {REGISTRY_URL_ENV}); --ca-file for a registry whose certificate is not trusted here",
            ) from None
        except ValueError as exc:  # not JSON: not a schema registry
            raise CliError(
                f"{what}: {self.url} did not answer JSON ({exc})",
                hint=f"is --registry-url {self.url} a schema registry's URL?",
            ) from None


def _subject(subject: str) -> str:
    return quote(subject, safe="")


def _connect(url: str, user: str | None, password: str | None, ca_file: Path | None) -> Registry:
    return Registry(url, user, password, ca_file)


def _print(doc: Any) -> None:
    typer.echo(json.dumps(doc, indent=2, ensure_ascii=False))


def _version_arg(raw: str) -> str:
    if raw != "latest" and not raw.isdigit():
        raise typer.BadParameter(f"must be a version number or latest, got {raw!r}", param_hint="--version")
    return raw


# ---- reading a schema file ---------------------------------------------------------------------


def _read_schema(path: Path, schema_type: str | None, refs: list[str] | None) -> dict[str, Any]:
    """The register request for a schema file: its text, its type (from the extension when not
    given) and `name=subject:version` references."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read schema file {path}: {exc}", hint="give the path of a .avsc, .proto or .json file") from None
    kind = (schema_type or EXTENSIONS.get(path.suffix.lower(), "")).upper()
    if kind not in SCHEMA_TYPES:
        raise CliError(
            f"cannot tell the schema type of {path}",
            hint=f"pass --type {'|'.join(SCHEMA_TYPES)} (guessed from the extensions {', '.join(EXTENSIONS)})",
        )
    if kind in ("AVRO", "JSON"):
        try:
            json.loads(text)
        except ValueError as exc:
            raise CliError(f"{path} is not JSON, as a {kind} schema is: {exc}", hint="check the file, or its --type") from None
    doc: dict[str, Any] = {"schema": text}
    if kind != "AVRO":
        doc["schemaType"] = kind
    parsed = [_reference(raw) for raw in refs or []]
    if parsed:
        doc["references"] = parsed
    return doc


def _reference(raw: str) -> dict[str, Any]:
    name, sep, rest = raw.partition("=")
    subject, colon, version = rest.rpartition(":")
    if not sep or not name or not colon or not subject or not version.isdigit():
        raise typer.BadParameter(f"must look like name=subject:version, got {raw!r}", param_hint="--reference")
    return {"name": name, "subject": subject, "version": int(version)}


# ---- the verbs ---------------------------------------------------------------------------------


@app.command("list")
def list_(
    deleted: Annotated[bool, typer.Option("--deleted", help="Also list soft-deleted subjects.")] = False,
    prefix: Annotated[str, typer.Option("--prefix", help="Only subjects starting with this.")] = "",
    url: RegistryUrlOption = DEFAULT_REGISTRY_URL,
    user: UserOption = None,
    password: PasswordOption = None,
    ca_file: CaFileOption = None,
) -> None:
    """Subjects, one per line."""
    registry = _connect(url, user, password, ca_file)
    query = {"deleted": "true"} if deleted else {}
    if prefix:
        query["subjectPrefix"] = prefix
    for subject in registry.call("GET", "/subjects", "list subjects", **query):
        if subject.startswith(prefix):  # a registry that ignores subjectPrefix
            typer.echo(subject)


@app.command()
def show(
    subject: Annotated[str | None, typer.Argument(help="Subject (or --id).")] = None,
    version: VersionOption = "latest",
    schema_id: Annotated[int | None, typer.Option("--id", help="Show the schema of this id instead.")] = None,
    url: RegistryUrlOption = DEFAULT_REGISTRY_URL,
    user: UserOption = None,
    password: PasswordOption = None,
    ca_file: CaFileOption = None,
) -> None:
    """A subject's version (subject, version, id, schemaType, references, schema) as JSON, or
    with --id the schema of an id and the subject versions that hold it."""
    if (subject is None) == (schema_id is None):
        raise typer.BadParameter("give a SUBJECT or --id N (one of them)")
    registry = _connect(url, user, password, ca_file)
    if schema_id is not None:
        doc = registry.call("GET", f"/schemas/ids/{schema_id}", f"show schema {schema_id}")
        doc = {"id": schema_id, **doc}
        doc["versions"] = registry.call("GET", f"/schemas/ids/{schema_id}/versions", f"show schema {schema_id}")
        _print(doc)
        return
    assert subject is not None
    _print(registry.call("GET", f"/subjects/{_subject(subject)}/versions/{_version_arg(version)}", f"show {subject}"))


@app.command()
def register(
    subject: Annotated[str, typer.Argument(help="Subject to register the schema under.")],
    file: Annotated[Path, typer.Argument(help="Schema file (.avsc, .proto, .json).")],
    schema_type: Annotated[
        str | None, typer.Option("--type", help="AVRO, PROTOBUF or JSON (default: from the file's extension).")
    ] = None,
    reference: Annotated[
        list[str] | None,
        typer.Option("--reference", help="A reference, name=subject:version (repeatable)."),
    ] = None,
    normalize: Annotated[bool, typer.Option("--normalize", help="Normalize the schema first (?normalize=true).")] = False,
    url: RegistryUrlOption = DEFAULT_REGISTRY_URL,
    user: UserOption = None,
    password: PasswordOption = None,
    ca_file: CaFileOption = None,
) -> None:
    """Register a schema file under a subject; prints its subject, version and id."""
    doc = _read_schema(file, schema_type, reference)
    registry = _connect(url, user, password, ca_file)
    flags = {"normalize": "true"} if normalize else {}
    path = f"/subjects/{_subject(subject)}"
    answer = registry.call("POST", f"{path}/versions", f"register {file} under {subject}", doc, **flags)
    found = registry.call("POST", path, f"look up {file} under {subject}", doc, **flags)
    typer.echo(f"{subject} version {found['version']} id {answer['id']}")


@app.command()
def check(
    subject: Annotated[str, typer.Argument(help="Subject to check against.")],
    file: Annotated[Path, typer.Argument(help="Schema file (.avsc, .proto, .json).")],
    version: Annotated[
        str | None, typer.Option("--version", help="A version number or latest (default: every version the level names).")
    ] = None,
    schema_type: Annotated[str | None, typer.Option("--type", help="AVRO, PROTOBUF or JSON.")] = None,
    reference: Annotated[list[str] | None, typer.Option("--reference", help="name=subject:version (repeatable).")] = None,
    normalize: Annotated[bool, typer.Option("--normalize", help="Normalize the schema first.")] = False,
    url: RegistryUrlOption = DEFAULT_REGISTRY_URL,
    user: UserOption = None,
    password: PasswordOption = None,
    ca_file: CaFileOption = None,
) -> None:
    """Is the schema compatible with the subject (by its level)? Exit 0: yes ("compatible");
    exit 1: no ("incompatible" and the registry's reasons on stderr)."""
    doc = _read_schema(file, schema_type, reference)
    registry = _connect(url, user, password, ca_file)
    target = f"/compatibility/subjects/{_subject(subject)}/versions"
    if version is not None:
        target += f"/{_version_arg(version)}"
    flags = {"verbose": "true", **({"normalize": "true"} if normalize else {})}
    answer = registry.call("POST", target, f"check {file} against {subject}", doc, **flags)
    if answer.get("is_compatible"):
        typer.echo("compatible")
        return
    typer.echo("incompatible")
    for message in answer.get("messages") or []:
        note(str(message))
    raise typer.Exit(1)


@app.command()
def delete(
    subject: Annotated[str, typer.Argument(help="Subject.")],
    version: Annotated[str | None, typer.Option("--version", help="Only this version (a number or latest).")] = None,
    permanent: Annotated[
        bool, typer.Option("--permanent", help="Remove for good (what was soft-deleted before).")
    ] = False,
    url: RegistryUrlOption = DEFAULT_REGISTRY_URL,
    user: UserOption = None,
    password: PasswordOption = None,
    ca_file: CaFileOption = None,
) -> None:
    """Soft-delete a subject (or one version); --permanent removes a soft-deleted one."""
    registry = _connect(url, user, password, ca_file)
    path = f"/subjects/{_subject(subject)}"
    if version is not None:
        path += f"/versions/{_version_arg(version)}"
    query = {"permanent": "true"} if permanent else {}
    answer = registry.call("DELETE", path, f"delete {subject}", **query)
    versions = answer if isinstance(answer, list) else [answer]
    how = "permanently deleted" if permanent else "deleted"
    typer.echo(f"{how} {subject} {plural(len(versions), 'version')}: {', '.join(str(v) for v in versions)}")


# ---- export and import: Confluent's _schemas records --------------------------------------------

#: One `_schemas` record: its key and value documents (value None: a tombstone).
Record = tuple[dict[str, Any], dict[str, Any] | None]


def schema_key(subject: str, version: int) -> dict[str, Any]:
    return {"keytype": "SCHEMA", "subject": subject, "version": version, "magic": KEY_MAGIC["SCHEMA"]}


def config_key(subject: str | None) -> dict[str, Any]:
    return {"keytype": "CONFIG", "subject": subject, "magic": 0}


def mode_key(subject: str | None) -> dict[str, Any]:
    return {"keytype": "MODE", "subject": subject, "magic": 0}


def encode_key(key: dict[str, Any]) -> bytes:
    """A key as Confluent writes it: keytype, subject, version, magic in that order, compact."""
    order = ("keytype", "subject", "version", "magic")
    return json.dumps({k: key[k] for k in order if k in key}, separators=(",", ":")).encode()


@dataclass
class Version:
    """A subject's version as a SCHEMA record's value holds it."""

    subject: str
    version: int
    schema_id: int
    schema_type: str
    schema: str
    references: list[dict[str, Any]]
    deleted: bool

    def value(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"subject": self.subject, "version": self.version, "id": self.schema_id}
        if self.schema_type != "AVRO":
            doc["schemaType"] = self.schema_type
        doc["schema"] = self.schema
        if self.references:
            doc["references"] = self.references
        doc["deleted"] = self.deleted
        return doc

    @classmethod
    def of(cls, value: dict[str, Any]) -> Version:
        return cls(
            str(value["subject"]), int(value["version"]), int(value["id"]), str(value.get("schemaType") or "AVRO"),
            str(value["schema"]), list(value.get("references") or []), bool(value.get("deleted", False)),
        )  # fmt: skip


@dataclass
class State:
    """What a `_schemas` topic holds, folded: versions, configs and modes (None: the global one)."""

    versions: dict[tuple[str, int], Version] = field(default_factory=dict)
    configs: dict[str | None, str] = field(default_factory=dict)
    modes: dict[str | None, str] = field(default_factory=dict)
    skipped: int = 0

    def apply(self, key: dict[str, Any], value: dict[str, Any] | None) -> None:
        kind = key.get("keytype")
        subject = key.get("subject")
        if kind == "SCHEMA":
            at = (str(subject), int(key["version"]))
            if value is None:  # a tombstone: the version was deleted permanently
                self.versions.pop(at, None)
            else:
                self.versions[at] = Version.of(value)
        elif kind == "CONFIG":
            level = (value or {}).get("compatibilityLevel") or (value or {}).get("compatibility")
            if level:
                self.configs[subject] = str(level)
            else:
                self.configs.pop(subject, None)
        elif kind == "MODE":
            mode = (value or {}).get("mode")
            if mode:
                self.modes[subject] = str(mode)
            else:
                self.modes.pop(subject, None)
        elif kind == "DELETE_SUBJECT" and value is not None:  # soft-deletes up to its version
            deleted_subject, up_to = str(value["subject"]), int(value["version"])
            for (s, v), row in self.versions.items():
                if s == deleted_subject and v <= up_to:
                    row.deleted = True
        elif kind in KEYTYPES:
            self.skipped += 1
        else:
            raise ValueError(f"unknown keytype {kind!r}")

    def records(self) -> list[Record]:
        """The state as `_schemas` records: configs, modes, then versions in replay order."""
        out: list[Record] = [(config_key(subject), {"compatibilityLevel": c}) for subject, c in self.configs.items()]
        out += [(mode_key(subject), {"mode": m}) for subject, m in self.modes.items()]
        out += [(schema_key(v.subject, v.version), v.value()) for v in replay_order(self.versions.values())]
        return out


def replay_order(versions: Iterable[Version]) -> list[Version]:
    """An order to register `versions` in that the registry takes: each subject's versions
    ascending, a referenced version before the ones that reference it, and each new schema id
    above the ones before it (loglake hands out no id below its next free one): of the subjects'
    next versions it takes one whose id is registered already, else the smallest id."""
    queues: dict[str, list[Version]] = {}
    for v in sorted(versions, key=lambda v: (v.subject, v.version)):
        queues.setdefault(v.subject, []).append(v)
    pending = {(v.subject, v.version) for q in queues.values() for v in q}
    seen_ids: set[int] = set()
    out: list[Version] = []
    while queues:
        heads = [q[0] for q in queues.values()]
        ready = [
            h for h in heads if not any((r["subject"], int(r["version"])) in pending for r in h.references)
        ] or heads
        known = [h for h in ready if h.schema_id in seen_ids]
        pick = known[0] if known else min(ready, key=lambda h: h.schema_id)
        out.append(pick)
        seen_ids.add(pick.schema_id)
        pending.discard((pick.subject, pick.version))
        queue = queues[pick.subject]
        queue.pop(0)
        if not queue:
            del queues[pick.subject]
    return out


def _registry_state(registry: Registry) -> State:
    """Everything the registry holds, as a State, through its REST API."""
    state = State()
    for subject in registry.call("GET", "/subjects", "list subjects", deleted="true"):
        path = f"/subjects/{_subject(subject)}"
        try:
            live = set(registry.call("GET", f"{path}/versions", f"versions of {subject}"))
        except RegistryRefused as exc:
            if exc.status != 404:
                raise
            live = set()  # every version soft-deleted
        for v in registry.call("GET", f"{path}/versions", f"versions of {subject}", deleted="true"):
            doc = registry.call("GET", f"{path}/versions/{v}", f"version {v} of {subject}", deleted="true")
            state.versions[(subject, int(v))] = Version.of({**doc, "deleted": v not in live})
        for kind, table in (("config", state.configs), ("mode", state.modes)):
            try:
                answer = registry.call("GET", f"/{kind}/{_subject(subject)}", f"{kind} of {subject}")
            except RegistryRefused as exc:
                if exc.status != 404:
                    raise
                continue  # none of its own
            table[subject] = str(answer.get("compatibilityLevel") or answer.get("compatibility") or answer.get("mode"))
    state.configs[None] = str(registry.call("GET", "/config", "global config")["compatibilityLevel"])
    mode = str(registry.call("GET", "/mode", "global mode")["mode"])
    if mode != "READWRITE":
        state.modes[None] = mode
    return state


def _file_records(path: Path) -> Iterator[Record]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {path}: {exc}", hint="give a file `loglake schemas export` wrote") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            key, value = doc["key"], doc.get("value")
            if not isinstance(key, dict) or not (value is None or isinstance(value, dict)):
                raise TypeError("key is not an object, or value is neither an object nor null")
        except (ValueError, KeyError, TypeError) as exc:
            raise CliError(
                f"{path} line {lineno} is not a _schemas record: {exc}",
                hint='each line is {"key": {...}, "value": {...} or null}, as `loglake schemas export` writes',
            ) from None
        yield key, value


def _topic_records(bootstrap: str, topic: str) -> Iterator[Record]:
    """Every record of `topic` from its start to its end at the time of the call."""
    from confluent_kafka import KafkaError, TopicPartition

    from loglake.cli.remote import REMOTE_TIMEOUT_S, Remote, consumer

    remote = Remote(bootstrap)
    partitions = remote.partitions(topic)
    c = consumer(
        bootstrap,
        **{"group.id": f"loglake-schemas-{uuid.uuid4().hex}", "enable.auto.commit": False, "enable.partition.eof": True},
    )
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=REMOTE_TIMEOUT_S)[1] for p in partitions}
        left = {p for p, end in ends.items() if end > 0}
        c.assign([TopicPartition(topic, p, 0) for p in left])
        while left:
            msg = c.poll(REMOTE_TIMEOUT_S)
            if msg is None:
                raise CliError(
                    f"reading {topic} from {bootstrap}: no record within {REMOTE_TIMEOUT_S:g}s",
                    hint="is the broker up, and may this principal read the topic?",
                )
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    left.discard(msg.partition())
                    continue
                raise CliError(f"reading {topic} from {bootstrap}: {err.str()}", hint="see `loglake topics describe` for the topic")
            if msg.offset() + 1 >= ends[msg.partition()]:
                left.discard(msg.partition())
            raw_key, raw_value = msg.key(), msg.value()
            try:
                key = json.loads(raw_key) if raw_key else None
                value = json.loads(raw_value) if raw_value else None
            except ValueError as exc:
                raise CliError(
                    f"{topic} offset {msg.offset()} is not a _schemas record: {exc}",
                    hint="a _schemas topic's keys and values are JSON",
                ) from None
            if isinstance(key, dict) and (value is None or isinstance(value, dict)):
                yield key, value
    finally:
        c.close()


def _produce(bootstrap: str, topic: str, records: list[Record]) -> None:
    from confluent_kafka.admin import NewTopic

    from loglake.cli.remote import (
        ADMIN_CALL_TIMEOUT_S,
        REMOTE_TIMEOUT_S,
        Remote,
        describe_error,
        producer,
        result,
    )

    remote = Remote(bootstrap)
    if topic not in remote.metadata().topics:
        # one partition, compacted: as Confluent's registry makes its own
        new = NewTopic(topic, num_partitions=1, config={"cleanup.policy": "compact"})
        future = remote.admin.create_topics([new], request_timeout=REMOTE_TIMEOUT_S)[topic]
        try:
            future.result(timeout=ADMIN_CALL_TIMEOUT_S)
        except Exception as exc:
            if "already exists" not in describe_error(exc).lower():
                result(future, f"create topic {topic}")
    failures: list[str] = []
    p = producer(bootstrap, **{"acks": "all", "enable.idempotence": True})
    for key, value in records:
        p.produce(
            topic, key=encode_key(key), value=None if value is None else json.dumps(value, separators=(",", ":")).encode(),
            partition=0, on_delivery=lambda err, _msg: failures.append(str(err.str())) if err is not None else None,
        )  # fmt: skip
    left = p.flush(REMOTE_TIMEOUT_S * 3)
    if failures or left:
        raise CliError(
            f"produce to {topic} failed: {failures[0] if failures else plural(left, 'record') + ' not acknowledged'}",
            hint="is the broker up, and may this principal write to the topic?",
        )


@app.command("export")
def export(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="File to write (default: stdout).")] = None,
    to_topic: Annotated[
        str | None, typer.Option("--to-topic", help=f"Produce the records to this topic instead (e.g. {SCHEMAS_TOPIC}).")
    ] = None,
    bootstrap: Annotated[
        str | None, typer.Option("--bootstrap-server", help="HOST:PORT of the broker for --to-topic.")
    ] = None,
    url: RegistryUrlOption = DEFAULT_REGISTRY_URL,
    user: UserOption = None,
    password: PasswordOption = None,
    ca_file: CaFileOption = None,
    _command_config: CommandConfigOption = None,
) -> None:
    """Write the whole registry as Confluent's `_schemas` records: JSON lines {"key", "value"},
    or with --to-topic the records of a topic (keys and values JSON, as Confluent's registry
    writes them)."""
    if to_topic is not None and not bootstrap:
        raise CliError("--to-topic needs --bootstrap-server HOST:PORT", hint="the broker to produce the records to")
    registry = _connect(url, user, password, ca_file)
    records = _registry_state(registry).records()
    versions = sum(1 for k, _ in records if k["keytype"] == "SCHEMA")
    if to_topic is not None:
        assert bootstrap is not None
        _produce(bootstrap, to_topic, records)
        note(f"exported {plural(versions, 'schema version')} ({plural(len(records), 'record')}) to topic {to_topic}")
        return
    lines = "".join(json.dumps({"key": k, "value": v}, ensure_ascii=False) + "\n" for k, v in records)
    if output is None:
        typer.echo(lines, nl=False)
        return
    try:
        output.write_text(lines, encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot write {output}: {exc}", hint="give --output a writable path") from None
    note(f"exported {plural(versions, 'schema version')} ({plural(len(records), 'record')}) to {output}")


@app.command("import")
def import_(
    file: Annotated[Path | None, typer.Argument(help="A file `export` wrote (JSON lines {\"key\", \"value\"}).")] = None,
    from_topic: Annotated[
        str | None, typer.Option("--from-topic", help=f"Read the records of this topic instead (e.g. {SCHEMAS_TOPIC}).")
    ] = None,
    bootstrap: Annotated[
        str | None, typer.Option("--bootstrap-server", help="HOST:PORT of the broker for --from-topic.")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Import into a registry that holds subjects already (IMPORT mode's force).")
    ] = False,
    url: RegistryUrlOption = DEFAULT_REGISTRY_URL,
    user: UserOption = None,
    password: PasswordOption = None,
    ca_file: CaFileOption = None,
    _command_config: CommandConfigOption = None,
) -> None:
    """Replay `_schemas` records into the registry, keeping every schema's id and version (the
    registry's IMPORT mode; its global mode is given back afterwards)."""
    if (file is None) == (from_topic is None):
        raise CliError("give a FILE or --from-topic TOPIC (one of them)", hint=f"e.g. --from-topic {SCHEMAS_TOPIC} --bootstrap-server HOST:PORT")
    if from_topic is not None and not bootstrap:
        raise CliError("--from-topic needs --bootstrap-server HOST:PORT", hint="the broker that holds the topic")
    registry = _connect(url, user, password, ca_file)
    state = State()
    source = _file_records(file) if file is not None else _topic_records(str(bootstrap), str(from_topic))
    where = str(file) if file is not None else f"topic {from_topic}"
    for key, value in source:
        try:
            state.apply(key, value)
        except (ValueError, KeyError, TypeError) as exc:
            raise CliError(f"{where}: a record {json.dumps(key)} cannot be read: {exc}", hint="is it a _schemas topic?") from None
    previous = str(registry.call("GET", "/mode", "global mode")["mode"])
    registry.call("PUT", "/mode", "set IMPORT mode", {"mode": "IMPORT"}, **({"force": "true"} if force else {}))
    order = replay_order(state.versions.values())
    try:
        for v in order:
            body = {k: val for k, val in v.value().items() if k not in ("subject", "deleted")}
            registry.call("POST", f"/subjects/{_subject(v.subject)}/versions", f"import {v.subject} version {v.version}", body)
        for v in reversed(order):  # the referencing versions first
            if v.deleted:
                path = f"/subjects/{_subject(v.subject)}/versions/{v.version}"
                try:
                    registry.call("DELETE", path, f"soft-delete {v.subject} version {v.version}")
                except RegistryRefused as exc:
                    if exc.status != 404:  # deleted already (an import run again)
                        raise
        for subject, level in state.configs.items():
            path = "/config" if subject is None else f"/config/{_subject(subject)}"
            registry.call("PUT", path, f"config of {subject or 'the registry'}", {"compatibility": level})
    finally:
        registry.call("PUT", "/mode", "give back the global mode", {"mode": previous}, force="true")
    for subject, mode in state.modes.items():
        if subject is not None and mode != "IMPORT":
            registry.call("PUT", f"/mode/{_subject(subject)}", f"mode of {subject}", {"mode": mode}, force="true")
    if state.skipped:
        note(f"skipped {plural(state.skipped, 'record')} that hold no schema state (NOOP, CONTEXT, CLEAR_SUBJECT)")
    note(f"imported {plural(len(order), 'schema version')} from {where}, ids and versions kept")

