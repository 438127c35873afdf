"""`AclStore`: the ACL bindings in the metadata store, as ``acls`` records (loglake.meta.acls).

The broker's authorizer (loglake.broker.security.authorizer) is built from `bindings()` at
start-up; CreateAcls and DeleteAcls (loglake.broker.handlers.acls) record each change with
`save` before they answer, so a binding acknowledged is a binding enforced after a restart too.
"""

from __future__ import annotations

from loglake.broker.meta_facts import MetaFacts
from loglake.meta.acls import Binding
from loglake.meta.records import Acls

__all__ = ["AclStore"]


class AclStore(MetaFacts):
    def bindings(self) -> list[Binding]:
        """The stored ACL bindings, in creation order."""
        return self.meta.read(lambda s: list(s.acls))

    def save(self, created: list[list[object]], deleted: list[list[object]]) -> None:
        """Record bindings created and deleted (JSON rows), as one ``acls`` record; durable on return."""
        self._append(Acls(created, deleted)).result()
