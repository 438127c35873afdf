"""Checkpoints of the metadata log in etcd: chunked under etcd's request limit, swapped in by a
manifest (loglake.cluster.etcd's module doc; docs/CLUSTER.md).

A checkpoint is the single-node checkpoint encoding (loglake.meta.state, docs/FORMAT.md) cut into
CHECKPOINT_CHUNK_BYTES pieces under a name of its own, `<seq, 20 digits>-<random tag>`, so two
brokers checkpointing the same seq never interleave chunks. The manifest (seq, name, bytes,
CRC-32C of the whole) is swapped in by a transaction compared on its mod revision: of several
brokers racing, one wins and the others delete their chunks. The same transaction deletes the
log up to the *previous* checkpoint and every chunk older than it; the previous checkpoint and
the log after it stay, so a broker lagging by less than one checkpoint interval catches up from
the log alone.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import crc32c

from loglake.cluster import etcd_client as ec
from loglake.cluster.etcd_client import EtcdClient, prefix_end
from loglake.errors import CorruptionError
from loglake.meta.checkpoint import CheckpointImage, decode_checkpoint, encode_checkpoint
from loglake.meta.state import MetaState

__all__ = ["CHECKPOINT_CHUNK_BYTES", "MetaKeys", "load_checkpoint", "write_checkpoint"]

#: Size of one checkpoint chunk: under etcd's default request limit (1.5 MiB) with room for the
#: base64 the JSON gateway adds (4/3) and the request around it.
CHECKPOINT_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class MetaKeys:
    """The metadata keys under one cluster prefix (the layout in loglake.cluster.etcd)."""

    prefix: str

    def key(self, rel: str) -> bytes:
        return f"{self.prefix}/{rel}".encode()

    @property
    def head(self) -> bytes:
        return self.key("meta/head")

    @property
    def log(self) -> bytes:
        return self.key("meta/log/")

    def log_key(self, seq: int) -> bytes:
        return self.log + b"%020d" % seq

    @property
    def manifest(self) -> bytes:
        return self.key("meta/checkpoint")

    @property
    def chunks(self) -> bytes:
        return self.key("meta/ckpt/")


def _manifest(raw: bytes, where: str) -> tuple[str, int, int, int]:
    """(name, seq, bytes, crc32c) of a manifest; CorruptionError when it does not parse."""
    try:
        doc = json.loads(raw)
        return str(doc["name"]), int(doc["seq"]), int(doc["bytes"]), int(doc["crc32c"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptionError(where, 0, f"checkpoint manifest does not parse: {exc!r}") from None


def newest_checkpoint_seq(client: EtcdClient, keys: MetaKeys) -> int | None:
    """The seq the newest checkpoint holds (its manifest's); None when there is none."""
    manifest, _ = client.get(keys.manifest)
    if manifest is None:
        return None
    return _manifest(manifest.value, keys.manifest.decode())[1]


def load_checkpoint(client: EtcdClient, keys: MetaKeys) -> tuple[MetaState, int | None]:
    """The newest checkpoint's state (marked replaying) and its seq; an empty state and None when
    there is none. Manifest and chunks are read at one etcd revision (EtcdCompactedError when that
    revision is compacted meanwhile: the caller starts over)."""
    manifest, revision = client.get(keys.manifest)
    if manifest is None:
        state = MetaState()
        state.replaying = True
        return state, None
    where = keys.manifest.decode()
    name, seq, size, crc = _manifest(manifest.value, where)
    start = keys.chunks + name.encode() + b"/"
    kvs, _ = client.range_all(start, prefix_end(start), revision=revision)
    data = b"".join(kv.value for kv in kvs)
    if len(data) != size or crc32c.crc32c(data) != crc:
        raise CorruptionError(
            start.decode(),
            0,
            f"checkpoint chunks hold {len(data)} bytes (CRC {crc32c.crc32c(data):#010x}), the manifest says {size} ({crc:#010x})",
        )
    state = decode_checkpoint(data, path=start.decode())
    if state.seq != seq:
        raise CorruptionError(where, 0, f"checkpoint holds seq {state.seq}, its manifest says {seq}")
    state.replaying = True
    return state, seq


def write_checkpoint(client: EtcdClient, keys: MetaKeys, image: CheckpointImage) -> int | None:
    """Write `image` and swap it in; its seq, or None when another broker's checkpoint at the
    same or a later seq won (this one's chunks are deleted again)."""
    data = b"".join(encode_checkpoint(image))
    name = f"{image.seq:020d}-{os.urandom(4).hex()}"
    start = keys.chunks + name.encode() + b"/"
    chunks = [data[i : i + CHECKPOINT_CHUNK_BYTES] for i in range(0, len(data), CHECKPOINT_CHUNK_BYTES)] or [
        b""
    ]
    for i, chunk in enumerate(chunks):
        client.put(start + b"%06d" % i, chunk)
    current, _ = client.get(keys.manifest)
    prev = _manifest(current.value, keys.manifest.decode()) if current is not None else None
    if prev is not None and prev[1] >= image.seq:
        client.delete_range(start, prefix_end(start))
        return None
    manifest: dict[str, Any] = {
        "seq": image.seq,
        "name": name,
        "bytes": len(data),
        "crc32c": crc32c.crc32c(data),
        "chunks": len(chunks),
    }
    success = [ec.op_put(keys.manifest, json.dumps(manifest).encode())]
    if prev is not None:
        prev_name, prev_seq = prev[0], prev[1]
        success.append(ec.op_delete(keys.log_key(0), keys.log_key(prev_seq + 1)))
        success.append(ec.op_delete(keys.chunks, keys.chunks + prev_name.encode()))
    ok, _, _ = client.txn([ec.cmp_mod(keys.manifest, current.mod_revision if current else 0)], success)
    if not ok:
        client.delete_range(start, prefix_end(start))
        return None
    return image.seq
