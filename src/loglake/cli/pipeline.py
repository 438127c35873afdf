"""`loglake pipeline export|verify|compact-table`: Spark jobs over a loglake segment store, and
the small-file compaction of the Iceberg tables export lands.

pyspark is imported only when a command runs (the spark extra: loglake.extras), so the rest of
the CLI works without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer

from loglake.cli.common import CliError, error_line, note, parse_pairs, stderr_console, stdout_console
from loglake.extras import missing_extra
from loglake.spark.iceberg import CATALOG_NAME, DLQ_SUFFIX, REGISTRY_FORMAT, dlq_name
from loglake.spark.options import LoglakeOptionError
from loglake.spark.plan import NoLoglakeDataError

app = typer.Typer(
    name="pipeline",
    help="Spark pipelines over loglake segments: export a topic to Parquet or an Iceberg table, "
    "verify every segment, compact an exported Iceberg table.",
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
CatalogNameOption = Annotated[
    str,
    typer.Option(
        "--catalog-name",
        help="Name the Iceberg catalog is opened under: a SQL catalog files its tables under it, so "
        "readers must use the same (spark.sql.catalog.<name>, pyiceberg's SqlCatalog(name, ...)).",
    ),
]


@contextmanager
def _explained() -> Iterator[None]:
    """A bad source option or `--path` as one error line (and a hint), not a traceback."""
    try:
        yield
    except NoLoglakeDataError as exc:
        error_line(exc.message)
        note(f"hint: {exc.hint}")
        raise typer.Exit(1) from None
    except LoglakeOptionError as exc:
        raise CliError(str(exc)) from None


def _spark(master: str, app_name: str, conf: list[str] | None) -> Any:
    try:
        from loglake.spark.pipeline import spark_session
    except ImportError as exc:
        missing = missing_extra(exc, "loglake pipeline")
        raise (missing or CliError(f"pipelines cannot load pyspark: {exc}")) from None
    return spark_session(master, app_name, parse_pairs(conf, "--conf"))


@app.command("export")
def export(
    path: PathOption,
    topic: Annotated[str, typer.Option("--topic", help="Topic to export.")],
    to: Annotated[
        str,
        typer.Option("--to", help="Output directory or URL (parquet); the warehouse (iceberg)."),
    ],
    fmt: Annotated[
        str, typer.Option("--format", help="parquet (Spark file sink, default) or iceberg (a table).")
    ] = "parquet",
    catalog_uri: Annotated[
        str | None,
        typer.Option("--catalog-uri", help="Iceberg catalog: sqlite:///FILE (SQL catalog) or a REST URL."),
    ] = None,
    table: Annotated[
        str | None, typer.Option("--table", help="Iceberg table NAMESPACE.NAME (created if missing).")
    ] = None,
    value_schema: Annotated[
        str | None,
        typer.Option(
            "--value-schema", help="DDL of JSON values, e.g. 'user string, n int': parsed into columns."
        ),
    ] = None,
    value_format: Annotated[
        str | None,
        typer.Option(
            "--value-format",
            help="json: parse values as JSON (schema inferred from a sample); registry (iceberg): decode "
            f"Confluent's wire format with --registry-url into typed columns, undecodable records to <table>{DLQ_SUFFIX}.",
        ),
    ] = None,
    key_format: Annotated[
        str | None,
        typer.Option("--key-format", help="registry (iceberg): decode keys with --registry-url into a typed key column."),
    ] = None,
    registry_url: Annotated[
        str | None,
        typer.Option(
            "--registry-url",
            help="The schema registry of --value-format/--key-format registry: http(s)://HOST:PORT (a broker's "
            "--schema-registry-listen address).",
        ),
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
    catalog_name: CatalogNameOption = CATALOG_NAME,
    master: MasterOption = "local[*]",
    option: OptionOption = None,
    conf: ConfOption = None,
) -> None:
    """Export a topic exactly once: to Parquet partitioned by date and partition (checkpointed),
    or to an Iceberg table partitioned by day(timestamp) whose snapshots record the offsets."""
    if value_schema and value_format:
        raise typer.BadParameter("give --value-schema or --value-format, not both")
    if value_format not in (None, "json", "binary", REGISTRY_FORMAT):
        raise typer.BadParameter(f"--value-format must be json, binary or {REGISTRY_FORMAT}, not {value_format!r}")
    if key_format not in (None, REGISTRY_FORMAT):
        raise typer.BadParameter(f"--key-format must be {REGISTRY_FORMAT}, not {key_format!r}")
    typed = REGISTRY_FORMAT in (value_format, key_format)
    if typed and fmt != "iceberg":
        raise typer.BadParameter(f"--value-format/--key-format {REGISTRY_FORMAT} are for --format iceberg")
    if typed and not registry_url:
        raise typer.BadParameter(f"--value-format/--key-format {REGISTRY_FORMAT} need --registry-url")
    if registry_url and not typed:
        raise typer.BadParameter(f"--registry-url is for --value-format/--key-format {REGISTRY_FORMAT}")
    if fmt == "iceberg":
        if not catalog_uri or not table:
            raise typer.BadParameter("--format iceberg needs --catalog-uri and --table")
        if checkpoint:
            raise typer.BadParameter("--format iceberg keeps its offsets in the table: no --checkpoint")
        from loglake.spark.iceberg import catalog_properties, split_name

        split_name(table)  # bad names fail here, before Spark starts
        catalog_properties(catalog_uri, None, {})
    elif catalog_uri or table or catalog_name != CATALOG_NAME:
        raise typer.BadParameter("--catalog-uri, --table and --catalog-name are for --format iceberg")
    if isolation not in ("read_committed", "read_uncommitted"):
        raise typer.BadParameter(f"--isolation must be read_committed or read_uncommitted, not {isolation!r}")
    source_options = parse_pairs(option, "--option")
    if not any(k.lower() == "kafka.isolation.level" for k in source_options):
        source_options["kafka.isolation.level"] = isolation
    # Everything that can be told without Spark is, before a JVM starts (~30 s): bad options, a
    # path with no loglake data, and whether there is anything new to land at all.
    with _explained():
        done = _nothing_to_land(
            path, topic, to, fmt, checkpoint, catalog_uri, table, catalog_name, source_options, continuous
        )
    if done is not None:
        stdout_console().print(done, markup=False)
        return
    spark = _spark(master, f"loglake-export-{topic}", conf)
    if fmt == "iceberg":
        assert catalog_uri and table
        _export_iceberg(
            spark,
            path,
            topic,
            to,
            catalog_uri,
            table,
            catalog_name,
            value_schema,
            value_format,
            continuous,
            source_options,
            key_format,
            registry_url,
        )
        return
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


def _nothing_to_land(
    path: str,
    topic: str,
    to: str,
    fmt: str,
    checkpoint: str | None,
    catalog_uri: str | None,
    table: str | None,
    catalog_name: str,
    source_options: dict[str, str],
    continuous: float | None,
) -> str | None:
    """The line to print when a one-off export has nothing new to land (the table or checkpoint
    already holds every offset up to the log's end), or None: start Spark. Checks the options and
    the path on the way (LoglakeOptionError, NoLoglakeDataError)."""
    from loglake.spark.iceberg import IcebergExportError, landed_offsets, open_catalog, options_of_table
    from loglake.spark.pipeline import checkpoint_offsets, export_source, to_land

    if fmt == "iceberg":
        options_of_table(source_options)
    source = export_source(path, topic, source_options, "batch" if fmt == "iceberg" else "stream")
    if continuous:
        return None
    if topic not in source.meta.topics:
        have = ", ".join(sorted(source.meta.topics)) or "none"
        return f"export: nothing to land: topic {topic!r} is not in {path} (its topics: {have})"
    landed: dict[tuple[str, int], int] | None
    if fmt == "iceberg":
        assert catalog_uri and table
        try:
            landed = landed_offsets(
                open_catalog(catalog_uri, to, source_options, catalog_name),
                table,
                source.opts.store_url,
                topic,
            )
        except IcebergExportError:
            raise
        except Exception:  # the catalog cannot be read now: the export itself says so
            return None
        dest = table
    else:
        landed = checkpoint_offsets(checkpoint or to.rstrip("/") + "/_checkpoint")
        dest = to
    if landed is None or to_land(source.parts, landed):
        return None
    ends = ", ".join(f"{pm.partition}={pm.end}" for pm in source.parts[:8])
    ends += ", ..." if len(source.parts) > 8 else ""
    unsealed = (
        ""
        if source.opts.hybrid
        else "; unsealed records are read only with -o kafka.bootstrap.servers=HOST:PORT"
    )
    return (
        f"export: nothing new to land: {dest} already holds {topic} up to the log's end "
        f"(next offset by partition: {ends}){unsealed}; Spark not started"
    )


def _export_iceberg(
    spark: Any,
    path: str,
    topic: str,
    warehouse: str,
    catalog_uri: str,
    table: str,
    catalog_name: str,
    value_schema: str | None,
    value_format: str | None,
    continuous: float | None,
    source_options: dict[str, str],
    key_format: str | None,
    registry_url: str | None,
) -> None:
    from loglake.spark.iceberg import IcebergBatch, export_iceberg

    out = stdout_console()

    def progress(b: IcebergBatch) -> None:
        rate = b.rows / b.seconds if b.seconds > 0 else 0.0
        dead = f", {b.dead_letters} to the dead-letter table" if b.dead_letters else ""
        out.print(
            f"batch {b.batch}: {b.rows} rows in {b.files} files ({rate:,.0f} rows/s){dead}, snapshot {b.snapshot_id}",
            markup=False,
        )

    try:
        result = export_iceberg(
            spark,
            path,
            topic,
            catalog_uri=catalog_uri,
            table_name=table,
            warehouse=warehouse,
            catalog_name=catalog_name,
            value_schema=value_schema,
            value_format=value_format,
            continuous=continuous,
            source_options=source_options,
            on_batch=progress,
            key_format=key_format,
            registry_url=registry_url,
        )
    finally:
        spark.stop()
    dead = f" ({result.dead_letters} undecodable to {dlq_name(table)})" if result.dead_letters else ""
    out.print(
        f"export done: {result.rows} rows in {result.batches} micro-batches, {result.seconds:.1f}s -> {table}{dead}",
        markup=False,
    )


@app.command("compact-table")
def compact_table(
    catalog_uri: Annotated[
        str, typer.Option("--catalog-uri", help="Iceberg catalog: sqlite:///FILE or a REST URL.")
    ],
    table: Annotated[str, typer.Option("--table", help="Iceberg table NAMESPACE.NAME.")],
    catalog_name: CatalogNameOption = CATALOG_NAME,
    option: OptionOption = None,
) -> None:
    """Rewrite each day partition's small files of an Iceberg table into one, in one snapshot."""
    try:
        from loglake.spark.iceberg import compact_table as compact
        from loglake.spark.iceberg import open_catalog
    except ImportError as exc:
        missing = missing_extra(exc, "loglake pipeline compact-table")
        raise (missing or CliError(f"compact-table cannot load pyiceberg: {exc}")) from None
    catalog = open_catalog(catalog_uri, None, parse_pairs(option, "--option"), catalog_name)
    result = compact(catalog, table)
    if not result.partitions:
        stdout_console().print(f"compact-table: nothing to compact in {table}", markup=False)
        return
    stdout_console().print(
        f"compact-table: {result.files_before} files in {result.partitions} partitions -> "
        f"{result.files_after} files, snapshot {result.snapshot_id}",
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
    """Check every segment's CRCs and hash chain on the executors (a cluster's bucket: its flush
    ranges not merged yet too); exit 1 naming the first bad one."""
    from loglake.spark.options import store_url_from
    from loglake.spark.plan import cached_store, load_metadata

    extra = {k.lower(): v for k, v in parse_pairs(option, "--option").items()}
    with _explained():  # a path with no loglake data: said before Spark starts
        load_metadata(cached_store(store_url_from({"path": path, **extra})), path=path)
    spark = _spark(master, "loglake-verify", conf)
    from loglake.spark.pipeline import verify_store

    try:
        outcome = verify_store(spark, path, cold_path, extra)
    finally:
        spark.stop()
    ranges = f" and {outcome.ranges} flush ranges" if outcome.ranges else ""  # a cluster's bucket
    summary = f"{outcome.segments} segments{ranges} in {outcome.partitions} partitions, {outcome.seconds:.1f}s"
    if outcome.ok:
        stdout_console().print(f"verify ok: {summary}", style="green", markup=False)
        return
    key, problem = outcome.errors[0]
    error_line(f"verify FAILED: first bad segment {key}: {problem}")
    for k, p in outcome.errors[1:]:
        stderr_console().print(f"  also: {k}: {p}", style="red", markup=False)
    raise typer.Exit(1)
