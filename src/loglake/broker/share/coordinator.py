"""The share coordinator: share-group membership by heartbeat, share sessions, share-partitions.

Membership (ShareGroupHeartbeat, KIP-848 style): a member joins with epoch 0 under the member id
it generated, heartbeats with its epoch, leaves with -1, and is removed after its group's
session timeout (`share.session.timeout.ms`, else the broker's) of silence; each heartbeat's
answer carries the group's heartbeat interval (`share.heartbeat.interval.ms`, else the broker's).
Assignment is the server's and is not exclusive: every member gets every partition of the topics
it subscribes to (a share group spreads records, not partitions). The group epoch moves with every join, leave and subscription change; a member's
epoch becomes the group's when its assignment changes.

Share-partitions (`SharePartition`) live where ShareFetch is served, on the partition's leader:
loaded from the store on first use, initialised from `share.auto.offset.reset` (latest by
default) when the store has none, and saved whole after every change of what would be stored.

Share sessions (ShareFetch's `ShareSessionEpoch`): per (group, member) the partitions the member
fetches, opened with epoch 0, continued with epoch + 1, closed with -1 (which releases what the
member still holds here). At most `max_share_sessions`.

Everything here runs on the broker's event loop; no method blocks.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from loglake.broker.share.limits import GroupShareLimits, ShareLimits
from loglake.broker.share.partition import SharePartition
from loglake.broker.share.states import RecordState
from loglake.broker.share.store import ShareKey, ShareStore
from loglake.errors import MetaFencedError
from loglake.kafka_errors import ErrorCode

log = logging.getLogger("loglake.broker.share")

#: Group states as ShareGroupDescribe and ListGroups name them (Kafka's ShareGroupState).
EMPTY, STABLE = "Empty", "Stable"
#: The assignor ShareGroupDescribe names (Kafka's default share assignor is "simple").
ASSIGNOR = "simple"
#: How often (ms) silent members are looked for.
REAP_INTERVAL_MS = 1000
INT32_MAX = 2**31 - 1


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclass(slots=True)
class ShareMember:
    member_id: str
    epoch: int
    client_id: str
    client_host: str
    rack_id: str | None
    subscribed: list[str]
    last_seen_ms: int
    previous_epoch: int = 0
    #: topic id hex -> partitions: the assignment last given to the member
    assignment: dict[str, list[int]] = field(default_factory=dict)


@dataclass(slots=True)
class ShareGroup:
    group_id: str
    epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)

    @property
    def state(self) -> str:
        return STABLE if self.members else EMPTY


@dataclass(frozen=True, slots=True)
class Heartbeat:
    group_id: str
    member_id: str
    member_epoch: int
    rack_id: str | None
    subscribed: list[str] | None
    client_id: str
    client_host: str


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    error_code: int
    member_id: str | None
    member_epoch: int
    heartbeat_interval_ms: int
    error_message: str | None = None
    #: topic id hex -> partitions, when the member must be told (joined, or it changed)
    assignment: dict[str, list[int]] | None = None


@dataclass(slots=True)
class ShareSession:
    epoch: int
    #: when a request last used it (monotonic ms): one idle past the session timeout is dropped
    used_ms: int = 0
    #: (topic id hex, partition) the member fetches through this session
    partitions: set[tuple[str, int]] = field(default_factory=set)


class ShareCoordinator:
    def __init__(
        self,
        store: ShareStore,
        limits: ShareLimits,
        *,
        topic_partitions: Callable[[str], tuple[str, int] | None],
        initial_offset: Callable[[str, int, str], int],
        auto_offset_reset: Callable[[str], str] = lambda group_id: "latest",
        group_limits: Callable[[str], GroupShareLimits] | None = None,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        """`topic_partitions(name)`: (topic id hex, partition count), None if no such topic;
        `initial_offset(topic id hex, partition, "latest"|"earliest")`: where a new share-partition
        starts; `auto_offset_reset(group)`: the group's `share.auto.offset.reset`;
        `group_limits(group)`: its share.record.lock.duration.ms, share.delivery.count.limit,
        share.partition.max.record.locks, share.session.timeout.ms and share.heartbeat.interval.ms,
        by default `limits`' for every group."""
        self.store = store
        self.limits = limits
        self._group_limits = group_limits or (lambda _g: limits.of_group())
        self._topic_partitions = topic_partitions
        self._initial_offset = initial_offset
        self._auto_offset_reset = auto_offset_reset
        self.clock = clock
        self.groups: dict[str, ShareGroup] = {}
        self.sessions: dict[tuple[str, str], ShareSession] = {}
        self.partitions: dict[ShareKey, SharePartition] = {}
        #: the partition's leader epoch each share-partition was loaded at, and its stored `gen`
        self._epochs: dict[ShareKey, int] = {}
        self._gens: dict[ShareKey, int] = {}
        #: share-partitions whose write the store refused (another broker leads the partition now):
        #: added from the store's thread, so only set.add/discard (atomic) touch it
        self._fenced: set[ShareKey] = set()
        self._reaped_ms = 0

    # ---- membership --------------------------------------------------------------------------

    def heartbeat(self, hb: Heartbeat) -> HeartbeatResult:
        now = self.clock()
        self.reap(now)
        interval = self._group_limits(hb.group_id).heartbeat_interval_ms  # share.heartbeat.interval.ms
        group = self.groups.get(hb.group_id)
        if hb.member_epoch == -1:  # leave
            if group is not None and hb.member_id in group.members:
                self._remove(group, hb.member_id, "left")
            return HeartbeatResult(ErrorCode.NONE, hb.member_id, -1, interval)
        if hb.subscribed is not None and len(hb.subscribed) > self.limits.max_subscribed_topics:
            return HeartbeatResult(ErrorCode.INVALID_REQUEST, hb.member_id, hb.member_epoch, interval,
                                   f"subscribes to more than {self.limits.max_subscribed_topics} topics")
        if hb.member_epoch == 0:
            if group is None:
                if len(self.groups) >= self.limits.max_groups:
                    self._forget_an_empty_group()
                if len(self.groups) >= self.limits.max_groups:
                    return HeartbeatResult(ErrorCode.GROUP_MAX_SIZE_REACHED, hb.member_id, 0, interval,
                                           f"this broker coordinates {self.limits.max_groups} share groups already")
                group = self.groups[hb.group_id] = ShareGroup(hb.group_id)
            member_id = hb.member_id or str(uuid.uuid4())
            member = group.members.get(member_id)
            if member is None:
                if len(group.members) >= self.limits.max_size:
                    return HeartbeatResult(ErrorCode.GROUP_MAX_SIZE_REACHED, member_id, 0, interval,
                                           f"the share group has {self.limits.max_size} members (group.share.max.size)")
                if not hb.subscribed:
                    return HeartbeatResult(ErrorCode.INVALID_REQUEST, member_id, 0, interval,
                                           "SubscribedTopicNames must be set in the first request")
                group.epoch += 1
                member = group.members[member_id] = ShareMember(
                    member_id, 0, hb.client_id, hb.client_host, hb.rack_id, list(hb.subscribed), now
                )
                log.info("share group %s: member %s joined (epoch %d)", group.group_id, member_id, group.epoch)
            member.last_seen_ms = now
            if hb.subscribed is not None and sorted(hb.subscribed) != sorted(member.subscribed):
                member.subscribed = list(hb.subscribed)
                group.epoch += 1
            assignment = self._assign(member)
            member.previous_epoch, member.epoch = member.epoch, group.epoch
            member.assignment = assignment
            return HeartbeatResult(ErrorCode.NONE, member_id, member.epoch, interval, assignment=assignment)
        member = group.members.get(hb.member_id) if group is not None else None
        if group is None or member is None:
            return HeartbeatResult(ErrorCode.UNKNOWN_MEMBER_ID, hb.member_id, hb.member_epoch, interval)
        if hb.member_epoch not in (member.epoch, member.previous_epoch):
            return HeartbeatResult(ErrorCode.FENCED_MEMBER_EPOCH, hb.member_id, hb.member_epoch, interval)
        member.last_seen_ms = now
        if hb.rack_id is not None:
            member.rack_id = hb.rack_id
        if hb.subscribed is not None and sorted(hb.subscribed) != sorted(member.subscribed):
            member.subscribed = list(hb.subscribed)
            group.epoch += 1
        assignment = self._assign(member)
        if assignment == member.assignment and hb.member_epoch == member.epoch:
            return HeartbeatResult(ErrorCode.NONE, member.member_id, member.epoch, interval)
        member.previous_epoch, member.epoch = member.epoch, max(group.epoch, member.epoch + 1)
        group.epoch = max(group.epoch, member.epoch)
        member.assignment = assignment
        return HeartbeatResult(ErrorCode.NONE, member.member_id, member.epoch, interval, assignment=assignment)

    def _forget_an_empty_group(self) -> None:
        """Make room: forget one group without members (its share-partition states stay stored)."""
        for group_id, group in self.groups.items():
            if not group.members:
                del self.groups[group_id]
                return

    def _assign(self, member: ShareMember) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for name in member.subscribed:
            found = self._topic_partitions(name)
            if found is not None:
                tid, count = found
                out[tid] = list(range(count))
        return out

    def session_timeout_ms(self, group_id: str) -> int:
        """How long a member of the group may stay silent (share.session.timeout.ms)."""
        return self._group_limits(group_id).session_timeout_ms

    def reap(self, now: int | None = None) -> None:
        """Remove members silent for longer than their group's session timeout, and share
        sessions unused for as long (at most once a second)."""
        now = self.clock() if now is None else now
        if now - self._reaped_ms < REAP_INTERVAL_MS:
            return
        self._reaped_ms = now
        timeouts: dict[str, int] = {}

        def timeout(group_id: str) -> int:
            if group_id not in timeouts:
                timeouts[group_id] = self.session_timeout_ms(group_id)
            return timeouts[group_id]

        for group in list(self.groups.values()):
            for m in [m for m in group.members.values() if now - m.last_seen_ms > timeout(group.group_id)]:
                self._remove(group, m.member_id, "session timed out")
                self.close_session(group.group_id, m.member_id)
        for group_id, member_id in [k for k, s in self.sessions.items() if now - s.used_ms > timeout(k[0])]:
            self.close_session(group_id, member_id)

    def _remove(self, group: ShareGroup, member_id: str, why: str) -> None:
        """Remove a member. Its share sessions stay: a leaving consumer sends its last
        acknowledgements and closes them (epoch -1) concurrently with its leave heartbeat."""
        del group.members[member_id]
        group.epoch += 1
        log.info("share group %s: member %s removed (%s)", group.group_id, member_id, why)

    # ---- share sessions ----------------------------------------------------------------------

    def session(self, group_id: str, member_id: str, epoch: int) -> ShareSession | int:
        """The session a ShareFetch/ShareAcknowledge of this epoch continues (or opens, epoch 0),
        or the error code; the expected next epoch moves on."""
        key = (group_id, member_id)
        now = self.clock()
        self.reap(now)
        if epoch == 0:
            if key not in self.sessions and len(self.sessions) >= self.limits.max_share_sessions:
                return ErrorCode.SHARE_SESSION_LIMIT_REACHED
            s = self.sessions[key] = ShareSession(1, now)
            return s
        found = self.sessions.get(key)
        if found is None:
            return ErrorCode.SHARE_SESSION_NOT_FOUND
        found.used_ms = now
        if epoch == -1:
            return found
        if epoch != found.epoch:
            return ErrorCode.INVALID_SHARE_SESSION_EPOCH
        found.epoch = 1 if found.epoch == INT32_MAX else found.epoch + 1
        return found

    def close_session(self, group_id: str, member_id: str) -> list[ShareKey]:
        """Drop the member's session and release what it holds here; the share-partitions changed."""
        self.sessions.pop((group_id, member_id), None)
        changed = []
        for key, sp in self.partitions.items():
            if key[0] == group_id and sp.release_member(member_id):
                changed.append(key)
        for key in changed:
            self.persist(key)
        return changed

    # ---- share-partitions --------------------------------------------------------------------

    def lock_ms(self, group_id: str) -> int:
        """How long the group's members hold what they acquire (share.record.lock.duration.ms)."""
        return self._group_limits(group_id).lock_ms

    def partition(self, key: ShareKey, leader_epoch: int = 0) -> SharePartition | None:
        """The share-partition, loaded or initialised, with its group's lock duration, delivery
        limit and record-lock limit as they are now (a group config may change them; KIP-1240: a record in flight when
        the limit drops gets its last delivery); None when this broker holds too many. One held
        from an older leader epoch is loaded again: while another broker led the partition, it
        moved the stored state on."""
        sp = self._partition(key, leader_epoch)
        if sp is not None:
            own = self._group_limits(key[0])
            sp.lock_ms, sp.delivery_limit, sp.max_locks = own.lock_ms, own.delivery_limit, own.max_locks
        return sp

    def _partition(self, key: ShareKey, leader_epoch: int) -> SharePartition | None:
        sp = self.partitions.get(key)
        if key in self._fenced:  # a write was refused: what is held here is stale
            self._fenced.discard(key)
            sp = None
        if sp is not None and self._epochs.get(key) == leader_epoch:
            gen = self.store.generation(key)
            if gen is None or gen == self._gens.get(key, 0):
                return sp
            # an admin altered or deleted the state meanwhile (AlterShareGroupOffsets, ...)
        self.drop_partition(key)
        if len(self.partitions) >= self.limits.max_partitions and not self._evict_one():
            return None
        lim = self.limits
        stored = self.store.load(key)
        gen = stored.gen if stored is not None else self.store.generation(key) or 0
        if stored is not None and stored.start >= 0:
            sp = SharePartition.restored(stored.start, stored.end, stored.batches, lock_ms=lim.record_lock_duration_ms,
                                         delivery_limit=lim.delivery_count_limit, max_locks=lim.partition_max_record_locks)
        else:
            group_id, tid, p = key
            start = self._initial_offset(tid, p, self._auto_offset_reset(group_id))
            sp = SharePartition(start, lock_ms=lim.record_lock_duration_ms, delivery_limit=lim.delivery_count_limit,
                                max_locks=lim.partition_max_record_locks)
            self._watch(key, self.store.save(key, sp.start, sp.end, sp.snapshot(), gen, leader_epoch=leader_epoch))
        self.partitions[key] = sp
        self._epochs[key] = leader_epoch
        self._gens[key] = gen
        return sp

    def _evict_one(self) -> bool:
        """Forget one share-partition that holds no acquired record (its state is stored)."""
        for k, held in self.partitions.items():
            if held.count(RecordState.ACQUIRED) == 0:
                self.drop_partition(k)
                return True
        return False

    def persist(self, key: ShareKey, sp: SharePartition | None = None) -> Future[int]:
        """Store the share-partition whole, fenced by the leader epoch it was loaded at; a refused
        write (MetaFencedError: another broker leads the partition now) makes the next use load it
        again."""
        sp = sp if sp is not None else self.partitions[key]
        return self._watch(key, self.store.save(key, sp.start, sp.end, sp.snapshot(), self._gens.get(key, 0),
                                                leader_epoch=self._epochs.get(key)))

    def _watch(self, key: ShareKey, saved: Future[int]) -> Future[int]:
        def done(f: Future[int]) -> None:
            if isinstance(f.exception(), MetaFencedError):
                self._fenced.add(key)
                log.info("share-partition %s-%s-%d: a write was fenced (another broker leads the partition); "
                         "forgetting this broker's copy", *key)

        saved.add_done_callback(done)
        return saved

    def drop_partition(self, key: ShareKey) -> None:
        """Forget the in-memory state (this broker no longer leads the partition): the next
        leader loads what was stored."""
        self.partitions.pop(key, None)
        self._epochs.pop(key, None)
        self._gens.pop(key, None)

    # ---- admin (Describe/Alter/DeleteShareGroupOffsets) --------------------------------------

    def known(self, group_id: str) -> bool:
        """A share group with members here or share-partition state stored."""
        return group_id in self.groups or bool(self.store.keys(group_id))

    def is_empty(self, group_id: str) -> bool:
        self.reap()  # a member whose session timed out is not one
        group = self.groups.get(group_id)
        return group is None or not group.members

    def start_offset(self, key: ShareKey) -> int:
        """The stored share-partition start offset, -1 when there is none (or it is uninitialised)."""
        stored = self.store.load(key)
        return stored.start if stored is not None else -1

    def reset(self, key: ShareKey, start: int) -> Future[int]:
        """Set the share-partition start offset (-1: uninitialised, started afresh from
        share.auto.offset.reset); every in-flight record is forgotten. A leader holding the state
        in memory sees the new `gen` and loads it again; its writes made before it noticed are
        refused (cluster mode: a compare on the `gen`, loglake.cluster.shares)."""
        self.drop_partition(key)
        return self.store.reset(key, start)

    def delete_group(self, group_id: str) -> list[Future[int]]:
        """Forget an empty share group and every share-partition state it has (DeleteGroups)."""
        self.groups.pop(group_id, None)
        for key in [k for k in self.partitions if k[0] == group_id]:
            self.drop_partition(key)
        return [self.store.forget(key) for key in self.store.keys(group_id)]

    # ---- describing --------------------------------------------------------------------------

    def group(self, group_id: str) -> ShareGroup | None:
        self.reap()
        return self.groups.get(group_id)

    def listed(self) -> list[ShareGroup]:
        self.reap()
        return sorted(self.groups.values(), key=lambda g: g.group_id)


__all__ = ["Heartbeat", "HeartbeatResult", "ShareCoordinator", "ShareGroup", "ShareMember", "ShareSession"]
