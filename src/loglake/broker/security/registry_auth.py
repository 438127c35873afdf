"""Who calls the schema registry, and what they may do.

Authentication: HTTP basic auth (``Authorization: Basic base64(user:password)``, what
confluent-kafka's ``basic.auth.user.info`` sends) is checked as a SASL/PLAIN login is: against
the user's SCRAM credential in the metadata (`SaslAuthenticator.check_plain`: one key derivation
and a constant-time compare, a user without a credential costs the same), through the broker's
failed-login throttle (`LoginThrottle`: per source address and per user, the same buckets as
Kafka logins). Credentials are required whenever a Kafka listener authenticates clients
(`BrokerConfig.authenticates`); when sent, they are checked either way. Over HTTPS a client
certificate the handshake verified names the principal too (``ssl_principal_mapping_rules``),
when no credentials are sent. A request without acceptable credentials is answered 401 with
Confluent's body (UNAUTHORIZED) and a ``WWW-Authenticate`` header; a wrong password after
`connection_failed_authentication_delay_ms`, as a failed SASL login is.

Authorization: the broker's authorizer (its bindings, super users and
allow.everyone.if.no.acl.found) decides each request's operation on a SUBJECT or on the
REGISTRY resource (loglake.registry.api.ACCESS says which); refusals are audit lines.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging

from loglake.broker.config import BrokerConfig
from loglake.broker.http import HttpRequest
from loglake.broker.security.authorized import audit_denied
from loglake.broker.security.authorizer import REGISTRY_NAME, AclOperation, Authorizer, ResourceType
from loglake.broker.security.sasl import PLAIN_FIELD_BYTES_MAX, PRINCIPAL_SHOWN_MAX, SaslAuthenticator
from loglake.broker.security.tls import ANONYMOUS, PrincipalMapper
from loglake.logsafe import RateLimitedLog
from loglake.registry.api import On, Op

__all__ = ["WWW_AUTHENTICATE", "RegistryAuth", "RegistryCaller", "basic_credentials"]

log = logging.getLogger("loglake.broker.schema_registry")

#: The challenge of a 401 (RFC 7617).
WWW_AUTHENTICATE = 'Basic realm="schema-registry", charset="UTF-8"'
#: What the audit lines name as the API of a registry request.
_API = "SchemaRegistry"
_RESOURCE = {On.SUBJECT: ResourceType.SUBJECT, On.REGISTRY: ResourceType.REGISTRY}


class Unauthenticated(Exception):
    """The request gets a 401; the text says why, for the broker's log."""


def basic_credentials(header: str) -> tuple[str, bytes]:
    """(user, password) of an ``Authorization: Basic ...`` value; Unauthenticated when it is not one."""
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        raise Unauthenticated(f"{scheme[:32]!r} authorization, not Basic")
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise Unauthenticated("malformed Basic credentials (not base64)") from None
    user, sep, password = raw.partition(b":")
    if not sep or not user or not password:
        raise Unauthenticated("malformed Basic credentials (want user:password, neither empty)")
    if len(user) > PLAIN_FIELD_BYTES_MAX or len(password) > PLAIN_FIELD_BYTES_MAX:
        raise Unauthenticated(f"Basic credentials over {PLAIN_FIELD_BYTES_MAX} bytes")
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        raise Unauthenticated("Basic user name is not UTF-8") from None


class RegistryCaller:
    """One request's principal before the authorizer: the `Guard` loglake.registry.api asks."""

    def __init__(self, authorizer: Authorizer, principal: str, host: str) -> None:
        self.authorizer = authorizer
        self.principal = principal
        self.host = host

    def allows(self, op: Op, on: On, subject: str) -> bool:
        name = subject if on is On.SUBJECT else REGISTRY_NAME
        return self.authorizer.authorize(self.principal, self.host, AclOperation[op.value], _RESOURCE[on], name)

    def refused(self, op: Op, on: On, subjects: list[str]) -> None:
        names = subjects if on is On.SUBJECT else [REGISTRY_NAME]
        audit_denied(self.principal, self.host, _API, AclOperation[op.value], _RESOURCE[on], names)


class RegistryAuth:
    """The registry endpoint's authentication and authorization (module doc)."""

    def __init__(
        self, config: BrokerConfig, sasl: SaslAuthenticator, authorizer: Authorizer, limited: RateLimitedLog
    ) -> None:
        #: whether a request must authenticate (some Kafka listener does)
        self.required = config.authenticates()
        self.sasl = sasl
        self.authorizer = authorizer
        self.limited = limited
        self.mapper = PrincipalMapper(config.ssl_principal_mapping_rules)

    async def caller(self, request: HttpRequest) -> RegistryCaller:
        """Who sent `request`; Unauthenticated when the answer is 401."""
        return RegistryCaller(self.authorizer, await self._principal(request), request.peer_host)

    async def _principal(self, request: HttpRequest) -> str:
        header = request.headers.get("authorization")
        if header is not None:
            try:
                user, password = basic_credentials(header)
            except Unauthenticated as exc:
                self._failed(request, None, str(exc))
                raise
            return await self._login(request, user, password)
        if request.peer_dn is not None:
            name = self.mapper.name(request.peer_dn)
            if name is None:
                why = f"no ssl_principal_mapping_rules rule matches the client certificate subject {request.peer_dn!r}"
                self._failed(request, None, why)
                raise Unauthenticated(why)
            return f"User:{name}"
        if self.required:
            raise Unauthenticated("no credentials")  # a client's first try, before its challenge: no log line
        return ANONYMOUS

    async def _login(self, request: HttpRequest, user: str, password: bytes) -> str:
        host, principal = request.peer_host, f"User:{user}"
        refusal = self.sasl.throttle.admit(principal, host)
        if refusal is not None:
            self.limited.warning(("registry_login_throttled", refusal.scope.value),
                                 "schema registry: basic auth as %s from %s %s", principal[:PRINCIPAL_SHOWN_MAX], host, refusal)
            raise Unauthenticated(str(refusal))
        ok, why = await asyncio.get_running_loop().run_in_executor(None, self.sasl.check_plain, user, password)
        if ok:
            self.sasl.throttle.succeeded(principal, host)
            return principal
        self.sasl.throttle.failed(principal, host, admitted=True)
        self._failed(request, principal, why)
        await asyncio.sleep(self.sasl.failure_delay_s)  # as a failed SASL login waits before its answer
        raise Unauthenticated(why)

    def _failed(self, request: HttpRequest, principal: str | None, why: str) -> None:
        if principal is None:
            self.sasl.throttle.failed(None, request.peer_host, admitted=False)
        shown = principal[:PRINCIPAL_SHOWN_MAX] if principal else "unknown"
        self.limited.warning(("registry_auth_failed", request.peer_host),
                             "schema registry: authentication failed for %s from %s: %s", shown, request.peer_host, why)
