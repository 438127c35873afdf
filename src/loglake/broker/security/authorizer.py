"""Kafka's ACL authorizer model: bindings, filters, and the decision for one request.

A binding is (resource pattern, entry): the pattern is a resource type, a name and a pattern
type (LITERAL: the name itself, or ``*`` for every resource of the type; PREFIXED: every name
starting with it); the entry is a principal (``User:alice``, ``User:*`` for everyone), a host
(an address, ``*`` for any), an operation (ALL for every one) and ALLOW or DENY.

`Authorizer.authorize` decides as Kafka's StandardAuthorizer does:

1. a super user (`super_users`) may do anything;
2. the bindings whose pattern matches the resource are collected (literal name, literal ``*``,
   every prefixed pattern the name starts with); when there are none at all (for any principal)
   the answer is `allow_everyone_if_no_acl_found`;
3. a matching DENY for the principal and host (operation or ALL) refuses: DENY wins;
4. a matching ALLOW grants: the operation itself, ALL, or one that implies it (READ, WRITE,
   DELETE and ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS);
5. otherwise refused.

Lookups are indexed: literal bindings by (resource type, name), prefixed ones by (resource
type, prefix), so a decision costs one dict lookup per prefix length of the name, never a scan of
all bindings.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum

from loglake.broker.config import BrokerConfig
from loglake.broker.security.acl_store import AclStore

log = logging.getLogger("loglake.broker.authorizer")

__all__ = [
    "CLUSTER_NAME",
    "REGISTRY_NAME",
    "WILDCARD",
    "AclFilter",
    "AclOperation",
    "Authorizer",
    "Binding",
    "PatternType",
    "Permission",
    "ResourceType",
    "broker_authorizer",
    "check_binding",
]

#: The one resource name of CLUSTER bindings (Kafka's ResourcePattern for the cluster).
CLUSTER_NAME = "kafka-cluster"
#: The one resource name of REGISTRY bindings (the schema registry as a whole).
REGISTRY_NAME = "schema-registry"
#: A literal resource name, principal name or host that matches every one.
WILDCARD = "*"


class AclOperation(IntEnum):
    """org.apache.kafka.common.acl.AclOperation codes (ANY and UNKNOWN only in filters)."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class ResourceType(IntEnum):
    """org.apache.kafka.common.resource.ResourceType codes, and loglake's own for the schema
    registry (Redpanda's two schema registry resource types; Kafka has none, so the codes are
    loglake's, far above Kafka's): a subject, and the registry as a whole (one resource,
    `REGISTRY_NAME`: the global config and mode). Bindings of them are made with CreateAcls
    like any other (docs/SCHEMA_REGISTRY.md, "ACLs")."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7
    SUBJECT = 100
    REGISTRY = 101


class PatternType(IntEnum):
    """org.apache.kafka.common.resource.PatternType codes (ANY and MATCH only in filters)."""

    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Permission(IntEnum):
    """org.apache.kafka.common.acl.AclPermissionType codes."""

    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


_OP = AclOperation
#: Operations an ALLOW binding of the key grants besides itself (Kafka's implied operations).
_IMPLIED_BY: dict[int, frozenset[int]] = {
    _OP.DESCRIBE: frozenset({_OP.READ, _OP.WRITE, _OP.DELETE, _OP.ALTER}),
    _OP.DESCRIBE_CONFIGS: frozenset({_OP.ALTER_CONFIGS}),
}
#: Resource types a binding may name (ANY and UNKNOWN only appear in filters or as errors).
BINDING_RESOURCE_TYPES = frozenset(
    {ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID,
     ResourceType.DELEGATION_TOKEN, ResourceType.USER, ResourceType.SUBJECT, ResourceType.REGISTRY}
)


@dataclass(frozen=True, slots=True)
class Binding:
    resource_type: int
    name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int

    def row(self) -> list[object]:
        """The JSON row of the metadata record (loglake.meta.acls)."""
        return [self.resource_type, self.name, self.pattern_type, self.principal, self.host, self.operation,
                self.permission]

    @classmethod
    def of(cls, row: Iterable[object]) -> Binding:
        rtype, name, pattern, principal, host, op, perm = row
        return cls(int(rtype), str(name), int(pattern), str(principal), str(host), int(op), int(perm))  # type: ignore[call-overload]

    def describe(self) -> str:
        return (f"{_name(ResourceType, self.resource_type)}:{_name(PatternType, self.pattern_type)}:{self.name} "
                f"{self.principal} from {self.host} {_name(Permission, self.permission)} "
                f"{_name(AclOperation, self.operation)}")


def _name(enum: type[IntEnum], value: int) -> str:
    try:
        return enum(value).name
    except ValueError:
        return str(value)


def operation_name(op: int) -> str:
    return _name(AclOperation, op)


def resource_type_name(rtype: int) -> str:
    return _name(ResourceType, rtype)


def _check_principal(principal: str) -> str | None:
    kind, sep, name = principal.partition(":")
    if not sep or not kind or not name:
        return f"Could not parse principal from `{principal}` (no colon is present separating the principal type from the principal name)"
    return None


def check_binding(b: Binding) -> str | None:
    """Why `b` cannot be stored (answered with INVALID_REQUEST), or None when it is valid."""
    if b.resource_type not in BINDING_RESOURCE_TYPES:
        return f"Invalid resourceType {resource_type_name(b.resource_type)}"
    if b.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"Invalid patternType {_name(PatternType, b.pattern_type)}"
    if b.operation in (AclOperation.ANY, AclOperation.UNKNOWN) or b.operation not in set(AclOperation):
        return f"Invalid operation {operation_name(b.operation)}"
    if b.permission not in (Permission.ALLOW, Permission.DENY):
        return f"Invalid permissionType {_name(Permission, b.permission)}"
    if not b.name:
        return "Resource name should not be empty"
    if b.resource_type == ResourceType.CLUSTER and b.name != CLUSTER_NAME:
        return f"Only the '{CLUSTER_NAME}' resource name is valid for cluster ACLs"
    if b.resource_type == ResourceType.REGISTRY and b.name != REGISTRY_NAME:
        return f"Only the '{REGISTRY_NAME}' resource name is valid for schema registry ACLs (subjects are SUBJECT resources)"
    if b.pattern_type == PatternType.PREFIXED and b.name == WILDCARD:
        return "A prefixed pattern cannot be the wildcard '*'; use a LITERAL '*' binding"
    if not b.host:
        return "Host should not be empty; use '*' for any host"
    return _check_principal(b.principal)


@dataclass(frozen=True, slots=True)
class AclFilter:
    """A DescribeAcls/DeleteAcls filter: None for a name, principal or host matches every one."""

    resource_type: int
    name: str | None
    pattern_type: int
    principal: str | None
    host: str | None
    operation: int
    permission: int

    def problem(self) -> str | None:
        """Why the filter is invalid (INVALID_REQUEST), or None."""
        if self.resource_type == ResourceType.UNKNOWN or self.resource_type not in set(ResourceType):
            return f"Invalid resourceTypeFilter {resource_type_name(self.resource_type)}"
        if self.pattern_type == PatternType.UNKNOWN or self.pattern_type not in set(PatternType):
            return f"Invalid patternTypeFilter {_name(PatternType, self.pattern_type)}"
        if self.operation == AclOperation.UNKNOWN or self.operation not in set(AclOperation):
            return f"Invalid operation {operation_name(self.operation)}"
        if self.permission == Permission.UNKNOWN or self.permission not in set(Permission):
            return f"Invalid permissionType {_name(Permission, self.permission)}"
        return None

    def matches(self, b: Binding) -> bool:
        """Kafka's AclBindingFilter.matches (ResourcePatternFilter and AccessControlEntryFilter)."""
        if self.resource_type != ResourceType.ANY and self.resource_type != b.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and self.pattern_type != b.pattern_type:
            return False
        if self.name is not None:
            if self.pattern_type in (PatternType.ANY, b.pattern_type):
                if self.name != b.name:
                    return False
            elif b.pattern_type == PatternType.LITERAL:  # MATCH
                if b.name not in (self.name, WILDCARD):
                    return False
            elif not self.name.startswith(b.name):  # MATCH against a prefixed binding
                return False
        if self.principal is not None and self.principal != b.principal:
            return False
        if self.host is not None and self.host != b.host:
            return False
        if self.operation != AclOperation.ANY and self.operation != b.operation:
            return False
        return self.permission == Permission.ANY or self.permission == b.permission


