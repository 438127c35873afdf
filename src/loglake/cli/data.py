"""`loglake produce` and `loglake consume`: lines in, records out."""

from __future__ import annotations

import contextlib
import enum
import io
import json
import os
import select
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Annotated, BinaryIO

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from loglake.cli.command_config import CommandConfigOption
from loglake.cli.common import (
    DEFAULT_DATA_DIR,
    CliError,
    DataDirOption,
    format_bytes,
    note,
    open_log,
    parse_header_pairs,
    plural,
    stderr_console,
    strip_newline,
)
from loglake.cli.interrupt import stop_signals
from loglake.cli.remote import BootstrapOption
from loglake.log import ConsumerRecord, Headers, StartSpec
from loglake.records.batch import BATCH_HEADER_SIZE

#: Input files above this size get a progress bar (when stderr is a terminal).
PROGRESS_MIN_BYTES = 1024 * 1024
#: Worst-case Kafka v2 per-record framing (length, attributes, deltas, key/value lengths, header count).
_RECORD_OVERHEAD = 40
_HEADER_OVERHEAD = 10
#: A batch is cut well below max.message.bytes (the estimate is close but not exact).
_BATCH_FILL = 0.9

ProduceRecord = tuple[bytes | None, bytes | None] | tuple[bytes | None, bytes | None, Headers]


# ---- produce ------------------------------------------------------------------------------------


def produce(
    topic: Annotated[str, typer.Argument(help="Topic to produce to (created with 1 partition if missing).")],
    file: Annotated[
        Path | None,
        typer.Option("--file", "-f", exists=True, dir_okay=False, readable=True, help="Read lines from this file."),
    ] = None,
    key_separator: Annotated[
        str | None, typer.Option("--key-separator", "-k", help="Split each line at the first SEP into key and value.")
    ] = None,
    partition: Annotated[int | None, typer.Option("--partition", "-p", min=0, help="Produce to this partition.")] = None,
    header: Annotated[list[str] | None, typer.Option("--header", "-H", help="Header k=v on every record (repeatable).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", min=1, help="Records per produce_batch call.")] = 10_000,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    bootstrap: BootstrapOption = None,
_command_config: CommandConfigOption = None,
) -> None:
    """Produce lines from stdin (or --file) as records, one record per line."""
    headers = parse_header_pairs(header)
    if key_separator == "":
        raise typer.BadParameter("must not be empty", param_hint="--key-separator")
    sep = key_separator.encode() if key_separator is not None else None
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if file is not None:
            src: BinaryIO = stack.enter_context(file.open("rb"))
            total = file.stat().st_size
        else:
            src = sys.stdin.buffer
            total = 0
        interactive = _isatty(src)
        if bootstrap:
            from loglake.cli import remote_data

            return remote_data.produce(bootstrap, topic, src, total, sep, partition, headers, interactive, file)
        # Ctrl-C / SIGTERM only ask the loop below to stop (cli/interrupt.py says why): the lines
        # read so far are produced and the data directory closes as at the end of the input.
        stop = stack.enter_context(stop_signals())
        log = stack.enter_context(open_log(str(data_dir), must_exist=False))
        if not log.engine.has_topic(topic):
            log.create_topic(topic, partitions=1)
            note(f"created topic {topic} (1 partition)")
        limit = max(4096, int(log.engine.topic(topic).config.max_message_bytes * _BATCH_FILL) - BATCH_HEADER_SIZE)
        progress: Progress | None = None
        task = None
        if file is not None and total > PROGRESS_MIN_BYTES and stderr_console().is_terminal:
            progress = stack.enter_context(
                Progress(
                    TextColumn("producing"),
                    BarColumn(),
                    DownloadColumn(),
                    TransferSpeedColumn(),
                    TimeRemainingColumn(),
                    console=stderr_console(),
                    transient=True,
                )
            )
            task = progress.add_task("produce", total=total)
        records_out = 0
        bytes_in = 0
        pending: list[ProduceRecord] = []
        pending_in = 0
        estimate = 0
        extra = sum(len(k) + len(v or b"") + _HEADER_OVERHEAD for k, v in headers)

        def send() -> None:
            nonlocal records_out, bytes_in, pending_in, estimate
            if pending:
                log.produce_batch(topic, pending, partition=partition)
                records_out += len(pending)
                pending.clear()
            bytes_in += pending_in
            if progress is not None and task is not None:
                progress.advance(task, pending_in)
            pending_in = 0
            estimate = 0

        lines = iter(src)
        lineno = 0
        while not stop():
            # waiting for input holds no engine lock: a signal may cut a blocked read short
            stop.raising = True
            try:
                raw = next(lines, None)
            except KeyboardInterrupt:
                raw = None
            finally:
                stop.raising = False
            if raw is None:
                break
            lineno += 1
            pending_in += len(raw)
            line = strip_newline(raw)
            key: bytes | None = None
            value: bytes = line
            if sep is not None:
                k, found, v = line.partition(sep)
                if not found:
                    send()
                    raise CliError(
                        f"line {lineno} has no key separator {key_separator!r} "
                        f"({plural(records_out, 'record')} before it were produced)"
                    )
                key, value = k, v
            size = len(value) + (len(key) if key is not None else 0) + _RECORD_OVERHEAD + extra
            if pending and (len(pending) >= batch_size or estimate + size > limit):
                send()
            pending.append((key, value, headers) if headers else (key, value))
            estimate += size
            if interactive:
                send()
        send()
    seconds = time.perf_counter() - started
    rate = records_out / seconds if seconds > 0 else 0.0
    stderr_console().print(
        f"produced {plural(records_out, 'record')} ({format_bytes(bytes_in)}) to {topic} in {seconds:.2f}s "
        f"({rate:,.0f} records/s)",
        markup=False,
    )


