"""`ConfigStore`: dynamic broker and group configs in the metadata store, as ``broker_config``
({scope, configs}) and ``group_config`` ({g, configs}) records, each replacing its scope's or
group's configs whole (loglake.meta.state).

`BrokerConfigs` (loglake.broker.dynamic_config) keeps the broker's dynamic layers here,
`GroupConfigStore` (loglake.broker.group_configs) the per-group overrides.
"""

from __future__ import annotations

from loglake.broker.meta_facts import MetaFacts
from loglake.meta.records import BrokerConfig, GroupConfig

__all__ = ["ConfigStore"]


class ConfigStore(MetaFacts):
    def broker_configs(self) -> dict[str, dict[str, str]]:
        """Stored dynamic broker configs: scope ("" the cluster-wide default, or a node id) -> name -> value."""
        return self.meta.read(lambda s: {scope: dict(c) for scope, c in s.broker_configs.items()})

    def group_configs(self) -> dict[str, dict[str, str]]:
        """Stored group configs: group id -> name -> value."""
        return self.meta.read(lambda s: {group: dict(c) for group, c in s.group_configs.items()})

    def group_config(self, group_id: str, name: str) -> str | None:
        """One stored group config (a lookup: no copy of the others)."""
        return self.meta.read(lambda s: s.group_configs.get(group_id, {}).get(name))

    def save_broker_configs(self, scope: str, configs: dict[str, str]) -> None:
        """Replace one scope's dynamic configs ({} removes them); durable on return."""
        self._append(BrokerConfig(scope, configs)).result()

    def save_group_configs(self, group_id: str, configs: dict[str, str]) -> None:
        """Replace one group's configs ({} removes them); durable on return."""
        self._append(GroupConfig(group_id, configs)).result()
