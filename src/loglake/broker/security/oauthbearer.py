"""SASL/OAUTHBEARER (RFC 7628, KIP-255 and KIP-768): a bearer token (a JWT) names the principal.

Off unless asked for: OAUTHBEARER is offered only when it is in `sasl_enabled_mechanisms` *and*
`sasl_oauthbearer_validator` says how tokens are checked (`BrokerConfig.validate` refuses one
without the other). Two validators, as Kafka's broker has:

* ``unsecured`` - Kafka's OAuthBearerUnsecuredValidatorCallbackHandler: an unsigned JWT (header
  ``{"alg":"none"}``, empty signature), the kind librdkafka builds from
  ``sasl.oauthbearer.config=principal=...`` and Kafka's client from ``unsecuredLoginStringClaim_sub``.
  Its ``exp`` must be in the future and its ``iat`` (if any) not in it, both give or take
  `sasl_oauthbearer_clock_skew_seconds`; the principal is the `sasl_oauthbearer_sub_claim_name`
  claim. Anyone can write such a token: for tests and trusted networks only.
* ``jwks`` - Kafka's BrokerJwtValidator: a signed JWT checked with PyJWT (the ``oauth`` extra)
  against the keys of `sasl_oauthbearer_jwks_endpoint_url` (``https://``, ``http://`` or
  ``file://``; fetched when first needed, cached, fetched again for an unknown key id and every
  `sasl_oauthbearer_jwks_endpoint_refresh_ms`): a signature by one of those keys (RS*, PS*, ES*;
  never ``none`` or HMAC), ``exp`` required, ``nbf``/``iat`` honoured, with the same skew; ``iss``
  must be `sasl_oauthbearer_expected_issuer` and ``aud`` one of
  `sasl_oauthbearer_expected_audience` when those are set; the principal is the sub claim.

A token's ``exp`` bounds the session: SaslAuthenticate's session lifetime is the shorter of the
time left and `connections_max_reauth_ms` (KIP-368), as Kafka's broker answers it. A refused
token fails the authentication as a wrong password does (SASL_AUTHENTICATION_FAILED, the delay,
the close); the reason is logged, not told.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from loglake.errors import ConfigError

if TYPE_CHECKING:
    import jwt
    from jwt import PyJWK

OAUTHBEARER = "OAUTHBEARER"
#: `sasl_oauthbearer_validator` values.
UNSECURED, JWKS = "unsecured", "jwks"
VALIDATORS = (UNSECURED, JWKS)
#: Signature algorithms a JWKS-checked token may use: public-key ones only (never "none", never
#: HMAC, whose key would be the public key itself).
SIGNED_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
_KVSEP = b"\x01"


class TokenRefused(Exception):
    """The token does not authenticate anyone; the text is for the broker's log."""


@dataclass(frozen=True)
class Bearer:
    """What a valid token says: who, until when (seconds since the epoch), and its scopes."""

    principal: str
    expires_at: float
    scopes: frozenset[str] = frozenset()


class TokenValidator(Protocol):
    def validate(self, token: str) -> Bearer:
        """The token's bearer, or TokenRefused."""
        ...


class OAuthSettings(Protocol):
    """The broker settings OAUTHBEARER reads (`loglake.broker.config.BrokerConfig`)."""

    @property
    def sasl_oauthbearer_validator(self) -> str | None: ...
    @property
    def sasl_oauthbearer_jwks_endpoint_url(self) -> str | None: ...
    @property
    def sasl_oauthbearer_jwks_endpoint_refresh_ms(self) -> int: ...
    @property
    def sasl_oauthbearer_expected_issuer(self) -> str | None: ...
    @property
    def sasl_oauthbearer_expected_audience(self) -> str | None: ...
    @property
    def sasl_oauthbearer_sub_claim_name(self) -> str: ...
    @property
    def sasl_oauthbearer_scope_claim_name(self) -> str: ...
    @property
    def sasl_oauthbearer_clock_skew_seconds(self) -> int: ...


