"""`QuotaStore`: client quota configs in the metadata store, as ``client_quota`` records
(loglake.meta.quotas).

The broker's `QuotaManager` (loglake.broker.security.quotas) loads them at start-up and enforces
them; AlterClientQuotas (loglake.broker.handlers.client_quotas) records each change with `save`
before it takes effect, and `follow` hands every recorded change to the manager — in cluster
mode those another broker recorded too, so a quota holds on every broker at once.
"""

from __future__ import annotations

from collections.abc import Callable

from loglake.broker.meta_facts import MetaFacts
from loglake.meta.quotas import EntityKey, entity_key
from loglake.meta.records import ClientQuota, RecordKind

__all__ = ["QuotaStore"]


class QuotaStore(MetaFacts):
    def quotas(self) -> dict[EntityKey, dict[str, float]]:
        """Stored client quota configs: entity -> quota key -> value."""
        return self.meta.read(lambda s: {key: dict(values) for key, values in s.client_quotas.items()})

    def save(self, key: EntityKey, values: dict[str, float] | None) -> None:
        """Replace one entity's quota configs (None or {} removes it); durable on return."""
        self._append(ClientQuota(key, values)).result()

    def follow(self, changed: Callable[[EntityKey, dict[str, float] | None], None]) -> None:
        """Call `changed(entity, values)` for every client_quota record applied from now on, on
        the metadata store's thread (under its lock: `changed` only hands the change on)."""

        def on_record(seq: int, kind: RecordKind, body: object, raw: bytes) -> None:
            if kind != RecordKind.CLIENT_QUOTA or not isinstance(body, dict):
                return
            values = body.get("values")
            changed(entity_key(body["entity"]), {k: float(v) for k, v in values.items()} if values else None)

        self.meta.watch(on_record)
