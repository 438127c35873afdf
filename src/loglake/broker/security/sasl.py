"""SASL on SASL_PLAINTEXT and SASL_SSL listeners: PLAIN (RFC 4616), SCRAM-SHA-256 and -512, and
OAUTHBEARER (RFC 7628) when a token validator is configured (loglake.broker.security.oauthbearer).

Theory of operation
-------------------
A connection accepted on a SASL listener gets a `SaslSession` (`conn.sasl`; None elsewhere).
Until it is authenticated the connection may send only ApiVersions, SaslHandshake (v1) and
SaslAuthenticate; anything else closes it with one log line, as Kafka does. Frames are bounded
by `SASL_MAX_RECEIVE_BYTES` (Kafka's sasl.server.max.receive.size) until then, and the whole
exchange must finish within `SASL_AUTHENTICATION_TIMEOUT_S` of the connection being accepted.

SaslHandshake picks the mechanism (one of `sasl_enabled_mechanisms`, else
UNSUPPORTED_SASL_MECHANISM with the enabled list); SaslAuthenticate carries the tokens: one for
PLAIN and OAUTHBEARER, two for SCRAM (client-first -> server-first, client-final -> server-final). Handshake v0
(tokens sent raw, without SaslAuthenticate, as clients before Kafka 1.0 did) is refused: the
clients loglake is tested with all send v1. A handshake twice, or SaslAuthenticate out of order,
is ILLEGAL_SASL_STATE and the connection is closed; on a listener without SASL both answer
ILLEGAL_SASL_STATE and the connection stays as it was.

Success sets `conn.security.principal` to ``User:NAME`` (ACLs and quotas key on it). Failure
answers SASL_AUTHENTICATION_FAILED with Kafka's message, logs one rate-limited line naming the
peer, the user and the reason (the client is told only that it failed), waits
`connection_failed_authentication_delay_ms` and closes the connection. Every credential is a
SCRAM credential in the metadata log (loglake.meta.scram); PLAIN derives the password against
it. A user without one is answered with a fake credential derived from this broker's secret
(`SECRET_FILE` in the data directory) and shaped as most real users' credentials are (their
iteration count and salt length, `ScramStore.shapes`), so it fails exactly as a wrong password
does: the same server-first message, the same key derivation for PLAIN.

Failed logins are throttled per source address and per claimed principal
(loglake.broker.security.login_throttle): once either has failed too often, a login is refused
before its password is checked, with the same answer, and one rate-limited line is logged.

KIP-368 re-authentication, as Kafka's broker does it: with `connections_max_reauth_ms` (Kafka's
connections.max.reauth.ms) above 0, a successful SaslAuthenticate answers that session lifetime
and the session expires that long after it; 0 (the default, as Kafka's) answers 0 and a session
never expires. An authenticated client re-authenticates on the same connection with SaslHandshake
(the same mechanism; another is UNSUPPORTED_SASL_MECHANISM and closes it) and SaslAuthenticate,
which check the credential afresh: a user deleted or given a new password since fails and the
connection is closed, and a re-authentication as another principal fails too ("a principal
cannot change"). A success starts a new lifetime. Once a session has expired, any request but
SaslHandshake and SaslAuthenticate closes the connection with one log line (Kafka's rule: the
broker does not close an idle expired connection, it refuses to serve it).

A session's state (`SaslState`) moves only by `SaslSession.transition_to`, along
`VALID_PREVIOUS_SASL_STATES`; a move the table does not hold is a bug and raises
IllegalSaslTransition:

* **handshake** - accepted; waiting for SaslHandshake (the first handshake is answered here).
* **authenticate** - the mechanism is chosen; waiting for the first SaslAuthenticate token
  (entered from **done** too: a re-authentication's handshake).
* **scram_final** - SCRAM's server-first message was sent; waiting for the client-final message.
* **done** - authenticated (PLAIN's one token, or SCRAM's final one, checked out).
* **failed** - a token was refused; the connection closes after the failure delay.

SaslAuthenticate is answered in the two token states only. Pipelined SaslAuthenticate requests
take their turn (`SaslSession.turn`), so each sees the state the one before it left, as Kafka's
broker reads one request of a connection at a time while it authenticates.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from loglake.broker.listeners import split_list
from loglake.broker.off_loop import OffLoop
from loglake.broker.protocol.api_keys import ApiKey
from loglake.broker.security.login_throttle import LoginThrottle, Refusal
from loglake.broker.security.oauthbearer import (
    OAUTHBEARER,
    OAuthSettings,
    TokenRefused,
    client_token,
    validator,
)
from loglake.broker.security.tls import SecurityContext
from loglake.errors import ConfigError
from loglake.fs.modes import FILE_MODE
from loglake.logsafe import RateLimitedLog
from loglake.meta.records import JsonDoc
from loglake.meta.scram import TypicalShapes, to_credential
from loglake.scram import (
    MECHANISMS,
    PLAIN_CHECKED_WITH,
    ScramCredential,
    ScramError,
    ScramServer,
    fake_credential,
    verify_password,
)

if TYPE_CHECKING:
    from prometheus_client.core import Metric

log = logging.getLogger("loglake.broker.sasl")

PLAIN = "PLAIN"
#: Every mechanism loglake implements (OAUTHBEARER only with a validator: oauthbearer.py).
SUPPORTED_MECHANISMS = (PLAIN, "SCRAM-SHA-256", "SCRAM-SHA-512", OAUTHBEARER)
#: Kafka's sasl.server.max.receive.size: the largest frame read before authentication is done.
SASL_MAX_RECEIVE_BYTES = 512 * 1024
#: How long a connection on a SASL listener may take from accept to authenticated.
SASL_AUTHENTICATION_TIMEOUT_S = 30.0
#: APIs answered before authentication: ApiVersions, SaslHandshake, SaslAuthenticate.
PRE_AUTH_APIS = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
#: APIs an expired session may still send (KIP-368: re-authentication).
REAUTH_APIS = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
#: Distinct (principal, source address) label pairs of the failure counter; further ones are
#: counted under OVERFLOW_LABEL (a scan of user names must not grow /metrics without bound).
SASL_FAILURE_LABELS_MAX = 1000
OVERFLOW_LABEL = "other"
#: The per-broker secret fake credentials of unknown users derive from (32 random bytes, 0600).
SECRET_FILE = ".sasl-secret"
SECRET_BYTES = 32
#: Longest principal shown in a log line or a metrics label (user names may be 1 KiB).
PRINCIPAL_SHOWN_MAX = 256
#: Longest PLAIN message field (authzid, user, password) accepted.
PLAIN_FIELD_BYTES_MAX = 1024


class SaslState(enum.StrEnum):
    """A connection's SASL state (the values appear in log lines)."""

    HANDSHAKE = "handshake"
    AUTHENTICATE = "authenticate"
    SCRAM_FINAL = "scram_final"
    DONE = "done"
    FAILED = "failed"


