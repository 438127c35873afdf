"""Which live broker coordinates a consumer group: rendezvous hashing over the live node ids.

Every broker computes the same answer from the same live set, with no record to write: the
coordinator of a group is the live node with the highest hash of (group, node id). When a broker
dies only its own groups move (each to the next-highest node for that group), and when one joins
it takes about 1/n of the groups, from every other broker alike — the fewest moves any
assignment can make. The hash is BLAKE2b (8 bytes), stable across processes and Python versions
(not Python's `hash`, which is salted per process) and well mixed: a CRC is linear, and its
weights for node ids differing in one digit are too alike to spread groups evenly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection

__all__ = ["coordinator_of"]


def _weight(key: str, node: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{node}\0{key}".encode(), digest_size=8).digest(), "big")


def coordinator_of(key: str, live: Collection[int]) -> int:
    """The node coordinating `key` (a group id) among `live`; -1 when no broker is live."""
    if not live:
        return -1
    return max(live, key=lambda n: (_weight(key, n), -n))
