"""Write-ahead log: sharded, group-committed, checksummed frames (DESIGN.md §3, §4)."""

from loglake.wal.frame import FRAME_OVERHEAD, Frame, FrameError, decode_frame, encode_frame
from loglake.wal.recovery import ReplayFrame, WalRecovery, recover_wal, shard_dir_name
from loglake.wal.shard import Durability, WalEntry, WalFile, WalShard

__all__ = [
    "FRAME_OVERHEAD",
    "Durability",
    "Frame",
    "FrameError",
    "ReplayFrame",
    "WalEntry",
    "WalFile",
    "WalRecovery",
    "WalShard",
    "decode_frame",
    "encode_frame",
    "recover_wal",
    "shard_dir_name",
]
