"""ConsumerGroupHeartbeat and ConsumerGroupDescribe (KIP-848): the consumer group protocol.

One heartbeat does everything (Kafka's GroupMetadataManager.consumerGroupHeartbeat):

1. validate the request (INVALID_REQUEST, UNSUPPORTED_ASSIGNOR, INVALID_REGULAR_EXPRESSION);
2. find the group: a new one is made by a join (epoch 0); an Empty classic group is taken over
   when `group.consumer.migration.policy` allows an upgrade; any other classic group answers
   GROUP_ID_NOT_FOUND ("not a consumer group");
3. leave (epoch -1), static leave (epoch -2: the member keeps its partitions until its session
   expires or its instance id comes back with epoch 0), join (epoch 0: new member, or a static
   member taking over its instance's assignment without a rebalance) or heartbeat (epoch
   checks, UNKNOWN_MEMBER_ID / FENCED_MEMBER_EPOCH / FENCED_INSTANCE_ID);
4. update the member's subscription; resolve every member's topic names and regex against the
   topics that exist now; a changed subscription or topic set bumps the group epoch. A regex new
   to the group counts from the next heartbeat on: Kafka resolves it asynchronously, so literal
   topics are assigned first and the regex's matches in a later heartbeat (clients rely on it);
5. when the group epoch is ahead of the assignment epoch, compute a new target assignment;
6. reconcile the member (reconcile.py) with the partitions it reports owning;
7. when anything changed, save the group (consumer_persistence.py) and answer once durable.

Sessions: each heartbeat re-arms the member's session timer (`group.consumer.session.timeout.ms`
or the group's `consumer.session.timeout.ms` override); when it fires the member is removed
(its next heartbeat gets UNKNOWN_MEMBER_ID) and the group epoch goes up. A member that keeps
partitions to revoke longer than its rebalance timeout is removed the same way.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from loglake.broker.groups import errors as E
from loglake.broker.groups.assignors import assign
from loglake.broker.groups.changes import ChangeQueueFull
from loglake.broker.groups.consumer_model import (
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    Assignment,
    ConsumerGroupData,
    ConsumerMember,
    MemberState,
    SubscriptionKey,
    TopicMetadata,
    assignment_of,
)
from loglake.broker.groups.consumer_persistence import encode_consumer
from loglake.broker.groups.group import Group, GroupState
from loglake.broker.groups.limits import MAX_TOPIC_NAME_LENGTH, ConsumerLimits
from loglake.broker.groups.reconcile import check_epoch, reconcile
from loglake.broker.groups.registry import GroupRegistry
from loglake.broker.groups.topic_regex import compile_subscription

log = logging.getLogger(__name__)

#: topic name -> (topic id hex, partition count), the topics that exist now.
TopicCatalog = Callable[[], Mapping[str, tuple[str, int]]]
GroupOverrides = Callable[[str], Mapping[str, int]]
SESSION_OVERRIDE = "consumer.session.timeout.ms"
HEARTBEAT_OVERRIDE = "consumer.heartbeat.interval.ms"


@dataclass
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_names: list[str] | None = None
    subscribed_regex: str | None = None
    server_assignor: str | None = None
    owned: list[tuple[str, list[int]]] | None = None  # (topic id hex, partitions)
    client_id: str = ""
    client_host: str = ""
    version: int = 1
    #: (principal, host) of the connection when ACLs are on: a regex subscription then selects only
    #: the topics this principal may DESCRIBE (Kafka filters resolved regexes the same way)
    principal: tuple[str, str] | None = None


#: (principal, host, topic names) -> the names of those it may DESCRIBE.
TopicFilter = Callable[[str, str, list[str]], list[str]]


@dataclass
class HeartbeatResult:
    error_code: int
    member_id: str | None
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: Assignment | None = None  # None: unchanged, not sent
    error_message: str | None = None


def _new_member_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")


class ConsumerProtocol:
    def __init__(
        self,
        registry: GroupRegistry,
        limits: ConsumerLimits,
        catalog: TopicCatalog | None,
        overrides: GroupOverrides | None,
    ) -> None:
        self.reg = registry
        self.limits = limits
        self.catalog: TopicCatalog = catalog or (lambda: {})
        self.overrides: GroupOverrides = overrides or (lambda _group_id: {})
        self._regex_cache: dict[str, re.Pattern[str]] = {}
        # Regex -> matching topic names, for the topic set `_matches_key` (recomputed when topics change):
        # a heartbeat resolves every member's regex, so matching each against every topic each time
        # would cost members x topics per heartbeat.
        self._matches: dict[str, list[str]] = {}
        self._matches_key: frozenset[tuple[str, tuple[str, int]]] | None = None
        #: set by the broker when ACLs are on (`set_topic_filter`); narrows regex matches per member
        self.topic_filter: TopicFilter | None = None
        self.filter_generation: Callable[[], int] = lambda: 0
        #: (principal, host, regex) -> its matches it may describe; dropped with `_matches` and
        #: when the filter's generation moves (an ACL was created or deleted)
        self._allowed: dict[tuple[str, str, str], list[str]] = {}
        self._allowed_generation = 0

    # ---- group settings ---------------------------------------------------------------------------

    def _setting(self, group_id: str, name: str, default: int, lo: int, hi: int) -> int:
        value = self.overrides(group_id).get(name)
        return default if value is None else max(lo, min(hi, int(value)))

    def session_timeout_ms(self, group_id: str) -> int:
        lim = self.limits
        return self._setting(group_id, SESSION_OVERRIDE, lim.session_timeout_ms,
                             lim.min_session_timeout_ms, lim.max_session_timeout_ms)

    def heartbeat_interval_ms(self, group_id: str) -> int:
        lim = self.limits
        return self._setting(group_id, HEARTBEAT_OVERRIDE, lim.heartbeat_interval_ms,
                             lim.min_heartbeat_interval_ms, lim.max_heartbeat_interval_ms)

    # ---- the heartbeat ----------------------------------------------------------------------------

    async def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResult:
        result, group = self._heartbeat(req)
        if group is not None and not await self._save(group):
            return self._error(req, E.COORDINATOR_NOT_AVAILABLE, "the group state could not be saved")
        return result

    def _error(self, req: HeartbeatRequest, code: int, message: str | None = None) -> HeartbeatResult:
        return HeartbeatResult(code, req.member_id or None, req.member_epoch, 0, None, message)

    def _validate(self, req: HeartbeatRequest) -> HeartbeatResult | None:
        bad = None
        if not req.group_id:
            bad = "GroupId can't be empty."
        elif req.member_epoch < STATIC_LEAVE_EPOCH:
            bad = f"MemberEpoch {req.member_epoch} is invalid."
        elif not req.member_id and (req.version >= 1 or req.member_epoch != 0):
            bad = "MemberId can't be empty."
        elif req.member_epoch == 0:
            if req.rebalance_timeout_ms <= 0:
                bad = "RebalanceTimeoutMs must be provided in first request."
            elif req.owned:
                bad = "TopicPartitions must be empty when (re-)joining."
            elif req.subscribed_names is None and req.subscribed_regex is None:
                bad = "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
        elif req.member_epoch == STATIC_LEAVE_EPOCH and req.instance_id is None:
            bad = "InstanceId can't be null when MemberEpoch is -2."
        if bad is None and req.subscribed_names is not None:
            if len(req.subscribed_names) > self.limits.max_topics_per_subscription:
                bad = f"more than {self.limits.max_topics_per_subscription} subscribed topic names"
            elif any(len(n) > MAX_TOPIC_NAME_LENGTH for n in req.subscribed_names):
                bad = f"a subscribed topic name is over {MAX_TOPIC_NAME_LENGTH} characters"
        if bad is not None:
            return self._error(req, E.INVALID_REQUEST, bad)
        if req.server_assignor is not None and req.server_assignor not in self.limits.assignors:
            return self._error(req, E.UNSUPPORTED_ASSIGNOR, f"ServerAssignor {req.server_assignor[:80]} is not supported. "
                               f"Supported assignors: {', '.join(self.limits.assignors)}.")
        if req.subscribed_regex:
            if len(req.subscribed_regex) > self.limits.max_regex_length:
                return self._error(req, E.INVALID_REGULAR_EXPRESSION,
                                   f"SubscribedTopicRegex is over {self.limits.max_regex_length} characters.")
            if self._compile(req.subscribed_regex) is None:
                return self._error(req, E.INVALID_REGULAR_EXPRESSION,
                                   "SubscribedTopicRegex does not compile or could backtrack without bound.")
        return None

    def _compile(self, pattern: str) -> re.Pattern[str] | None:
        compiled = self._regex_cache.get(pattern)
        if compiled is None:
            compiled = compile_subscription(pattern)
            if compiled is None:
                return None
            if len(self._regex_cache) >= self.limits.max_size:
                self._regex_cache.clear()  # bounded: at most one pattern per member is live
            self._regex_cache[pattern] = compiled
        return compiled

    def _heartbeat(self, req: HeartbeatRequest) -> tuple[HeartbeatResult, Group | None]:
        """The answer, and the group to save first (None: nothing changed)."""
        if self.reg.closed:
            return self._error(req, E.COORDINATOR_NOT_AVAILABLE), None
        bad = self._validate(req)
        if bad is not None:
            return bad, None
        group = self.reg.groups.get(req.group_id)
        if group is not None and group.deleting:
            return self._error(req, E.COORDINATOR_NOT_AVAILABLE), None
        if group is not None and group.consumer is None and not self._take_classic(group, req):
            return self._error(req, E.GROUP_ID_NOT_FOUND, f"Group {req.group_id} is not a consumer group."), None
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(group, req)
        if group is None:
            if req.member_epoch != 0:
                return self._error(req, E.UNKNOWN_MEMBER_ID, f"Group {req.group_id} has no members."), None
            group = self.reg.new_group(req.group_id)
            if group is None:
                return self._error(req, E.COORDINATOR_NOT_AVAILABLE, "too many groups"), None
            group.consumer = ConsumerGroupData()
        cg = group.consumer
        assert cg is not None
        interval = self.heartbeat_interval_ms(req.group_id)
        changed = False
        if req.member_epoch == 0:
            found = self._join(group, cg, req)
            if isinstance(found, HeartbeatResult):
                return found, None
            member, changed = found
        else:
            member_or_error = self._known_member(cg, req)
            if isinstance(member_or_error, HeartbeatResult):
                return member_or_error, None
            member = member_or_error
        owned = assignment_of(req.owned)
        if req.member_epoch != 0:
            code = check_epoch(member, req.member_epoch, owned)
            if code != E.NONE:
                return self._error(req, code, f"The member epoch {req.member_epoch} is fenced, "
                                   f"the member is at epoch {member.member_epoch}."), None
        assigned_before = member.assigned
        regex_before = member.subscribed_regex
        updated, bump = self._update_member(member, req)
        changed |= updated
        regex = member.subscribed_regex
        if regex and regex != regex_before and not any(
            m.subscribed_regex == regex for m in cg.members.values() if m is not member
        ):
            cg.unresolved_regexes.add(regex)
        topics = self.catalog()  # once per heartbeat
        if self._refresh_subscription(cg, topics) or bump:
            cg.group_epoch += 1  # once per heartbeat, whatever changed
            changed = True
        if cg.group_epoch > cg.assignment_epoch:
            self._compute_target(cg, topics)
            changed = True
        if reconcile(member, cg.assignment_epoch, cg.target.get(member.member_id, {}),
                     cg.owners(member.member_id), owned):
            changed = True
            if member.state is MemberState.UNREVOKED_PARTITIONS:  # a new revocation: a new deadline
                self._arm_revocation(group, member)
            else:
                self.reg.cancel(member.revocation_timer)
                member.revocation_timer = None
        self._arm_session(group, member)
        send = req.member_epoch == 0 or member.assigned != assigned_before or (
            owned is not None and owned != member.assigned
        )
        result = HeartbeatResult(E.NONE, member.member_id, member.member_epoch, interval,
                                 dict(member.assigned) if send else None)
        cg.unresolved_regexes.clear()  # resolved by the next heartbeat of any member
        return result, (group if changed else None)

    def _take_classic(self, group: Group, req: HeartbeatRequest) -> bool:
        """An Empty classic group becomes a consumer group on a join, if the policy allows."""
        empty = group.is_(GroupState.EMPTY) and not group.members and not group.pending_members
        if req.member_epoch != 0 or not empty or not self.limits.upgrade_allowed():
            return False
        group.consumer = ConsumerGroupData()
        group.consumer.group_epoch = group.generation_id  # epochs keep going up across the conversion
        group.consumer.assignment_epoch = group.generation_id
        group.protocol_type = "consumer"
        log.info("group %r: Empty classic group converted to a consumer group", group.group_id)
        return True

    def _join(
        self, group: Group, cg: ConsumerGroupData, req: HeartbeatRequest
    ) -> HeartbeatResult | tuple[ConsumerMember, bool]:
        if req.instance_id is not None:
            old = cg.static_member(req.instance_id)
            if old is not None and old.member_epoch != STATIC_LEAVE_EPOCH and old.member_id != req.member_id:
                return self._error(req, E.UNRELEASED_INSTANCE_ID,
                                   f"Static member {old.member_id} with instance id {req.instance_id} "
                                   "is present in the consumer group.")
            if old is not None:
                # The instance comes back: it takes over the old member's assignment, no rebalance.
                member_id = req.member_id or _new_member_id()
                self._drop_timers(old)
                target = cg.target.pop(old.member_id, None)
                cg.remove(old.member_id)
                old.member_id = member_id
                old.member_epoch = 0
                old.state = MemberState.STABLE
                old.assigned, old.revoking = {}, {}
                cg.add(old)
                if target is not None:
                    cg.target[member_id] = target
                return old, True
        existing = cg.members.get(req.member_id) if req.member_id else None
        if existing is not None:
            # A known member joins again (after it was fenced on its side): it has given up everything.
            existing.member_epoch = 0
            existing.state = MemberState.STABLE
            existing.assigned, existing.revoking = {}, {}
            return existing, True
        if len(cg.members) >= self.limits.max_size:
            return self._error(req, E.GROUP_MAX_SIZE_REACHED,
                               f"The consumer group has reached its maximum capacity of {self.limits.max_size} members.")
        member = ConsumerMember(
            member_id=req.member_id or _new_member_id(),
            principal=req.principal,
            instance_id=req.instance_id,
            rack_id=req.rack_id,
            client_id=req.client_id,
            client_host=req.client_host,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
        )
        cg.add(member)
        return member, True  # the subscription it brings bumps the group epoch (_update_member)

    def _known_member(self, cg: ConsumerGroupData, req: HeartbeatRequest) -> HeartbeatResult | ConsumerMember:
        member = cg.members.get(req.member_id)
        if req.instance_id is not None:
            static = cg.static_member(req.instance_id)
            if static is None:
                return self._error(req, E.UNKNOWN_MEMBER_ID, f"Instance id {req.instance_id} is unknown.")
            if static.member_id != req.member_id:
                return self._error(req, E.FENCED_INSTANCE_ID,
                                   f"Instance id {req.instance_id} belongs to another member.")
        if member is None:
            return self._error(req, E.UNKNOWN_MEMBER_ID, f"Member {req.member_id} is not a member of the group.")
        return member

    def _update_member(self, member: ConsumerMember, req: HeartbeatRequest) -> tuple[bool, bool]:
        """(anything changed, the group epoch must go up: its subscription or assignor changed)."""
        before = (member.rack_id, member.rebalance_timeout_ms, member.client_id, member.client_host,
                  member.server_assignor)
        subscription = (member.subscribed_names, member.subscribed_regex)
        if req.rack_id is not None:
            member.rack_id = req.rack_id
        if req.rebalance_timeout_ms > 0:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.client_id, member.client_host = req.client_id, req.client_host
        if req.principal is not None:
            member.principal = req.principal
        if req.server_assignor is not None:
            member.server_assignor = req.server_assignor
        if req.subscribed_names is not None:
            member.subscribed_names = tuple(sorted(set(req.subscribed_names)))
        if req.subscribed_regex is not None:
            member.subscribed_regex = req.subscribed_regex or None  # "" clears it
        bump = subscription != (member.subscribed_names, member.subscribed_regex) or (
            before[4] != member.server_assignor
        )
        after = (member.rack_id, member.rebalance_timeout_ms, member.client_id, member.client_host,
                 member.server_assignor)
        return bump or before != after, bump

    # ---- subscriptions and the target assignment --------------------------------------------------

    def member_topics(
        self, member: ConsumerMember, topics: Mapping[str, tuple[str, int]], unresolved: set[str] | None = None
    ) -> set[str]:
        """Topic names the member's subscription selects among existing topics (regex: full match;
        none yet for a regex in `unresolved`)."""
        names = {n for n in member.subscribed_names if n in topics}
        if member.subscribed_regex and member.subscribed_regex not in (unresolved or ()):
            matched = self._regex_topics(member.subscribed_regex, topics)
            if self.topic_filter is not None and member.principal is not None:
                matched = self._describable(member.principal, member.subscribed_regex, matched)
            names.update(matched)
        return names

    def _describable(self, who: tuple[str, str], pattern: str, matched: list[str]) -> list[str]:
        """`matched` narrowed to what `who` may DESCRIBE (names given explicitly are checked by the
        handler instead: those it may not describe are refused with TOPIC_AUTHORIZATION_FAILED)."""
        generation = self.filter_generation()
        if generation != self._allowed_generation:
            self._allowed.clear()
            self._allowed_generation = generation
        key = (who[0], who[1], pattern)
        allowed = self._allowed.get(key)
        if allowed is None:
            assert self.topic_filter is not None
            allowed = self.topic_filter(who[0], who[1], matched)
            if len(self._allowed) >= self.limits.max_size:
                self._allowed.clear()  # bounded like the matches themselves
            self._allowed[key] = allowed
        return allowed

    def subscription_key(self, m: ConsumerMember) -> SubscriptionKey:
        """What a member's resolved topics depend on: its names and regex, and, for a regex when
        ACLs narrow it, who the member is."""
        who = m.principal if m.subscribed_regex and self.topic_filter is not None else None
        return (m.subscribed_names, m.subscribed_regex, who)

    def _topics_changed(self, topics: Mapping[str, tuple[str, int]]) -> frozenset[tuple[str, tuple[str, int]]]:
        """The key of this topic set; drops the regex matches of the previous one if it differs."""
        key = frozenset(topics.items())
        if key != self._matches_key:
            self._matches.clear()
            self._allowed.clear()
            self._matches_key = key
        return key

    def _regex_topics(self, pattern: str, topics: Mapping[str, tuple[str, int]]) -> list[str]:
        self._topics_changed(topics)
        matched = self._matches.get(pattern)
        if matched is None:
            compiled = self._compile(pattern)
            matched = sorted(n for n in topics if compiled.fullmatch(n)) if compiled is not None else []
            cap = self.limits.max_topics_per_subscription
            if len(matched) > cap:
                log.warning("regex %r matches %d topics; only the first %d (by name) are subscribed",
                            pattern[:80], len(matched), cap)
                matched = matched[:cap]
            if len(self._matches) >= self.limits.max_size:
                self._matches.clear()  # bounded like the compiled patterns
            self._matches[pattern] = matched
        return matched

    def _refresh_subscription(self, cg: ConsumerGroupData, topics: Mapping[str, tuple[str, int]]) -> bool:
        """Resolve the members' subscriptions against existing topics; True if the topic set changed.

        Resolved once per distinct subscription, and not at all while neither the topics nor the
        members' subscriptions changed since the last heartbeat (`cg.resolved_key`).
        """
        distinct = {self.subscription_key(m): m for m in cg.members.values()}
        unresolved = cg.unresolved_regexes
        key = (self._topics_changed(topics), frozenset(distinct), self.filter_generation(), frozenset(unresolved))
        if key == cg.resolved_key:
            return False
        cg.resolved_key = key
        per_key = {k: frozenset(self.member_topics(m, topics, unresolved)) for k, m in distinct.items()}
        wanted: set[str] = set().union(*per_key.values())
        subscription: TopicMetadata = {topics[n][0]: (n, topics[n][1]) for n in wanted}
        # One member's topics may change while the union stays (an ACL taken from a regex member
        # on a topic another member names): that needs a new target too.
        narrowed = cg.resolved_sets is not None and per_key.keys() == cg.resolved_sets.keys() and per_key != cg.resolved_sets
        cg.resolved_sets = per_key
        if subscription == cg.subscription and not narrowed:
            return False
        cg.subscription = subscription
        return True

    def _choose_assignor(self, cg: ConsumerGroupData) -> str:
        asked = [m.server_assignor for m in cg.members.values() if m.server_assignor]
        if not asked:
            return self.limits.assignors[0]
        return max(sorted(set(asked)), key=asked.count)

    def _compute_target(self, cg: ConsumerGroupData, topics: Mapping[str, tuple[str, int]]) -> None:
        by_name = {name: tid for tid, (name, _n) in cg.subscription.items()}
        resolved: dict[SubscriptionKey, frozenset[str]] = {}  # once per distinct subscription
        subscriptions: dict[str, frozenset[str]] = {}
        for m in cg.members.values():
            key = self.subscription_key(m)
            if key not in resolved:
                resolved[key] = frozenset(
                    by_name[n] for n in self.member_topics(m, topics, cg.unresolved_regexes) if n in by_name
                )
            subscriptions[m.member_id] = resolved[key]
        cg.assignor = self._choose_assignor(cg)
        cg.target = assign(cg.assignor, subscriptions, cg.subscription, cg.target)
        cg.assignment_epoch = cg.group_epoch

    # ---- leaving, timers ----------------------------------------------------------------------------

    def _leave(self, group: Group | None, req: HeartbeatRequest) -> tuple[HeartbeatResult, Group | None]:
        cg = group.consumer if group is not None else None
        if group is None or cg is None:
            return self._error(req, E.UNKNOWN_MEMBER_ID, f"Group {req.group_id} has no members."), None
        found = self._known_member(cg, req)
        if isinstance(found, HeartbeatResult):
            return found, None
        member = found
        done = HeartbeatResult(E.NONE, member.member_id, req.member_epoch, 0)
        if req.member_epoch == STATIC_LEAVE_EPOCH:
            # Keeps its partitions until it comes back or its session expires.
            member.member_epoch = STATIC_LEAVE_EPOCH
            self.reg.cancel(member.revocation_timer)
            member.revocation_timer = None
            self._arm_session(group, member)
            return done, group
        self._remove(group, cg, member, "left the group")
        return done, group

    def _remove(self, group: Group, cg: ConsumerGroupData, member: ConsumerMember, why: str) -> None:
        self._drop_timers(member)
        cg.remove(member.member_id)
        cg.group_epoch += 1
        if not cg.members:
            group.empty_since_ms = self.reg.now_ms()
        log.info("group %r: member %s %s (group epoch %d)", group.group_id, member.member_id, why, cg.group_epoch)

    def _drop_timers(self, member: ConsumerMember) -> None:
        self.reg.cancel(member.session_timer)
        self.reg.cancel(member.revocation_timer)
        member.session_timer = member.revocation_timer = None

    def _arm_session(self, group: Group, member: ConsumerMember) -> None:
        self.reg.cancel(member.session_timer)
        member.session_timer = self.reg.call_later(
            self.session_timeout_ms(group.group_id), lambda: self._expire(group, member, "session timed out")
        )

    def _arm_revocation(self, group: Group, member: ConsumerMember) -> None:
        self.reg.cancel(member.revocation_timer)
        epoch = member.member_epoch

        def fire() -> None:
            if member.state is MemberState.UNREVOKED_PARTITIONS and member.member_epoch == epoch:
                self._expire(group, member, "did not revoke its partitions within its rebalance timeout")

        member.revocation_timer = self.reg.call_later(member.rebalance_timeout_ms, fire)

    def _expire(self, group: Group, member: ConsumerMember, why: str) -> None:
        cg = group.consumer
        if not self.reg.live(group) or cg is None or cg.members.get(member.member_id) is not member:
            return
        self._remove(group, cg, member, why)
        self._save_later(group)

    def arm_restored(self, group: Group) -> None:
        """Start the sessions of a group loaded from the store (and its revocation deadlines)."""
        cg = group.consumer
        if cg is None:
            return
        for member in cg.members.values():
            self._arm_session(group, member)
            if member.state is MemberState.UNREVOKED_PARTITIONS:
                self._arm_revocation(group, member)

    def stop(self, group: Group) -> None:
        if group.consumer is not None:
            for member in group.consumer.members.values():
                self._drop_timers(member)

    # ---- saving ---------------------------------------------------------------------------------------

    def _record(self, group: Group) -> asyncio.Future[bool]:
        cg = group.consumer
        assert cg is not None
        doc = encode_consumer(cg, group.empty_since_ms)
        return self.reg.record(group, "consumer group state", lambda: self.reg.store.save_state(group.group_id, doc))

    async def _save(self, group: Group) -> bool:
        try:
            return await self._record(group)
        except ChangeQueueFull:
            return False

    def _save_later(self, group: Group) -> None:
        try:
            self._record(group)
        except ChangeQueueFull:
            pass  # logged by the queue; the next change saves the whole state again
