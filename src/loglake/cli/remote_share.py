"""Share groups (KIP-932) for `loglake groups`: ListGroups, ShareGroupDescribe and
DescribeShareGroupOffsets over the Kafka protocol.

confluent-kafka 2.16's AdminClient lists and describes consumer groups only (its group types have
no `share`), so these requests are sent here (`loglake.cli.remote_raw`, with TLS and SASL from
`--command-config`): ListGroups to every broker (each lists the groups it coordinates), the
describes to the group's coordinator (FindCoordinator on the bootstrap broker). A share group
exists while it has members or stored share-partition states, so a group without members (after
a broker restart, say) is described from its offsets alone, as Empty.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from loglake.broker.protocol.api_keys import ApiKey
from loglake.cli.common import CliError
from loglake.cli.remote import Remote
from loglake.cli.remote_raw import Connection
from loglake.cli.remote_raw import error_name as _error
from loglake.kafka_errors import ErrorCode

#: Versions sent: ListGroups v5 (types filter), FindCoordinator v1 (one key), and the share APIs'
#: only versions the broker serves.
LIST_GROUPS_VERSION, FIND_COORDINATOR_VERSION = 5, 1
SHARE_GROUP_DESCRIBE_VERSION, DESCRIBE_SHARE_GROUP_OFFSETS_VERSION = 1, 0
#: ListGroups' and GroupType's name of a share group.
SHARE = "share"
WHAT = "loglake groups (share groups)"

__all__ = ["SHARE", "describe_share_group", "list_share_groups"]


def _brokers(remote: Remote) -> list[str]:
    return [f"{b.host}:{b.port}" for _, b in sorted(remote.metadata().brokers.items())]


def list_share_groups(remote: Remote) -> list[tuple[str, str]]:
    """(group id, state as the CLI prints states: STABLE, EMPTY) of every share group, by id."""
    out: dict[str, str] = {}
    for address in _brokers(remote):
        with Connection(address, WHAT) as conn:
            got = conn.request(ApiKey.LIST_GROUPS, LIST_GROUPS_VERSION, states_filter=[], types_filter=[SHARE])
        if got.error_code != ErrorCode.NONE:
            raise CliError(f"list share groups at {address}: {_error(got.error_code)}")
        for g in got.groups:
            out[g.group_id] = g.group_state.upper()
    return sorted(out.items())


def _coordinator(remote: Remote, group: str) -> str:
    with Connection(remote.bootstrap, WHAT) as conn:
        found = conn.request(ApiKey.FIND_COORDINATOR, FIND_COORDINATOR_VERSION, key=group, key_type=0)
    if found.error_code != ErrorCode.NONE:
        raise CliError(f"find the coordinator of group {group!r}: {_error(found.error_code)}")
    return f"{found.host}:{found.port}"


def describe_share_group(remote: Remote, group: str) -> dict[str, Any] | None:
    """The share group as a JSON-able dict (type, state, members, and per share-partition the
    start offset and the log end offset), None when `group` is no share group."""
    with Connection(_coordinator(remote, group), WHAT) as conn:
        described = conn.request(ApiKey.SHARE_GROUP_DESCRIBE, SHARE_GROUP_DESCRIBE_VERSION, group_ids=[group],
                                 include_authorized_operations=False).groups[0]
        offsets = conn.request(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, DESCRIBE_SHARE_GROUP_OFFSETS_VERSION,
                               groups=[{"group_id": group, "topics": None}]).groups[0]
    for code in (described.error_code, offsets.error_code):
        if code not in (ErrorCode.NONE, ErrorCode.GROUP_ID_NOT_FOUND):
            raise CliError(f"describe share group {group!r}: {_error(code)}")
    if described.error_code != ErrorCode.NONE and offsets.error_code != ErrorCode.NONE:
        return None
    members = []
    if described.error_code == ErrorCode.NONE:
        for m in described.members:
            members.append({
                "member_id": m.member_id,
                "client_id": m.client_id,
                "host": m.client_host,
                "assignment": sorted([t.topic_name, p] for t in m.assignment.topic_partitions for p in t.partitions),
            })
    starts: dict[tuple[str, int], int] = {}
    if offsets.error_code == ErrorCode.NONE:
        for t in offsets.topics:
            for p in t.partitions:
                if p.error_code == ErrorCode.NONE:
                    starts[(t.topic_name, p.partition_index)] = p.start_offset
    # every partition a member is assigned or the group has state for
    keys = set(starts) | {(t, p) for m in members for t, p in m["assignment"]}
    ends: dict[tuple[str, int], int] = {}
    for topic in sorted({t for t, _ in keys}):
        ends.update({(topic, p): o for p, o in remote.offsets(topic, _parts(keys, topic), "latest").items()})
    return {
        "group": group,
        "type": SHARE,
        "state": described.group_state.upper() if described.error_code == ErrorCode.NONE else "EMPTY",
        "members": members,
        "partitions": [
            {
                "topic": topic,
                "partition": p,
                # -1 from the broker: no state stored (uninitialised, or not fetched from yet)
                "start_offset": starts[(topic, p)] if starts.get((topic, p), -1) >= 0 else None,
                "log_end_offset": ends.get((topic, p)),
            }
            for topic, p in sorted(keys)
        ],
    }


def _parts(keys: Iterable[tuple[str, int]], topic: str) -> list[int]:
    return sorted(p for t, p in keys if t == topic)
