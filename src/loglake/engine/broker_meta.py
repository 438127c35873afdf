"""Broker facts kept in the metadata store, still reached through the engine: consumer groups'
offsets and states, dynamic broker and group configs, ACLs, SCRAM credentials, client quotas,
transactional ids. (A mixin of `Engine` on its way out: each fact moves to a broker-side store
over `MetaStore`, as consumer groups did — loglake.broker.groups.meta_store.)
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol, cast

from loglake.meta.quotas import EntityKey, client_quota_body
from loglake.meta.state import MetaState
from loglake.meta.store import MetaStore

__all__ = ["BrokerMetaMixin"]


class _Host(Protocol):
    meta: MetaStore

    def _check_open(self) -> None: ...


class BrokerMetaMixin:
    def _eng(self) -> _Host:
        return cast(_Host, self)

    # ==== consumer groups' metadata (the broker's coordinator owns the meaning) ======================

    def group_metadata(self) -> dict[str, dict[str, Any]]:
        """{group_id: {"offsets": {(topic, partition): [offset, epoch, metadata, ts]}, "state": dict | None}}"""
        def copy(state: MetaState) -> dict[str, dict[str, Any]]:
            return {
                g: {"offsets": {tp: list(row) for tp, row in gm.offsets.items()}, "state": gm.state}
                for g, gm in state.groups.items()
            }

        return self._eng().meta.read(copy)

    def commit_group_offsets(self, group_id: str, rows: list[tuple[str, int, int, int, str, int]]) -> Future[int]:
        """Record committed offsets (topic, partition, offset, leader_epoch, metadata, commit_ts_ms)."""
        eng = self._eng()
        eng._check_open()
        return eng.meta.append("offset_commit", {"g": group_id, "rows": [list(r) for r in rows]})

    def save_group_state(self, group_id: str, state: dict[str, Any] | None) -> Future[int]:
        eng = self._eng()
        eng._check_open()
        return eng.meta.append("group_state", {"g": group_id, "state": state})

    # ==== dynamic configs: stored for the broker ========================================================

    def dynamic_configs(self, kind: str) -> dict[str, dict[str, str]]:
        """Stored dynamic configs: kind "broker" ({scope: {name: value}}) or "group" ({group: ...})."""

        def copy(state: MetaState) -> dict[str, dict[str, str]]:
            table = state.broker_configs if kind == "broker" else state.group_configs
            return {key: dict(configs) for key, configs in table.items()}

        return self._eng().meta.read(copy)

    def save_dynamic_configs(self, kind: str, key: str, configs: dict[str, str]) -> None:
        """Replace one broker scope's or group's dynamic configs; durable on return."""
        eng = self._eng()
        eng._check_open()
        if kind == "broker":
            eng.meta.append("broker_config", {"scope": key, "configs": dict(configs)}).result()
        else:
            eng.meta.append("group_config", {"g": key, "configs": dict(configs)}).result()

    # ==== ACL bindings (loglake.meta.acls; the broker's authorizer decides with them) ==================

    def acl_bindings(self) -> list[tuple[int, str, int, str, str, int, int]]:
        """The stored ACL bindings, in creation order."""
        return self._eng().meta.read(lambda s: list(s.acls))

    def save_acls(self, created: list[list[Any]], deleted: list[list[Any]]) -> None:
        """Record ACL bindings created and deleted, as one `acls` record; durable on return."""
        eng = self._eng()
        eng._check_open()
        eng.meta.append("acls", {"created": created, "deleted": deleted}).result()

    # ==== SCRAM credentials (loglake.meta.scram): the broker's SASL authenticator reads them =========

    def scram_credentials(self) -> dict[str, dict[str, dict[str, Any]]]:
        """A copy of every stored credential: user -> mechanism -> credential doc."""
        return self._eng().meta.read(
            lambda s: {user: {m: dict(c) for m, c in mechs.items()} for user, mechs in s.scram.items()}
        )

    def scram_credential(self, user: str, mechanism: str) -> dict[str, Any] | None:
        """The stored credential doc of one user and mechanism, or None."""

        def one(state: MetaState) -> dict[str, Any] | None:
            cred = state.scram.get(user, {}).get(mechanism)
            return None if cred is None else dict(cred)

        return self._eng().meta.read(one)

    def save_scram_credential(self, user: str, mechanism: str, cred: dict[str, Any] | None) -> None:
        """Set (or with None remove) one user's credential for one mechanism; durable on return.
        ValueError when the record is refused (too many users, a bad body): nothing was logged."""
        eng = self._eng()
        eng._check_open()
        eng.meta.append("scram_credential", {"user": user, "mechanism": mechanism, "cred": cred}).result()

    # ==== client quotas: stored for the broker (loglake.broker.security.quotas enforces them) ==================

    def client_quotas(self) -> dict[EntityKey, dict[str, float]]:
        """Stored client quota configs: entity -> quota key -> value (loglake.meta.quotas)."""
        return self._eng().meta.read(lambda s: {key: dict(values) for key, values in s.client_quotas.items()})

    def save_client_quota(self, key: EntityKey, values: dict[str, float] | None) -> None:
        """Replace one client quota entity's configs (None or {} removes it); durable on return."""
        eng = self._eng()
        eng._check_open()
        eng.meta.append("client_quota", client_quota_body(key, values)).result()

    # ==== transactional ids (loglake.meta.txn; the broker's coordinator owns their meaning) ===========

    def record_txn(self, body: dict[str, Any]) -> Future[int]:
        """Log a transactional id's new state (a ``txn`` metadata record, loglake.meta.txn)."""
        eng = self._eng()
        eng._check_open()
        return eng.meta.append("txn", body)

    def txn_states(self) -> dict[str, dict[str, Any]]:
        """A copy of every transactional id's last recorded state."""
        return self._eng().meta.read(lambda s: {t: dict(b) for t, b in s.txns.items()})
