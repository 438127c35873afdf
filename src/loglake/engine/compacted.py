"""Compacted topics take only records with a key (Kafka's LogValidator rule).

A topic whose cleanup.policy includes compact refuses a batch holding a record without a key:
the whole append fails with `MissingKeyError` (INVALID_RECORD) naming each keyless record by its
index in its batch, and nothing of it is appended. Only compacted topics pay for the check: their
batches are decoded (and decompressed) to read the keys, other topics' batches stay opaque.
Control batches are exempt. As in Kafka, when several batches are appended at once the first
batch holding keyless records is the one reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from loglake.errors import MissingKeyError
from loglake.records.batch import BatchHeader, Buffer
from loglake.records.rebuild import decode_plain

__all__ = ["check_batches", "check_keys"]


def check_batches(topic: str, partition: int, buf: Buffer, batches: Sequence[tuple[int, BatchHeader]]) -> None:
    """Raise MissingKeyError if a data batch of `buf` (already validated, CRC included) has a keyless record."""
    view = memoryview(buf)
    for pos, header in batches:
        if header.is_control:
            continue
        _h, records = decode_plain(view[pos : pos + header.size])  # the compiled decoder: on produce's path
        missing = [i for i, rec in enumerate(records) if rec.key is None]
        if missing:
            raise MissingKeyError(topic, partition, missing)


def check_keys(topic: str, partition: int | None, keys: Iterable[bytes | None]) -> None:
    """Raise MissingKeyError naming the positions of the None keys, if any."""
    missing = [i for i, key in enumerate(keys) if key is None]
    if missing:
        raise MissingKeyError(topic, partition, missing)
