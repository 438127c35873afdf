"""`loglake verify`: every segment's CRCs, index and hash chain, of a data directory (stopped or
held by a running broker) or of a cluster's bucket."""

from __future__ import annotations

import json
import os
from typing import Annotated, NoReturn

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

import loglake
from loglake.cli.common import (
    DATA_DIR_ENV,
    DEFAULT_DATA_DIR,
    CliError,
    DataDirOption,
    error_line,
    format_bytes,
    plural,
    stderr_console,
    stdout_console,
)
from loglake.engine.verify import VerifyReport, verify_data_dir, verify_source
from loglake.engine.verify_live import LiveSource
from loglake.errors import DataDirLockedError
from loglake.fs.os_fs import OsFileSystem
from loglake.store import accepted_store_urls, open_store


def verify(
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    cold_store: Annotated[
        str | None, typer.Option("--cold-store", help=f"Cold store URL ({accepted_store_urls()}): also walk the segments held there.")
    ] = None,
) -> None:
    """Check every segment's CRCs, index and hash chain; exit 1 naming the first bad one.

    On a stopped data directory it opens it as always (recovery first; an empty directory with
    --cold-store is restored from the bucket). On a running broker's directory it reads the
    metadata and sealed segments read-only, without the lock (segments the broker removes meanwhile
    are skipped), and says how many acknowledged records are still unsealed in the broker's WAL:
    those it does not check.
    """
    console = stderr_console()
    if cold_store and (cluster_report := _verify_cluster_bucket(cold_store)) is not None:
        _verify_exit(cluster_report, as_json)  # a cluster's bucket is proven from itself: no data dir
    if not os.path.isdir(data_dir):
        raise CliError(f"data directory {data_dir} does not exist (use --data-dir or {DATA_DIR_ENV})")
    with Progress(
        TextColumn("verifying"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=as_json or not console.is_terminal,
    ) as progress:
        task = progress.add_task("verify", total=None)
        unsealed = 0

        def on_progress(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        try:
            log = loglake.open(data_dir, cold_store=cold_store)
        except DataDirLockedError:
            log = None  # a running broker holds it: read its sealed data without the lock
        if log is not None:
            with log:
                report = verify_data_dir(log.engine, on_progress)
        else:
            cold = open_store(cold_store, OsFileSystem()) if cold_store else None
            try:
                source = LiveSource(data_dir, cold)
                report = verify_source(source, on_progress)
                unsealed = source.unsealed_records()
            finally:
                if cold is not None:
                    cold.close()
    if log is not None:
        _verify_exit(report, as_json)
    _verify_exit(
        report,
        as_json,
        {"unsealed_records_not_checked": unsealed},
        f"note: a running broker holds {data_dir}: verify checked its sealed segments; at least "
        f"{plural(unsealed, 'record')} it acknowledged are in its WAL, not sealed yet and not checked "
        "(stop the broker to verify everything: its shutdown seals them)",
    )


def _verify_cluster_bucket(cold_store: str) -> VerifyReport | None:
    """The report on a cluster-mode bucket (merged segments and flush ranges, from the metadata the
    cluster publishes there), or None when `cold_store` is not one."""
    from loglake.cluster.verify import is_cluster_bucket, verify_cluster_bucket

    store = open_store(cold_store, OsFileSystem())
    try:
        return verify_cluster_bucket(store) if is_cluster_bucket(store) else None
    finally:
        store.close()


def _verify_exit(
    report: VerifyReport, as_json: bool, extra: dict[str, object] | None = None, note: str | None = None
) -> NoReturn:
    """Print the report (with `extra` fields in JSON, `note` after the text) and exit 0 or 1."""
    if as_json:
        typer.echo(json.dumps({**report.to_json(), **(extra or {})}, indent=2))
    else:
        _print_verify(report)
        if note is not None:
            stderr_console().print(note, style="yellow", markup=False)
    raise typer.Exit(0 if report.ok else 1)


def _print_verify(report: VerifyReport) -> None:
    summary = (
        f"{plural(report.segments_checked, 'segment')}, {format_bytes(report.bytes_checked)} "
        f"({plural(report.bytes_checked, 'byte')}), {plural(report.partitions, 'partition')} in {report.seconds:.2f}s"
    )
    for key in report.unreferenced:
        stderr_console().print(f"note: segment object not referenced by the metadata: {key}", style="yellow", markup=False)
    first = report.first_error
    if first is None:
        stdout_console().print(f"verify ok: {summary}", style="green", markup=False)
        return
    error_line(f"verify FAILED: first bad segment {first.key} at byte {first.offset}: {first.detail}")
    for e in report.errors[1:]:
        stderr_console().print(f"  also: {e.key} at byte {e.offset}: {e.detail}", style="red", markup=False)
    stderr_console().print(
        f"checked {summary}: {plural(len(report.errors), 'error')} in {plural(len(report.bad_segments), 'segment')}", markup=False
    )