def _cannot_block(stream: BinaryIO, size: int) -> bool:
    """Whether writing `size` bytes to `stream` (flushed after each record) cannot block: at most
    PIPE_BUF bytes, and its descriptor is writable now (a pipe then has at least PIPE_BUF free)."""
    if size > select.PIPE_BUF:
        return False
    try:
        _, writable, _ = select.select([], [stream.fileno()], [], 0)
    except (OSError, ValueError, io.UnsupportedOperation):
        return False
    return bool(writable)


def _isatty(stream: BinaryIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# ---- consume ------------------------------------------------------------------------------------


class OutputFormat(enum.StrEnum):
    value = "value"
    json = "json"


class Isolation(enum.StrEnum):
    """Kafka's isolation.level."""

    read_uncommitted = "read_uncommitted"
    read_committed = "read_committed"


def parse_start(raw: str) -> StartSpec:
    """earliest | latest | an offset | an ISO-8601 time (naive times are local time)."""
    text = raw.strip()
    if text in ("earliest", "latest"):
        return text
    if text.isdigit():
        return int(text)
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(
            f"expected earliest, latest, an offset or an ISO-8601 time, got {raw!r}", param_hint="--from"
        ) from None


def _text(b: bytes | None) -> str | None:
    return None if b is None else b.decode("utf-8", errors="backslashreplace")


def format_json(rec: ConsumerRecord) -> bytes:
    obj = {
        "topic": rec.topic,
        "partition": rec.partition,
        "offset": rec.offset,
        "timestamp": rec.timestamp,
        "key": _text(rec.key),
        "value": _text(rec.value),
        "headers": [[k, _text(v)] for k, v in rec.headers],
    }
    return json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n"


def format_value(rec: ConsumerRecord, sep: bytes | None) -> bytes:
    value = rec.value if rec.value is not None else b"null"
    if sep is None:
        return value + b"\n"
    key = rec.key if rec.key is not None else b"null"
    return key + sep + value + b"\n"


def consume(
    topic: Annotated[str, typer.Argument(help="Topic to read.")],
    start: Annotated[
        str, typer.Option("--from", help="earliest, latest, an offset, or an ISO-8601 time.")
    ] = "earliest",
    partition: Annotated[
        list[int] | None, typer.Option("--partition", "-p", min=0, help="Only these partitions (repeatable).")
    ] = None,
    follow: Annotated[bool, typer.Option("--follow", "-F", help="Wait for new records until Ctrl-C.")] = False,
    max_records: Annotated[int | None, typer.Option("--max-records", "-n", min=0, help="Stop after N records.")] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", help="value: one value per line; json: one object per line.")] = OutputFormat.value,
    key_separator: Annotated[
        str | None, typer.Option("--key-separator", "-k", help="With --format value: print key SEP value.")
    ] = None,
    group: Annotated[
        str | None,
        typer.Option("--group", "-g", help="With --bootstrap-server: consume in this group, committing what is printed."),
    ] = None,
    isolation: Annotated[
        Isolation,
        typer.Option(
            "--isolation",
            "--isolation-level",
            help="read_committed: only committed transactions' records, up to the last stable offset.",
        ),
    ] = Isolation.read_uncommitted,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    bootstrap: BootstrapOption = None,
_command_config: CommandConfigOption = None,
) -> None:
    """Print the records of a topic (transaction markers never; with --isolation read_committed,
    no records of aborted or still-open transactions)."""
    spec = parse_start(start)
    sep = key_separator.encode() if key_separator is not None else None
    if group is not None:
        if not bootstrap:
            raise typer.BadParameter("needs --bootstrap-server (groups live in a running broker)", param_hint="--group")
        if partition:
            raise typer.BadParameter("the group assigns the partitions; drop --partition", param_hint="--group")
        if spec not in ("earliest", "latest"):
            raise typer.BadParameter(
                "with --group, --from is earliest or latest (for partitions without a committed offset); "
                "move a group with `loglake groups reset-offsets`",
                param_hint="--from",
            )
    out = sys.stdout.buffer
    # Ctrl-C / SIGTERM only ask the loops below to stop (cli/interrupt.py says why), from before
    # the data directory is opened until it is closed again.
    with stop_signals() as stop, contextlib.ExitStack() as stack:
        done: Callable[[ConsumerRecord], None] = _nothing
        if bootstrap:
            from loglake.cli import remote_data

            stop.raising = True  # connecting holds no engine lock: Ctrl-C may cut its wait short
            try:
                remote = stack.enter_context(
                    remote_data.records(bootstrap, topic, spec, partition, follow, group, isolation.value, stop=stop)
                )
            except KeyboardInterrupt:
                return
            finally:
                stop.raising = False
            source: Iterable[ConsumerRecord] = remote
            done = remote.done
        else:
            log = stack.enter_context(open_log(str(data_dir), must_exist=True))
            source = log.consume(
                topic, spec, follow=follow, partitions=partition or None, isolation=isolation.value, stop=stop
            )
        try:
            for rec, data in _records(source, max_records, fmt, sep, stop):
                # our own output holds no engine lock: a signal may interrupt a blocked write here.
                # A follow's record that cannot block (small, and the pipe has room) is written
                # without that: a signal arriving as its flush returns would otherwise skip
                # done(rec) for a record already printed, and a group would not commit it.
                stop.raising = not (follow and _cannot_block(out, len(data)))
                out.write(data)
                if follow:
                    out.flush()
                stop.raising = False
                done(rec)
            stop.raising = True
            out.flush()
        except KeyboardInterrupt:
            # raised only out of our own write, blocked on a pipe nobody reads: drop what it holds
            stop.raising = False
            _silence_stdout()
        except BrokenPipeError:
            _silence_stdout()
        finally:
            stop.raising = False


def _nothing(rec: ConsumerRecord) -> None:
    pass


def _records(
    records: Iterable[ConsumerRecord],
    max_records: int | None,
    fmt: OutputFormat,
    sep: bytes | None,
    stop: Callable[[], bool],
) -> Iterator[tuple[ConsumerRecord, bytes]]:
    if max_records == 0:
        return
    count = 0
    try:
        for rec in records:
            if stop():
                return
            yield rec, format_json(rec) if fmt is OutputFormat.json else format_value(rec, sep)
            count += 1
            if max_records is not None and count >= max_records:
                return
    finally:
        close = getattr(records, "close", None)  # a generator: stop it (and its waits) now
        if close is not None:
            close()


def _silence_stdout() -> None:
    """The reader went away (`| head`), or Ctrl-C broke a write it did not take: point stdout at
    /dev/null so neither the exit nor a flush complains or blocks."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
