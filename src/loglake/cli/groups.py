"""`loglake groups list|describe|reset-offsets|delete`: consumer and share groups of a running broker.

Like kafka-consumer-groups.sh: describe shows the group's state and members and, per partition,
the committed offset, the log end offset and the lag (end - committed), for every partition of the
topics the group has offsets in or is assigned (a partition without a committed offset shows lag
"-"; the total lag counts it with everything it holds, log end - log start, and says how many
there were); reset-offsets plans new
committed offsets (--dry-run, the default, prints the plan) and with --execute commits them, which
Kafka (and loglake) only allow while the group has no active members.

Share groups (KIP-932) are listed with the consumer groups and described like kafka-share-groups.sh
does: state, members, and per share-partition the start offset (DescribeShareGroupOffsets) and the
log end offset (`loglake.cli.remote_share`; confluent-kafka has no share-group admin calls).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from loglake.cli import remote_share
from loglake.cli.command_config import CommandConfigOption
from loglake.cli.common import CliError, plural, stderr_console, stdout_console
from loglake.cli.remote import (
    ADMIN_CALL_TIMEOUT_S,
    REMOTE_TIMEOUT_S,
    BootstrapOption,
    Remote,
    describe_error,
    error_name,
    require_bootstrap,
    result,
)

app = typer.Typer(help="List, describe, reset and delete consumer and share groups (needs --bootstrap-server).",
                  no_args_is_help=True)

GroupOption = Annotated[str, typer.Option("--group", "-g", help="Consumer group id.")]
#: Groups in these states have no active members: their offsets may be reset (as Kafka's tool).
INACTIVE_STATES = ("EMPTY", "DEAD")


def _state(desc: Any) -> str:
    return str(getattr(desc.state, "name", desc.state))


def _describe(remote: Remote, group: str) -> Any:
    futures = remote.admin.describe_consumer_groups([group], request_timeout=REMOTE_TIMEOUT_S)
    return result(futures[group], f"describe group {group}")


def committed_offsets(remote: Remote, group: str) -> dict[tuple[str, int], int]:
    from confluent_kafka import ConsumerGroupTopicPartitions

    futures = remote.admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)], request_timeout=REMOTE_TIMEOUT_S
    )
    listing = result(futures[group], f"offsets of group {group}")
    return {(tp.topic, tp.partition): tp.offset for tp in listing.topic_partitions or [] if tp.offset >= 0}


class NoSuchGroup(CliError):
    """The broker has no consumer group of this id."""


def _known(remote: Remote, group: str) -> tuple[Any, dict[tuple[str, int], int]]:
    """The group's description and committed offsets; NoSuchGroup when the broker has no such group."""
    desc = _describe(remote, group)
    # A share group's id has no consumer-group offsets to list: the broker answers
    # GROUP_ID_NOT_FOUND (one group namespace), so it is looked for first
    if _state(desc) == "DEAD" and _is_share_group(remote, group):
        raise NoSuchGroup(f"{group!r} is a share group, not a consumer group")
    committed = committed_offsets(remote, group)
    if _state(desc) == "DEAD" and not committed:
        raise NoSuchGroup(f"consumer group {group!r} does not exist")  # nor a share group, in `describe`
    return desc, committed


def _is_share_group(remote: Remote, group: str) -> bool:
    """Whether the broker holds a share group of this id (a broker without share groups: no)."""
    try:
        return remote_share.describe_share_group(remote, group) is not None
    except CliError:  # e.g. a broker that does not serve ShareGroupDescribe
        return False


def _type(listing: Any) -> str:
    """A consumer group's type as ListGroups names it (consumer, classic)."""
    kind = getattr(listing, "type", None)
    return str(getattr(kind, "name", "unknown")).lower()


@app.command("list")
def list_(
    state: Annotated[bool, typer.Option("--state", help="Also print each group's state.")] = False,
    kind: Annotated[
        bool, typer.Option("--type", help="Also print each group's type (consumer, classic, share).")
    ] = False,
    bootstrap: BootstrapOption = None,
_command_config: CommandConfigOption = None,
) -> None:
    """Group ids, one per line (with --state: id and state; with --type: and the type last)."""
    remote = Remote(require_bootstrap(bootstrap, "loglake groups list"))
    listing = result(remote.admin.list_consumer_groups(request_timeout=REMOTE_TIMEOUT_S), "list groups")
    rows = [(g.group_id, _state(g), _type(g)) for g in listing.valid]
    try:
        rows += [(g, st, remote_share.SHARE) for g, st in remote_share.list_share_groups(remote)]
    except CliError as exc:  # e.g. a --command-config setting only librdkafka's connections know
        stderr_console().print(f"warning: share groups not listed: {exc}", style="yellow", markup=False)
    for group_id, group_state, group_type in sorted(rows):
        typer.echo(" ".join([group_id] + ([group_state] if state else []) + ([group_type] if kind else [])))