def client_token(message: bytes) -> str:
    """The bearer token of a client's initial response (RFC 7628 section 3.1:
    ``n,[a=authzid],`` then ``auth=Bearer <token>`` and any extensions, each ended by 0x01)."""
    gs2, sep, rest = message.partition(_KVSEP)
    if not sep or not gs2.startswith(b"n,") or not rest.endswith(_KVSEP + _KVSEP):
        raise TokenRefused("malformed OAUTHBEARER message (RFC 7628 client initial response)")
    for pair in rest[:-2].split(_KVSEP):
        key, _, value = pair.partition(b"=")
        if key == b"auth":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() != b"bearer" or not token:
                raise TokenRefused("OAUTHBEARER auth is not 'Bearer <token>'")
            try:
                return token.decode("ascii")
            except UnicodeDecodeError:
                raise TokenRefused("OAUTHBEARER token is not ASCII") from None
    raise TokenRefused("OAUTHBEARER message has no auth=Bearer token")


def _b64json(part: str, what: str) -> dict[str, object]:
    try:
        doc = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except (binascii.Error, ValueError) as exc:
        raise TokenRefused(f"token {what} is not base64url JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise TokenRefused(f"token {what} is not a JSON object")
    return doc


def _number(claims: dict[str, object], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TokenRefused(f"claim {name!r} is not a number")
    return float(value)


def _principal(claims: dict[str, object], claim: str) -> str:
    value = claims.get(claim)
    if not isinstance(value, str) or not value.strip():
        raise TokenRefused(f"no principal: claim {claim!r} is missing or empty")
    return value


def _scopes(claims: dict[str, object], claim: str) -> frozenset[str]:
    """The scope claim as Kafka's validators read it: a string is one scope, a list its strings,
    anything else (or none) no scope; an empty or non-string scope refuses the token."""
    value = claims.get(claim)
    raw = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    scopes: set[str] = set()
    for scope in raw:
        if not isinstance(scope, str) or not scope.strip():
            raise TokenRefused(f"claim {claim!r} holds an empty or non-string scope")
        scopes.add(scope.strip())
    return frozenset(scopes)


class UnsecuredValidator:
    """Kafka's unsecured validator: an unsigned JWT whose claims are checked, not its origin."""

    def __init__(self, sub_claim: str, skew_s: int, clock: Callable[[], float] = time.time,
                 scope_claim: str = "scope") -> None:
        self.sub_claim, self.skew_s, self.clock, self.scope_claim = sub_claim, skew_s, clock, scope_claim

    def validate(self, token: str) -> Bearer:
        parts = token.split(".")
        if len(parts) != 3:
            raise TokenRefused("token is not a JWT (three dot-separated parts)")
        header, claims = _b64json(parts[0], "header"), _b64json(parts[1], "payload")
        if header.get("alg") != "none" or parts[2]:
            raise TokenRefused("the unsecured validator takes only unsigned tokens (alg none, no signature)")
        now = self.clock()
        exp, iat = _number(claims, "exp"), _number(claims, "iat")
        if exp is None:
            raise TokenRefused("token has no exp claim")
        if exp + self.skew_s <= now:
            raise TokenRefused(f"token expired {now - exp:.0f} s ago")
        if iat is not None and iat - self.skew_s > now:
            raise TokenRefused("token issued in the future (iat)")
        return Bearer(_principal(claims, self.sub_claim), exp, _scopes(claims, self.scope_claim))


class JwksValidator:
    """Kafka's broker JWT validator: a signed JWT, its key from a JWKS, issuer and audience checked."""

    def __init__(self, settings: OAuthSettings) -> None:
        try:
            import jwt
        except ModuleNotFoundError as exc:
            from loglake.extras import MissingExtraError

            raise MissingExtraError("sasl_oauthbearer_validator=jwks", "jwt") from exc
        url = settings.sasl_oauthbearer_jwks_endpoint_url
        if not url:
            raise ConfigError("sasl_oauthbearer_validator=jwks needs sasl_oauthbearer_jwks_endpoint_url "
                              "(https://..., http://... or file:///...: the identity provider's JWKS)")
        self._jwt = jwt
        self.file: str | None = None
        self.keys: jwt.PyJWKClient | None = None
        self._file_keys: tuple[float, jwt.PyJWKSet] | None = None  # (mtime, keys) of a file:// JWKS
        if url.startswith("file:"):
            self.file = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
        elif url.startswith(("https://", "http://")):
            # fetched on first use (and for an unknown kid), then kept for the refresh interval
            lifespan = max(1, settings.sasl_oauthbearer_jwks_endpoint_refresh_ms // 1000)
            self.keys = jwt.PyJWKClient(url, cache_keys=True, lifespan=lifespan)
        else:
            raise ConfigError(f"sasl_oauthbearer_jwks_endpoint_url={url!r}: expected https://, http:// or file:///")
        self.issuer = settings.sasl_oauthbearer_expected_issuer
        audience = [a.strip() for a in (settings.sasl_oauthbearer_expected_audience or "").split(",") if a.strip()]
        self.audience = audience or None
        self.sub_claim = settings.sasl_oauthbearer_sub_claim_name
        self.scope_claim = settings.sasl_oauthbearer_scope_claim_name
        self.skew_s = settings.sasl_oauthbearer_clock_skew_seconds

    def validate(self, token: str) -> Bearer:
        """Blocking (it may fetch the JWKS): run it off the event loop."""
        jwt = self._jwt
        try:
            key = self.keys.get_signing_key_from_jwt(token) if self.keys is not None else self._from_file(token)
            claims = jwt.decode(
                token, key.key, algorithms=list(SIGNED_ALGORITHMS), audience=self.audience, issuer=self.issuer,
                leeway=self.skew_s, options={"require": ["exp"], "verify_aud": self.audience is not None},
            )
        except jwt.PyJWKClientError as exc:
            raise TokenRefused(f"no key for the token in the JWKS: {exc}") from None
        except jwt.InvalidTokenError as exc:
            raise TokenRefused(f"{type(exc).__name__}: {exc}") from None
        exp = _number(claims, "exp")
        assert exp is not None  # required above
        return Bearer(_principal(claims, self.sub_claim), exp, _scopes(claims, self.scope_claim))

    def _from_file(self, token: str) -> PyJWK:
        """The token's key from a file:// JWKS, read again whenever the file changed."""
        assert self.file is not None
        try:
            mtime = os.stat(self.file).st_mtime
            if self._file_keys is None or self._file_keys[0] != mtime:
                with open(self.file, encoding="utf-8") as fh:
                    self._file_keys = (mtime, self._jwt.PyJWKSet.from_json(fh.read()))
        except (OSError, ValueError, self._jwt.PyJWKError, self._jwt.PyJWKSetError) as exc:
            raise TokenRefused(f"cannot read the JWKS {self.file}: {exc}") from None
        kid = self._jwt.get_unverified_header(token).get("kid")
        for key in self._file_keys[1].keys:
            if key.key_id == kid:
                return key
        raise TokenRefused(f"no key with kid {kid!r} in the JWKS {self.file}")


def validator(settings: OAuthSettings) -> TokenValidator | None:
    """The configured validator; None when OAUTHBEARER is not set up."""
    kind = settings.sasl_oauthbearer_validator
    if kind is None:
        return None
    if kind == UNSECURED:
        return UnsecuredValidator(settings.sasl_oauthbearer_sub_claim_name, settings.sasl_oauthbearer_clock_skew_seconds,
                                  scope_claim=settings.sasl_oauthbearer_scope_claim_name)
    if kind == JWKS:
        return JwksValidator(settings)
    raise ConfigError(f"sasl_oauthbearer_validator={kind!r}: expected one of {', '.join(VALIDATORS)}")


__all__ = [
    "JWKS",
    "OAUTHBEARER",
    "SIGNED_ALGORITHMS",
    "UNSECURED",
    "VALIDATORS",
    "Bearer",
    "JwksValidator",
    "OAuthSettings",
    "TokenRefused",
    "TokenValidator",
    "UnsecuredValidator",
    "client_token",
    "validator",
]