class Authorizer:
    """The bindings, indexed, and the decision for (principal, host, operation, resource)."""

    def __init__(self, super_users: Iterable[str] = (), allow_if_no_acl: bool = True, bindings: Iterable[Binding] = ()) -> None:
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl
        #: every binding, in creation order (DescribeAcls answers in this order)
        self._all: dict[Binding, None] = {}
        self._literal: dict[tuple[int, str], list[Binding]] = {}
        self._prefixed: dict[tuple[int, str], list[Binding]] = {}
        #: the lengths of the prefixes bound per resource type, so a lookup only tries those
        self._prefix_lengths: dict[int, dict[int, int]] = {}
        #: bumped by every change of the bindings: caches of decisions (the group coordinator's
        #: regex subscriptions) compare it to know theirs are stale
        self.generation = 0
        self.add(bindings)

    def __len__(self) -> int:
        return len(self._all)

    def bindings(self) -> list[Binding]:
        return list(self._all)

    def __contains__(self, b: object) -> bool:
        return b in self._all

    def add(self, bindings: Iterable[Binding]) -> None:
        for b in bindings:
            if b in self._all:
                continue
            self.generation += 1
            self._all[b] = None
            if b.pattern_type == PatternType.PREFIXED:
                self._prefixed.setdefault((b.resource_type, b.name), []).append(b)
                lengths = self._prefix_lengths.setdefault(b.resource_type, {})
                lengths[len(b.name)] = lengths.get(len(b.name), 0) + 1
            else:
                self._literal.setdefault((b.resource_type, b.name), []).append(b)

    def remove(self, bindings: Iterable[Binding]) -> None:
        for b in bindings:
            if b not in self._all:
                continue
            self.generation += 1
            del self._all[b]
            table = self._prefixed if b.pattern_type == PatternType.PREFIXED else self._literal
            key = (b.resource_type, b.name)
            table[key].remove(b)
            if not table[key]:
                del table[key]
            if b.pattern_type == PatternType.PREFIXED:
                lengths = self._prefix_lengths[b.resource_type]
                lengths[len(b.name)] -= 1
                if not lengths[len(b.name)]:
                    del lengths[len(b.name)]

    def matching(self, resource_type: int, name: str) -> list[Binding]:
        """Every binding whose pattern matches the resource, for any principal."""
        out = list(self._literal.get((resource_type, name), ()))
        if name != WILDCARD:
            out += self._literal.get((resource_type, WILDCARD), ())
        for length in self._prefix_lengths.get(resource_type, {}):
            if length <= len(name):
                out += self._prefixed.get((resource_type, name[:length]), ())
        return out

    def authorize(self, principal: str, host: str, operation: int, resource_type: int, name: str) -> bool:
        if not self._all:  # no bindings at all (a broker without ACLs): no lookup per request
            return self.allow_if_no_acl or principal in self.super_users
        if principal in self.super_users:
            return True
        acls = self.matching(resource_type, name)
        if not acls:
            return self.allow_if_no_acl
        granting = _IMPLIED_BY.get(operation, frozenset())
        everyone = _wildcard_principal(principal)
        allowed = False
        for b in acls:
            if b.principal != principal and b.principal != everyone:
                continue
            if b.host != host and b.host != WILDCARD:
                continue
            if b.permission == Permission.DENY:
                if b.operation in (operation, AclOperation.ALL):
                    return False
            elif b.operation in (operation, AclOperation.ALL) or b.operation in granting:
                allowed = True
        return allowed

    def authorize_any(self, principal: str, host: str, operation: int, resource_type: int) -> bool:
        """Whether the principal may perform `operation` on some resource of the type (Kafka's
        authorizeByResourceType, used for idempotent producers): an ALLOW binding for it (or ALL)
        that no literal-wildcard DENY cancels; with no bindings of the type at all,
        `allow_if_no_acl`."""
        if principal in self.super_users:
            return True
        seen = False
        allowed = False
        everyone = _wildcard_principal(principal)
        for b in self._all:  # a scan: only idempotent producers' InitProducerId asks this
            if b.resource_type != resource_type:
                continue
            seen = True
            if b.principal not in (principal, everyone) or b.host not in (host, WILDCARD):
                continue
            if b.operation not in (operation, AclOperation.ALL):
                continue
            if b.permission == Permission.DENY:
                if b.pattern_type == PatternType.LITERAL and b.name == WILDCARD:
                    return False
            else:
                allowed = True
        return allowed or (not seen and self.allow_if_no_acl)


