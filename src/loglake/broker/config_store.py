"""`ConfigStore`: dynamic broker and group configs in the metadata store, as ``broker_config``
({scope, configs}) and ``group_config`` ({g, configs}) records, each replacing its scope's or
group's configs whole (loglake.meta.state).

`BrokerConfigs` (loglake.broker.dynamic_config) keeps the broker's dynamic layers here,
`GroupConfigStore` (loglake.broker.group_configs) the per-group overrides. Each loads them at
start-up and `follow_brokers` / `follow_groups` hand it every change recorded after — in cluster
mode those another broker recorded too, so a config altered on one broker holds on every broker
(as `QuotaStore.follow` does for client quotas).
"""

from __future__ import annotations

from collections.abc import Callable

from loglake.broker.meta_facts import MetaFacts
from loglake.meta.records import BrokerConfig, GroupConfig, RecordKind

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

    def follow_brokers(self, changed: Callable[[str, dict[str, str]], None]) -> None:
        """Call `changed(scope, configs)` for every broker_config record applied from now on, on
        the metadata store's thread (under its lock: `changed` only hands the change on)."""
        self._follow(RecordKind.BROKER_CONFIG, "scope", changed)

    def follow_groups(self, changed: Callable[[str, dict[str, str]], None]) -> None:
        """Call `changed(group_id, configs)` for every group_config record applied from now on,
        as `follow_brokers`."""
        self._follow(RecordKind.GROUP_CONFIG, "g", changed)

    def _follow(self, wanted: RecordKind, key: str, changed: Callable[[str, dict[str, str]], None]) -> None:
        def on_record(seq: int, kind: RecordKind, body: object, raw: bytes) -> None:
            if kind != wanted or not isinstance(body, dict):
                return
            configs = body.get("configs") or {}
            changed(str(body[key]), {str(k): str(v) for k, v in configs.items()})

        self.meta.watch(on_record)
