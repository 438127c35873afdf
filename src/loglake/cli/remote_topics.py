"""`loglake topics ... --bootstrap-server`: the topic commands through a running broker's AdminClient."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.table import Table

from loglake.cli.common import plural, stdout_console
from loglake.cli.remote import REMOTE_TIMEOUT_S, Remote, result, sources


def create(bootstrap: str, name: str, partitions: int, overrides: dict[str, str], replication_factor: int = -1) -> None:
    from confluent_kafka.admin import NewTopic

    remote = Remote(bootstrap)
    topic = NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=overrides)
    futures = remote.admin.create_topics([topic], request_timeout=REMOTE_TIMEOUT_S)
    result(futures[name], f"create topic {name}")
    extra = f" with {', '.join(f'{k}={v}' for k, v in overrides.items())}" if overrides else ""
    stdout_console().print(f"created topic {name} ({plural(partitions, 'partition')}){extra}", markup=False)


def list_(bootstrap: str) -> None:
    for name in Remote(bootstrap).topic_names():
        typer.echo(name)


def topic_config(remote: Remote, name: str) -> dict[str, tuple[str | None, str, bool]]:
    from confluent_kafka.admin import ConfigResource, ResourceType

    res = ConfigResource(ResourceType.TOPIC, name)
    futures = remote.admin.describe_configs([res], request_timeout=REMOTE_TIMEOUT_S)
    return sources(result(futures[res], f"describe topic {name}"))


def describe(bootstrap: str, name: str, as_json: bool) -> None:
    remote = Remote(bootstrap)
    parts = remote.partitions(name)
    starts = remote.offsets(name, parts, "earliest")
    ends = remote.offsets(name, parts, "latest")
    config = topic_config(remote, name)
    if as_json:
        doc: dict[str, Any] = {
            "name": name,
            "partitions": [
                {"partition": p, "log_start_offset": starts[p], "high_watermark": ends[p]} for p in parts
            ],
            "config": {k: v for k, (v, _src, _o) in config.items()},
            "overrides": {k: v for k, (v, _src, over) in config.items() if over},
        }
        typer.echo(json.dumps(doc, indent=2))
        return
    console = stdout_console()
    console.print(f"topic {name}  partitions {len(parts)}  (broker {bootstrap})", markup=False)
    table = Table(title="partitions", title_justify="left")
    for col in ("partition", "log start", "high watermark", "records"):
        table.add_column(col, justify="right")
    for p in parts:
        table.add_row(str(p), str(starts[p]), str(ends[p]), str(ends[p] - starts[p]))
    console.print(table)
    cfg = Table(title="config (* = set on this topic)", title_justify="left")
    cfg.add_column("name")
    cfg.add_column("value")
    cfg.add_column("", justify="center")
    for key in sorted(config):
        value, _source, override = config[key]
        cfg.add_row(key, value if value is not None else "", "*" if override else "")
    console.print(cfg)


def delete(bootstrap: str, name: str) -> None:
    remote = Remote(bootstrap)
    futures = remote.admin.delete_topics([name], request_timeout=REMOTE_TIMEOUT_S)
    result(futures[name], f"delete topic {name}")
    stdout_console().print(f"deleted topic {name}", markup=False)


def alter_configs(remote: Remote, resource_type: str, name: str, sets: dict[str, str], deletes: list[str]) -> None:
    """IncrementalAlterConfigs: SET each of `sets`, DELETE each of `deletes` (topic or broker)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    ops = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in sets.items()]
    ops += [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in deletes]
    rtype = ResourceType.TOPIC if resource_type == "topic" else ResourceType.BROKER
    res = ConfigResource(rtype, name, incremental_configs=ops)
    futures = remote.admin.incremental_alter_configs([res], request_timeout=REMOTE_TIMEOUT_S)
    result(futures[res], f"alter config of {resource_type} {name}")


def alter(bootstrap: str, name: str, sets: dict[str, str], deletes: list[str]) -> None:
    remote = Remote(bootstrap)
    remote.partitions(name)  # unknown topic: say so before trying to alter it
    alter_configs(remote, "topic", name, sets, deletes)
    stdout_console().print(f"altered config of topic {name}: {change_summary(sets, deletes)}", markup=False)


def change_summary(sets: dict[str, str], deletes: list[str]) -> str:
    return ", ".join([f"{k}={v}" for k, v in sets.items()] + [f"-{k}" for k in deletes])


def add_partitions(bootstrap: str, name: str, total: int) -> None:
    from confluent_kafka.admin import NewPartitions

    remote = Remote(bootstrap)
    before = len(remote.partitions(name))
    futures = remote.admin.create_partitions([NewPartitions(name, total)], request_timeout=REMOTE_TIMEOUT_S)
    result(futures[name], f"add partitions to {name}")
    stdout_console().print(f"topic {name}: {before} -> {plural(total, 'partition')}", markup=False)
