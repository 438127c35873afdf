"""The `loglake` command line: topics, produce, consume, groups, configs, verify, inspect, demo.

topics, produce and consume work on a stopped data directory or, with --bootstrap-server, through
a running broker; groups and configs always talk to a broker.

Every operating error (a LoglakeError: unknown topic, bad config, locked or corrupt data
directory) and every CliError ends the command with one red line on stderr and exit code 1;
usage errors exit 2 (typer's default). `main()` is the console-script entry point.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Annotated, Any, NoReturn

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from typer.core import TyperGroup

import loglake
from loglake.cli import configs, data, groups, inspect, interrupt, pipeline, serve, topics, users
from loglake.cli.common import (
    DATA_DIR_ENV,
    DEFAULT_DATA_DIR,
    CliError,
    DataDirOption,
    error_line,
    format_bytes,
    open_log,
    plural,
    report_error,
    stderr_console,
    stdout_console,
)
from loglake.cli.early import GLOBAL_OPTIONS
from loglake.engine.verify import VerifyReport, verify_data_dir, verify_source
from loglake.engine.verify_live import LiveSource
from loglake.errors import DataDirLockedError, LoglakeError
from loglake.extras import missing_extra
from loglake.fs.os_fs import OsFileSystem
from loglake.store import accepted_store_urls, open_store

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class LoglakeGroup(TyperGroup):
    """Turns operating errors into one red line and exit code 1, for every subcommand."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (LoglakeError, CliError) as exc:
            report_error(exc)
            raise typer.Exit(1) from None
        except ModuleNotFoundError as exc:  # an optional dependency a command needs: name its extra
            missing = missing_extra(exc, f"loglake {ctx.invoked_subcommand or ''}".strip())
            if missing is None:
                raise
            report_error(missing)
            raise typer.Exit(1) from None


app = typer.Typer(
    name="loglake",
    cls=LoglakeGroup,
    help="loglake: a Kafka-compatible, durable, append-only event log.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # click's own help layout: rich's table cut long words (env var names) with "…" at 80
    # columns and gave every flag a "<bool>" metavar
    rich_markup_mode=None,
)
app.add_typer(topics.app, name="topics")
app.command("produce")(data.produce)
app.command("consume")(data.consume)
app.command("inspect")(inspect.inspect)
app.command("serve")(serve.serve)
app.add_typer(pipeline.app, name="pipeline")
app.add_typer(groups.app, name="groups")
app.add_typer(configs.app, name="configs")
app.add_typer(users.app, name="users")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"loglake {loglake.__version__}")
        raise typer.Exit()


@app.callback()
def _global(
    log_level: Annotated[
        str, typer.Option("--log-level", help=f"Logging level on stderr: {', '.join(LOG_LEVELS)}.")
    ] = "WARNING",
    log_format: Annotated[
        str, typer.Option("--log-format", help="text, or json (one JSON object per line, for log shippers).")
    ] = "text",
    version: Annotated[
        bool, typer.Option("--version", is_eager=True, callback=_version, help="Print the version and exit.")
    ] = False,
) -> None:
    level = log_level.upper()
    if level not in LOG_LEVELS:
        raise typer.BadParameter(f"must be one of {', '.join(LOG_LEVELS)}", param_hint="--log-level")
    if log_format not in ("text", "json"):
        raise typer.BadParameter("must be text or json", param_hint="--log-format")
    configure_logging(getattr(logging, level), json_lines=log_format == "json")


class _StderrHandler(logging.Handler):
    """Writes to whatever sys.stderr is at the time of the record (tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:
            self.handleError(record)


class JsonLineFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg (and exc when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def configure_logging(level: int, *, json_lines: bool = False) -> None:
    """Log to stderr at `level`; replaces only the handler an earlier call installed."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _StderrHandler):
            root.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(log_formatter(json_lines=json_lines))
    root.addHandler(handler)
    root.setLevel(level)