def group_lag(remote: Remote, group: str) -> dict[str, Any]:
    """A group as a JSON-able dict: state, members, and per partition committed / end / lag."""
    desc, committed = _known(remote, group)
    owner: dict[tuple[str, int], Any] = {}
    members = []
    for m in desc.members:
        tps = list(m.assignment.topic_partitions) if m.assignment else []
        for tp in tps:
            owner[(tp.topic, tp.partition)] = m
        members.append(
            {
                "member_id": m.member_id,
                "client_id": m.client_id,
                "host": m.host,
                "assignment": [[tp.topic, tp.partition] for tp in tps],
            }
        )
    # Every partition of every topic the group has offsets in or is assigned, as a lag total must
    # see them all: a partition nobody committed in yet has lag "-" in its row, as in Kafka's tool.
    keys = set(committed) | set(owner)
    starts: dict[tuple[str, int], int] = {}
    ends: dict[tuple[str, int], int] = {}
    for topic in sorted({t for t, _ in keys}):
        parts = sorted(set(remote.partitions(topic)) | {p for t, p in keys if t == topic})
        keys |= {(topic, p) for p in parts}
        starts.update({(topic, p): o for p, o in remote.offsets(topic, parts, "earliest").items()})
        ends.update({(topic, p): o for p, o in remote.offsets(topic, parts, "latest").items()})
    partitions = []
    for topic, p in sorted(keys):
        current = committed.get((topic, p))
        end = ends.get((topic, p))
        m = owner.get((topic, p))
        partitions.append(
            {
                "topic": topic,
                "partition": p,
                "committed_offset": current,
                "log_start_offset": starts.get((topic, p)),
                "log_end_offset": end,
                "lag": None if current is None or end is None else max(0, end - current),
                "member_id": m.member_id if m else None,
                "client_id": m.client_id if m else None,
                "host": m.host if m else None,
            }
        )
    total, uncommitted = total_lag(partitions)
    return {
        "group": group,
        "state": _state(desc),
        "members": members,
        "partitions": partitions,
        "total_lag": total,
        "partitions_without_commit": uncommitted,
    }


def total_lag(partitions: list[dict[str, Any]]) -> tuple[int, int]:
    """(total lag, partitions without a committed offset). Such a partition counts with all it
    holds (log end - log start): what a consumer of the group starting there from the earliest
    offset has to read, which is also the most it can lag."""
    total = uncommitted = 0
    for row in partitions:
        if row["lag"] is not None:
            total += row["lag"]
        elif row["log_end_offset"] is not None:
            uncommitted += 1
            total += max(0, row["log_end_offset"] - (row["log_start_offset"] or 0))
    return total, uncommitted


def _dash(v: Any) -> str:
    return "-" if v is None else str(v)


@app.command("describe")
def describe(
    group: GroupOption,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    bootstrap: BootstrapOption = None,
_command_config: CommandConfigOption = None,
) -> None:
    """State, members (client id, host, assignment), and committed offset, log end and lag per
    partition; for a share group, each share-partition's start offset and log end."""
    remote = Remote(require_bootstrap(bootstrap, "loglake groups describe"))
    try:
        doc = group_lag(remote, group)
    except NoSuchGroup:
        share = remote_share.describe_share_group(remote, group)
        if share is None:
            raise
        _print_share(share, as_json=as_json)
        return
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    console = stdout_console()
    uncommitted = doc["partitions_without_commit"]
    note = (
        f" ({plural(uncommitted, 'partition')} without a committed offset counted from the log start)"
        if uncommitted else ""
    )
    console.print(
        f"group {group}  state {doc['state']}  members {len(doc['members'])}  total lag {doc['total_lag']}{note}",
        markup=False,
    )
    if doc["members"]:
        console.print(_members_table(doc["members"]))
    offsets = Table(title="offsets", title_justify="left")
    for col in ("topic", "partition", "committed", "log end", "lag", "client id", "host"):
        offsets.add_column(col, justify="right" if col in ("partition", "committed", "log end", "lag") else "left")
    for p in doc["partitions"]:
        offsets.add_row(p["topic"], str(p["partition"]), _dash(p["committed_offset"]), _dash(p["log_end_offset"]),
                        _dash(p["lag"]), _dash(p["client_id"]), _dash(p["host"]))
    console.print(offsets)


