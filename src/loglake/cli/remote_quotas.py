"""`loglake configs` for client quotas: DescribeClientQuotas / AlterClientQuotas over the Kafka protocol.

Neither confluent-kafka's nor kafka-python's AdminClient has the client quota APIs, so these
commands send the two requests themselves (`loglake.cli.remote_raw`: one connection to the
bootstrap broker, with TLS and SASL from `--command-config` like the other commands).

Entities are named as kafka-configs names them: ``--entity-type users --entity-name alice``,
``--entity-type clients --entity-default``, or both types paired with names by position;
``<default>`` as a name is the default entity too.
"""

from __future__ import annotations

from typing import Any

from loglake.broker.protocol.api_keys import ApiKey
from loglake.cli.common import CliError
from loglake.cli.remote_raw import Connection
from loglake.cli.remote_raw import error_name as _error

#: The versions sent (both APIs' newest; the broker supports 0-1).
DESCRIBE_VERSION = ALTER_VERSION = 1
DEFAULT_NAME = "<default>"
#: kafka-configs' entity types -> Kafka's quota entity types.
ENTITY_TYPES = {"users": "user", "clients": "client-id"}


def call(bootstrap: str, api_key: int, version: int, **fields: Any) -> Any:
    """Send one request to the bootstrap broker (over TLS/SASL as --command-config says)."""
    with Connection(bootstrap, "loglake configs --entity-type users/clients") as conn:
        return conn.request(api_key, version, **fields)


def entity_parts(types: list[str], names: list[str], default: bool) -> list[tuple[str, str | None]]:
    """[(Kafka entity type, name or None for the default)] from the command's options."""
    if default:
        if len(types) != 1 or names:
            raise CliError(
                "--entity-default names the default of one --entity-type; with two types, "
                f"give each an --entity-name ({DEFAULT_NAME} for the default)"
            )
        return [(ENTITY_TYPES[types[0]], None)]
    if len(names) != len(types):
        raise CliError(
            f"give one --entity-name (or {DEFAULT_NAME}) per --entity-type users/clients, or --entity-default"
        )
    return [(ENTITY_TYPES[t], None if n == DEFAULT_NAME else n) for t, n in zip(types, names, strict=True)]


def entity_text(parts: list[tuple[str, str | None]]) -> str:
    return ", ".join(f"{t}={DEFAULT_NAME if n is None else n}" for t, n in parts)


def describe(
    bootstrap: str, types: list[str], names: list[str], default: bool
) -> list[tuple[str, dict[str, float]]]:
    """(entity text, {key: value}) of the entities the options select; all of a type without a name."""
    if names or default:
        filt = [
            {"entity_type": t, "match_type": 0 if n is not None else 1, "match": n}
            for t, n in entity_parts(types, names, default)
        ]
    else:
        filt = [{"entity_type": ENTITY_TYPES[t], "match_type": 2, "match": None} for t in types]
    resp = call(bootstrap, ApiKey.DESCRIBE_CLIENT_QUOTAS, DESCRIBE_VERSION, components=filt, strict=True)
    if resp.error_code:
        raise CliError(f"describe quotas: {_error(resp.error_code)}: {resp.error_message}")
    out = []
    for entry in resp.entries or ():
        parts = [(e.entity_type, e.entity_name) for e in entry.entity]
        out.append((entity_text(parts), {v.key: v.value for v in entry.values}))
    return sorted(out)


def alter(
    bootstrap: str, parts: list[tuple[str, str | None]], sets: dict[str, str], deletes: list[str]
) -> None:
    ops: list[dict[str, Any]] = []
    for key, raw in sets.items():
        try:
            value = float(raw)
        except ValueError:
            raise CliError(f"--add-config {key}={raw}: not a number") from None
        ops.append({"key": key, "value": value, "remove": False})
    ops += [{"key": key, "value": 0.0, "remove": True} for key in deletes]
    entity = [{"entity_type": t, "entity_name": n} for t, n in parts]
    resp = call(bootstrap, ApiKey.ALTER_CLIENT_QUOTAS, ALTER_VERSION, entries=[{"entity": entity, "ops": ops}], validate_only=False)
    for entry in resp.entries:
        if entry.error_code:
            raise CliError(
                f"alter quotas of {entity_text(parts)}: {_error(entry.error_code)}: {entry.error_message}"
            )
