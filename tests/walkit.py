"""Shared pieces of the WAL shard tests (spare files, recycled files): a fault model that behaves
as ext4 does for the WAL's choice, one acknowledged append at a time, and what recovery reads back of those appends."""

from __future__ import annotations

import threading

from loglake.fs.base import FileSystem
from loglake.fs.faulty import FaultyFileSystem
from loglake.wal import Durability, WalEntry, WalShard
from loglake.wal.recovery import recover_wal

TID = bytes(range(16))
FILE_BYTES = 64 * 1024
PAYLOAD = 10_000  # 6 frames fill a file: a roll every 6 appends
WAIT_S = 10.0  # longest a test waits for the shard's threads


class ExtentFs(FaultyFileSystem):
    """The fault-injecting model, told to behave as ext4 does for the WAL's choice."""

    has_unwritten_extents = True


def append_one(shard: WalShard, base: int, acked: list[int]) -> None:
    """One fsync-class frame at offset `base`; waits for its answer and notes it in `acked` when
    acknowledged."""
    done = threading.Event()
    errors: list[BaseException | None] = []

    def on_done(_e: WalEntry, err: BaseException | None) -> None:
        errors.append(err)
        done.set()

    shard.submit(WalEntry(TID, 0, base, base + 1, bytes([base % 251]) * PAYLOAD, Durability.FSYNC, on_done))
    assert done.wait(WAIT_S)
    if errors[0] is None:
        acked.append(base)


def recovered_offsets(fs: FileSystem, wal_dir: str) -> list[int]:
    """The offsets of the frames recovery reads from `wal_dir`, each payload checked to be the
    one `append_one` wrote for it (an old frame read as new would carry another offset's bytes)."""
    frames = recover_wal(fs, wal_dir).frames
    for f in frames:
        assert bytes(f.payload) == bytes([f.base_offset % 251]) * PAYLOAD, f"frame {f.base_offset}: wrong payload"
    return [f.base_offset for f in frames]
