"""SCRAM credentials in the metadata: one record kind, ``scram_credential``.

Body ``{user, mechanism, cred}``: `cred` is ``{salt, iterations, stored_key, server_key}`` (bytes
in base64) to set the user's credential for that mechanism (replacing one it had), or null to
remove it. A user with no credential left is gone. Passwords are never in a record: only what
`loglake.scram` derives from them. Credentials are kept in checkpoints as ``scram`` (user ->
mechanism -> cred, the same shape), so a checkpoint plus the records after it gives them back.

The broker's SASL authenticator reads them through the engine's catalog; `loglake users` and
AlterUserScramCredentials write them (docs/SECURITY.md).
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from loglake.scram import (
    ITERATIONS_MAX,
    ITERATIONS_MIN,
    MECHANISMS,
    PLAIN_CHECKED_WITH,
    SALT_BYTES_MAX,
    CredentialShape,
    ScramCredential,
    common_shape,
)

__all__ = [
    "SCRAM_USERS_MAX",
    "USER_NAME_BYTES_MAX",
    "TypicalShapes",
    "apply_scram",
    "credential_body",
    "load_scram",
    "scram_doc",
    "to_credential",
    "typical_shapes",
]

#: Most users with SCRAM credentials a cluster keeps; a record adding one more is refused before
#: it is logged (the whole table is in every checkpoint and in the broker's memory).
SCRAM_USERS_MAX = 10_000
#: Longest user name stored (bytes of UTF-8).
USER_NAME_BYTES_MAX = 1024


def credential_body(cred: ScramCredential) -> dict[str, Any]:
    """A credential as the record and checkpoint hold it."""

    def enc(b: bytes) -> str:
        return base64.b64encode(b).decode("ascii")

    return {
        "salt": enc(cred.salt),
        "iterations": cred.iterations,
        "stored_key": enc(cred.stored_key),
        "server_key": enc(cred.server_key),
    }


def to_credential(mechanism: str, doc: dict[str, Any]) -> ScramCredential:
    return ScramCredential(
        mechanism,
        base64.b64decode(doc["salt"]),
        int(doc["iterations"]),
        base64.b64decode(doc["stored_key"]),
        base64.b64decode(doc["server_key"]),
    )


def _check(user: str, mechanism: str, cred: dict[str, Any] | None) -> None:
    """A body that could not have been written by loglake is refused (ValueError: nothing applied)."""
    if not user or len(user.encode("utf-8", "surrogatepass")) > USER_NAME_BYTES_MAX:
        raise ValueError(f"scram_credential: user name empty or over {USER_NAME_BYTES_MAX} bytes")
    if mechanism not in MECHANISMS:
        raise ValueError(f"scram_credential: unknown mechanism {mechanism!r}")
    if cred is not None:
        c = to_credential(mechanism, cred)
        if not ITERATIONS_MIN <= c.iterations <= ITERATIONS_MAX or not 0 < len(c.salt) <= SALT_BYTES_MAX:
            raise ValueError(
                f"scram_credential: iterations {c.iterations} or salt of {len(c.salt)} bytes out of range"
            )


class ScramState(Protocol):
    """The part of the metadata state (`loglake.meta.state.MetaState`, which imports this module)
    SCRAM credentials live in: user -> mechanism -> credential doc."""

    @property
    def scram(self) -> dict[str, dict[str, dict[str, Any]]]: ...


def apply_scram(state: ScramState, b: dict[str, Any]) -> None:
    user, mechanism, cred = str(b["user"]), str(b["mechanism"]), b["cred"]
    _check(user, mechanism, cred)
    table = state.scram
    if cred is None:
        mechs = table.get(user)
        if mechs is not None:
            mechs.pop(mechanism, None)
            if not mechs:
                del table[user]
        return
    if user not in table and len(table) >= SCRAM_USERS_MAX:
        raise ValueError(
            f"scram_credential: already {SCRAM_USERS_MAX} users with SCRAM credentials (SCRAM_USERS_MAX)"
        )
    table.setdefault(user, {})[mechanism] = dict(cred)


def scram_doc(state: ScramState) -> dict[str, Any]:
    return {user: {m: dict(c) for m, c in mechs.items()} for user, mechs in state.scram.items()}


def load_scram(state: ScramState, doc: dict[str, Any]) -> None:
    """Credentials of a checkpoint (absent from checkpoints written before SASL: none)."""
    for user, mechs in (doc.get("scram") or {}).items():
        for mechanism, cred in mechs.items():
            _check(str(user), str(mechanism), cred)
            state.scram.setdefault(str(user), {})[str(mechanism)] = dict(cred)


@dataclass(frozen=True)
class TypicalShapes:
    """What the credentials of a user table look like, so that a fake one for a name without
    credentials looks the same: per mechanism the `common_shape` of its credentials, and the
    mechanism and shape most users' PLAIN logins derive with (`PLAIN_CHECKED_WITH`)."""

    by_mechanism: Mapping[str, CredentialShape]
    plain: tuple[str, CredentialShape]

    def shape(self, mechanism: str) -> CredentialShape:
        return self.by_mechanism.get(mechanism, CredentialShape())


def _shape(doc: Mapping[str, Any]) -> CredentialShape:
    return CredentialShape(int(doc["iterations"]), len(base64.b64decode(doc["salt"])))


def typical_shapes(table: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> TypicalShapes:
    """The `TypicalShapes` of a user -> mechanism -> credential doc table (`ScramState.scram`);
    the defaults (SCRAM-SHA-512 for PLAIN) where it has none."""
    shapes: dict[str, list[CredentialShape]] = {m: [] for m in MECHANISMS}
    plain: Counter[tuple[str, CredentialShape]] = Counter()
    for mechs in table.values():
        for mechanism, doc in mechs.items():
            shapes.setdefault(mechanism, []).append(_shape(doc))
        checked = next((m for m in PLAIN_CHECKED_WITH if m in mechs), None)
        if checked is not None:
            plain[(checked, _shape(mechs[checked]))] += 1
    # a tie: the larger shape, then SHA-512 (the fake costs no less than a real one)
    common = max(plain, key=lambda p: (plain[p], p[1], p[0])) if plain else (PLAIN_CHECKED_WITH[0], CredentialShape())
    return TypicalShapes({m: common_shape(s) for m, s in shapes.items()}, common)
