"""TLS for SSL listeners, and who a connection is (its `SecurityContext`).

`server_context` builds the listener's `ssl.SSLContext` from Python's `ssl` module: the
certificate chain and key (`ssl_cert`, `ssl_key`, `ssl_key_password`), TLS 1.2 or newer only, and
with `ssl_client_auth` = requested/required the CAs client certificates must chain to (`ssl_ca`).

A connection's principal is ``User:ANONYMOUS`` until something authenticates it. On an SSL
listener a verified client certificate does: its subject DN, written as Kafka writes it (RFC 2253,
most specific first: ``CN=alice,OU=eng,O=Example``), goes through `PrincipalMapper`, Kafka's
``ssl.principal.mapping.rules`` (setting `ssl_principal_mapping_rules`): a comma-separated list of
``RULE:pattern/replacement/`` (optionally followed by ``L`` or ``U`` to lower- or upper-case the
result) and ``DEFAULT`` (the whole DN). The first rule whose pattern matches the whole DN gives the
name (``$1`` in the replacement is the pattern's first group, as in Java); no match refuses the
connection. SASL (later) will set the principal the same way, on the same context.

A failed handshake is one log line that says whose certificate was refused: an alert the client
sent about a certificate (unknown_ca, bad_certificate, certificate_expired, ...) means the client
did not accept the broker's; a verification failure or a missing certificate on the broker's
side means the broker did not accept the client's.

An SSL listener accepts TCP like any other; `upgrade` runs the handshake (`loop.start_tls`) on
the connection's `FrameReceiver` before its first Kafka byte is read, and marks it `over_tls` first,
so that an EOF arriving with the client's last handshake flight closes instead of "keep open"
(asyncio logs a warning for that over TLS).
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from loglake.broker.listeners import PLAINTEXT, Listener
from loglake.broker.receive import FrameReceiver
from loglake.errors import ConfigError
from loglake.logsafe import RateLimitedLog

ANONYMOUS = "User:ANONYMOUS"
CLIENT_AUTH = ("none", "requested", "required")
#: How long a client may take to complete its TLS handshake.
HANDSHAKE_TIMEOUT_S = 10.0
#: OpenSSL's reason for an alert received from the peer (SSLV3_ALERT_BAD_CERTIFICATE,
#: TLSV1_ALERT_UNKNOWN_CA): on the broker's side, an alert the client sent.
_RECEIVED_ALERT = re.compile(r"^(SSLV3|TLSV1|TLSV13)_ALERT_")

#: X.500 attribute names as Java's X500Principal.getName() (RFC 2253) writes them.
_SHORT = {
    "commonName": "CN",
    "organizationalUnitName": "OU",
    "organizationName": "O",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}


@dataclass
class SecurityContext:
    """Who is on the other end of one connection, and through which listener. ACLs and quotas
    (later) key on `principal`; SASL (later) sets it after SaslAuthenticate."""

    listener: Listener
    #: The (host, port) this listener advertises: what Metadata answers a client that came in here.
    advertised: tuple[str, int]
    peer_host: str = ""
    principal: str = ANONYMOUS
    tls_version: str | None = None
    cipher: str | None = None
    #: The client certificate's subject DN (RFC 2253), when one was presented and verified.
    peer_dn: str | None = None
    #: What else authenticated it: ``sasl_mechanism``.
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def protocol(self) -> str:
        return self.listener.protocol

    @classmethod
    def plaintext(cls, host: str, port: int) -> SecurityContext:
        return cls(Listener(PLAINTEXT, host, port), (host, port))


def _escape(value: str) -> str:
    out = re.sub(r'([,+"\\<>;=])', r"\\\1", value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


#: A certificate's subject as `SSLSocket.getpeercert()` gives it: RDNs of (attribute, value) pairs.
Subject = tuple[tuple[tuple[str, str], ...], ...]


def subject_dn(cert: Mapping[str, object]) -> str:
    """The subject of a verified peer certificate (`SSLSocket.getpeercert()`) as an RFC 2253 DN."""
    subject = cast(Subject, cert.get("subject", ()))  # getpeercert's documented layout
    rdns = []
    for rdn in reversed(subject):
        rdns.append("+".join(f"{_SHORT.get(k, k)}={_escape(str(v))}" for k, v in rdn))
    return ",".join(rdns)


_RULE = re.compile(r"\s*(?:(DEFAULT)|RULE:((?:\\/|[^/])*)/((?:\\/|[^/])*)/([LU]?))\s*(?:,|$)")


class PrincipalMapper:
    """Kafka's ``ssl.principal.mapping.rules`` (see the module doc)."""

    def __init__(self, rules: str) -> None:
        self.rules: list[tuple[re.Pattern[str], str, str] | None] = []  # None is DEFAULT
        text = rules.strip() or "DEFAULT"
        pos = 0
        while pos < len(text):
            m = _RULE.match(text, pos)
            if m is None or m.end() == pos:
                raise ConfigError(f"ssl_principal_mapping_rules={rules!r}: cannot parse the rule at {text[pos:]!r}; "
                                  "rules are DEFAULT or RULE:pattern/replacement/ (optionally followed by L or U)")
            if m.group(1):
                self.rules.append(None)
            else:
                pattern = m.group(2).replace("\\/", "/")
                replacement = re.sub(r"\$(\d+)", r"\\g<\1>", m.group(3).replace("\\/", "/"))
                try:
                    self.rules.append((re.compile(pattern), replacement, m.group(4)))
                except re.error as exc:
                    raise ConfigError(f"ssl_principal_mapping_rules: bad pattern {pattern!r}: {exc}") from None
            pos = m.end()

    def name(self, dn: str) -> str | None:
        """The principal name for `dn` (without the ``User:`` type), or None when no rule matches."""
        for rule in self.rules:
            if rule is None:
                return dn
            pattern, replacement, case = rule
            if pattern.fullmatch(dn):
                out = pattern.sub(replacement, dn)
                return out.lower() if case == "L" else out.upper() if case == "U" else out
        return None


