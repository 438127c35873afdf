"""`loglake inspect SEGMENT_FILE`: one segment file, read directly (no data dir, no lock)."""

from __future__ import annotations

import builtins
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import crc32c
import typer
from rich.table import Table
from rich.text import Text

from loglake.cli.common import CliError, error_line, format_bytes, stdout_console
from loglake.errors import CorruptionError, LoglakeError, StorageError
from loglake.records.compression import codec_name
from loglake.segment.format import KAFKA_CRC_START, KAFKA_HEADER_SIZE, read_tail, unpack_kafka_header
from loglake.segment.verify import describe_segment, verify_segment_in_store
from loglake.store.base import BytesLike, ObjectNotFoundError, ObjectStore, parse_segment_key


class SingleFileStore(ObjectStore):
    """A read-only ObjectStore holding exactly one object: a file, under its own path as key.

    Lets the segment module's streaming readers (read_tail, verify_segment_in_store,
    describe_segment) work on any file without copying it into a store.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.url = "file://" + os.path.abspath(path)

    def _check(self, key: str) -> None:
        if key != self.path:
            raise ObjectNotFoundError(key, self.url)

    def put(self, key: str, parts: Sequence[BytesLike]) -> None:
        raise StorageError("put", key, "inspect opens segment files read-only")

    def delete(self, key: str) -> None:
        raise StorageError("delete", key, "inspect opens segment files read-only")

    def get(self, key: str) -> bytes:
        self._check(key)
        return self.get_range(key, 0, self._size())

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self._check(key)
        if start < 0 or length < 0:
            raise ValueError(f"invalid byte range start={start} length={length}")
        try:
            with open(self.path, "rb") as f:
                f.seek(start)
                return f.read(length)
        except OSError as exc:
            raise StorageError("read", self.path, exc) from exc

    def head(self, key: str) -> int | None:
        if key != self.path:
            return None
        return self._size()

    def _size(self) -> int:
        try:
            return os.path.getsize(self.path)
        except OSError as exc:
            raise StorageError("stat", self.path, exc) from exc

    def list(self, prefix: str) -> builtins.list[str]:
        return [self.path] if self.path.startswith(prefix) else []


def _batch_details(store: SingleFileStore, described: dict[str, Any]) -> None:
    """Add codec and a CRC check to each batch of `described` (one batch in memory at a time)."""
    for batch in described["batches"]:
        data = store.get_range(store.path, batch["position"], batch["length"])
        if len(data) < KAFKA_HEADER_SIZE:
            batch.update(codec="?", crc_ok=False, crc="?")
            continue
        h = unpack_kafka_header(data)
        batch["codec"] = codec_name(h.compression)
        batch["crc"] = f"{h.crc:#010x}"
        batch["crc_ok"] = len(data) == batch["length"] and crc32c.crc32c(data[KAFKA_CRC_START:]) == h.crc
        batch["transactional"] = h.is_transactional
        batch["control"] = h.is_control


def inspect(
    segment_file: Annotated[Path, typer.Argument(help="Path of a segment file (…/<partition>/<offset>.seg).")],
    batches: Annotated[bool, typer.Option("--batches/--no-batches", help="List every batch.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Header, trailer, index summary and batch list of one segment file; verifies it fully."""
    path = str(segment_file)
    if not segment_file.is_file():
        raise CliError(f"{path}: no such file")
    store = SingleFileStore(path)
    try:
        read_tail(store, path)  # tail unreadable: nothing to describe
        described = describe_segment(store, path, max_batches=None if batches else 0)
    except CorruptionError as exc:
        raise CliError(f"{path} is not a readable segment: byte {exc.offset}: {exc.detail}") from None
    if batches:
        _batch_details(store, described)
    problem: CorruptionError | None = None
    try:
        verify_segment_in_store(store, path)
    except CorruptionError as exc:
        problem = exc
    except LoglakeError as exc:
        raise CliError(f"{path}: {exc}") from None
    described["file"] = path
    described["verified"] = problem is None
    described["problem"] = None if problem is None else {"offset": problem.offset, "detail": problem.detail}
    with_key = _key_info(path)
    if with_key is not None:
        described["segment_key"] = with_key
    if as_json:
        typer.echo(json.dumps(described, indent=2))
    else:
        _print(described, batches)
    if problem is not None:
        error_line(f"{path} is corrupt at byte {problem.offset}: {problem.detail}")
        raise typer.Exit(1)


def _key_info(path: str) -> dict[str, Any] | None:
    parts = Path(path).resolve().parts
    try:
        parsed = parse_segment_key("/".join(parts[-4:]))
    except LoglakeError:
        return None
    return {
        "topic": parsed.topic,
        "topic_id": parsed.topic_id,
        "partition": parsed.partition,
        "base_offset": parsed.base_offset,
    }


def _print(d: dict[str, Any], batches: bool) -> None:
    console = stdout_console()
    where = ""
    if "segment_key" in d:
        k = d["segment_key"]
        where = f"  topic {k['topic']} partition {k['partition']}"
    console.print(f"segment {d['file']}  ({format_bytes(d['size'])}, {d['size']} bytes){where}", markup=False)
    h, t, ix = d["header"], d["trailer"], d["index"]
    summary = Table(show_header=False, title="header / trailer", title_justify="left")
    summary.add_column("field")
    summary.add_column("value")
    rows = [
        ("magic / version", f"{h['magic']} / {h['version']}"),
        ("header crc", h["header_crc"]),
        ("offsets", f"{t['base_offset']} .. {t['last_offset']}"),
        ("records", str(t["record_count"])),
        ("max timestamp", str(t["max_timestamp"])),
        ("created ms", str(t["created_ms"])),
        ("data crc", t["data_crc"]),
        ("trailer crc", t["trailer_crc"]),
        ("prev hash", t["prev_hash"]),
        ("chain hash", t["chain_hash"]),
        (
            "index",
            f"{ix['entries']} batches, offsets {ix['first_offset']}..{ix['last_offset']}, "
            f"data {ix['data_bytes']} bytes, index {ix['index_bytes']} bytes at {t['index_position']}",
        ),
        ("verified", "ok" if d["verified"] else f"CORRUPT at byte {d['problem']['offset']}: {d['problem']['detail']}"),
    ]
    for name, value in rows:
        summary.add_row(Text(name), Text(value))
    console.print(summary)
    if not batches:
        return
    table = Table(title="batches", title_justify="left")
    for col, justify in (
        ("offsets", "left"),
        ("position", "right"),
        ("length", "right"),
        ("records", "right"),
        ("max timestamp", "right"),
        ("codec", "left"),
        ("crc", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for b in d["batches"]:
        flags = " control" if b.get("control") else ""
        table.add_row(
            f"{b['base_offset']}..{b['last_offset']}",
            str(b["position"]),
            str(b["length"]),
            str(b["record_count"]),
            str(b["max_timestamp"]),
            f"{b.get('codec', '?')}{flags}",
            f"{b.get('crc', '?')} {'ok' if b.get('crc_ok') else 'BAD'}",
            style=None if b.get("crc_ok") else "red",
        )
    console.print(table)