#: target state -> the states it may be entered from; HANDSHAKE is the first state, never a target.
VALID_PREVIOUS_SASL_STATES: dict[SaslState, frozenset[SaslState]] = {
    SaslState.HANDSHAKE: frozenset(),
    SaslState.AUTHENTICATE: frozenset({SaslState.HANDSHAKE, SaslState.DONE}),  # from done: KIP-368
    SaslState.SCRAM_FINAL: frozenset({SaslState.AUTHENTICATE}),
    SaslState.DONE: frozenset({SaslState.AUTHENTICATE, SaslState.SCRAM_FINAL}),
    SaslState.FAILED: frozenset({SaslState.AUTHENTICATE, SaslState.SCRAM_FINAL}),
}
#: States in which a SaslAuthenticate token is expected.
TOKEN_STATES = frozenset({SaslState.AUTHENTICATE, SaslState.SCRAM_FINAL})


class IllegalSaslTransition(RuntimeError):
    """A broker bug: a SASL state transition the table does not allow."""


def enabled_mechanisms(value: str | list[str] | tuple[str, ...]) -> list[str]:
    """`sasl_enabled_mechanisms` checked: a non-empty list of mechanisms loglake implements."""
    names = [m.upper() for m in split_list(value)]
    unknown = [m for m in names if m not in SUPPORTED_MECHANISMS]
    if unknown or not names:
        raise ConfigError(
            f"sasl_enabled_mechanisms={value!r}: {'unknown ' + ', '.join(unknown) if unknown else 'empty'}; "
            f"loglake implements {', '.join(SUPPORTED_MECHANISMS)}"
        )
    return list(dict.fromkeys(names))


