"""Shared pieces of the WAL shard tests (spare files, recycled files): a fault model that behaves
as ext4 does for the WAL's choice, and one acknowledged append at a time."""

from __future__ import annotations

import threading

from loglake.fs.faulty import FaultyFileSystem
from loglake.wal import Durability, WalEntry, WalShard

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
