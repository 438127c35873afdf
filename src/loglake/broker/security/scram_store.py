"""`ScramStore`: SCRAM credentials in the metadata store, as ``scram_credential`` records
(loglake.meta.scram: salt, iterations, StoredKey, ServerKey; never a password).

The SASL authenticator (loglake.broker.security.sasl) looks one credential up per
authentication, and the `TypicalShapes` of all of them for the fake credential of a name that has
none; AlterUserScramCredentials and DescribeUserScramCredentials
(loglake.broker.handlers.scram_admin), the users inbox (security.users_inbox) and `loglake users`
on a free data directory (loglake.cli.users) change and list them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from loglake.broker.meta_facts import MetaFacts, OpenCheck
from loglake.meta.records import JsonDoc, RecordKind, ScramCredentialSet
from loglake.meta.scram import TypicalShapes, typical_shapes
from loglake.meta.state import MetaState
from loglake.meta.store import MetaStore

__all__ = ["SHAPES_REFRESH_S", "ScramStore"]

#: The typical shapes are computed again at least this often, even when no `scram_credential`
#: record went by: a metadata store that adopts a whole state (a restore, cluster mode's reload of
#: a newer checkpoint) tells no watcher.
SHAPES_REFRESH_S = 60.0


class ScramStore(MetaFacts):
    def __init__(self, meta: MetaStore, check_open: OpenCheck, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(meta, check_open)
        self._clock = clock
        #: Bumped under the store's lock by every scram_credential record applied.
        self._generation = 0
        #: (generation, when, shapes) of the last computation.
        self._shapes: tuple[int, float, TypicalShapes] | None = None
        meta.watch(self._on_record)

    def _on_record(self, seq: int, kind: RecordKind, body: object, raw: bytes) -> None:
        if kind == RecordKind.SCRAM_CREDENTIAL:
            self._generation += 1  # under the store's lock: nothing more here

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

    def shapes(self) -> TypicalShapes:
        """What the stored credentials look like (iterations and salt length per mechanism, and
        PLAIN's), as of the last scram_credential record; computed once per change (one pass over
        at most SCRAM_USERS_MAX users), not per login."""
        cached, now = self._shapes, self._clock()
        if cached is not None and cached[0] == self._generation and now - cached[1] < SHAPES_REFRESH_S:
            return cached[2]
        # The generation is read under the same lock the watcher bumps it under: a record applied
        # after this read makes the next call compute again.
        generation, shapes = self.meta.read(lambda s: (self._generation, typical_shapes(s.scram)))
        self._shapes = (generation, now, shapes)
        return shapes

    def save(self, user: str, mechanism: str, cred: JsonDoc | None) -> None:
        """Set (or with None remove) one user's credential for one mechanism; durable on return.
        MetaRecordRejectedError (a ValueError) when the record is refused (too many users, a bad
        body): nothing was logged."""
        self._append(ScramCredentialSet(user, mechanism, cred)).result()
