"""`loglake configs describe|alter`: topic and broker configs and client quotas of a running broker (kafka-configs.sh).

describe prints the configs set on the entity (with --all, every config and where its value comes
from); alter sends one IncrementalAlterConfigs request: SET for each --add-config, DELETE for each
--delete-config. Broker configs are passed through as they are: the broker decides which it accepts.

Entity types users and clients are client quotas (loglake.cli.remote_quotas: DescribeClientQuotas
and AlterClientQuotas): ``--entity-type users --entity-name alice``, ``--entity-default`` for the
default entity, both types (paired with names by position) for a user's quota on one client id.
"""

from __future__ import annotations

import enum
import json
from typing import Annotated

import typer
from rich.table import Table

from loglake.cli.command_config import CommandConfigOption
from loglake.cli.common import stdout_console
from loglake.cli.remote import (
    REMOTE_TIMEOUT_S,
    BootstrapOption,
    Remote,
    parse_config_list,
    parse_name_list,
    require_bootstrap,
    result,
    sources,
)
from loglake.cli.remote_topics import alter_configs, change_summary

app = typer.Typer(help="Describe and alter topic and broker configs (needs --bootstrap-server).",
                  no_args_is_help=True)


class EntityType(enum.StrEnum):
    topics = "topics"
    brokers = "brokers"
    users = "users"
    clients = "clients"


QUOTA_TYPES = (EntityType.users, EntityType.clients)
EntityTypeOption = Annotated[
    list[EntityType],
    typer.Option("--entity-type", help="topics, brokers, users or clients (users and clients: client quotas; "
                 "give both, each with its --entity-name, for a user's quota on one client id)."),
]
EntityNameOption = Annotated[
    list[str] | None,
    typer.Option("--entity-name", help="Topic name, broker id (brokers: defaults to the broker you reach), "
                 "user or client id (<default>: the default entity)."),
]
EntityDefaultOption = Annotated[
    bool, typer.Option("--entity-default", help="The default user or client id (Kafka's <default> entity).")
]


def _quota_entity(types: list[EntityType], names: list[str] | None, default: bool) -> bool:
    """True for a client quota entity (users/clients); BadParameter for a mix with topics/brokers."""
    quota = [t in QUOTA_TYPES for t in types]
    if all(quota):
        if len(set(types)) != len(types):
            raise typer.BadParameter("each entity type at most once", param_hint="--entity-type")
        return True
    if len(types) != 1 or len(names or []) > 1 or default:
        raise typer.BadParameter("one topic or broker entity (--entity-default is for users and clients)",
                                 param_hint="--entity-type")
    return False


def _entity(remote: Remote, entity_type: EntityType, entity_name: str | None) -> tuple[str, str]:
    """('topic'|'broker', name), checking that a topic exists."""
    if entity_type is EntityType.topics:
        if not entity_name:
            raise typer.BadParameter("name the topic", param_hint="--entity-name")
        remote.partitions(entity_name)
        return "topic", entity_name
    return "broker", entity_name or str(remote.broker_id())


@app.command("describe")
def describe(
    entity_type: EntityTypeOption,
    entity_name: EntityNameOption = None,
    all_: Annotated[bool, typer.Option("--all", help="Every config, not only those set on the entity.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON: name -> {value, source}.")] = False,
    bootstrap: BootstrapOption = None,
    _command_config: CommandConfigOption = None,
    entity_default: EntityDefaultOption = False,
) -> None:
    """Configs set on a topic or broker (--all: every config with its source), or client quotas."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    if _quota_entity(entity_type, entity_name, entity_default):
        _describe_quotas(require_bootstrap(bootstrap, "loglake configs describe"), entity_type, entity_name or [],
                         entity_default, as_json)
        return
    remote = Remote(require_bootstrap(bootstrap, "loglake configs describe"))
    kind, name = _entity(remote, entity_type[0], entity_name[0] if entity_name else None)
    res = ConfigResource(ResourceType.TOPIC if kind == "topic" else ResourceType.BROKER, name)
    futures = remote.admin.describe_configs([res], request_timeout=REMOTE_TIMEOUT_S)
    entries = sources(result(futures[res], f"describe {kind} {name}"))
    shown = {k: v for k, v in sorted(entries.items()) if all_ or v[2]}
    if as_json:
        typer.echo(json.dumps({k: {"value": v, "source": src} for k, (v, src, _o) in shown.items()}, indent=2))
        return
    console = stdout_console()
    what = "configs" if all_ else "dynamic configs"
    console.print(f"{what} of {kind} {name}:{'' if shown else ' none'}", markup=False)
    if not shown:
        return
    table = Table()
    for col in ("name", "value", "source"):
        table.add_column(col)
    for key, (value, source, _over) in shown.items():
        table.add_row(key, "" if value is None else value, source)
    console.print(table)


@app.command("alter")
def alter(
    entity_type: EntityTypeOption,
    entity_name: EntityNameOption = None,
    add_config: Annotated[
        list[str] | None,
        typer.Option("--add-config", help="k=v[,k2=v2] to set (a list value in brackets: k=[a,b]); repeatable."),
    ] = None,
    delete_config: Annotated[
        list[str] | None, typer.Option("--delete-config", help="k[,k2] to remove (back to the default); repeatable.")
    ] = None,
    bootstrap: BootstrapOption = None,
    _command_config: CommandConfigOption = None,
    entity_default: EntityDefaultOption = False,
) -> None:
    """Set and remove configs of a topic or broker (IncrementalAlterConfigs), or client quotas (AlterClientQuotas)."""
    sets = parse_config_list(add_config, "--add-config")
    deletes = parse_name_list(delete_config)
    if not sets and not deletes:
        raise typer.BadParameter("give --add-config k=v and/or --delete-config k", param_hint="--add-config")
    if _quota_entity(entity_type, entity_name, entity_default):
        from loglake.cli import remote_quotas  # kafka-python's codec: only the quota commands pay its import

        parts = remote_quotas.entity_parts([t.value for t in entity_type], entity_name or [], entity_default)
        remote_quotas.alter(require_bootstrap(bootstrap, "loglake configs alter"), parts, sets, deletes)
        stdout_console().print(f"altered quotas of {remote_quotas.entity_text(parts)}: {change_summary(sets, deletes)}",
                               markup=False)
        return
    remote = Remote(require_bootstrap(bootstrap, "loglake configs alter"))
    kind, name = _entity(remote, entity_type[0], entity_name[0] if entity_name else None)
    alter_configs(remote, kind, name, sets, deletes)
    stdout_console().print(f"altered config of {kind} {name}: {change_summary(sets, deletes)}", markup=False)


def _describe_quotas(bootstrap: str, types: list[EntityType], names: list[str], default: bool, as_json: bool) -> None:
    from loglake.cli import remote_quotas

    entries = remote_quotas.describe(bootstrap, [t.value for t in types], names, default)
    if as_json:
        typer.echo(json.dumps(dict(entries), indent=2))
        return
    console = stdout_console()
    console.print(f"client quotas:{'' if entries else ' none'}", markup=False)
    if not entries:
        return
    table = Table()
    for col in ("entity", "quota", "value"):
        table.add_column(col)
    for entity, values in entries:
        for key, value in sorted(values.items()):
            table.add_row(entity, key, str(int(value)) if value.is_integer() else repr(value))
    console.print(table)
