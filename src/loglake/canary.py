"""Canary mutations: test-only switches that break one safety mechanism each.

NEVER set `LOGLAKE_CANARY` in production. Each canary deliberately breaks a guarantee loglake
makes (durability of acknowledged records, corruption detection, never losing a segment's only
copy); the engine logs a WARNING at open while any is on.

They exist to prove the tests can see what they claim to guard: `make test-long` runs, for each
canary, the tests that should catch it with the canary on and fails unless they do fail
(tests/test_long_canaries.py; docs/RELIABILITY.md, "Canaries").

`LOGLAKE_CANARY` is a comma-separated list of names from `NAMES`, read once when this module is
imported (subprocess brokers inherit it through the environment). An unknown name is an error
at import, so a misspelt canary cannot make a run look clean. Each switch is a module-level
bool, so the mutation sites cost one attribute lookup.
"""

from __future__ import annotations

import logging
import os

__all__ = [
    "ACK_BEFORE_WAL_WRITE",
    "ACTIVE",
    "DELETE_HOT_BEFORE_COLD_VERIFIED",
    "ENV",
    "NAMES",
    "SKIP_CHAIN_CHECK",
    "SKIP_CRC_CHECK",
    "SKIP_WAL_FSYNC",
    "active",
    "parse",
    "warn_if_active",
]

log = logging.getLogger(__name__)

#: The environment variable holding the comma-separated list of active canaries.
ENV = "LOGLAKE_CANARY"

#: Every canary and what it breaks (where: the `if canary.X:` site).
NAMES: dict[str, str] = {
    "skip_wal_fsync": "the WAL group commit skips its fdatasync but acks as if it ran (wal/shard.py)",
    "ack_before_wal_write": "appends are acknowledged at enqueue, before the WAL write (engine/append.py)",
    "skip_crc_check": "the read path does not check sealed batches' CRC-32C (engine/corrupt.py)",
    "skip_chain_check": "segment verification skips the SHA-256 chain hash and the prev_hash links (segment/verify.py)",
    "delete_hot_before_cold_verified": "relocation deletes the hot copy right after the upload, before the cold copy is verified and the tier switched (engine/tiering.py)",
}


def parse(value: str | None) -> frozenset[str]:
    """The canaries named in `value` (a comma-separated list; blanks ignored). Unknown names
    raise ValueError."""
    names = frozenset(n.strip() for n in (value or "").split(",") if n.strip())
    unknown = sorted(names - NAMES.keys())
    if unknown:
        raise ValueError(f"{ENV}: unknown canary {', '.join(unknown)} (known: {', '.join(sorted(NAMES))})")
    return names


#: The canaries on in this process (fixed at import).
ACTIVE: frozenset[str] = parse(os.environ.get(ENV))

SKIP_WAL_FSYNC = "skip_wal_fsync" in ACTIVE
ACK_BEFORE_WAL_WRITE = "ack_before_wal_write" in ACTIVE
SKIP_CRC_CHECK = "skip_crc_check" in ACTIVE
SKIP_CHAIN_CHECK = "skip_chain_check" in ACTIVE
DELETE_HOT_BEFORE_COLD_VERIFIED = "delete_hot_before_cold_verified" in ACTIVE

_warned = False


def active(name: str) -> bool:
    """Whether canary `name` is on (ValueError for a name that is not a canary)."""
    if name not in NAMES:
        raise ValueError(f"unknown canary {name!r}")
    return name in ACTIVE


def warn_if_active() -> None:
    """Log a WARNING (once per process) when any canary is on; the engine calls it at open."""
    global _warned
    if ACTIVE and not _warned:
        _warned = True
        log.warning(
            "CANARY MUTATIONS ACTIVE (%s=%s): this process deliberately breaks loglake's safety "
            "guarantees for testing; never run it with real data",
            ENV,
            ",".join(sorted(ACTIVE)),
        )
