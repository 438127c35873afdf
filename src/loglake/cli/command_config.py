"""`--command-config FILE`: client security settings for the commands that talk to a broker.

Kafka's own tools take the same option (`kafka-topics --command-config client.properties`): a
properties file of client settings — for loglake, librdkafka's names, since the commands use
confluent-kafka: ``security.protocol``, ``ssl.ca.location``, ``ssl.certificate.location``,
``ssl.key.location``, ``sasl.mechanism``, ``sasl.username``, ``sasl.password`` and any other
librdkafka setting. A Java client's ``sasl.jaas.config`` line (PlainLoginModule or
ScramLoginModule with ``username="…" password="…"``) is read as ``sasl.username`` and
``sasl.password``, so an existing Kafka client.properties works once its truststore is a PEM
file.

The option is declared on every `--bootstrap-server` command with `expose_value=False`: its
callback loads the file into this module, where `client_settings()` (confluent-kafka clients) and
`loglake.cli.remote_raw` (the quota commands' own requests) read it. One command runs per
process, so module state is the whole lifetime of the settings.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from loglake.cli.common import CliError

COMMAND_CONFIG_ENV = "LOGLAKE_COMMAND_CONFIG"
#: Largest file read: a client.properties holds a few dozen settings.
COMMAND_CONFIG_BYTES_MAX = 64 * 1024
#: Settings the CLI sets itself; a file naming them is refused rather than half-obeyed.
RESERVED = frozenset({"bootstrap.servers", "client.id", "logger", "error_cb"})
#: Java client settings with no librdkafka equivalent, and what to write instead.
JAVA_ONLY = {
    "ssl.truststore.location": "ssl.ca.location (a PEM file of the CA certificates)",
    "ssl.keystore.location": "ssl.certificate.location and ssl.key.location (PEM files)",
    "ssl.truststore.password": "nothing (a PEM CA file has no password)",
    "ssl.keystore.password": "ssl.key.password",
}
_JAAS = re.compile(r'\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')

_settings: dict[str, str] = {}
_source: str | None = None


def parse(text: str, where: str) -> dict[str, str]:
    """The settings of a properties file: ``key=value`` or ``key: value`` per line, ``#`` and
    ``!`` comments, blank lines ignored; anything else is a CliError naming the line."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if cut < 0:
            raise CliError(f"{where}:{number}: expected key=value, got {line[:60]!r}")
        key, value = line[:cut].strip(), line[cut + 1 :].strip()
        if key in RESERVED:
            raise CliError(
                f"{where}:{number}: {key} is set by loglake itself (use --bootstrap-server for the address)"
            )
        if key in JAVA_ONLY:
            raise CliError(f"{where}:{number}: {key} is a Java client setting; use {JAVA_ONLY[key]}")
        if key == "sasl.jaas.config":
            found = {k: v.replace('\\"', '"') for k, v in _JAAS.findall(value)}
            if set(found) != {"username", "password"}:
                raise CliError(f'{where}:{number}: sasl.jaas.config needs username="…" and password="…"')
            out["sasl.username"], out["sasl.password"] = found["username"], found["password"]
            continue
        out[key] = value
    return out


def load(path: str) -> dict[str, str]:
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = f.read(COMMAND_CONFIG_BYTES_MAX + 1)
    except OSError as exc:
        raise CliError(f"--command-config {path}: {exc.strerror or exc}") from None
    if len(data) > COMMAND_CONFIG_BYTES_MAX:
        raise CliError(
            f"--command-config {path}: larger than {COMMAND_CONFIG_BYTES_MAX} bytes; is it a properties file?"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CliError(f"--command-config {path}: not UTF-8 text") from None
    return parse(text, path)


def _remember(value: str | None) -> str | None:
    """The option's callback: load the file now, so a bad file fails before anything connects."""
    global _source
    _settings.clear()
    _source = None
    if value:
        _settings.update(load(value))
        _source = value
    return value


def use(settings: dict[str, str], source: str = "<given>") -> None:
    """Set the settings directly (the embedded use of the CLI's functions, tests)."""
    global _source
    _settings.clear()
    _settings.update(settings)
    _source = source


def client_settings() -> dict[str, str]:
    """The loaded settings, for a confluent-kafka client's config."""
    return dict(_settings)


def source() -> str | None:
    """Where the settings came from (for error messages), None when there are none."""
    return _source


CommandConfigOption = Annotated[
    str | None,
    typer.Option(
        "--command-config",
        envvar=COMMAND_CONFIG_ENV,
        callback=_remember,
        expose_value=False,
        help="Properties file of client settings (librdkafka names: security.protocol, ssl.ca.location, "
        f"sasl.mechanism, sasl.username, sasl.password, …) for a TLS or SASL listener (env {COMMAND_CONFIG_ENV}).",
        show_default=False,
    ),
]
