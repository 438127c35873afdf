"""`loglake topics create|list|describe|alter|add-partitions|delete`.

Each works on a stopped data directory (--data-dir) or, with --bootstrap-server, through a
running broker (`loglake.cli.remote_topics`).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from loglake.cli import remote_topics
from loglake.cli.command_config import CommandConfigOption
from loglake.cli.common import (
    DEFAULT_DATA_DIR,
    CliError,
    DataDirOption,
    format_bytes,
    open_log,
    parse_pairs,
    plural,
    stdout_console,
)
from loglake.cli.remote import BootstrapOption, parse_name_list

app = typer.Typer(
    help="Create, list, describe, alter and delete topics (a data directory or --bootstrap-server).",
    no_args_is_help=True,
)


@app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="Topic name ([a-zA-Z0-9._-], at most 249 characters).")],
    partitions: Annotated[int, typer.Option("--partitions", "-p", min=1, help="Number of partitions.")] = 1,
    config: Annotated[
        list[str] | None, typer.Option("--config", "-c", help="Topic config k=v (repeatable).")
    ] = None,
    replication_factor: Annotated[
        int | None,
        typer.Option(
            "--replication-factor",
            help="Replicas per partition, as kafka-topics.sh takes it: 1 (each partition has one replica); "
            "more is refused as Kafka refuses it with too few brokers.",
        ),
    ] = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    bootstrap: BootstrapOption = None,
_command_config: CommandConfigOption = None,
) -> None:
    """Create a topic."""
    overrides = parse_pairs(config, "--config")
    if bootstrap:
        # the broker decides, and answers as Kafka does (INVALID_REPLICATION_FACTOR)
        return remote_topics.create(bootstrap, name, partitions, overrides, replication_factor or -1)
    if replication_factor is not None:
        # the broker's wording; its handler tables are imported only here (0.3 s)
        from loglake.broker.handlers.admin_topics import replication_factor_problem

        problem = replication_factor_problem(replication_factor)
        if problem is not None:
            raise CliError(f"create topic {name}: {problem}")
    with open_log(data_dir, must_exist=False) as log:
        info = log.create_topic(name, partitions=partitions, config=overrides)
    extra = f" with {', '.join(f'{k}={v}' for k, v in overrides.items())}" if overrides else ""
    stdout_console().print(
        f"created topic {info.name} ({plural(info.partitions, 'partition')}){extra}",
        markup=False,
    )


@app.command("list")
def list_(
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    bootstrap: BootstrapOption = None,
    _command_config: CommandConfigOption = None,
) -> None:
    """List topic names, one per line."""
    if bootstrap:
        return remote_topics.list_(bootstrap)
    with open_log(data_dir, must_exist=True) as log:
        names = log.list_topics()
    for name in names:
        typer.echo(name)


@app.command("describe")
def describe(
    name: Annotated[str, typer.Argument(help="Topic name.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    bootstrap: BootstrapOption = None,
_command_config: CommandConfigOption = None,
) -> None:
    """Partitions (log start, high watermark, segments, bytes) and effective config."""
    if bootstrap:
        return remote_topics.describe(bootstrap, name, as_json)
    with open_log(data_dir, must_exist=True) as log:
        d = log.describe_topic(name)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "name": d.name,
                    "topic_id": d.topic_id,
                    "partitions": [
                        {
                            "partition": p.partition,
                            "log_start_offset": p.log_start_offset,
                            "high_watermark": p.high_watermark,
                            "segments": p.segments,
                            "sealed_bytes": p.sealed_bytes,
                            "unsealed_bytes": p.unsealed_bytes,
                            "clean_end": p.clean_end,
                            "dirty_ratio": round(p.dirty_ratio, 4),
                        }
                        for p in d.partitions
                    ],
                    "config": d.config,
                    "overrides": d.overrides,
                },
                indent=2,
            )
        )
        return
    console = stdout_console()
    console.print(f"topic {d.name}  id {d.topic_id}  partitions {len(d.partitions)}", markup=False)
    parts = Table(title="partitions", title_justify="left")
    for col in ("partition", "log start", "high watermark", "records", "segments", "sealed", "unsealed", "dirty ratio"):
        parts.add_column(col, justify="right")
    for p in d.partitions:
        parts.add_row(
            str(p.partition),
            str(p.log_start_offset),
            str(p.high_watermark),
            str(p.high_watermark - p.log_start_offset),
            str(p.segments),
            format_bytes(p.sealed_bytes),
            format_bytes(p.unsealed_bytes),
            f"{p.dirty_ratio:.2f}",
        )
    console.print(parts)
    cfg = Table(title="config (* = set on this topic)", title_justify="left")
    cfg.add_column("name")
    cfg.add_column("value")
    cfg.add_column("", justify="center")
    for key in sorted(d.config):
        cfg.add_row(key, d.config[key], "*" if key in d.overrides else "")
    console.print(cfg)


@app.command("delete")
def delete(
    name: Annotated[str, typer.Argument(help="Topic name.")],
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    bootstrap: BootstrapOption = None,
_command_config: CommandConfigOption = None,
) -> None:
    """Delete a topic and all its data."""
    if bootstrap:
        return remote_topics.delete(bootstrap, name)
    with open_log(data_dir, must_exist=True) as log:
        log.delete_topic(name)
    stdout_console().print(f"deleted topic {name}", markup=False)


@app.command("alter")
def alter(
    name: Annotated[str, typer.Argument(help="Topic name.")],
    config: Annotated[
        list[str] | None, typer.Option("--config", "-c", help="Set topic config k=v (repeatable).")
    ] = None,
    delete_config: Annotated[
        list[str] | None,
        typer.Option("--delete-config", help="Remove the topic's override of k (back to the default; repeatable)."),
    ] = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    bootstrap: BootstrapOption = None,
_command_config: CommandConfigOption = None,
) -> None:
    """Set or remove topic config overrides (other overrides are kept)."""
    sets = parse_pairs(config, "--config")
    deletes = parse_name_list(delete_config)
    if not sets and not deletes:
        raise typer.BadParameter("give at least one --config k=v or --delete-config k", param_hint="--config")
    if bootstrap:
        return remote_topics.alter(bootstrap, name, sets, deletes)
    with open_log(data_dir, must_exist=True) as log:
        overrides = dict(log.describe_topic(name).overrides)
        overrides.update(sets)
        for key in deletes:
            overrides.pop(key, None)
        log.engine.alter_topic_config(name, overrides)
    stdout_console().print(
        f"altered config of topic {name}: {remote_topics.change_summary(sets, deletes)}", markup=False
    )


@app.command("add-partitions")
def add_partitions(
    name: Annotated[str, typer.Argument(help="Topic name.")],
    partitions: Annotated[
        int, typer.Option("--partitions", "-p", min=1, help="The new total partition count (larger than today's).")
    ],
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    bootstrap: BootstrapOption = None,
_command_config: CommandConfigOption = None,
) -> None:
    """Raise a topic's partition count to --partitions (as kafka-topics.sh --alter --partitions)."""
    if bootstrap:
        return remote_topics.add_partitions(bootstrap, name, partitions)
    with open_log(data_dir, must_exist=True) as log:
        before = len(log.describe_topic(name).partitions)
        log.engine.create_partitions(name, partitions)
    stdout_console().print(f"topic {name}: {before} -> {plural(partitions, 'partition')}", markup=False)
