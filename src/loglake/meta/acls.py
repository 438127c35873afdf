"""ACL bindings in the metadata: Kafka's authorizer state, durable and in the bucket copy.

One record kind, ``acls``, body ``{created: [binding, ...], deleted: [binding, ...]}``, where a
binding is ``[resource_type, resource_name, pattern_type, principal, host, operation,
permission]`` with Kafka's codes (org.apache.kafka.common.resource.ResourceType,
PatternType, acl.AclOperation, acl.AclPermissionType). Applying it removes `deleted` and then
adds `created`; adding a binding that exists and removing one that does not are no-ops, so
replaying a record is harmless. CreateAcls and DeleteAcls each write one record
(loglake.broker.handlers.acls); the broker's authorizer (loglake.broker.security.authorizer) indexes
the bindings for lookups.

Checkpoints carry the set as ``acls`` (a list of bindings; absent in checkpoints written before
ACLs: none).
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["ACL_BINDINGS_MAX", "Binding", "acls_doc", "apply_acls", "binding_from_json", "load_acls"]

#: Most ACL bindings the cluster keeps. CreateAcls refuses bindings past it (every request
#: consults the authorizer's index, and every binding is in every checkpoint); Kafka has no
#: limit, but 100,000 bindings is far beyond what any hand-kept ACL set reaches.
ACL_BINDINGS_MAX = 100_000

#: (resource_type, resource_name, pattern_type, principal, host, operation, permission)
Binding = tuple[int, str, int, str, str, int, int]


def binding_from_json(row: Any) -> Binding:
    """A binding from its JSON row; ValueError/TypeError on a row of the wrong shape."""
    rtype, name, pattern, principal, host, op, perm = row
    if not all(isinstance(v, str) for v in (name, principal, host)):
        raise TypeError(f"ACL binding {row!r}: name, principal and host must be strings")
    return (int(rtype), name, int(pattern), principal, host, int(op), int(perm))


class AclState(Protocol):
    """The part of the metadata state (`loglake.meta.state.MetaState`, which imports this module)
    ACL bindings live in: the bindings in creation order."""

    @property
    def acls(self) -> dict[Binding, None]: ...


def apply_acls(state: AclState, b: dict[str, Any]) -> None:
    for row in b.get("deleted", ()):
        state.acls.pop(binding_from_json(row), None)
    for row in b.get("created", ()):
        state.acls[binding_from_json(row)] = None


def acls_doc(state: AclState) -> list[list[Any]]:
    return [list(binding) for binding in state.acls]


def load_acls(state: AclState, doc: dict[str, Any]) -> None:
    for row in doc.get("acls") or ():
        state.acls[binding_from_json(row)] = None
