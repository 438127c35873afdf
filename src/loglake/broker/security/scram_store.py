"""`ScramStore`: SCRAM credentials in the metadata store, as ``scram_credential`` records
(loglake.meta.scram: salt, iterations, StoredKey, ServerKey; never a password).

The SASL authenticator (loglake.broker.security.sasl) looks one credential up per
authentication; AlterUserScramCredentials and DescribeUserScramCredentials
(loglake.broker.handlers.scram_admin), the users inbox (security.users_inbox) and `loglake users`
on a free data directory (loglake.cli.users) change and list them.
"""

from __future__ import annotations

from loglake.broker.meta_facts import MetaFacts
from loglake.meta.records import JsonDoc, ScramCredentialSet
from loglake.meta.state import MetaState

__all__ = ["ScramStore"]


class ScramStore(MetaFacts):
    def credentials(self) -> dict[str, dict[str, JsonDoc]]:
        """A copy of every stored credential: user -> mechanism -> credential doc."""
        return self.meta.read(
            lambda s: {user: {m: dict(c) for m, c in mechs.items()} for user, mechs in s.scram.items()}
        )

    def credential(self, user: str, mechanism: str) -> JsonDoc | None:
        """The stored credential doc of one user and mechanism, or None."""

        def one(state: MetaState) -> JsonDoc | None:
            cred = state.scram.get(user, {}).get(mechanism)
            return None if cred is None else dict(cred)

        return self.meta.read(one)

    def save(self, user: str, mechanism: str, cred: JsonDoc | None) -> None:
        """Set (or with None remove) one user's credential for one mechanism; durable on return.
        MetaRecordRejectedError (a ValueError) when the record is refused (too many users, a bad
        body): nothing was logged."""
        self._append(ScramCredentialSet(user, mechanism, cred)).result()
