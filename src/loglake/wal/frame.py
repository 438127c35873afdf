"""WAL frame format.

One frame carries one append: the Kafka RecordBatch bytes of a single partition, with their
offsets already assigned. All integers little-endian.

    off  size  field
      0     4  body_length     u32   bytes from frame_type to the end of the payload
      4     4  length_crc      u32   CRC-32C of the 4 body_length bytes
    ---- body (covered by data_crc) -------------------------------------------------------
      8     1  frame_type      u8    1 = APPEND
      9     1  flags           u8    bit 0 (FLAG_RECYCLED_FILE): the frame's file is a recycled
                                     WAL file, so bytes of an older generation of frames (lower
                                     seq) may follow the file's last frame; other bits 0
     10     2  reserved        u16   0
     12     8  seq             u64   frame sequence number in the shard, dense from 0
     20     8  group_seq       u64   seq of the first frame of the group commit this frame
                                     was written in (tells a torn group from mid-file corruption)
     28    16  topic_id        uuid  the topic's UUID bytes (a re-created topic never matches)
     44     4  partition       u32
     48     8  base_offset     i64   offset of the first record in the payload
     56     8  end_offset      i64   offset after the last record in the payload
     64     .  payload               one or more Kafka v2 RecordBatches, back to back
    ---- trailer -----------------------------------------------------------------------------
      .     4  data_crc        u32   CRC-32C of the body
      .     4  body_length     u32   repeated, so a scanner can find a frame's start from its end
      .     4  magic           "LLWE"

The length is checked by its own CRC before it is trusted, so a torn length never makes the
reader skip or allocate a wrong amount; the magic at the very end proves the whole frame landed.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import crc32c

from loglake.fs.base import BytesLike

PREFIX = struct.Struct("<II")  # body_length, length_crc
BODY_HEADER = struct.Struct("<BBHQQ16sIqq")  # type, flags, reserved, seq, group_seq, topic_id, partition, base, end
TRAILER = struct.Struct("<II4s")  # data_crc, body_length, magic
MAGIC = b"LLWE"
FRAME_APPEND = 1
#: Frame flag: written into a recycled WAL file (loglake.wal.spare). Recovery then reads a frame
#: whose seq is below the expected one, or undecodable bytes, after the last frame as the file's
#: old contents (docs/FORMAT.md, WAL frames, version 2).
FLAG_RECYCLED_FILE = 0x01

PREFIX_SIZE = PREFIX.size
BODY_HEADER_SIZE = BODY_HEADER.size
TRAILER_SIZE = TRAILER.size
FRAME_OVERHEAD = PREFIX_SIZE + BODY_HEADER_SIZE + TRAILER_SIZE

#: Largest payload one frame may carry. Bigger than any batch the engine accepts
#: (max.message.bytes tops out well below), small enough that a corrupt length is caught
#: by this bound as well as by its CRC.
FRAME_PAYLOAD_BYTES_MAX = 256 * 1024 * 1024


class Frame(NamedTuple):
    position: int  # byte position of the frame in its file
    size: int  # total bytes of the frame
    seq: int
    group_seq: int
    topic_id: bytes
    partition: int
    base_offset: int
    end_offset: int
    payload: memoryview
    flags: int = 0


def encode_frame(
    seq: int,
    group_seq: int,
    topic_id: bytes,
    partition: int,
    base_offset: int,
    end_offset: int,
    payload: BytesLike,
    flags: int = 0,
) -> list[BytesLike]:
    """The parts of one frame, ready for a vectored write (the payload is not copied)."""
    body_length = BODY_HEADER_SIZE + len(payload)
    length_bytes = body_length.to_bytes(4, "little")
    header = BODY_HEADER.pack(FRAME_APPEND, flags, 0, seq, group_seq, topic_id, partition, base_offset, end_offset)
    data_crc = crc32c.crc32c(payload, crc32c.crc32c(header))
    return [
        PREFIX.pack(body_length, crc32c.crc32c(length_bytes)),
        header,
        payload,
        TRAILER.pack(data_crc, body_length, MAGIC),
    ]


class FrameError(Exception):
    """A frame at `position` is not intact (torn, zeroed, or corrupt); `reason` says how."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(f"byte {position}: {reason}")
        self.position = position
        self.reason = reason


def decode_frame(buf: memoryview, pos: int) -> Frame | None:
    """Decode the frame at `pos`.

    Returns None at a clean end of data (fewer than a prefix left, or a zero length and CRC as in
    the untouched preallocated tail). Raises FrameError for anything else that is not a whole,
    valid frame.
    """
    end = len(buf)
    if pos + PREFIX_SIZE > end:
        return None
    body_length, length_crc = PREFIX.unpack_from(buf, pos)
    if body_length == 0 and length_crc == 0:
        return None
    if crc32c.crc32c(buf[pos : pos + 4]) != length_crc:
        raise FrameError(pos, "length CRC mismatch")
    if body_length < BODY_HEADER_SIZE or body_length - BODY_HEADER_SIZE > FRAME_PAYLOAD_BYTES_MAX:
        raise FrameError(pos, f"implausible body length {body_length}")
    body_start = pos + PREFIX_SIZE
    body_end = body_start + body_length
    frame_end = body_end + TRAILER_SIZE
    if frame_end > end:
        raise FrameError(pos, "frame runs past the end of the file")
    data_crc, length_again, magic = TRAILER.unpack_from(buf, body_end)
    if magic != MAGIC or length_again != body_length:
        raise FrameError(pos, "trailer magic missing (incomplete write)")
    if crc32c.crc32c(buf[body_start:body_end]) != data_crc:
        raise FrameError(pos, "data CRC mismatch")
    (frame_type, flags, _reserved, seq, group_seq, topic_id, partition, base_offset, end_offset) = (
        BODY_HEADER.unpack_from(buf, body_start)
    )
    if frame_type != FRAME_APPEND:
        raise FrameError(pos, f"unknown frame type {frame_type}")
    return Frame(
        pos,
        frame_end - pos,
        seq,
        group_seq,
        topic_id,
        partition,
        base_offset,
        end_offset,
        buf[body_start + BODY_HEADER_SIZE : body_end],
        flags,
    )


def find_valid_frame_after(buf: memoryview, pos: int) -> Frame | None:
    """The first intact frame that ends after `pos`, found by scanning for trailer magics.

    Used after a bad frame: an intact frame from a later group commit proves the bad one was
    durable once (corruption); frames of the same group were never acknowledged (torn write).
    """
    raw = buf.obj if isinstance(buf.obj, bytes) else bytes(buf)
    search = pos
    while True:
        hit = raw.find(MAGIC, search)
        if hit < 0:
            return None
        search = hit + 1
        trailer_start = hit - 8
        if trailer_start < pos:
            continue
        body_length = int.from_bytes(raw[trailer_start + 4 : trailer_start + 8], "little")
        start = trailer_start - body_length - PREFIX_SIZE
        if start < pos:
            continue
        try:
            frame = decode_frame(buf, start)
        except FrameError:
            continue
        if frame is not None:
            return frame
