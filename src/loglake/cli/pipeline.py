"""`loglake pipeline export|verify`: Spark jobs over a loglake segment store.

pyspark is imported only when a command runs (`pip install loglake[spark]`), so the rest of
the CLI works without it.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from loglake.cli.common import CliError, error_line, parse_pairs, stderr_console, stdout_console

app = typer.Typer(
    name="pipeline",
    help="Spark pipelines over loglake segments: export a topic to Parquet, verify every segment.",
    no_args_is_help=True,
)

PathOption = Annotated[
    str, typer.Option("--path", help="A loglake data directory or segment store URL (s3://...).")
]
MasterOption = Annotated[
    str, typer.Option("--master", help="Spark master: local[*] (default), spark://host:7077, ...")
]
OptionOption = Annotated[
    list[str] | None,
    typer.Option(
        "--option",
        "-o",
        help="Extra source option key=value (e.g. s3.endpoint_url=..., failOnDataLoss=false).",
    ),
]
ConfOption = Annotated[list[str] | None, typer.Option("--conf", help="Spark configuration key=value.")]


def _spark(master: str, app_name: str, conf: list[str] | None) -> Any:
    try:
        from loglake.spark.pipeline import spark_session
    except ImportError as exc:
        raise CliError(f"pipelines need pyspark: pip install 'loglake[spark]' ({exc})") from None
    return spark_session(master, app_name, parse_pairs(conf, "--conf"))


@app.command("export")
def export(
    path: PathOption,
    topic: Annotated[str, typer.Option("--topic", help="Topic to export.")],
    to: Annotated[str, typer.Option("--to", help="Output directory or URL of the table.")],
    fmt: Annotated[str, typer.Option("--format", help="Output format (Spark file sink).")] = "parquet",
    value_schema: Annotated[
        str | None,
        typer.Option(
            "--value-schema", help="DDL of JSON values, e.g. 'user string, n int': parsed into columns."
        ),
    ] = None,
    value_format: Annotated[
        str | None,
        typer.Option("--value-format", help="json: parse values as JSON (schema inferred from a sample)."),
    ] = None,
    continuous: Annotated[
        float | None,
        typer.Option("--continuous", min=0.1, help="Run a micro-batch every N seconds until Ctrl-C."),
    ] = None,
    checkpoint: Annotated[
        str | None, typer.Option("--checkpoint", help="Checkpoint directory (default: <to>/_checkpoint).")
    ] = None,
    isolation: Annotated[
        str,
        typer.Option(
            "--isolation",
            help="read_committed (default): committed transactions only; read_uncommitted: every record.",
        ),
    ] = "read_committed",
    master: MasterOption = "local[*]",
    option: OptionOption = None,
    conf: ConfOption = None,
) -> None:
    """Export a topic to a table partitioned by date and partition, exactly once (checkpointed)."""
    if value_schema and value_format:
        raise typer.BadParameter("give --value-schema or --value-format, not both")
    if isolation not in ("read_committed", "read_uncommitted"):
        raise typer.BadParameter(f"--isolation must be read_committed or read_uncommitted, not {isolation!r}")
    source_options = parse_pairs(option, "--option")
    if not any(k.lower() == "kafka.isolation.level" for k in source_options):
        source_options["kafka.isolation.level"] = isolation
    spark = _spark(master, f"loglake-export-{topic}", conf)
    from loglake.spark.pipeline import export_query, watch

    out = stdout_console()
    try:
        query = export_query(
            spark,
            path,
            topic,
            to,
            fmt=fmt,
            checkpoint=checkpoint,
            value_schema=value_schema,
            value_format=value_format,
            continuous=continuous,
            source_options=source_options,
        )

        def progress(p: dict[str, Any]) -> None:
            rate = p.get("processedRowsPerSecond") or 0.0
            out.print(
                f"batch {p['batchId']}: {p.get('numInputRows', 0)} rows ({rate:,.0f} rows/s)",
                markup=False,
            )

        result = watch(query, progress)
    finally:
        spark.stop()
    out.print(
        f"export done: {result.rows} rows in {result.batches} micro-batches, {result.seconds:.1f}s -> {to}",
        markup=False,
    )


@app.command("verify")
def verify(
    path: PathOption,
    cold_path: Annotated[
        str | None, typer.Option("--cold-path", help="Store URL of the cold tier, if any.")
    ] = None,
    master: MasterOption = "local[*]",
    option: OptionOption = None,
    conf: ConfOption = None,
) -> None:
    """Check every segment's CRCs and hash chain on the executors; exit 1 naming the first bad one."""
    spark = _spark(master, "loglake-verify", conf)
    from loglake.spark.pipeline import verify_store

    try:
        outcome = verify_store(
            spark, path, cold_path, {k.lower(): v for k, v in parse_pairs(option, "--option").items()}
        )
    finally:
        spark.stop()
    summary = f"{outcome.segments} segments in {outcome.partitions} partitions, {outcome.seconds:.1f}s"
    if outcome.ok:
        stdout_console().print(f"verify ok: {summary}", style="green", markup=False)
        return
    key, problem = outcome.errors[0]
    error_line(f"verify FAILED: first bad segment {key}: {problem}")
    for k, p in outcome.errors[1:]:
        stderr_console().print(f"  also: {k}: {p}", style="red", markup=False)
    raise typer.Exit(1)