def _wildcard_principal(principal: str) -> str:
    kind = principal.partition(":")[0]
    return f"{kind}:{WILDCARD}"


def broker_authorizer(config: BrokerConfig, acls: AclStore) -> Authorizer:
    """The broker's authorizer: its settings and the bindings stored in the metadata."""
    authz = Authorizer(config.super_users, config.acl_default_allow(), (Binding.of(row) for row in acls.bindings()))
    log.info(
        "authorizer: %d ACL binding(s), %d super user(s), allow.everyone.if.no.acl.found=%s",
        len(authz), len(authz.super_users), str(authz.allow_if_no_acl).lower(),
    )
    if not authz.allow_if_no_acl and not authz.super_users and not len(authz):
        # Nobody may do anything, and nobody may grant it (CreateAcls needs ALTER on the cluster):
        # say so once at start rather than leave the first client to find out.
        why = " because a listener authenticates clients" if config.allow_everyone_if_no_acl_found is None else ""
        log.warning(
            "ACLs are enforced (allow.everyone.if.no.acl.found is off%s) with no super user and no ACL binding: "
            "every client is refused, and nobody may grant an ACL; hint: start with --super-users User:NAME and "
            "grant ACLs as that principal, or with --allow-everyone-if-no-acl-found (docs/SECURITY.md, \"ACLs\")",
            why,
        )
    return authz
