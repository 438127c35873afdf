"""SCRAM (RFC 5802, RFC 7677) credentials and both sides of one SCRAM exchange.

A stored credential never holds a password: per user and mechanism it is the salt, the iteration
count, ``StoredKey = H(HMAC(SaltedPassword, "Client Key"))`` and ``ServerKey =
HMAC(SaltedPassword, "Server Key")`` with ``SaltedPassword = PBKDF2(password, salt, iterations)``,
as Kafka stores them. PLAIN logins are checked against the same credential (`verify_password`:
derive with its salt and iterations, compare the StoredKey), so there is one credential store.

`ScramServer` runs one exchange: client-first (gs2 header ``n,,`` or ``y,,`` only: no channel
binding and no authorization id; no extensions), server-first (the client's nonce plus ours, the
salt, the iterations), client-final (the channel-binding echo, the whole nonce and the proof,
checked in constant time), server-final (the server signature). Any deviation is a `ScramError`
whose text says what was wrong, for the broker's log; the client only learns that authentication
failed. A user with no credential gets a fake one derived from a per-broker secret (`fake_credential`):
the same salt every time for that name, and the iteration count and salt length it is given (the
broker gives the `common_shape` of its real users), so an unknown user cannot be told from a
wrong password by what the server-first message shows or by the work PLAIN does.

`ScramClient` is the other side, for the CLI's own requests to a SASL listener: it refuses a
server that asks for fewer than `ITERATIONS_MIN` or more than `ITERATIONS_MAX` iterations (a
weak or a costly derivation) and checks the server's signature, so a server that does not know
the credential cannot pass for the broker.

This module imports nothing of loglake: the broker, the metadata state and the CLI use it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "ITERATIONS_DEFAULT",
    "ITERATIONS_MAX",
    "ITERATIONS_MIN",
    "MECHANISMS",
    "MECHANISM_TYPES",
    "PLAIN_CHECKED_WITH",
    "SALT_BYTES",
    "SCRAM_FIELD_BYTES_MAX",
    "CredentialShape",
    "ScramClient",
    "ScramCredential",
    "ScramError",
    "ScramServer",
    "common_shape",
    "fake_credential",
    "from_salted_password",
    "make_credential",
    "salted_password",
    "verify_password",
]

#: mechanism name -> hashlib name.
MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
#: Kafka's ScramMechanism type codes (DescribeUserScramCredentials / AlterUserScramCredentials).
MECHANISM_TYPES = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
#: Kafka's bounds on iterations (ScramMechanism.minIterations and the broker's 16384 maximum).
ITERATIONS_MIN = 4096
ITERATIONS_MAX = 16384
ITERATIONS_DEFAULT = 4096
#: Random salt of credentials made here (RFC 5802 asks only that it be unique per user; 32 random
#: bytes is that with room to spare).
SALT_BYTES = 32
#: Largest user name, nonce or other attribute of a SCRAM message (Kafka's whole token is
#: bounded at 512 KiB by the broker; these keep one attribute far smaller).
SCRAM_FIELD_BYTES_MAX = 1024
#: Most bytes a salt may have in a credential (AlterUserScramCredentials, the metadata log).
SALT_BYTES_MAX = 1024
#: The credentials a PLAIN login's password is checked against, the first the user has.
PLAIN_CHECKED_WITH = ("SCRAM-SHA-512", "SCRAM-SHA-256")


class ScramError(Exception):
    """The client's SCRAM message is not acceptable; the text says why (for the broker's log)."""


@dataclass(frozen=True)
class ScramCredential:
    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


@dataclass(frozen=True, order=True)
class CredentialShape:
    """What a SCRAM exchange shows of a credential before the proof (the server-first message's
    ``i=`` and the length of its ``s=``); PLAIN's work is set by the iterations too."""

    iterations: int = ITERATIONS_DEFAULT
    salt_bytes: int = SALT_BYTES

    @classmethod
    def of(cls, cred: ScramCredential) -> CredentialShape:
        return cls(cred.iterations, len(cred.salt))


def common_shape(shapes: Iterable[CredentialShape]) -> CredentialShape:
    """The most common of `shapes` (a tie: the larger, so the fake costs no less than a real
    one); the default (`ITERATIONS_DEFAULT`, `SALT_BYTES`: what `make_credential` makes) when
    there are none."""
    counts = Counter(shapes)
    if not counts:
        return CredentialShape()
    return max(counts, key=lambda shape: (counts[shape], shape))


def _hash(mechanism: str) -> str:
    try:
        return MECHANISMS[mechanism]
    except KeyError:
        raise ValueError(f"unknown SCRAM mechanism {mechanism!r}; one of {', '.join(MECHANISMS)}") from None


def salted_password(mechanism: str, password: bytes, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i) of RFC 5802: PBKDF2 with HMAC of the mechanism's hash."""
    return hashlib.pbkdf2_hmac(_hash(mechanism), password, salt, iterations)


