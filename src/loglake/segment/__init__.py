"""Segment objects: the immutable, verifiable unit a partition's log is sealed into."""

from loglake.segment.format import (
    FORMAT_VERSION,
    HEADER_SIZE,
    TAIL_READ_BYTES,
    TRAILER_SIZE,
    ZERO_HASH,
    KafkaBatchHeader,
    SegmentTrailer,
    SegmentWriter,
    parse_tail,
    read_tail,
)
from loglake.segment.index import INDEX_ENTRY_SIZE, IndexEntry, SegmentIndex
from loglake.segment.verify import (
    describe_segment,
    verify_chain,
    verify_segment,
    verify_segment_in_store,
)
from loglake.store.base import parse_segment_key, partition_prefix, segment_key

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "INDEX_ENTRY_SIZE",
    "TAIL_READ_BYTES",
    "TRAILER_SIZE",
    "ZERO_HASH",
    "IndexEntry",
    "KafkaBatchHeader",
    "SegmentIndex",
    "SegmentTrailer",
    "SegmentWriter",
    "describe_segment",
    "parse_segment_key",
    "parse_tail",
    "partition_prefix",
    "read_tail",
    "segment_key",
    "verify_chain",
    "verify_segment",
    "verify_segment_in_store",
]
