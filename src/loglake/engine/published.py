"""Metadata published into the segment store, for readers that never talk to the broker.

`<prefix>/loglake-<cluster_id>/meta.json` is replaced (atomically: one PUT, or temp+rename in a
folder) after the metadata changes: topics, configs, each partition's log start offset and
sealed segment list, and committed consumer-group offsets. Spark's data source reads it to find
segments; a broker started with an empty data directory can rebuild from it (disaster recovery).

It may lag the local snapshot by one maintenance tick; readers that need to be exact list the
partition's prefix and read segment trailers (segments are immutable and self-describing).
"""

from __future__ import annotations

import json
from typing import Any

from loglake.errors import CorruptionError
from loglake.store.base import ObjectStore, cluster_prefix

PUBLISHED_FORMAT = "loglake-meta"
PUBLISHED_VERSION = 1
META_OBJECT_NAME = "meta.json"


def meta_key(cluster_id: str, prefix: str = "") -> str:
    return cluster_prefix(cluster_id, prefix) + META_OBJECT_NAME


def encode_published(payload: dict[str, Any], seq: int, written_ms: int) -> bytes:
    doc = {
        "format": PUBLISHED_FORMAT,
        "version": PUBLISHED_VERSION,
        "seq": seq,
        "written_ms": written_ms,
        "cluster_id": payload["cluster_id"],
        "topics": payload["topics"],
        "partitions": payload["partitions"],
        "extra": payload.get("extra", {}),
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def decode_published(data: bytes, key: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptionError(key, 0, f"published metadata is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != PUBLISHED_FORMAT:
        raise CorruptionError(key, 0, "not a loglake published-metadata object")
    if doc.get("version") != PUBLISHED_VERSION:
        raise CorruptionError(key, 0, f"published metadata version {doc.get('version')} is not supported (want 1)")
    return doc


def find_published(store: ObjectStore, prefix: str = "") -> list[str]:
    """Keys of every cluster's meta.json under `prefix` (usually one)."""
    base = prefix.strip("/") + "/" if prefix.strip("/") else ""
    keys = [k for k in store.list(base + "loglake-") if k.endswith("/" + META_OBJECT_NAME)]
    return sorted(k for k in keys if k.count("/") == base.count("/") + 1)


def read_published(store: ObjectStore, prefix: str = "") -> dict[str, Any]:
    """The published metadata of the one cluster under `prefix`."""
    keys = find_published(store, prefix)
    if not keys:
        raise CorruptionError(store.url, 0, f"no loglake metadata (loglake-*/meta.json) under prefix {prefix!r}")
    if len(keys) > 1:
        raise CorruptionError(store.url, 0, f"several clusters under prefix {prefix!r}: {', '.join(keys)}")
    return decode_published(store.get(keys[0]), keys[0])