def _members_table(members: list[dict[str, Any]]) -> Table:
    table = Table(title="members", title_justify="left")
    for col in ("member id", "client id", "host", "assignment"):
        table.add_column(col)
    for m in members:
        table.add_row(m["member_id"], m["client_id"], m["host"],
                      ", ".join(f"{t}:{p}" for t, p in m["assignment"]) or "-")
    return table


def _print_share(doc: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    console = stdout_console()
    console.print(f"group {doc['group']}  type share  state {doc['state']}  members {len(doc['members'])}",
                  markup=False)
    if doc["members"]:
        console.print(_members_table(doc["members"]))
    offsets = Table(title="share-partitions", title_justify="left")
    for col in ("topic", "partition", "start offset", "log end"):
        offsets.add_column(col, justify="left" if col == "topic" else "right")
    for p in doc["partitions"]:
        offsets.add_row(p["topic"], str(p["partition"]), _dash(p["start_offset"]), _dash(p["log_end_offset"]))
    console.print(offsets)


# ---- reset-offsets ------------------------------------------------------------------------------


def parse_topic_spec(raw: str) -> tuple[str, list[int] | None]:
    """`topic` or `topic:0,2` -> (topic, partitions or None for all)."""
    topic, sep, parts = raw.partition(":")
    if not topic:
        raise typer.BadParameter(f"expected TOPIC or TOPIC:P[,P...], got {raw!r}", param_hint="--topic")
    if not sep:
        return topic, None
    try:
        return topic, sorted({int(p) for p in parts.split(",") if p.strip()})
    except ValueError:
        raise typer.BadParameter(f"partitions must be integers, got {raw!r}", param_hint="--topic") from None


def plan_reset(
    remote: Remote,
    committed: dict[tuple[str, int], int],
    targets: list[tuple[str, list[int]]],
    how: str,
    value: Any,
) -> list[tuple[str, int, int | None, int]]:
    """(topic, partition, current committed or None, new offset) for each target partition."""
    plan: list[tuple[str, int, int | None, int]] = []
    for topic, parts in targets:
        starts = remote.offsets(topic, parts, "earliest")
        ends = remote.offsets(topic, parts, "latest")
        at_time = remote.offsets(topic, parts, int(value.timestamp() * 1000)) if how == "to-datetime" else {}
        for p in parts:
            current = committed.get((topic, p))
            if how == "to-earliest":
                new = starts[p]
            elif how == "to-latest":
                new = ends[p]
            elif how == "to-datetime":
                new = at_time[p] if at_time[p] >= 0 else ends[p]  # nothing at or after it: the end
            elif how == "to-offset":
                new = int(value)
            else:  # shift-by
                if current is None:
                    raise CliError(f"cannot shift {topic}:{p}: the group has no committed offset there")
                new = current + int(value)
            clamped = min(max(new, starts[p]), ends[p])  # as Kafka's tool, which warns as below
            if clamped != new and how in ("to-offset", "shift-by"):
                side = "lower than the earliest" if new < clamped else "higher than the latest"
                stderr_console().print(
                    f"warning: new offset ({new}) is {side} offset for {topic}:{p}; it will be set to {clamped}",
                    style="yellow",
                    markup=False,
                )
            plan.append((topic, p, current, clamped))
    return plan


@app.command("reset-offsets")
def reset_offsets(
    group: GroupOption,
    topic: Annotated[
        list[str] | None, typer.Option("--topic", "-t", help="TOPIC or TOPIC:P[,P...] (repeatable).")
    ] = None,
    all_topics: Annotated[bool, typer.Option("--all-topics", help="Every topic the group has offsets for.")] = False,
    to_earliest: Annotated[bool, typer.Option("--to-earliest", help="Each partition's log start.")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest", help="Each partition's log end.")] = False,
    to_datetime: Annotated[
        str | None, typer.Option("--to-datetime", help="The first offset at or after this ISO-8601 time.")
    ] = None,
    to_offset: Annotated[int | None, typer.Option("--to-offset", help="This offset (clamped to the log).")] = None,
    shift_by: Annotated[
        int | None, typer.Option("--shift-by", help="Committed offset plus N (negative: back; clamped).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only print the plan (the default).")] = False,
    execute: Annotated[bool, typer.Option("--execute", help="Commit the new offsets.")] = False,
    bootstrap: BootstrapOption = None,
_command_config: CommandConfigOption = None,
) -> None:
    """Move a group's committed offsets; the group must have no active members."""
    chosen: list[tuple[str, Any]] = [
        (name, value)
        for name, value, given in (
            ("to-earliest", None, to_earliest),
            ("to-latest", None, to_latest),
            ("to-datetime", to_datetime, to_datetime is not None),
            ("to-offset", to_offset, to_offset is not None),
            ("shift-by", shift_by, shift_by is not None),
        )
        if given
    ]
    if len(chosen) != 1:
        raise typer.BadParameter(
            "give exactly one of --to-earliest, --to-latest, --to-datetime, --to-offset, --shift-by"
        )
    how, value = chosen[0]
    if how == "to-datetime":
        try:
            value = datetime.fromisoformat(str(value))
        except ValueError:
            raise typer.BadParameter(f"not an ISO-8601 time: {value!r}", param_hint="--to-datetime") from None
    if dry_run and execute:
        raise typer.BadParameter("give --dry-run or --execute, not both", param_hint="--execute")
    if bool(topic) == all_topics:
        raise typer.BadParameter("give --topic (repeatable) or --all-topics", param_hint="--topic")
    remote = Remote(require_bootstrap(bootstrap, "loglake groups reset-offsets"))
    desc = _describe(remote, group)
    state = _state(desc)
    if state not in INACTIVE_STATES:
        raise CliError(
            f"group {group!r} is {state} with {plural(len(desc.members), 'active member')}: offsets can only be reset "
            "while it is inactive (stop its consumers first)"
        )
    committed = committed_offsets(remote, group)
    targets: list[tuple[str, list[int]]] = []
    if all_topics:
        for t in sorted({t for t, _ in committed}):
            targets.append((t, sorted(p for tt, p in committed if tt == t)))
    for raw in topic or []:
        name, parts = parse_topic_spec(raw)
        known = remote.partitions(name)
        for p in parts or []:
            if p not in known:
                raise CliError(f"topic {name!r} has no partition {p} (it has {len(known)})")
        targets.append((name, parts if parts is not None else known))
    plan = plan_reset(remote, committed, targets, how, value)
    _print_plan(group, plan, executed=execute)
    if not execute:
        stderr_console().print("dry run: nothing changed (add --execute to commit these offsets)", style="yellow",
                               markup=False)
        return
    _commit(remote, group, plan)
    stdout_console().print(f"reset {plural(len(plan), 'partition')} of group {group}", markup=False)


def _print_plan(group: str, plan: list[tuple[str, int, int | None, int]], *, executed: bool) -> None:
    table = Table(title=f"group {group}: {'new' if executed else 'planned'} offsets", title_justify="left")
    for col in ("topic", "partition", "committed", "new offset"):
        table.add_column(col, justify="left" if col == "topic" else "right")
    for t, p, current, new in plan:
        table.add_row(t, str(p), _dash(current), str(new))
    stdout_console().print(table)


def _commit(remote: Remote, group: str, plan: list[tuple[str, int, int | None, int]]) -> None:
    """AlterConsumerGroupOffsets, one topic per request (a progress bar on a terminal)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    console = stderr_console()
    topics = sorted({t for t, *_ in plan})
    with Progress(TextColumn("committing"), BarColumn(), MofNCompleteColumn(), console=console, transient=True,
                  disable=not console.is_terminal) as progress:
        task = progress.add_task("commit", total=len(plan))
        for t in topics:
            tps = [TopicPartition(tt, p, new) for tt, p, _c, new in plan if tt == t]
            futures = remote.admin.alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group, tps)], request_timeout=REMOTE_TIMEOUT_S
            )
            done = result(futures[group], f"reset offsets of group {group}")
            for tp in done.topic_partitions or []:
                if tp.error is not None:
                    raise CliError(f"reset offsets of group {group}: {t}:{tp.partition}: {tp.error.str()}")
            progress.advance(task, len(tps))


@app.command("delete")
def delete(
    group: Annotated[list[str], typer.Option("--group", "-g", help="Consumer group id (repeatable).")],
    bootstrap: BootstrapOption = None,
_command_config: CommandConfigOption = None,
) -> None:
    """Delete groups and their committed offsets (only groups without active members)."""
    remote = Remote(require_bootstrap(bootstrap, "loglake groups delete"))
    futures = remote.admin.delete_consumer_groups(group, request_timeout=REMOTE_TIMEOUT_S)
    for g in group:
        try:
            futures[g].result(timeout=ADMIN_CALL_TIMEOUT_S)
        except Exception as exc:
            name = error_name(exc)
            if name == "GROUP_ID_NOT_FOUND":
                raise CliError(f"consumer group {g!r} does not exist") from None
            if name == "NON_EMPTY_GROUP":
                raise CliError(f"group {g!r} has active members: stop its consumers before deleting it") from None
            raise CliError(f"delete group {g}: {describe_error(exc)}") from None
        stdout_console().print(f"deleted group {g}", markup=False)