def log_formatter(*, json_lines: bool = False) -> logging.Formatter:
    """How every command logs a record: UTC time, level, logger, message (or one JSON object per
    line). The tests' in-process brokers write their log files with it too (tests/brokerkit.py)."""
    formatter: logging.Formatter = (
        JsonLineFormatter() if json_lines else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    formatter.converter = time.gmtime
    return formatter


# ---- verify ------------------------------------------------------------------------------------


@app.command("verify")
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


# ---- demo --------------------------------------------------------------------------------------

DEMO_TOPIC = "demo"
DEMO_PARTITIONS = 3
DEMO_CHUNK = 2_000
#: The demo's own data directory: never the broker's (`loglake serve`, `make run`) by default.
DEMO_DATA_DIR = "./loglake-demo"


@app.command("demo")
def demo(
    records: Annotated[int, typer.Option("--records", "-n", min=1, help="Records to produce with produce_batch.")] = 10_000,
    data_dir: Annotated[
        str, typer.Option("--data-dir", "-d", help="Data directory of the demo (not LOGLAKE_DATA_DIR's).")
    ] = DEMO_DATA_DIR,
) -> None:
    """Produce and consume a few thousand records on topic 'demo' of an embedded log in its own
    directory (./loglake-demo: no broker, and not `make run`'s data); re-runnable."""
    started = time.perf_counter()
    console = stdout_console()
    with open_log(data_dir, must_exist=False) as log:
        recovery = log.recovery_report
        if not log.engine.has_topic(DEMO_TOPIC):
            log.create_topic(DEMO_TOPIC, partitions=DEMO_PARTITIONS)
            console.print(f"created topic {DEMO_TOPIC} ({plural(DEMO_PARTITIONS, 'partition')})", markup=False)
        before = {p.partition: p.high_watermark for p in log.describe_topic(DEMO_TOPIC).partitions}
        run = int(time.time())
        produced: dict[int, int] = {}
        t0 = time.perf_counter()
        for start in range(0, records, DEMO_CHUNK):
            batch: list[tuple[bytes | None, bytes | None]] = [
                (f"user-{i % 97}".encode(), f'{{"run": {run}, "seq": {i}, "event": "click"}}'.encode())
                for i in range(start, min(records, start + DEMO_CHUNK))
            ]
            for md in log.produce_batch(DEMO_TOPIC, batch):
                produced[md.partition] = produced.get(md.partition, 0) + 1
        for i in range(3):
            md1 = log.produce(
                DEMO_TOPIC, f"hello {i} from run {run}".encode(), key=b"greeting", headers=[("source", b"loglake demo")]
            )
            produced[md1.partition] = produced.get(md1.partition, 0) + 1
        produce_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        consumed: dict[int, list[int]] = {}
        for rec in log.consume(DEMO_TOPIC, start=before):
            consumed.setdefault(rec.partition, []).append(rec.offset)
        consume_s = time.perf_counter() - t0
        total_produced = sum(produced.values())
        total_consumed = sum(len(v) for v in consumed.values())
        table = Table(title=f"topic {DEMO_TOPIC}: this run", title_justify="left")
        for col in ("partition", "produced", "consumed", "offsets", "log start", "high watermark"):
            table.add_column(col, justify="right")
        for p in log.describe_topic(DEMO_TOPIC).partitions:
            offsets = consumed.get(p.partition, [])
            table.add_row(
                str(p.partition),
                str(produced.get(p.partition, 0)),
                str(len(offsets)),
                f"{offsets[0]}..{offsets[-1]}" if offsets else "-",
                str(p.log_start_offset),
                str(p.high_watermark),
            )
        console.print(table)
        console.print(
            f"produced {plural(total_produced, 'record')} in {produce_s:.2f}s, consumed {total_consumed} in {consume_s:.2f}s",
            markup=False,
        )
        if recovery is not None:
            console.print(f"open: {recovery.summary()}", markup=False)
        log.flush()
    if total_consumed != total_produced:
        raise CliError(f"demo consumed {plural(total_consumed, 'record')} but produced {total_produced}")
    console.print(f"demo done in {time.perf_counter() - started:.2f}s (data in {data_dir})", markup=False)



def hoist_global_options(argv: list[str]) -> list[str]:
    """Move the group's own options in front of the subcommand, where click expects them."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        name = arg.split("=", 1)[0]
        if name in GLOBAL_OPTIONS:
            if "=" in arg or not GLOBAL_OPTIONS[name]:
                front.append(arg)
                i += 1
                continue
            front.extend(argv[i : i + 2])
            i += 2
            continue
        rest.append(arg)
        i += 1
    return front + rest


def main() -> None:
    """Console-script entry point."""
    try:
        app(args=hoist_global_options(sys.argv[1:]), prog_name="loglake")
    except SystemExit as exc:  # click ends every run with one
        code = 0 if exc.code is None else exc.code
        if isinstance(code, int) and interrupt.signalled():  # Ctrl-C / SIGTERM; all is closed now
            interrupt.exit_now(code)
        raise


if __name__ == "__main__":
    main()