def load_secret(data_dir: str) -> bytes:
    """This broker's secret, made on first use (O_EXCL, mode 0600)."""
    path = os.path.join(data_dir, SECRET_FILE)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        with open(path, "rb") as fh:
            secret = fh.read(SECRET_BYTES * 2)
        if len(secret) >= SECRET_BYTES:
            return secret[:SECRET_BYTES]
        log.warning("%s is %d bytes (want %d): making a new one", path, len(secret), SECRET_BYTES)
        os.unlink(path)
        return load_secret(data_dir)
    try:
        secret = os.urandom(SECRET_BYTES)
        os.write(fd, secret)
        os.fsync(fd)
    finally:
        os.close(fd)
    return secret


class SaslStats:
    """What /metrics shows of SASL: failures per principal and source, successes per mechanism,
    and the login throttle's refusals and table sizes (once an authenticator set `throttle`)."""

    def __init__(self) -> None:
        self.failures: dict[tuple[str, str], int] = {}
        self.successes: dict[str, int] = {}
        self.throttle: LoginThrottle | None = None

    def failed(self, principal: str, source: str) -> None:
        key = (principal, source)
        if key not in self.failures and len(self.failures) >= SASL_FAILURE_LABELS_MAX:
            key = (OVERFLOW_LABEL, OVERFLOW_LABEL)
        self.failures[key] = self.failures.get(key, 0) + 1

    def succeeded(self, mechanism: str) -> None:
        self.successes[mechanism] = self.successes.get(mechanism, 0) + 1

    def families(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily

        failures = CounterMetricFamily(
            "loglake_sasl_authentication_failures_total",
            f"Failed SASL authentications by principal and source address (past {SASL_FAILURE_LABELS_MAX} pairs: "
            f"principal=source={OVERFLOW_LABEL!r}).",
            labels=["principal", "source"],
        )
        for (principal, source), n in sorted(self.failures.items()):
            failures.add_metric([principal, source], n)
        yield failures
        successes = CounterMetricFamily(
            "loglake_sasl_authentications_total",
            "Successful SASL authentications by mechanism.",
            labels=["mechanism"],
        )
        for mechanism, n in sorted(self.successes.items()):
            successes.add_metric([mechanism], n)
        yield successes
        if self.throttle is not None:
            yield from _throttle_families(self.throttle)


def _throttle_families(throttle: LoginThrottle) -> Iterator[Metric]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    refused = CounterMetricFamily(
        "loglake_sasl_login_throttled_total",
        "SASL logins refused without checking the password by the failed-login throttle, by the bucket that was full.",
        labels=["scope"],
    )
    for scope, n in throttle.refused.items():
        refused.add_metric([scope.value], n)
    yield refused
    entries = GaugeMetricFamily(
        "loglake_sasl_login_throttle_entries",
        "Entries of the failed-login throttle's bounded tables: sources, principals, trusted (principal, source) pairs.",
        labels=["table"],
    )
    for table, n in throttle.sizes().items():
        entries.add_metric([table], n)
    yield entries


class CredentialLookup(Protocol):
    """Where the authenticator finds credentials (`ScramStore`; tests give a fake)."""

    def credential(self, user: str, mechanism: str) -> JsonDoc | None:
        """The stored credential document (the `scram_credential` record's), or None."""
        ...

    def shapes(self) -> TypicalShapes:
        """What the stored credentials look like (`loglake.meta.scram.typical_shapes`)."""
        ...


class SaslSettings(OAuthSettings, Protocol):
    """The broker settings SASL reads (`loglake.broker.config.BrokerConfig`, which imports this module)."""

    @property
    def sasl_enabled_mechanisms(self) -> str: ...
    @property
    def connection_failed_authentication_delay_ms(self) -> int: ...
    @property
    def connections_max_reauth_ms(self) -> int: ...
    @property
    def sasl_login_failures_per_source(self) -> int: ...
    @property
    def sasl_login_failures_per_principal(self) -> int: ...
    @property
    def sasl_login_failure_window_ms(self) -> int: ...
    @property
    def data_dir(self) -> str: ...


class SaslAuthenticator:
    """The broker's side of SASL: enabled mechanisms, the failure delay, the credential lookup,
    the failed-login throttle."""

    def __init__(
        self, config: SaslSettings, credentials: CredentialLookup, stats: SaslStats, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.mechanisms = enabled_mechanisms(config.sasl_enabled_mechanisms)
        self.failure_delay_s = config.connection_failed_authentication_delay_ms / 1000.0
        #: KIP-368: the session lifetime told to clients (0: sessions do not expire)
        self.max_reauth_ms = config.connections_max_reauth_ms
        #: how OAUTHBEARER tokens are checked (None: not offered)
        self.oauth = validator(config)
        self.clock = clock
        self.credentials = credentials
        self.stats = stats
        self.secret = load_secret(config.data_dir)
        self.throttle = stats.throttle = LoginThrottle(
            config.sasl_login_failures_per_source,
            config.sasl_login_failures_per_principal,
            config.sasl_login_failure_window_ms / 1000.0,
            clock,
        )

    def credential(self, user: str, mechanism: str) -> ScramCredential | None:
        doc = self.credentials.credential(user, mechanism)
        return None if doc is None else to_credential(mechanism, doc)

    def credential_or_fake(self, user: str, mechanism: str) -> tuple[ScramCredential, bool]:
        """The user's credential, or a fake one shaped as most users' of `mechanism` are (whether it is real)."""
        cred = self.credential(user, mechanism)
        if cred is not None:
            return cred, True
        return fake_credential(self.secret, mechanism, user, self.credentials.shapes().shape(mechanism)), False

    def check_plain(self, user: str, password: bytes) -> tuple[bool, str]:
        """PLAIN against the user's SCRAM credential (`PLAIN_CHECKED_WITH`: SHA-512 if it has one,
        else SHA-256). A user without one gets the derivation most users' PLAIN logins cost: the
        same mechanism and iteration count, one derivation and one constant-time compare."""
        for mechanism in PLAIN_CHECKED_WITH:
            cred = self.credential(user, mechanism)
            if cred is not None:
                return verify_password(cred, password), "wrong password"
        mechanism, shape = self.credentials.shapes().plain
        verify_password(fake_credential(self.secret, mechanism, user, shape), password)  # the same work
        return False, "unknown user"

    def admit(self, user: str, host: str) -> None:
        """LoginThrottled when a login as `user` from `host` is refused unchecked now; else it
        is charged to the throttle until it succeeds (`LoginThrottle.admit`)."""
        refusal = self.throttle.admit(f"User:{user}", host)
        if refusal is not None:
            raise LoginThrottled(refusal)


class SaslError(Exception):
    """Authentication failed; the text is the reason for the broker's log, not for the client."""


class LoginThrottled(SaslError):
    """Refused before the password was checked: the source or the principal failed too often."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(str(refusal))
        self.refusal = refusal


class FrameLimit(Protocol):
    """Where a connection applies its frame limit (`loglake.broker.receive.FrameReceiver`)."""

    max_frame_bytes: int


class SaslConn(Protocol):
    """What a SASL session uses of its connection (`loglake.broker.connection.Connection`)."""

    closing: bool
    close_after_write: float | None

    @property
    def peer(self) -> str: ...
    @property
    def peer_host(self) -> str: ...
    @property
    def security(self) -> SecurityContext: ...
    @property
    def limited(self) -> RateLimitedLog: ...
    @property
    def protocol_errors(self) -> dict[str, int]:
        """Connections closed for a protocol error, by kind (the broker's metrics)."""
    @property
    def decoder(self) -> FrameLimit: ...
    @property
    def max_frame_bytes(self) -> int:
        """The frame limit once authenticated (max_frame_bytes: dynamic, so read when it applies)."""
    @property
    def off_loop(self) -> OffLoop: ...
    def _close_transport(self) -> None: ...


class SaslSession:
    """One connection's SASL state: handshake -> authenticate (-> scram_final) -> done or failed."""

    def __init__(self, conn: SaslConn) -> None:
        self.conn = conn
        self.state = SaslState.HANDSHAKE
        #: Held while a SaslAuthenticate is answered: pipelined ones wait their turn.
        self.turn = asyncio.Lock()
        self.mechanism = ""
        self.user = ""
        self._scram: ScramServer | None = None
        self._known = True  # whether the SCRAM user has a credential (the log says "unknown user")
        self._admitted = False  # whether the login throttle admitted (and charged) this login
        self._timer = asyncio.get_running_loop().call_later(SASL_AUTHENTICATION_TIMEOUT_S, self._expired)
        #: KIP-368: the lifetime the last success told the client (ms; 0: none), and when
        #: (the authenticator's clock) the session expires; None: never
        self.session_lifetime_ms = 0
        self.expires_at: float | None = None
        #: the principal of the session being re-authenticated (None: a first authentication)
        self.reauthenticating: str | None = None

    @property
    def authenticated(self) -> bool:
        return self.state is SaslState.DONE

    def transition_to(self, target: SaslState) -> None:
        """Move to `target`; IllegalSaslTransition when the table does not allow it (a bug)."""
        if self.state not in VALID_PREVIOUS_SASL_STATES[target]:
            raise IllegalSaslTransition(
                f"SASL session of {self.conn.peer}: {self.state.value} -> {target.value} is not a SASL state transition"
            )
        self.state = target

    def _expired(self) -> None:
        if self.authenticated or self.conn.closing:
            return
        self.conn.limited.warning(
            ("sasl_timeout", self.conn.peer_host),
            "closing %s: SASL authentication on the %s listener not finished within %.0f s (state %s)",
            self.conn.peer,
            self.conn.security.listener.name,
            SASL_AUTHENTICATION_TIMEOUT_S,
            self.state,
        )
        self.conn.protocol_errors["sasl_timeout"] += 1
        self.conn.closing = True
        self.conn._close_transport()

    def close(self) -> None:
        self._timer.cancel()

    def begin_reauthentication(self) -> None:
        """KIP-368: an authenticated session's SaslHandshake (its mechanism already checked)."""
        self.reauthenticating = self.conn.security.principal
        self.transition_to(SaslState.AUTHENTICATE)
        self.user, self._scram, self._known, self._admitted = "", None, True, False
        self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(SASL_AUTHENTICATION_TIMEOUT_S, self._expired)

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def refuse_request(self, api_key: int, name: str, now: float | None = None) -> bool:
        """Whether this request must close the connection (not allowed before authentication, or
        after the session expired: KIP-368); logs the one line. `now`: the authenticator's clock."""
        if self.authenticated and now is not None and self.expired(now) and api_key not in REAUTH_APIS:
            assert self.expires_at is not None
            self.conn.protocol_errors["sasl_session_expired"] += 1
            self.conn.limited.warning(
                ("sasl_session_expired", self.conn.peer_host),
                "closing %s: the SASL session of %s on the %s listener expired %.0f ms ago without re-authentication "
                "(session lifetime %d ms: connections_max_reauth_ms); %s request refused",
                self.conn.peer,
                self.conn.security.principal[:PRINCIPAL_SHOWN_MAX],
                self.conn.security.listener.name,
                (now - self.expires_at) * 1000,
                self.session_lifetime_ms,
                name,
            )
            return True
        if self.authenticated or api_key in PRE_AUTH_APIS:
            return False
        self.conn.protocol_errors["sasl_unauthenticated_request"] += 1
        self.conn.limited.warning(
            ("sasl_unauthenticated", self.conn.peer_host),
            "closing %s: %s request before SASL authentication on the %s listener (only ApiVersions, "
            "SaslHandshake and SaslAuthenticate are allowed until then)",
            self.conn.peer,
            name,
            self.conn.security.listener.name,
        )
        return True

    def frame_too_large(self, size: int) -> bool:
        """A frame over the pre-authentication bound: one log line (True) instead of the general one."""
        if self.authenticated:
            return False
        self.conn.limited.warning(
            ("sasl_frame_too_large", self.conn.peer_host),
            "closing %s: a %d-byte frame before SASL authentication finished on the %s listener "
            "(over SASL_MAX_RECEIVE_BYTES, %d: Kafka's sasl.server.max.receive.size)",
            self.conn.peer,
            size,
            self.conn.security.listener.name,
            SASL_MAX_RECEIVE_BYTES,
        )
        return True

    def succeeded(self, authenticator: SaslAuthenticator, credential_expires_at: float | None = None) -> None:
        """The credential checked out: the session is (again) authenticated, with a new lifetime
        (bounded by `credential_expires_at`, seconds since the epoch: an OAUTHBEARER token's exp).
        SaslError when a re-authentication names another principal (Kafka refuses that too)."""
        principal = f"User:{self.user}"
        if self.reauthenticating is not None and principal != self.reauthenticating:
            raise SaslError(f"re-authentication as {principal[:PRINCIPAL_SHOWN_MAX]} on a connection of "
                            f"{self.reauthenticating[:PRINCIPAL_SHOWN_MAX]} (a principal cannot change)")
        self.transition_to(SaslState.DONE)
        self._timer.cancel()
        authenticator.throttle.succeeded(principal, self.conn.peer_host)
        self.conn.security.principal = principal
        self.conn.security.extra["sasl_mechanism"] = self.mechanism
        self.conn.decoder.max_frame_bytes = self.conn.max_frame_bytes
        authenticator.stats.succeeded(self.mechanism)
        self.session_lifetime_ms = authenticator.max_reauth_ms
        if credential_expires_at is not None:  # as Kafka: the shorter of the token's time left and the setting
            left_ms = max(1, int((credential_expires_at - time.time()) * 1000))  # 0 would say "never expires"
            self.session_lifetime_ms = min(left_ms, self.session_lifetime_ms) if self.session_lifetime_ms > 0 else left_ms
        self.expires_at = authenticator.clock() + self.session_lifetime_ms / 1000 if self.session_lifetime_ms > 0 else None
        log.debug("%s %s as %s with %s", self.conn.peer,
                  "re-authenticated" if self.reauthenticating is not None else "authenticated", principal, self.mechanism)
        self.reauthenticating = None

    def failed(self, authenticator: SaslAuthenticator, error: SaslError) -> str:
        """Count and log a failed authentication, schedule the close; the client's message."""
        self.transition_to(SaslState.FAILED)
        self._timer.cancel()
        principal = f"User:{self.user}"[:PRINCIPAL_SHOWN_MAX] if self.user else "unknown"
        authenticator.stats.failed(principal, self.conn.peer_host)
        if isinstance(error, LoginThrottled):
            # Not per peer: a guesser spread over many addresses is still one line a window.
            key: tuple[str, ...] = ("sasl_throttled", error.refusal.scope.value)
        else:
            principal_claimed = f"User:{self.user}" if self.user else None
            authenticator.throttle.failed(principal_claimed, self.conn.peer_host, admitted=self._admitted)
            key = ("sasl_failed", self.conn.peer_host)  # not per user: a scan of names is one line a window
        self.conn.limited.warning(
            key,
            "SASL authentication failed for %s from %s on the %s listener with %s: %s; closing the connection in %.0f ms",
            principal,
            self.conn.peer,
            self.conn.security.listener.name,
            self.mechanism or "no mechanism",
            error,
            authenticator.failure_delay_s * 1000,
        )
        self.conn.close_after_write = authenticator.failure_delay_s
        return f"Authentication failed during authentication due to invalid credentials with SASL mechanism {self.mechanism}"

    async def step(self, authenticator: SaslAuthenticator, token: bytes) -> bytes:
        """One SaslAuthenticate token in, the answer token out; SaslError when it failed."""
        try:
            if self.mechanism == PLAIN:
                return await self._plain(authenticator, token)
            if self.mechanism == OAUTHBEARER:
                return await self._oauthbearer(authenticator, token)
            if self._scram is None:
                self._scram = ScramServer(self.mechanism)
                self.user = self._scram.first(token)
                authenticator.admit(self.user, self.conn.peer_host)
                self._admitted = True
                cred, self._known = await self.conn.off_loop(
                    authenticator.credential_or_fake, self.user, self.mechanism
                )
                self.transition_to(SaslState.SCRAM_FINAL)
                return self._scram.server_first(cred)
            answer = self._scram.final(token)
            self.succeeded(authenticator)
            return answer
        except ScramError as exc:
            raise SaslError(str(exc) if self._known else "unknown user") from None

    async def _oauthbearer(self, authenticator: SaslAuthenticator, message: bytes) -> bytes:
        check = authenticator.oauth
        if check is None:  # not offered without a validator (BrokerConfig.validate)
            raise SaslError("OAUTHBEARER is not set up on this broker")
        try:
            bearer = await self.conn.off_loop(check.validate, client_token(message))  # may fetch the JWKS
        except TokenRefused as exc:
            raise SaslError(f"token refused: {exc}") from None
        self.user = bearer.principal
        self.succeeded(authenticator, bearer.expires_at)
        # the token's scopes (sasl_oauthbearer_scope_claim_name) go with the session, as Kafka's
        # OAuthBearerToken carries them; the audit and debug lines name them
        self.conn.security.extra["oauth_scopes"] = " ".join(sorted(bearer.scopes))
        log.debug("%s OAUTHBEARER token of User:%s has scopes [%s]", self.conn.peer, self.user,
                  self.conn.security.extra["oauth_scopes"])
        return b""

    async def _plain(self, authenticator: SaslAuthenticator, token: bytes) -> bytes:
        parts = token.split(b"\0")
        if len(parts) != 3 or any(len(p) > PLAIN_FIELD_BYTES_MAX for p in parts):
            raise SaslError("malformed PLAIN message (want authzid NUL user NUL password)")
        authzid, user, password = parts
        try:
            self.user = user.decode("utf-8")
            if authzid and authzid.decode("utf-8") != self.user:
                raise SaslError("PLAIN authorization id differs from the user name (not supported)")
        except UnicodeDecodeError:
            raise SaslError("PLAIN user name is not UTF-8") from None
        if not self.user or not password:
            raise SaslError("PLAIN user name or password is empty")
        authenticator.admit(self.user, self.conn.peer_host)
        self._admitted = True
        ok, why = await self.conn.off_loop(authenticator.check_plain, self.user, password)
        if not ok:
            raise SaslError(why)
        self.succeeded(authenticator)
        return b""


__all__ = [
    "MECHANISMS",
    "OVERFLOW_LABEL",
    "PLAIN",
    "PRE_AUTH_APIS",
    "REAUTH_APIS",
    "SASL_AUTHENTICATION_TIMEOUT_S",
    "SASL_FAILURE_LABELS_MAX",
    "SASL_MAX_RECEIVE_BYTES",
    "SECRET_FILE",
    "SUPPORTED_MECHANISMS",
    "TOKEN_STATES",
    "VALID_PREVIOUS_SASL_STATES",
    "IllegalSaslTransition",
    "LoginThrottled",
    "SaslAuthenticator",
    "SaslError",
    "SaslSession",
    "SaslState",
    "SaslStats",
    "enabled_mechanisms",
    "load_secret",
]
