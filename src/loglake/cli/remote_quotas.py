"""`loglake configs` for client quotas: DescribeClientQuotas / AlterClientQuotas over the Kafka protocol.

Neither confluent-kafka's nor kafka-python's AdminClient has the client quota APIs, so these
commands send the two requests themselves, encoded with the same kafka-python message classes
the broker's codec uses, on one plain TCP connection to the bootstrap broker (PLAINTEXT
listeners; the other `--bootstrap-server` commands have no TLS options either).

Entities are named as kafka-configs names them: ``--entity-type users --entity-name alice``,
``--entity-type clients --entity-default``, or both types paired with names by position;
``<default>`` as a name is the default entity too.
"""

from __future__ import annotations

import socket
from typing import Any

from kafka.protocol.parser import KafkaProtocol

from loglake.broker.protocol.messages import request_class
from loglake.cli.common import CliError
from loglake.cli.remote import REMOTE_TIMEOUT_S, unreachable
from loglake.kafka_errors import ErrorCode

#: The versions sent (both APIs' newest; the broker supports 0-1).
DESCRIBE_VERSION = ALTER_VERSION = 1
#: Largest response read (a describe of CLIENT_QUOTA_ENTITIES_MAX entities fits).
RESPONSE_BYTES_MAX = 64 * 1024 * 1024
DEFAULT_NAME = "<default>"
#: kafka-configs' entity types -> Kafka's quota entity types.
ENTITY_TYPES = {"users": "user", "clients": "client-id"}


def _build(struct: Any, version: int, values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in values.items():
        field = struct.fields[name]
        if value is not None and field.is_struct_array():
            value = [field.data_class(**_build(field, version, v), version=version) for v in value]
        out[name] = value
    return out


def call(bootstrap: str, api_key: int, version: int, **fields: Any) -> Any:
    """Send one request to the bootstrap broker; its decoded response (CliError if unreachable)."""
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    if not host or not port.isdigit():
        raise CliError(f"bad --bootstrap-server {bootstrap!r}: want HOST:PORT")
    cls = request_class(api_key)
    proto = KafkaProtocol(client_id="loglake-cli")
    proto.send_request(cls[version](**_build(cls._struct, version, fields)))
    received = 0
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=REMOTE_TIMEOUT_S) as sock:
            sock.sendall(proto.send_bytes())
            while received < RESPONSE_BYTES_MAX:
                data = sock.recv(65536)
                if not data:
                    break
                received += len(data)
                responses = proto.receive_bytes(data)
                if responses:
                    return responses[0][1]
    except OSError:
        raise unreachable(bootstrap) from None
    raise CliError(f"{bootstrap} closed the connection without answering {cls.name}")


def _error(code: int) -> str:
    member = ErrorCode._value2member_map_.get(code)
    return member.name if member is not None else f"error {code}"


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
    resp = call(bootstrap, 48, DESCRIBE_VERSION, components=filt, strict=True)
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
    resp = call(bootstrap, 49, ALTER_VERSION, entries=[{"entity": entity, "ops": ops}], validate_only=False)
    for entry in resp.entries:
        if entry.error_code:
            raise CliError(
                f"alter quotas of {entity_text(parts)}: {_error(entry.error_code)}: {entry.error_message}"
            )
