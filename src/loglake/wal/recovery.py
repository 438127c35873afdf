"""Reading the WAL back after a restart.

Every shard directory (`shard-NN`, whatever the shard count was) is read file by file, frames
in sequence order. What recovery may do to a shard:

* A zero length where a frame should start, in the untouched preallocated tail: the clean end.
* A bad frame (length CRC, data CRC, trailer magic) in the newest file of a shard, with no intact
  frame of a *later* group commit behind it: a torn tail. The file is truncated there and the
  bytes are counted in the report (`torn_tails`). A torn write, never acknowledged, leaves one;
  so does damage confined to the newest group, which the file alone cannot tell from it: the
  engine does, by the acknowledged ends it checks after the replay (engine/acked.py).
* A bad frame anywhere else, or with an intact later group behind it, or a newest file that ends
  inside a frame (cut short: a torn write never shortens a preallocated file): corruption of data
  that was once durable. Recovery stops with CorruptionError naming the file and byte offset; it
  never skips it silently. With `accept_data_loss` (an operator's explicit choice) the shard is
  cut at that frame instead: the rest of the file and every later file of the shard are dropped,
  and the engine reports per partition what was lost (engine/acked.py).

A *recycled* file (its frames carry FLAG_RECYCLED_FILE: an obsolete WAL file reused as the next
one, loglake.wal.spare) holds its old contents after its last frame: frames of an older
generation (a lower seq) or, where the new frames do not end on an old frame boundary, bytes that
do not decode. Where its frames end is known without them: a closed file's frames run up to the
seq its successor starts at, and the newest file's up to the first byte that is not a frame of
this generation. The rules above still apply to what lies before that point, and an intact frame
of a later group anywhere behind it is still corruption.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import crc32c

from loglake.errors import CorruptionError
from loglake.fs.base import FileSystem
from loglake.wal.frame import (
    BODY_HEADER_SIZE,
    FLAG_RECYCLED_FILE,
    FRAME_PAYLOAD_BYTES_MAX,
    PREFIX,
    PREFIX_SIZE,
    TRAILER_SIZE,
    Frame,
    FrameError,
    decode_frame,
    find_valid_frame_after,
)
from loglake.wal.shard import WalFile, parse_wal_file_name

log = logging.getLogger(__name__)


@dataclass
class ReplayFrame:
    """A recovered append, payload copied out of the file buffer."""

    topic_id: bytes
    partition: int
    base_offset: int
    end_offset: int
    payload: bytes


@dataclass
class ShardRecovery:
    directory: str
    files: list[WalFile] = field(default_factory=list)
    next_seq: int = 0


@dataclass
class WalRecovery:
    shards: dict[str, ShardRecovery] = field(default_factory=dict)  # by directory name
    frames: list[ReplayFrame] = field(default_factory=list)
    frames_read: int = 0
    bytes_read: int = 0
    bytes_truncated: int = 0
    truncated_files: list[str] = field(default_factory=list)
    #: torn tails cut: (file, byte the cut is at, bytes cut). Whether they were unacknowledged
    #: writes is the caller's to tell (the engine checks acknowledged ends after the replay).
    torn_tails: list[tuple[str, int, int]] = field(default_factory=list)
    #: bytes after the last frame of recycled files, cut (the newest file) or left (closed ones)
    recycled_bytes_cut: int = 0
    removed_files: list[str] = field(default_factory=list)


def shard_dir_name(index: int) -> str:
    return f"shard-{index:02d}"


def recover_wal(fs: FileSystem, wal_dir: str, *, accept_data_loss: bool = False) -> WalRecovery:
    result = WalRecovery()
    if not fs.exists(wal_dir):
        return result
    for name in fs.listdir(wal_dir):
        directory = os.path.join(wal_dir, name)
        if not name.startswith("shard-") or not fs.is_dir(directory):
            continue
        result.shards[name] = _recover_shard(fs, directory, result, accept_data_loss)
    return result


def _recover_shard(fs: FileSystem, directory: str, result: WalRecovery, accept: bool) -> ShardRecovery:
    shard = ShardRecovery(directory)
    names: list[tuple[int, str]] = []
    for name in fs.listdir(directory):
        seq = parse_wal_file_name(name)
        if seq is not None:
            names.append((seq, name))
    names.sort()
    next_seq = 0
    for i, (first_seq, name) in enumerate(names):
        path = os.path.join(directory, name)
        is_last = i == len(names) - 1
        with fs.open(path, write=is_last or accept) as f:
            data = f.pread(0, f.size())
            result.bytes_read += len(data)
            frames, bad_at = _scan(data, path, first_seq)
            if frames and frames[0].seq != first_seq:
                raise CorruptionError(path, 0, f"first frame has seq {frames[0].seq}, file name says {first_seq}")
            if frames and i > 0 and first_seq != next_seq:
                raise CorruptionError(path, 0, f"file starts at seq {first_seq}, the previous file ended before {next_seq}")
            damaged = False
            successor = names[i + 1][0] if not is_last else None
            old = bad_at is not None and _old_contents(data, bad_at, frames, first_seq, successor)
            if old and not is_last and bad_at is not None:
                # a closed recycled file: every frame is there, the rest is its old contents
                result.recycled_bytes_cut += len(data) - bad_at
                bad_at = None
            if bad_at is not None:
                try:
                    _classify_bad_frame(memoryview(data), path, bad_at, is_last, frames, first_seq)
                except CorruptionError as exc:
                    if not accept:
                        raise
                    damaged = True
                    log.error("WAL %s damaged (%s): ACCEPTED (--accept-data-loss), the shard is cut at byte %d", path, exc.detail, bad_at)
                result.truncated_files.append(path)
                if old and not damaged:
                    # old contents of a recycled file, or a torn write over them: unacknowledged
                    # either way, and not counted as torn bytes
                    result.recycled_bytes_cut += len(data) - bad_at
                    log.info("WAL %s (recycled): %d bytes after its last frame cut at byte %d", path, len(data) - bad_at, bad_at)
                else:
                    garbage_end = len(data.rstrip(b"\0"))
                    torn = max(0, garbage_end - bad_at)
                    result.bytes_truncated += torn
                    if not damaged:
                        # Not "unacknowledged" yet: damage can look the same, and only the check of
                        # acknowledged ends after the replay tells (engine/acked.py).
                        result.torn_tails.append((path, bad_at, torn))
                        log.info("WAL %s: %d bytes from byte %d are no intact frame: cut there", path, torn, bad_at)
                f.truncate(bad_at)
                f.datasync()
        next_seq = max(next_seq, first_seq)
        if not frames:
            if is_last:
                # The newest file was rolled to but holds nothing intact: drop it.
                fs.unlink(path)
                fs.fsync_dir(directory)
                result.removed_files.append(path)
                continue
            raise CorruptionError(path, 0, "closed WAL file holds no intact frame")
        wal_file = WalFile(path, first_seq)
        for frame in frames:
            wal_file.partitions[(frame.topic_id, frame.partition)] = frame.end_offset
            result.frames.append(
                ReplayFrame(frame.topic_id, frame.partition, frame.base_offset, frame.end_offset, bytes(frame.payload))
            )
        result.frames_read += len(frames)
        next_seq = frames[-1].seq + 1
        shard.files.append(wal_file)
        if damaged:
            for _seq, later in names[i + 1 :]:
                later_path = os.path.join(directory, later)
                fs.unlink(later_path)
                result.removed_files.append(later_path)
                log.error("WAL %s dropped: it follows the damaged %s (--accept-data-loss)", later_path, path)
            fs.fsync_dir(directory)
            break
    shard.next_seq = next_seq
    return shard


def _cut_short(buf: memoryview, pos: int) -> bool:
    """Whether the file ends inside the frame at `pos`: its prefix is cut, or its length (checked
    by the length CRC) reaches past the end."""
    n = len(buf)
    if n - pos < PREFIX_SIZE:
        return True
    body_length, length_crc = PREFIX.unpack_from(buf, pos)
    return bool(
        crc32c.crc32c(buf[pos : pos + 4]) == length_crc
        and BODY_HEADER_SIZE <= body_length <= BODY_HEADER_SIZE + FRAME_PAYLOAD_BYTES_MAX
        and pos + PREFIX_SIZE + body_length + TRAILER_SIZE > n
    )


def _all_zero(data: bytes, pos: int) -> bool:
    """True when data[pos:] is all zero bytes (a memcmp against zeros: the preallocated tail of a
    file that was not closed cleanly is megabytes long, and a Python-level strip is slow)."""
    return memoryview(data)[pos:] == bytes(len(data) - pos)


def _scan(data: bytes, path: str, first_seq: int) -> tuple[list[Frame], int | None]:
    """Intact frames from the start of `data`, and the byte where a bad frame starts (or None).

    An intact frame of an older generation (a seq below the expected one) first in the file, or
    after a recycled file's frames, ends the scan there like a bad frame does (`_old_contents`
    then tells which it is)."""
    buf = memoryview(data)
    frames: list[Frame] = []
    pos = 0
    while True:
        try:
            frame = decode_frame(buf, pos)
        except FrameError as exc:
            return frames, exc.position
        if frame is None:
            if pos < len(data) and not _all_zero(data, pos):
                return frames, pos  # non-zero bytes after a zero length: not a clean end
            return frames, None
        expected = frames[-1].seq + 1 if frames else first_seq
        if frame.seq < expected and (not frames or frames[-1].flags & FLAG_RECYCLED_FILE):
            return frames, pos  # an older generation's frame: a recycled file's old contents
        if frames and frame.seq != expected:
            raise CorruptionError(path, pos, f"frame seq {frame.seq}, expected {expected}")
        frames.append(frame)
        pos += frame.size


def _old_contents(data: bytes, pos: int, frames: list[Frame], first_seq: int, successor_seq: int | None) -> bool:
    """Whether the bytes from `pos`, where the scan of a file stopped, may be a recycled file's
    old contents rather than damage. A closed file (`successor_seq` given) must hold every frame up
    to its successor's first seq. The newest file: its frames are flagged recycled, or none of
    this generation landed and an older one's frame is first; `_classify_bad_frame` still judges
    what lies behind `pos` (an intact frame of a later group there is a durable write lost)."""
    recycled = bool(frames and frames[-1].flags & FLAG_RECYCLED_FILE)
    if successor_seq is not None:
        return recycled and frames[-1].seq + 1 == successor_seq
    if frames:
        return recycled
    try:
        first = decode_frame(memoryview(data), 0)
    except FrameError:
        return False
    return first is not None and first.seq < first_seq


def _classify_bad_frame(
    buf: memoryview, path: str, bad_at: int, is_last: bool, frames: list[Frame], first_seq: int | None = None
) -> None:
    """Raise CorruptionError unless the bad bytes at `bad_at` are a torn, unacknowledged write."""
    if not is_last:
        raise CorruptionError(path, bad_at, "bad WAL frame in a closed file (data that was durable is damaged)")
    if _cut_short(buf, bad_at):
        raise CorruptionError(
            path,
            bad_at,
            "the file ends inside a frame: it was cut short (a torn write never shortens a preallocated "
            "WAL file), so acknowledged writes after this point may be lost",
        )
    # The bad frame's seq is the one after the last good frame; an intact frame whose group
    # started after that seq was written after the bad frame's group was fsynced. Every intact
    # frame behind is looked at: frames of the torn group itself, or of a recycled file's older
    # generation, may come first.
    bad_seq = frames[-1].seq + 1 if frames else first_seq
    pos = bad_at
    while (later := find_valid_frame_after(buf, pos)) is not None:
        if bad_seq is None:
            bad_seq = later.group_seq
        if later.group_seq > bad_seq:
            raise CorruptionError(
                path, bad_at, f"bad WAL frame followed by an intact later write (seq {later.seq} at byte {later.position})"
            )
        pos = later.position + later.size