def from_salted_password(mechanism: str, salted: bytes, salt: bytes, iterations: int) -> ScramCredential:
    """The credential for a SaltedPassword (what AlterUserScramCredentials sends)."""
    h = _hash(mechanism)
    client_key = hmac.digest(salted, b"Client Key", h)
    stored_key = hashlib.new(h, client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", h)
    return ScramCredential(mechanism, salt, iterations, stored_key, server_key)


def make_credential(
    mechanism: str, password: str, iterations: int = ITERATIONS_DEFAULT, salt: bytes | None = None
) -> ScramCredential:
    if not ITERATIONS_MIN <= iterations <= ITERATIONS_MAX:
        raise ValueError(f"iterations {iterations} outside {ITERATIONS_MIN}..{ITERATIONS_MAX}")
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    pw = password.encode("utf-8")
    return from_salted_password(mechanism, salted_password(mechanism, pw, salt, iterations), salt, iterations)


def verify_password(cred: ScramCredential, password: bytes) -> bool:
    """Whether `password` derives `cred`'s StoredKey (PLAIN against a SCRAM credential)."""
    derived = from_salted_password(
        cred.mechanism,
        salted_password(cred.mechanism, password, cred.salt, cred.iterations),
        cred.salt,
        cred.iterations,
    )
    return hmac.compare_digest(derived.stored_key, cred.stored_key)


def fake_credential(
    secret: bytes, mechanism: str, user: str, shape: CredentialShape = CredentialShape()
) -> ScramCredential:
    """A credential for a user that has none, of `shape` (iterations, salt length): stable per
    name (the salt a second attempt sees is the same), unguessable without the broker's secret,
    and matching no password."""
    h = _hash(mechanism)
    name = user.encode("utf-8", "surrogatepass")
    info = b"salt\0" + mechanism.encode() + b"\0" + name
    # HMAC blocks until the salt is long enough (the first block alone is what this made before
    # salts had a shape: a broker's fake salts of the default length did not change).
    salt = hmac.digest(secret, info, h)
    block = 1
    while len(salt) < shape.salt_bytes:
        salt += hmac.digest(secret, info + b"\0" + block.to_bytes(4, "big"), h)
        block += 1
    keys = hmac.digest(secret, b"keys\0" + mechanism.encode() + b"\0" + name, h)
    return ScramCredential(mechanism, salt[: shape.salt_bytes], shape.iterations, keys, keys)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ScramError(f"{what} is not base64") from None


def _saslname(text: str) -> str:
    """RFC 5802 saslname: "=2C" is ",", "=3D" is "=", any other "=" is invalid."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "=":
            code = text[i + 1 : i + 3]
            if code == "2C":
                out.append(",")
            elif code == "3D":
                out.append("=")
            else:
                raise ScramError("user name has an invalid '=' escape")
            i += 3
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _attributes(text: str, expected: str, what: str) -> list[str]:
    """`text` split at "," into attributes that must start with the letters of `expected`, in order."""
    parts = text.split(",")
    if len(parts) != len(expected):
        extra = "an extension or missing attribute" if len(parts) > len(expected) else "a missing attribute"
        raise ScramError(f"{what} has {len(parts)} attributes, expected {len(expected)} ({extra})")
    values = []
    for part, letter in zip(parts, expected, strict=True):
        if not part.startswith(letter + "="):
            raise ScramError(f"{what}: expected attribute {letter}= but got {part[:2]!r}")
        value = part[2:]
        if len(value) > SCRAM_FIELD_BYTES_MAX * 2:
            raise ScramError(f"{what}: attribute {letter}= is {len(value)} characters long")
        values.append(value)
    return values


def _printable_nonce(nonce: str) -> bool:
    return bool(nonce) and all(0x21 <= ord(c) <= 0x7E and c != "," for c in nonce)


class ScramServer:
    """One SCRAM exchange, server side. `first` takes the client-first message and returns the
    user name (to look its credential up); `server_first` answers it; `final` checks the
    client-final message and returns the server-final one."""

    def __init__(self, mechanism: str, server_nonce: str | None = None) -> None:
        """`server_nonce`: our part of the nonce (random unless given: RFC test vectors give it)."""
        _hash(mechanism)
        self._server_nonce = server_nonce or secrets.token_urlsafe(24)
        self.mechanism = mechanism
        self.user = ""
        self._client_first_bare = ""
        self._gs2 = ""
        self._nonce = ""
        self._server_first = ""
        self._cred: ScramCredential | None = None

    def first(self, message: bytes) -> str:
        try:
            text = message.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError("client-first message is not UTF-8") from None
        if text.startswith("p="):
            raise ScramError("the client asks for channel binding, which is not supported")
        if not (text.startswith("n,,") or text.startswith("y,,")):
            raise ScramError(
                "client-first message must start with the gs2 header 'n,,' or 'y,,' (no authorization id)"
            )
        self._gs2 = text[:3]
        self._client_first_bare = text[3:]
        if self._client_first_bare.startswith("m="):
            raise ScramError("client-first message has a mandatory extension (m=), which is not supported")
        name, nonce = _attributes(self._client_first_bare, "nr", "client-first message")
        user = _saslname(name)
        if not user or len(user.encode("utf-8")) > SCRAM_FIELD_BYTES_MAX:
            raise ScramError("client-first message has an empty or over-long user name")
        if not _printable_nonce(nonce) or len(nonce) > SCRAM_FIELD_BYTES_MAX:
            raise ScramError("client nonce is empty, too long or not printable ASCII")
        self.user = user
        self._nonce = nonce + self._server_nonce
        return user

    def server_first(self, cred: ScramCredential) -> bytes:
        self._cred = cred
        self._server_first = f"r={self._nonce},s={_b64(cred.salt)},i={cred.iterations}"
        return self._server_first.encode("ascii")

    def final(self, message: bytes) -> bytes:
        cred = self._cred
        if cred is None:
            raise ScramError("client-final message before client-first")
        try:
            text = message.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError("client-final message is not UTF-8") from None
        channel, nonce, proof_b64 = _attributes(text, "crp", "client-final message")
        if _unb64(channel, "channel binding (c=)") != self._gs2.encode("ascii"):
            raise ScramError("channel binding (c=) does not echo the gs2 header")
        # Kafka accepts a nonce that ends with this exchange's (ScramSaslServer: endsWith), and
        # librdkafka 2.0 (the one Debian's kcat uses) sends the client nonce twice in front of it. The
        # proof covers the nonce as sent, and our random part is new per exchange, so a message
        # of another exchange (a replay) still fails here.
        if not nonce.endswith(self._nonce):
            raise ScramError(
                "client-final nonce is not the nonce of this exchange (replayed or forged message)"
            )
        proof = _unb64(proof_b64, "proof (p=)")
        h = MECHANISMS[self.mechanism]
        without_proof = text[: text.rindex(",p=")]
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = hmac.digest(cred.stored_key, auth_message, h)
        if len(proof) != len(signature):
            raise ScramError(f"proof is {len(proof)} bytes, expected {len(signature)}")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(h, client_key).digest(), cred.stored_key):
            raise ScramError("wrong password (client proof does not match)")
        return f"v={_b64(hmac.digest(cred.server_key, auth_message, h))}".encode("ascii")


def _sasl_escape(user: str) -> str:
    """The inverse of `_saslname`: "," and "=" escaped as RFC 5802 wants them in n=."""
    return user.replace("=", "=3D").replace(",", "=2C")


class ScramClient:
    """One SCRAM exchange, client side: `first()` is the client-first message, `final(server_first)`
    the client-final one, and `verify(server_final)` checks the server's signature."""

    def __init__(self, mechanism: str, user: str, password: str, client_nonce: str | None = None) -> None:
        _hash(mechanism)
        self.mechanism = mechanism
        self._password = password.encode("utf-8")
        self._bare = f"n={_sasl_escape(user)},r={client_nonce or secrets.token_urlsafe(24)}"
        self._client_nonce = self._bare.rsplit(",r=", 1)[1]
        self._server_signature = b""

    def first(self) -> bytes:
        return ("n,," + self._bare).encode("utf-8")

    def final(self, server_first: bytes) -> bytes:
        try:
            text = server_first.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError("server-first message is not UTF-8") from None
        if text.startswith("e="):
            raise ScramError(f"the server refused: {text[2:]}")
        nonce, salt_b64, iterations_text = _attributes(text, "rsi", "server-first message")
        if not nonce.startswith(self._client_nonce) or nonce == self._client_nonce:
            raise ScramError("server-first nonce does not extend ours")
        if not iterations_text.isdigit() or not ITERATIONS_MIN <= int(iterations_text) <= ITERATIONS_MAX:
            raise ScramError(
                f"the server asks for {iterations_text[:12]} iterations, outside {ITERATIONS_MIN}..{ITERATIONS_MAX}"
            )
        salt = _unb64(salt_b64, "salt (s=)")
        h = MECHANISMS[self.mechanism]
        salted = salted_password(self.mechanism, self._password, salt, int(iterations_text))
        client_key = hmac.digest(salted, b"Client Key", h)
        without_proof = f"c={_b64(b'n,,')},r={nonce}"
        auth_message = f"{self._bare},{text},{without_proof}".encode()
        signature = hmac.digest(hashlib.new(h, client_key).digest(), auth_message, h)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = hmac.digest(hmac.digest(salted, b"Server Key", h), auth_message, h)
        return f"{without_proof},p={_b64(proof)}".encode("ascii")

    def verify(self, server_final: bytes) -> None:
        try:
            text = server_final.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError("server-final message is not UTF-8") from None
        if text.startswith("e="):
            raise ScramError(f"the server refused: {text[2:]}")
        if not self._server_signature:
            raise ScramError("server-final message before server-first")
        (value,) = _attributes(text, "v", "server-final message")
        if not hmac.compare_digest(_unb64(value, "server signature (v=)"), self._server_signature):
            raise ScramError("the server's signature does not match: it does not hold this user's credential")
