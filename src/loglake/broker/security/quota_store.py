"""`QuotaStore`: client quota configs in the metadata store, as ``client_quota`` records
(loglake.meta.quotas).

The broker's `QuotaManager` (loglake.broker.security.quotas) loads them at start-up and enforces
them; AlterClientQuotas (loglake.broker.handlers.client_quotas) records each change with `save`
before it takes effect.
"""

from __future__ import annotations

from loglake.broker.meta_facts import MetaFacts
from loglake.meta.quotas import EntityKey
from loglake.meta.records import ClientQuota

__all__ = ["QuotaStore"]


class QuotaStore(MetaFacts):
    def quotas(self) -> dict[EntityKey, dict[str, float]]:
        """Stored client quota configs: entity -> quota key -> value."""
        return self.meta.read(lambda s: {key: dict(values) for key, values in s.client_quotas.items()})

    def save(self, key: EntityKey, values: dict[str, float] | None) -> None:
        """Replace one entity's quota configs (None or {} removes it); durable on return."""
        self._append(ClientQuota(key, values)).result()
