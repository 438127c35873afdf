"""Crash-safe metadata snapshots: ``<dir>/snapshot-<seq 20 digits>.bin``.

File layout (big-endian; see docs/_format_meta.md)::

    0   4  magic  b"LLMS"
    4   2  version (1)
    6   2  flags (0)
    8   8  seq (equals the sequence number in the file name)
    16  4  payload length N (at most MAX_PAYLOAD_BYTES)
    20  4  CRC-32C (Castagnoli) of bytes 0..20 followed by the payload
    24  N  payload: JSON object, UTF-8, sort_keys, compact separators

A snapshot is published with `FileSystem.write_file_atomic` (temp, sync, rename, directory
fsync). After a new snapshot is durable, every snapshot except it and the previous one is
deleted, so a torn or bit-rotted newest file can always fall back to one older state.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
import struct
import threading
from typing import Any

import crc32c

from loglake.errors import CorruptionError
from loglake.fs.base import FileSystem

__all__ = [
    "HEADER",
    "MAGIC",
    "MAX_PAYLOAD_BYTES",
    "VERSION",
    "SnapshotStore",
    "decode_snapshot",
    "encode_snapshot",
    "snapshot_name",
]

log = logging.getLogger(__name__)

MAGIC = b"LLMS"
VERSION = 1
#: magic, version, flags, seq, payload length, crc
HEADER = struct.Struct(">4sHHQII")
#: Bytes of the header covered by the CRC (everything before the CRC field).
_CRC_COVERED = HEADER.size - 4
#: Largest payload accepted on read or write, so a corrupt length never allocates.
MAX_PAYLOAD_BYTES = 256 * 1024 * 1024

_NAME_RE = re.compile(r"^snapshot-(\d{20})\.bin$")


def snapshot_name(seq: int) -> str:
    return f"snapshot-{seq:020d}.bin"


def encode_snapshot(seq: int, payload: dict[str, Any]) -> bytes:
    """The full bytes of snapshot `seq` holding `payload`."""
    if not 0 <= seq < 10**20:
        raise ValueError(f"snapshot seq out of range: {seq}")
    body = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(body) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"snapshot payload is {len(body)} bytes, over the {MAX_PAYLOAD_BYTES}-byte limit")
    covered = HEADER.pack(MAGIC, VERSION, 0, seq, len(body), 0)[:_CRC_COVERED]
    crc = crc32c.crc32c(body, crc32c.crc32c(covered))
    return covered + struct.pack(">I", crc) + body


def decode_snapshot(data: bytes, *, path: str, expected_seq: int | None = None) -> tuple[int, dict[str, Any]]:
    """Parse and verify snapshot bytes; raise CorruptionError naming `path` and the bad offset."""
    if len(data) < HEADER.size:
        raise CorruptionError(path, len(data), f"file is {len(data)} bytes, shorter than the header")
    magic, version, flags, seq, length, crc = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise CorruptionError(path, 0, f"bad magic {magic!r}")
    if length > MAX_PAYLOAD_BYTES:
        raise CorruptionError(path, 16, f"payload length {length} over the {MAX_PAYLOAD_BYTES}-byte limit")
    if len(data) != HEADER.size + length:
        raise CorruptionError(
            path,
            min(len(data), HEADER.size + length),
            f"file is {len(data)} bytes, header says {HEADER.size + length}",
        )
    body = data[HEADER.size :]
    actual = crc32c.crc32c(body, crc32c.crc32c(data[:_CRC_COVERED]))
    if actual != crc:
        raise CorruptionError(path, 20, f"CRC-32C mismatch (stored {crc:#010x}, computed {actual:#010x})")
    if version != VERSION:
        raise CorruptionError(path, 4, f"unsupported snapshot version {version}")
    if flags != 0:
        raise CorruptionError(path, 6, f"unsupported snapshot flags {flags:#06x}")
    if expected_seq is not None and seq != expected_seq:
        raise CorruptionError(path, 8, f"seq {seq} does not match the file name's {expected_seq}")
    try:
        payload = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptionError(path, HEADER.size, f"payload is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise CorruptionError(path, HEADER.size, f"payload is a {type(payload).__name__}, not an object")
    return seq, payload


class SnapshotStore:
    """Numbered, checksummed metadata snapshots in one directory. Thread-safe."""

    def __init__(self, fs: FileSystem, directory: str) -> None:
        self._fs = fs
        self._dir = directory
        self._mu = threading.Lock()
        #: Highest seq seen on disk or written (None until the directory was scanned).
        self._last_seq: int | None = None
        #: The newest snapshot known to be valid (loaded or written by us).
        self._last_good: int | None = None
        self._dir_ready = False

    @property
    def directory(self) -> str:
        return self._dir

    def _path(self, seq: int) -> str:
        return posixpath.join(self._dir, snapshot_name(seq))

    def _scan(self) -> list[int]:
        """Snapshot seqs on disk, ascending; deletes leftover temp files."""
        if not self._fs.exists(self._dir):
            return []
        seqs: list[int] = []
        for name in self._fs.listdir(self._dir):
            if name.endswith(".tmp"):
                log.info("removing leftover temp file %s", posixpath.join(self._dir, name))
                try:
                    self._fs.unlink(posixpath.join(self._dir, name))
                except FileNotFoundError:
                    pass
                continue
            m = _NAME_RE.match(name)
            if m:
                seqs.append(int(m.group(1)))
        seqs.sort()
        return seqs

    def load(self) -> tuple[int, dict[str, Any]] | None:
        """The newest valid snapshot as (seq, payload), or None when there is none.

        A corrupt snapshot is logged as a warning and skipped in favour of an older one; when
        every snapshot is corrupt, the newest one's CorruptionError is raised.
        """
        with self._mu:
            seqs = self._scan()
            self._last_seq = seqs[-1] if seqs else 0
            self._last_good = None
            if not seqs:
                return None
            first_error: CorruptionError | None = None
            for seq in reversed(seqs):
                path = self._path(seq)
                try:
                    found = decode_snapshot(self._fs.read_file(path), path=path, expected_seq=seq)
                except CorruptionError as exc:
                    log.warning(
                        "metadata snapshot %s is corrupt at byte %d (%s); falling back to an older one",
                        exc.path,
                        exc.offset,
                        exc.detail,
                    )
                    first_error = first_error or exc
                    continue
                self._last_good = seq
                return found
            if first_error is None:  # pragma: no cover - seqs was not empty
                raise CorruptionError(self._dir, 0, "no snapshot could be read")
            raise CorruptionError(
                first_error.path,
                first_error.offset,
                f"{first_error.detail} (all {len(seqs)} snapshots in {self._dir} are corrupt)",
            )

    def write(self, payload: dict[str, Any]) -> int:
        """Durably publish `payload` as the next snapshot and return its seq."""
        with self._mu:
            if not self._dir_ready:
                self._fs.makedirs(self._dir)
                self._dir_ready = True
            if self._last_seq is None:
                seqs = self._scan()
                self._last_seq = seqs[-1] if seqs else 0
                self._last_good = seqs[-1] if seqs else None
            seq = self._last_seq + 1
            data = encode_snapshot(seq, payload)
            self._fs.write_file_atomic(self._path(seq), [data])
            previous = self._last_good
            self._last_seq = seq
            self._last_good = seq
            self._prune(keep={seq} if previous is None else {seq, previous})
            return seq

    def _prune(self, keep: set[int]) -> None:
        """Delete every snapshot not in `keep` (best effort; the new one is already durable)."""
        try:
            names = self._fs.listdir(self._dir)
        except OSError as exc:
            log.warning("could not list %s to prune old snapshots: %s", self._dir, exc)
            return
        for name in names:
            m = _NAME_RE.match(name)
            if m and int(m.group(1)) not in keep:
                path = posixpath.join(self._dir, name)
                try:
                    self._fs.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    log.warning("could not delete old snapshot %s: %s", path, exc)