def _encrypted(path: str) -> bool:
    """Whether the PEM file holds an encrypted private key (PKCS#8 or traditional OpenSSL)."""
    try:
        with open(path, "rb") as fh:
            text = fh.read(1 << 20)
    except OSError:
        return False
    return b"ENCRYPTED PRIVATE KEY" in text or b"Proc-Type: 4,ENCRYPTED" in text


def server_context(cert: str | None, key: str | None, password: str | None, ca: str | None, client_auth: str) -> ssl.SSLContext:
    """The SSLContext of SSL listeners; a ConfigError that says which file and why when it cannot be built."""
    if client_auth not in CLIENT_AUTH:
        raise ConfigError(f"ssl_client_auth={client_auth!r}: expected one of {', '.join(CLIENT_AUTH)}")
    if not cert:
        raise ConfigError("an SSL listener needs a certificate: set --ssl-cert (PEM chain) and --ssl-key")
    for flag, path in (("--ssl-cert", cert), ("--ssl-key", key), ("--ssl-ca", ca)):
        if path and not os.path.isfile(path):
            raise ConfigError(f"{flag} {path}: no such file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key or None, password=password or None)
    except ssl.SSLError as exc:
        why = str(exc)
        if _encrypted(key or cert) or "bad decrypt" in why.lower():
            what = "wrong --ssl-key-password" if password else "it is encrypted and --ssl-key-password is not set"
            raise ConfigError(f"--ssl-key {key or cert}: cannot decrypt the private key: {what}") from None
        raise ConfigError(f"--ssl-cert {cert} / --ssl-key {key}: not a usable certificate and matching key: {why}") from None
    except OSError as exc:
        raise ConfigError(f"--ssl-cert {cert} / --ssl-key {key}: cannot read: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"--ssl-key {key}: cannot load the private key: {exc}") from None
    if client_auth != "none":
        if not ca:
            raise ConfigError(f"--ssl-client-auth {client_auth} needs --ssl-ca (the CA certificates client certificates must chain to)")
        try:
            ctx.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--ssl-ca {ca}: cannot load CA certificates: {exc}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED if client_auth == "required" else ssl.CERT_OPTIONAL
    return ctx


async def upgrade(
    receiver: FrameReceiver, context: ssl.SSLContext, security: SecurityContext, mapper: PrincipalMapper
) -> str | None:
    """TLS handshake on an accepted connection before its first Kafka byte is read; fills
    `security` (version, cipher, peer DN, principal). None when it worked, else why not: one line
    for the log that names the cause (not TLS at all, TLS too old, the client certificate)."""
    where = f"the {security.listener.name} listener"
    receiver.over_tls = True
    transport = receiver.transport
    assert transport is not None
    # Until the TLS transport is there, the receiver pauses nothing: the TCP transport under the
    # handshake is asyncio's TLS protocol's to read, and it may hand over a request before
    # start_tls returns.
    receiver.transport = None
    tls: asyncio.Transport | None = None
    try:
        tls = await asyncio.get_running_loop().start_tls(
            transport, receiver, context, server_side=True,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
        )
    except (ssl.SSLError, ConnectionError, TimeoutError, OSError) as exc:
        why = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
        if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
            why = f"{why}: {exc.verify_message}"  # "certificate has expired", "unable to get local issuer certificate"
        hint = ""
        text = str(why).upper()
        if why in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNKNOWN_PROTOCOL", "RECORD_LAYER_FAILURE"):
            hint = " (not TLS: is a PLAINTEXT client pointed at the SSL listener?)"
        elif why in ("UNSUPPORTED_PROTOCOL", "TLSV1_ALERT_PROTOCOL_VERSION"):
            hint = " (the client offers only TLS older than 1.2)"
        elif _RECEIVED_ALERT.match(text) and ("CERTIFICATE" in text or "UNKNOWN_CA" in text):
            return (f"TLS handshake failed on {where}: the client did not accept the broker's certificate: {why} "
                    "(does the client trust the CA that signed ssl_cert, and does the certificate name the host "
                    "the client connects to?)")
        elif "CERTIFICATE" in text:
            hint = " (the client certificate was not accepted: untrusted, expired or missing)"
        return f"TLS handshake failed on {where}: {why}{hint}"
    finally:
        if tls is None:  # failed or cancelled: what the caller aborts
            receiver.transport = transport
    if tls is None:
        return f"TLS handshake failed on {where}: the connection closed"
    receiver.upgraded(tls)
    obj = tls.get_extra_info("ssl_object")
    if obj is None:
        return None
    security.tls_version = obj.version()
    cipher = obj.cipher()
    security.cipher = cipher[0] if cipher else None
    cert = obj.getpeercert()
    if cert:
        security.peer_dn = subject_dn(cert)
        name = mapper.name(security.peer_dn)
        if name is None:
            return f"no ssl_principal_mapping_rules rule matches the client certificate subject {security.peer_dn!r} on {where}"
        security.principal = f"User:{name}"
    return None


async def handshake_or_close(
    receiver: FrameReceiver, context: ssl.SSLContext, security: SecurityContext, mapper: PrincipalMapper,
    protocol_errors: dict[str, int], limited: RateLimitedLog,
) -> bool:
    """`upgrade` an accepted connection; False, with the connection closed, one rate-limited line
    (`limited`: the server's) and one more `tls_handshake` in `protocol_errors`, when that fails."""
    failure = await upgrade(receiver, context, security, mapper)
    if failure is None:
        return True
    transport = receiver.transport
    assert transport is not None
    peer = transport.get_extra_info("peername")
    shown = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
    protocol_errors["tls_handshake"] += 1
    limited.warning(("tls_handshake", str(peer[0]) if isinstance(peer, tuple) else shown), "closing %s: %s", shown, failure)
    try:
        transport.abort()
    except Exception:  # already gone
        pass
    return False


__all__ = [
    "ANONYMOUS",
    "CLIENT_AUTH",
    "HANDSHAKE_TIMEOUT_S",
    "PrincipalMapper",
    "SecurityContext",
    "handshake_or_close",
    "server_context",
    "subject_dn",
    "upgrade",
]
