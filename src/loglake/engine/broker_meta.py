"""The engine's calls for the broker's metadata (a mixin of `Engine`): leader epochs, consumer
groups' offsets and states, dynamic broker and group configs.

The broker owns what these mean (its group coordinator, its dynamic config layers); the engine
stores them durably in the metadata log and applies what concerns it (topic defaults, the
cleaner's rate, epochs stamped into batches).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, cast

from loglake.engine.epochs import end_offset_for, epoch_of, record_bump

if TYPE_CHECKING:
    from loglake.engine.engine import Engine

__all__ = ["BrokerMetaMixin"]


class BrokerMetaMixin:
    def _eng(self) -> Engine:
        return cast("Engine", self)

    def leader_epoch(self, name: str, partition: int, offset: int | None = None) -> int:
        """The partition's current leader epoch, or the epoch that wrote `offset`."""
        eng = self._eng()
        pm = eng.catalog.partition(name, partition).meta
        return pm.leader_epoch if offset is None else epoch_of(pm, offset)

    def epoch_end_offset(self, name: str, partition: int, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: (largest epoch <= `epoch`, where it ends); engine/epochs.py."""
        eng = self._eng()
        p = eng.catalog.partition(name, partition)
        with p.lock:
            return end_offset_for(p.meta, p.next_offset, epoch)

    def bump_leader_epoch(self, name: str, partition: int, reason: str) -> int:
        """Start a new leader epoch at the partition's log end, durably (an operator accepted a
        loss; engine/epochs.py). Consumers past the log end then see a truncation. Returns it."""
        eng = self._eng()
        eng._check_open()
        p = eng.catalog.partition(name, partition)
        with p.lock:  # appends after it carry the new epoch and offsets >= its start
            record_bump(eng.catalog, p, reason).result()
            return p.meta.leader_epoch

    # ==== consumer groups' metadata (the broker's coordinator owns the meaning) ======================

    def group_metadata(self) -> dict[str, dict[str, Any]]:
        """{group_id: {"offsets": {(topic, partition): [offset, epoch, metadata, ts]}, "state": dict | None}}"""
        eng = self._eng()
        return eng.catalog.group_metadata()

    def commit_group_offsets(self, group_id: str, rows: list[tuple[str, int, int, int, str, int]]) -> Future[int]:
        """Record committed offsets (topic, partition, offset, leader_epoch, metadata, commit_ts_ms)."""
        eng = self._eng()
        eng._check_open()
        return eng.catalog.commit_group_offsets(group_id, rows)

    def expire_group_offsets(self, group_id: str, partitions: list[tuple[str, int]]) -> Future[int]:
        eng = self._eng()
        eng._check_open()
        return eng.catalog.expire_group_offsets(group_id, partitions)

    def delete_group_metadata(self, group_id: str) -> Future[int]:
        eng = self._eng()
        eng._check_open()
        return eng.catalog.delete_group_metadata(group_id)

    def save_group_state(self, group_id: str, state: dict[str, Any] | None) -> Future[int]:
        eng = self._eng()
        eng._check_open()
        return eng.catalog.save_group_state(group_id, state)

    # ==== dynamic configs: stored for the broker; topic defaults and cleaner rate applied here ========

    def dynamic_configs(self, kind: str) -> dict[str, dict[str, str]]:
        """Stored dynamic configs: kind "broker" ({scope: {name: value}}) or "group" ({group: ...})."""
        eng = self._eng()
        return eng.catalog.dynamic_configs(kind)

    def save_dynamic_configs(self, kind: str, key: str, configs: dict[str, str]) -> None:
        """Replace one broker scope's or group's dynamic configs; durable on return."""
        eng = self._eng()
        eng._check_open()
        eng.catalog.save_dynamic_configs(kind, key, configs).result()

    def set_topic_defaults(self, defaults: dict[str, str]) -> None:
        """Topic config defaults changed at runtime: every topic without an override follows."""
        eng = self._eng()
        eng.config.check_topic_defaults(defaults)
        eng.catalog.set_topic_defaults(defaults)
        eng._wake()

    def set_cleaner_io_rate(self, bytes_per_s: int) -> None:
        """Change the cleaner's I/O bound (log.cleaner.io.max.bytes.per.second) at runtime."""
        eng = self._eng()
        eng.config.cleaner_io_max_bytes_per_second = bytes_per_s
        if eng._cleaner is not None:
            eng._cleaner.limiter.set_rate(bytes_per_s)

    # ==== ACL bindings (loglake.meta.acls; the broker's authorizer decides with them) ==================

    def acl_bindings(self) -> list[tuple[int, str, int, str, str, int, int]]:
        """The stored ACL bindings, in creation order."""
        eng = self._eng()
        return eng.catalog.acl_bindings()

    def save_acls(self, created: list[list[Any]], deleted: list[list[Any]]) -> None:
        """Record ACL bindings created and deleted, as one `acls` record; durable on return."""
        eng = self._eng()
        eng._check_open()
        eng.catalog.save_acls(created, deleted).result()

    # ==== SCRAM credentials (loglake.meta.scram): the broker's SASL authenticator reads them =========

    def scram_credentials(self) -> dict[str, dict[str, dict[str, Any]]]:
        """A copy of every stored credential: user -> mechanism -> credential doc."""
        catalog = self._eng().catalog
        read = getattr(catalog.meta, "read", None)

        def copy(state: Any) -> dict[str, dict[str, dict[str, Any]]]:
            return {user: {m: dict(c) for m, c in mechs.items()} for user, mechs in state.scram.items()}

        return copy(catalog.state) if read is None else cast("dict[str, dict[str, dict[str, Any]]]", read(copy))

    def scram_credential(self, user: str, mechanism: str) -> dict[str, Any] | None:
        """The stored credential doc of one user and mechanism, or None."""
        catalog = self._eng().catalog
        read = getattr(catalog.meta, "read", None)

        def one(state: Any) -> dict[str, Any] | None:
            cred = state.scram.get(user, {}).get(mechanism)
            return None if cred is None else dict(cred)

        return one(catalog.state) if read is None else cast("dict[str, Any] | None", read(one))

    def save_scram_credential(self, user: str, mechanism: str, cred: dict[str, Any] | None) -> None:
        """Set (or with None remove) one user's credential for one mechanism; durable on return.
        ValueError when the record is refused (too many users, a bad body): nothing was logged."""
        eng = self._eng()
        eng._check_open()
        eng.catalog.meta.append("scram_credential", {"user": user, "mechanism": mechanism, "cred": cred}).result()
