"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51), with Kafka's semantics.

Describe needs DESCRIBE on the cluster, Alter needs ALTER (else CLUSTER_AUTHORIZATION_FAILED).
Describe with users null or empty lists every user with a credential; a named user without one
is RESOURCE_NOT_FOUND, a user named twice DUPLICATE_RESOURCE. Alter answers one result per user:
an empty name is UNACCEPTABLE_CREDENTIAL, an unknown mechanism UNSUPPORTED_SASL_MECHANISM,
iterations outside 4096..16384 (or an empty salt, a salted password of the wrong length)
UNACCEPTABLE_CREDENTIAL, the same user and mechanism twice in one request DUPLICATE_RESOURCE,
deleting a credential that does not exist RESOURCE_NOT_FOUND; a user with any error has none of
its changes applied. The client sends the SaltedPassword; the broker stores StoredKey and
ServerKey derived from it (loglake.scram), never the salted password itself.
"""

from __future__ import annotations

import hashlib
import logging

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext, Handler
from loglake.broker.handlers.errors import error_code
from loglake.broker.protocol import ApiKey, DecodedRequest
from loglake.broker.protocol.kafka_types import KafkaStruct
from loglake.broker.security.authorized import AclOperation, cluster_allowed
from loglake.errors import LoglakeError
from loglake.kafka_errors import ErrorCode
from loglake.meta.records import JsonDoc
from loglake.meta.scram import USER_NAME_BYTES_MAX, credential_body
from loglake.scram import (
    ITERATIONS_MAX,
    ITERATIONS_MIN,
    MECHANISM_TYPES,
    MECHANISMS,
    SALT_BYTES_MAX,
    from_salted_password,
)

log = logging.getLogger(__name__)
_BY_TYPE = {code: name for name, code in MECHANISM_TYPES.items()}


#: A stored credential (a JSON document of the `scram_credential` record).
CredentialBody = JsonDoc
#: user -> mechanism -> its credential.
Credentials = dict[str, dict[str, CredentialBody]]


def _infos(mechs: dict[str, CredentialBody]) -> list[dict[str, int]]:
    return [
        {"mechanism": MECHANISM_TYPES[m], "iterations": int(c["iterations"])}
        for m, c in sorted(mechs.items())
    ]


async def describe_user_scram_credentials(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    if not cluster_allowed(ctx, conn, AclOperation.DESCRIBE):
        return {
            "throttle_time_ms": 0,
            "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            "error_message": "Cluster authorization failed.",
            "results": [],
        }
    table: Credentials = await ctx.off_loop(ctx.scram_store.credentials)
    users = req.body.users
    results: list[dict[str, object]] = []
    if not users:
        results = [
            {"user": u, "error_code": ErrorCode.NONE, "error_message": None, "credential_infos": _infos(m)}
            for u, m in sorted(table.items())
        ]
    else:
        names = [str(u.name) for u in users]
        for name in dict.fromkeys(names):
            if names.count(name) > 1:
                results.append(
                    {
                        "user": name,
                        "error_code": ErrorCode.DUPLICATE_RESOURCE,
                        "credential_infos": [],
                        "error_message": "Cannot describe SCRAM credentials for the same user twice in a single request",
                    }
                )
            elif name not in table:
                results.append(
                    {
                        "user": name,
                        "error_code": ErrorCode.RESOURCE_NOT_FOUND,
                        "credential_infos": [],
                        "error_message": "Attempt to describe a user credential that does not exist",
                    }
                )
            else:
                results.append(
                    {
                        "user": name,
                        "error_code": ErrorCode.NONE,
                        "error_message": None,
                        "credential_infos": _infos(table[name]),
                    }
                )
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "error_message": None, "results": results}


def _check_upsertion(u: KafkaStruct, mechanism: str) -> tuple[int, str] | None:
    if not u.iterations >= ITERATIONS_MIN:
        return (
            ErrorCode.UNACCEPTABLE_CREDENTIAL,
            f"Too few iterations: {u.iterations} (at least {ITERATIONS_MIN})",
        )
    if u.iterations > ITERATIONS_MAX:
        return (
            ErrorCode.UNACCEPTABLE_CREDENTIAL,
            f"Too many iterations: {u.iterations} (at most {ITERATIONS_MAX})",
        )
    if not 0 < len(u.salt or b"") <= SALT_BYTES_MAX:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, f"The salt must have 1 to {SALT_BYTES_MAX} bytes"
    if len(u.salted_password or b"") != hashlib.new(MECHANISMS[mechanism]).digest_size:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, f"The salted password is not a {mechanism} digest"
    return None


async def alter_user_scram_credentials(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    #: (user, mechanism type, the upsertion or None for a deletion)
    changes: list[tuple[str, int, KafkaStruct | None]] = [(str(d.name), int(d.mechanism), None) for d in body.deletions]
    changes += [(str(u.name), int(u.mechanism), u) for u in body.upsertions]
    users = list(dict.fromkeys(name for name, _m, _u in changes))
    if not cluster_allowed(ctx, conn, AclOperation.ALTER):
        return {
            "throttle_time_ms": 0,
            "results": [
                {
                    "user": u,
                    "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                    "error_message": "Cluster authorization failed.",
                }
                for u in users
            ],
        }
    table: Credentials = await ctx.off_loop(ctx.scram_store.credentials)
    errors: dict[str, tuple[int, str]] = {}
    pairs = [(name, m) for name, m, _u in changes]
    for name, code, upsertion in changes:
        if name in errors:
            continue
        mechanism = _BY_TYPE.get(code)
        if not name or len(name.encode("utf-8", "surrogatepass")) > USER_NAME_BYTES_MAX:
            errors[name] = (
                ErrorCode.UNACCEPTABLE_CREDENTIAL,
                "Username must not be empty" if not name else "Username too long",
            )
        elif mechanism is None:
            errors[name] = (ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"Unknown SCRAM mechanism type {code}")
        elif pairs.count((name, code)) > 1:
            errors[name] = (
                ErrorCode.DUPLICATE_RESOURCE,
                "A user credential cannot be altered twice in the same request",
            )
        elif upsertion is None and mechanism not in table.get(name, {}):
            errors[name] = (
                ErrorCode.RESOURCE_NOT_FOUND,
                "Attempt to delete a user credential that does not exist",
            )
        elif upsertion is not None and (problem := _check_upsertion(upsertion, mechanism)) is not None:
            errors[name] = problem
    results: list[dict[str, object]] = []
    for user in users:
        if user in errors:
            code, message = errors[user]
            results.append({"user": user, "error_code": code, "error_message": message})
            continue
        try:
            for name, code, upsertion in changes:
                if name != user:
                    continue
                mechanism = _BY_TYPE[code]
                cred = None
                if upsertion is not None:
                    cred = credential_body(
                        from_salted_password(
                            mechanism,
                            bytes(upsertion.salted_password),
                            bytes(upsertion.salt),
                            int(upsertion.iterations),
                        )
                    )
                await ctx.off_loop(ctx.scram_store.save, user, mechanism, cred)
        except ValueError as exc:  # the metadata refused it (SCRAM_USERS_MAX)
            results.append(
                {"user": user, "error_code": ErrorCode.UNACCEPTABLE_CREDENTIAL, "error_message": str(exc)}
            )
            continue
        except LoglakeError as exc:  # the metadata log cannot be written (a failed engine, a full disk)
            log.warning("AlterUserScramCredentials for user %r not applied: %s", user[:256], exc)
            results.append({"user": user, "error_code": error_code(exc), "error_message": str(exc)})
            continue
        results.append({"user": user, "error_code": ErrorCode.NONE, "error_message": None})
    return {"throttle_time_ms": 0, "results": results}


HANDLERS: dict[int, Handler] = {
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: describe_user_scram_credentials,
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: alter_user_scram_credentials,
}
