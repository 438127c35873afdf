"""Client quota configs in the metadata: Kafka's /config/users and /config/clients entities.

One record kind, ``client_quota``, carries one entity's whole quota config (it replaces the
previous one):

    {entity: [[type, name], ...], values: {key: number, ...}}     (values null or {}: removed)

`type` is ``user`` or ``client-id``; `name` is a string, or null for the default entity of that
type (Kafka's ``<default>``). An entity names each type at most once: ``[["user", "alice"]]``,
``[["client-id", null]]``, ``[["user", "alice"], ["client-id", "app"]]``. `values` maps Kafka's
quota keys (``producer_byte_rate``, ``consumer_byte_rate``, ``request_percentage``,
``controller_mutation_rate``) to positive finite numbers. The broker validates what it writes
(loglake.broker.security.quotas); applying only checks the shape, so a record a newer release wrote with
a key this one does not know is kept, not refused.

The state keeps the entities as `EntityKey`: the (type, name) pairs sorted by type, so the same
entity is one key whatever order a request named its parts in. Checkpoints list them as
``client_quotas: [[entity, values], ...]`` (absent in checkpoints written before quotas: none).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

__all__ = [
    "ENTITY_TYPES",
    "EntityKey",
    "apply_client_quota",
    "client_quotas_doc",
    "entity_key",
    "load_client_quotas",
]

#: Kafka's entity type names (ClientQuotaEntity.USER / CLIENT_ID).
ENTITY_TYPES = ("client-id", "user")
#: An entity: its (type, name) pairs sorted by type; a None name is the type's default entity.
EntityKey = tuple[tuple[str, str | None], ...]


def entity_key(parts: Any) -> EntityKey:
    """The canonical key of an entity given as [[type, name], ...]; ValueError on a bad shape."""
    seen: dict[str, str | None] = {}
    for part in parts:
        etype, name = part
        if etype not in ENTITY_TYPES or etype in seen:
            raise ValueError(f"client quota entity type {etype!r} unknown or repeated")
        if name is not None and not isinstance(name, str):
            raise ValueError(f"client quota entity name {name!r} is not a string")
        seen[etype] = name
    if not seen:
        raise ValueError("client quota entity is empty")
    return tuple(sorted(seen.items()))


def _values(raw: Any) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError("client quota values is not an object")
    out: dict[str, float] = {}
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"client quota {key}: {value!r} is not a number")
        number = float(value)
        if not math.isfinite(number) or number <= 0:
            raise ValueError(f"client quota {key}: {number} is not a positive finite number")
        out[str(key)] = number
    return out


class QuotaState(Protocol):
    """The part of the metadata state (`loglake.meta.state.MetaState`, which imports this module)
    client quotas live in: entity -> quota key -> value."""

    @property
    def client_quotas(self) -> dict[EntityKey, dict[str, float]]: ...


def apply_client_quota(state: QuotaState, b: dict[str, Any]) -> None:
    key = entity_key(b["entity"])
    values = _values(b.get("values"))
    if values:
        state.client_quotas[key] = values
    else:
        state.client_quotas.pop(key, None)


def client_quotas_doc(state: QuotaState) -> list[list[Any]]:
    return [[[list(p) for p in key], dict(values)] for key, values in state.client_quotas.items()]


def load_client_quotas(state: QuotaState, doc: dict[str, Any]) -> None:
    for entity, values in doc.get("client_quotas") or ():
        kept = _values(values)
        if kept:
            state.client_quotas[entity_key(entity)] = kept
