"""The authorizer's decisions, filters and validation, the settings behind it, the `acls`
metadata record, and the per-API rule table (loglake.broker.security.authorizer, authorized, acl_rules,
meta/acls)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loglake.broker.config import BrokerConfig
from loglake.broker.handlers import HANDLERS
from loglake.broker.security.acl_rules import API_ACLS
from loglake.broker.security.authorized import AclOperation as Op
from loglake.broker.security.authorizer import (
    AclFilter,
    Authorizer,
    Binding,
    PatternType,
    Permission,
    ResourceType,
    check_binding,
)
from loglake.errors import ConfigError
from loglake.meta.checkpoint import capture, decode_checkpoint, encode_checkpoint
from loglake.meta.state import MetaState

T, G, C, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY


def b(rtype: int, name: str, pattern: int, principal: str, op: int, perm: int = ALLOW, host: str = "*") -> Binding:
    return Binding(int(rtype), name, int(pattern), principal, host, int(op), int(perm))


def test_no_acl_found_follows_the_setting_and_any_binding_closes_the_resource() -> None:
    open_ = Authorizer(allow_if_no_acl=True)
    closed = Authorizer(allow_if_no_acl=False)
    assert open_.authorize("User:a", "h", Op.WRITE, T, "t")
    assert not closed.authorize("User:a", "h", Op.WRITE, T, "t")
    # A binding for someone else on the resource: no longer "no ACL found", so a is refused.
    open_.add([b(T, "t", LIT, "User:b", Op.READ)])
    assert not open_.authorize("User:a", "h", Op.READ, T, "t")
    assert open_.authorize("User:a", "h", Op.READ, T, "other")
    # the last binding removed: "no ACL found" everywhere again (the answer without a lookup)
    open_.remove([b(T, "t", LIT, "User:b", Op.READ)])
    assert open_.authorize("User:a", "h", Op.READ, T, "t")
    # with no bindings at all a super user is still one where "no ACL found" refuses
    root = Authorizer(allow_if_no_acl=False, super_users={"User:root"})
    assert root.authorize("User:root", "h", Op.WRITE, T, "t") and not root.authorize("User:a", "h", Op.WRITE, T, "t")


def test_literal_wildcard_and_prefixed_patterns() -> None:
    authz = Authorizer(allow_if_no_acl=False, bindings=[
        b(T, "orders", LIT, "User:a", Op.READ),
        b(T, "*", LIT, "User:b", Op.READ),
        b(T, "logs-", PRE, "User:c", Op.READ),
    ])
    assert authz.authorize("User:a", "h", Op.READ, T, "orders")
    assert not authz.authorize("User:a", "h", Op.READ, T, "orders2")
    assert authz.authorize("User:b", "h", Op.READ, T, "anything")
    assert authz.authorize("User:c", "h", Op.READ, T, "logs-app")
    assert authz.authorize("User:c", "h", Op.READ, T, "logs-")
    assert not authz.authorize("User:c", "h", Op.READ, T, "logs")
    assert not authz.authorize("User:c", "h", Op.READ, G, "logs-app")  # another resource type


def test_deny_wins_and_all_covers_every_operation() -> None:
    authz = Authorizer(allow_if_no_acl=False, bindings=[
        b(T, "pub-", PRE, "User:a", Op.ALL),
        b(T, "pub-secret", LIT, "User:a", Op.READ, DENY),
        b(T, "*", LIT, "User:*", Op.ALL, DENY, host="10.0.0.9"),
    ])
    assert authz.authorize("User:a", "h", Op.WRITE, T, "pub-x")
    assert authz.authorize("User:a", "h", Op.ALTER_CONFIGS, T, "pub-x")
    assert not authz.authorize("User:a", "h", Op.READ, T, "pub-secret")
    assert authz.authorize("User:a", "h", Op.WRITE, T, "pub-secret")
    assert not authz.authorize("User:a", "10.0.0.9", Op.WRITE, T, "pub-x")  # DENY for everyone from that host


def test_implied_operations() -> None:
    authz = Authorizer(allow_if_no_acl=False, bindings=[
        b(T, "r", LIT, "User:a", Op.READ), b(T, "w", LIT, "User:a", Op.WRITE), b(T, "d", LIT, "User:a", Op.DELETE),
        b(T, "al", LIT, "User:a", Op.ALTER), b(T, "ac", LIT, "User:a", Op.ALTER_CONFIGS),
    ])
    for name in ("r", "w", "d", "al"):
        assert authz.authorize("User:a", "h", Op.DESCRIBE, T, name), name
    assert not authz.authorize("User:a", "h", Op.DESCRIBE, T, "ac")
    assert authz.authorize("User:a", "h", Op.DESCRIBE_CONFIGS, T, "ac")
    assert not authz.authorize("User:a", "h", Op.WRITE, T, "r")  # READ implies DESCRIBE only
    # A DENY of READ does not deny DESCRIBE (Kafka: only ALLOWs imply).
    authz.add([b(T, "r", LIT, "User:a", Op.READ, DENY), b(T, "r", LIT, "User:a", Op.DESCRIBE)])
    assert authz.authorize("User:a", "h", Op.DESCRIBE, T, "r")


def test_principals_hosts_and_super_users() -> None:
    authz = Authorizer(super_users=["User:root"], allow_if_no_acl=False, bindings=[
        b(G, "g", LIT, "User:*", Op.READ),
        b(X, "tx", LIT, "User:a", Op.WRITE, host="10.0.0.1"),
        b(T, "t", LIT, "User:root", Op.ALL, DENY),
    ])
    assert authz.authorize("User:anyone", "h", Op.READ, G, "g")
    assert not authz.authorize("Group:anyone", "h", Op.READ, G, "g")  # User:* is users only
    assert authz.authorize("User:a", "10.0.0.1", Op.WRITE, X, "tx")
    assert not authz.authorize("User:a", "10.0.0.2", Op.WRITE, X, "tx")
    assert authz.authorize("User:root", "h", Op.WRITE, T, "t")  # super users skip the ACLs, DENY too
    assert authz.authorize("User:root", "h", Op.ALTER, C, "kafka-cluster")


def test_remove_keeps_the_index_consistent() -> None:
    keep, drop = b(T, "a-", PRE, "User:a", Op.READ), b(T, "ab", PRE, "User:a", Op.READ)
    authz = Authorizer(allow_if_no_acl=False, bindings=[keep, drop, drop])
    assert len(authz) == 2
    authz.remove([drop, b(T, "zz", LIT, "User:a", Op.READ)])  # removing an unknown binding is a no-op
    assert authz.bindings() == [keep]
    assert not authz.authorize("User:a", "h", Op.READ, T, "abc")
    assert authz.authorize("User:a", "h", Op.READ, T, "a-c")


def test_idempotent_write_by_resource_type() -> None:
    authz = Authorizer(allow_if_no_acl=False, bindings=[b(T, "p-", PRE, "User:a", Op.WRITE)])
    assert authz.authorize_any("User:a", "h", Op.WRITE, T)
    assert not authz.authorize_any("User:b", "h", Op.WRITE, T)
    authz.add([b(T, "*", LIT, "User:a", Op.WRITE, DENY)])
    assert not authz.authorize_any("User:a", "h", Op.WRITE, T)
    assert Authorizer(allow_if_no_acl=True).authorize_any("User:b", "h", Op.WRITE, T)


def test_filters_any_match_and_exact() -> None:
    lit, pre, wild = b(T, "orders", LIT, "User:a", Op.READ), b(T, "ord", PRE, "User:a", Op.READ), b(T, "*", LIT, "User:b", Op.WRITE)

    def f(rtype: int, name: str | None, pattern: int, principal: str | None = None, op: int = Op.ANY) -> AclFilter:
        return AclFilter(int(rtype), name, int(pattern), principal, None, int(op), int(Permission.ANY))

    every = [lit, pre, wild]
    assert [x for x in every if f(ResourceType.ANY, None, PatternType.ANY).matches(x)] == every
    assert [x for x in every if f(T, "orders", PatternType.ANY).matches(x)] == [lit]
    assert [x for x in every if f(T, "orders", PatternType.MATCH).matches(x)] == every
    assert [x for x in every if f(T, "ord", PRE).matches(x)] == [pre]
    assert [x for x in every if f(T, None, LIT, principal="User:b").matches(x)] == [wild]
    assert [x for x in every if f(T, None, PatternType.ANY, op=Op.WRITE).matches(x)] == [wild]
    assert f(ResourceType.UNKNOWN, None, PatternType.ANY).problem() is not None
    assert f(T, None, PatternType.UNKNOWN).problem() is not None
    assert f(T, None, PatternType.ANY, op=Op.UNKNOWN).problem() is not None


@pytest.mark.parametrize(
    ("binding", "problem"),
    [
        (b(ResourceType.ANY, "t", LIT, "User:a", Op.READ), "resourceType"),
        (b(T, "t", PatternType.MATCH, "User:a", Op.READ), "patternType"),
        (b(T, "t", LIT, "User:a", Op.ANY), "operation"),
        (b(T, "t", LIT, "User:a", Op.READ, Permission.ANY), "permissionType"),
        (b(T, "t", LIT, "alice", Op.READ), "principal"),
        (b(T, "", LIT, "User:a", Op.READ), "empty"),
        (b(C, "my-cluster", LIT, "User:a", Op.ALTER), "kafka-cluster"),
        (b(T, "*", PRE, "User:a", Op.READ), "wildcard"),
        (b(T, "t", LIT, "User:a", Op.READ, host=""), "Host"),
    ],
)
def test_invalid_bindings_are_named(binding: Binding, problem: str) -> None:
    message = check_binding(binding)
    assert message is not None and problem in message


def test_valid_bindings() -> None:
    for binding in (b(C, "kafka-cluster", LIT, "User:a", Op.ALTER), b(T, "*", LIT, "User:*", Op.ALL),
                    b(ResourceType.USER, "bob", LIT, "User:a", Op.ALTER), b(X, "tx-", PRE, "User:a", Op.WRITE)):
        assert check_binding(binding) is None, binding


def test_allow_everyone_default_follows_authentication(tmp_path: Path) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("")
    plain = BrokerConfig.load(env={})
    assert plain.allow_everyone_if_no_acl_found is None and plain.acl_default_allow()  # `make run` unchanged
    tls = {"listen": ["SSL://127.0.0.1:9093"], "ssl_cert": str(cert)}
    assert BrokerConfig.load(env={}, **tls).acl_default_allow()  # SSL without client auth: everyone ANONYMOUS
    assert not BrokerConfig.load(env={}, ssl_client_auth="required", **tls).acl_default_allow()
    assert not BrokerConfig.load(env={}, ssl_client_auth="requested", **tls).acl_default_allow()
    explicit = BrokerConfig.load(env={"LOGLAKE_ALLOW_EVERYONE_IF_NO_ACL_FOUND": "true"}, ssl_client_auth="required", **tls)
    assert explicit.acl_default_allow()
    assert not BrokerConfig.load(env={}, allow_everyone_if_no_acl_found=False).acl_default_allow()


def test_super_users_from_flag_environment_and_toml(tmp_path: Path) -> None:
    assert BrokerConfig.load(env={}, super_users="User:admin,User:ops").super_users == ["User:admin", "User:ops"]
    assert BrokerConfig.load(env={"LOGLAKE_SUPER_USERS": "User:admin;User:ops"}).super_users == ["User:admin", "User:ops"]
    toml = tmp_path / "b.toml"
    toml.write_text('super_users = ["User:admin", "User:ops"]\n')
    loaded = BrokerConfig.load(str(toml), env={})
    assert loaded.super_users == ["User:admin", "User:ops"] and loaded.sources["super_users"] == f"{toml}:1"
    with pytest.raises(ConfigError, match=r"super_users='admin'.*LOGLAKE_SUPER_USERS.*User:admin"):
        BrokerConfig.load(env={"LOGLAKE_SUPER_USERS": "admin"})


def test_acls_record_and_checkpoint() -> None:
    state = MetaState("c")
    one, two = [2, "t", 4, "User:a", "*", 3, 3], [3, "g", 3, "User:*", "*", 2, 2]
    state.apply("acls", {"created": [one, two], "deleted": []})
    state.apply("acls", {"created": [one], "deleted": [two, [3, "nope", 3, "User:x", "*", 3, 3]]})  # replay-safe
    assert list(state.acls) == [tuple(one)]
    image = capture(state)
    restored = decode_checkpoint(b"".join(encode_checkpoint(image)), path="ck")
    assert list(restored.acls) == [tuple(one)]
    with pytest.raises((TypeError, ValueError)):
        MetaState("c").apply("acls", {"created": [[2, 7, 4, "User:a", "*", 3, 3]], "deleted": []})


def test_every_api_has_a_rule() -> None:
    """The table in loglake.broker.security.acl_rules names the rule of every API served."""
    missing = sorted(set(HANDLERS) - set(API_ACLS))
    assert not missing, f"APIs without an ACL rule in acl_rules.API_ACLS: {missing}"
