"""Topics landed as Apache Iceberg tables, exactly once, through pyiceberg (`loglake[spark]`).

`loglake pipeline export --format iceberg` runs micro-batches of three steps:

1. The driver reads where the table is: the newest snapshot on the main branch that carries
   `loglake.offsets` (topic -> partition -> next offset to land) is the only resume point, so
   there is no checkpoint directory to lose or to get out of step with the table.
2. A Spark batch read of exactly [those offsets, the end now sealed) runs on the executors, and
   each task writes its rows as Iceberg data files (pyiceberg's writer: field ids, day
   partitions, column statistics) into the table's location and hands the DataFile entries
   back to the driver.
3. The driver commits every file of the batch in one append snapshot whose summary carries the
   new offsets. Before each commit attempt it re-reads the table: if another writer has moved
   the offsets of a partition this batch read, the batch is dropped (its files deleted) and the
   next batch starts from the table again; otherwise the commit is tried on the new head.

A crash before step 3 leaves data files that no snapshot names (orphans: no reader sees them)
and the table's offsets unchanged, so the next run reads the same range again; a crash after
it finds the new offsets. Either way every (partition, offset) is in the table once.

pyiceberg's own commit retry re-applies an append blindly on a conflict, which would land a
batch twice when two exports race; the tables made here set `commit.retry.num-retries=0` and
this module retries instead, with the offsets checked each time.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loglake.errors import LoglakeError
from loglake.spark.model import TopicPartition
from loglake.spark.options import TYPED_OPTIONS, parse_bool, parse_read_options
from loglake.spark.pipeline import spark_error
from loglake.spark.plan import (
    from_offset_dict,
    rate_limit,
    select_partitions,
    to_offset_dict,
)

if TYPE_CHECKING:
    from loglake.spark.source import Typed

log = logging.getLogger("loglake.spark.iceberg")

#: The catalog name export and compact-table open the catalog under, unless told otherwise
#: (`--catalog-name`). A SQL catalog keeps it in every row it writes (iceberg_tables.catalog_name),
#: so a reader must open the catalog under the same name to see the tables: Spark's
#: `spark.sql.catalog.<name>`, pyiceberg's `SqlCatalog(name, ...)`.
CATALOG_NAME = "loglake"
#: Snapshot summary key: JSON {topic: {partition: next offset}} of everything the table holds.
OFFSETS_PROP = "loglake.offsets"
#: Snapshot summary key: JSON {"store": segment store URL, "topic": topic} the offsets are of.
SOURCE_PROP = "loglake.source"
#: Commit attempts of one micro-batch that loses the optimistic race to other writers'
#: commits which did not touch its offsets (e.g. compact-table); past it the export fails.
COMMIT_ATTEMPTS = 10
#: Most records one micro-batch reads (spread over the partitions like maxOffsetsPerTrigger):
#: bounds the DataFile list the driver holds and the work a crash throws away.
MAX_BATCH_RECORDS = 5_000_000
#: Micro-batch rounds one export runs at most (one without --continuous stops as soon as it
#: has caught up with the end it saw when it started).
MAX_BATCHES = 10_000
#: Table properties of the tables export creates (and sets on tables it did not create).
TABLE_PROPERTIES = {"commit.retry.num-retries": "0"}
#: Name of the day partition field (Iceberg's day transform of `timestamp`).
DAY_FIELD = "timestamp_day"
#: Test hook, and only that: when set, the driver writes the names of the batch's data files
#: to the file it names and then sleeps (at most PAUSE_MAX_S) right before committing, so a
#: test can kill -9 the export between "files written" and "snapshot committed".
PAUSE_ENV = "LOGLAKE_TEST_ICEBERG_PAUSE_BEFORE_COMMIT"
PAUSE_MAX_S = 600.0
#: compact-table: a day partition's files are rewritten in groups of at most this many bytes
#: (read into memory, written as one file).
COMPACT_GROUP_BYTES = 256 * 1024 * 1024
#: compact-table: files at least this big are left alone.
COMPACT_SMALL_FILE_BYTES = 64 * 1024 * 1024
#: compact-table attempts when another commit lands between its plan and its commit.
COMPACT_ATTEMPTS = 5


class IcebergExportError(LoglakeError):
    """The table cannot take this export (another source's offsets, a lost commit race, ...)."""


# ---- catalog -----------------------------------------------------------------------------------


def catalog_properties(uri: str, warehouse: str | None, options: Mapping[str, str]) -> dict[str, str]:
    """pyiceberg catalog properties for `--catalog-uri` (sqlite:/// = SQL catalog, http(s) = REST)
    and the warehouse, with the command's s3.* options turned into pyiceberg's S3 FileIO ones."""
    low = {k.lower(): v for k, v in options.items()}
    if uri.startswith("sqlite:"):
        props = {"type": "sql", "uri": uri}
    elif uri.startswith(("http://", "https://")):
        props = {"type": "rest", "uri": uri}
    else:
        raise IcebergExportError(
            f"--catalog-uri must be sqlite:///FILE or an http(s) REST catalog URL, not {uri!r}"
        )
    if warehouse:
        if "://" not in warehouse:
            warehouse = os.path.abspath(warehouse)
            os.makedirs(warehouse, exist_ok=True)
        props["warehouse"] = warehouse
    if "s3.endpoint_url" in low:
        props["s3.endpoint"] = low["s3.endpoint_url"]
    if "s3.region" in low:
        props["s3.region"] = low["s3.region"]
    if low.get("s3.path_style", "").lower() in ("1", "true", "yes"):
        props["s3.force-virtual-addressing"] = "false"
    return props


def open_catalog(
    uri: str, warehouse: str | None, options: Mapping[str, str], name: str = CATALOG_NAME
) -> Any:
    """The pyiceberg catalog at `uri`, opened under the catalog name `name`."""
    from pyiceberg.catalog import load_catalog

    if not name.strip():
        raise IcebergExportError("the catalog name must not be empty")
    return load_catalog(name, **catalog_properties(uri, warehouse, options))


def split_name(name: str) -> tuple[str, str]:
    ns, _, table = name.rpartition(".")
    if not ns or not table:
        raise IcebergExportError(f"--table must be NAMESPACE.NAME, not {name!r}")
    return ns, table


def _utc_micros(t: Any) -> Any:
    """`t` with every zoned timestamp in it (nested ones too) as UTC microseconds."""
    import pyarrow as pa

    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC") if t.tz is not None else pa.timestamp("us")
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_utc_micros(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_utc_micros(t.key_type)), t.item_field.with_type(_utc_micros(t.item_type)))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(t.value_field.with_type(_utc_micros(t.value_type)))
    return t


def iceberg_arrow_schema(spark_schema: Any) -> Any:
    """The Arrow schema of the table for a Spark schema: timestamps as UTC microseconds."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(spark_schema, timezone="UTC")
    return pa.schema([f.with_type(_utc_micros(f.type)) for f in schema])


def load_or_create_table(catalog: Any, name: str, arrow_schema: Any) -> Any:
    """The table `name`, created partitioned by day(timestamp) if missing; columns of
    `arrow_schema` it lacks are added (they read null in older rows)."""
    from pyiceberg.exceptions import NoSuchTableError, ValidationError
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import assign_fresh_schema_ids
    from pyiceberg.transforms import DayTransform

    ns, _ = split_name(name)
    try:
        table = catalog.load_table(name)
    except NoSuchTableError:
        catalog.create_namespace_if_not_exists(ns)
        schema = assign_fresh_schema_ids(catalog._convert_schema_if_needed(arrow_schema))
        spec = PartitionSpec(
            PartitionField(
                source_id=schema.find_field("timestamp").field_id,
                field_id=1000,
                transform=DayTransform(),
                name=DAY_FIELD,
            )
        )
        table = catalog.create_table_if_not_exists(
            name, schema=schema, partition_spec=spec, properties=TABLE_PROPERTIES
        )
    if any(table.properties.get(k) != v for k, v in TABLE_PROPERTIES.items()):
        with table.transaction() as tx:
            tx.set_properties(TABLE_PROPERTIES)
    have = {f.name: str(f.field_type) for f in table.schema().fields}
    want = {f.name: str(f.field_type) for f in catalog._convert_schema_if_needed(arrow_schema).fields}
    changed = [n for n, t in want.items() if have.get(n) != t]
    if changed:
        log.info("iceberg: adding or widening columns %s of %s", ", ".join(changed), name)
        try:
            with table.update_schema() as upd:
                upd.union_by_name(arrow_schema)
        except (ValidationError, ValueError) as exc:
            raise IcebergExportError(
                f"table {name} cannot take the columns {', '.join(changed)} as given ({exc})"
            ) from None
        table.refresh()
    return table


# ---- offsets in snapshot summaries ---------------------------------------------------------------


def committed_offsets(table: Any) -> tuple[dict[TopicPartition, int], dict[str, str] | None]:
    """(offsets, source) of the newest snapshot in the main branch's history that has them."""
    snap = table.current_snapshot()
    while snap is not None:
        raw = snap.summary[OFFSETS_PROP]
        if raw:
            source = snap.summary[SOURCE_PROP]
            return from_offset_dict(json.loads(raw)), (json.loads(source) if source else None)
        snap = table.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id else None
    return {}, None


def offsets_summary(offsets: Mapping[TopicPartition, int], source: Mapping[str, str]) -> dict[str, str]:
    return {
        OFFSETS_PROP: json.dumps(to_offset_dict(offsets), sort_keys=True),
        SOURCE_PROP: json.dumps(dict(source), sort_keys=True),
    }


def options_of_table(options: Mapping[str, str]) -> dict[str, str]:
    """`options` with lower-cased names; the ones the export sets itself (from the table) are
    refused."""
    lower = {k.lower(): v for k, v in options.items()}
    for k in ("subscribe", "startingoffsets", "endingoffsets", "subscribepattern", "assign"):
        if k in lower:
            raise IcebergExportError(f"option {k} is set by the Iceberg export itself (from the table)")
    return lower


def landed_offsets(catalog: Any, name: str, store_url: str, topic: str) -> dict[TopicPartition, int] | None:
    """The offsets table `name` holds of `topic` in the store at `store_url` (what an export
    into it resumes from), read with pyiceberg alone; None when the table does not exist yet.
    A table holding another store's or topic's offsets is refused, as the export refuses it."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        table = catalog.load_table(name)
    except (NoSuchTableError, NoSuchNamespaceError):
        return None
    offsets, table_source = committed_offsets(table)
    _check_source(table_source, {"store": store_url, "topic": topic}, name)
    return offsets


def _check_source(table_source: Mapping[str, str] | None, source: Mapping[str, str], name: str) -> None:
    if table_source is not None and dict(table_source) != dict(source):
        raise IcebergExportError(
            f"table {name} holds offsets of {json.dumps(dict(table_source))}, not of "
            f"{json.dumps(dict(source))}: export into another table"
        )


# ---- executors: Arrow batches -> Iceberg data files -------------------------------------------


def _file_writer(metadata_json: str, io_props: dict[str, str]) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The mapInArrow function: a task's rows become data files of the table (one per day it
    spans); it yields the pickled DataFile entries for the driver to commit."""

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyiceberg.io import load_file_io
        from pyiceberg.io.pyarrow import _dataframe_to_data_files
        from pyiceberg.table.metadata import TableMetadataUtil

        got = [b for b in batches if b.num_rows]
        if not got:
            return
        data = pa.Table.from_batches(got)
        ts = data.schema.get_field_index("timestamp")
        data = data.set_column(ts, "timestamp", data.column(ts).cast(pa.timestamp("us", tz="UTC")))
        metadata = TableMetadataUtil.parse_raw(metadata_json)
        io = load_file_io(io_props, metadata.location)
        blobs = [
            pickle.dumps(f) for f in _dataframe_to_data_files(metadata, data, io, write_uuid=uuid.uuid4())
        ]
        yield pa.RecordBatch.from_pydict({"file": blobs}, schema=pa.schema([("file", pa.binary())]))

    return write


# ---- typed exports: the registry's columns, and the dead-letter table ----------------------------


#: `--value-format registry` / `--key-format registry`: keys or values in Confluent's wire format,
#: read with the format their subject's latest version has (loglake.spark.typed).
REGISTRY_FORMAT = "registry"
#: The dead-letter table of a typed export: `<table>` + this, in the same namespace.
DLQ_SUFFIX = "_dlq"
#: The dead-letter table's column saying why a record could not be decoded.
REASON_COLUMN = "reason"


def dlq_name(table_name: str) -> str:
    return table_name + DLQ_SUFFIX


@dataclass(frozen=True)
class TypedLayout:
    """How a typed read's columns land: the table's columns in order, each (name, source column,
    field of the value struct or None); the dead-letter table's the same way."""

    table: tuple[tuple[str, str, str | None], ...]
    dlq: tuple[tuple[str, str, str | None], ...]

    def spark_schemas(self, typed: Any) -> tuple[Any, Any]:
        """(table, dead-letter table) Spark schemas for the typed read's schema `typed`."""
        from pyspark.sql.types import StringType, StructField, StructType

        by_name = {f.name: f for f in typed.fields}
        typed_value = any(sub is not None for _, _, sub in self.table)
        value_fields = {f.name: f for f in by_name["value"].dataType.fields} if typed_value else {}

        def field(name: str, col: str, sub: str | None) -> Any:
            if col == REASON_COLUMN:
                return StructField(name, StringType())
            src = value_fields[sub] if sub is not None else by_name[col]
            return StructField(name, src.dataType, True)

        return (
            StructType([field(*c) for c in self.table]),
            StructType([field(*c) for c in self.dlq]),
        )


def typed_layout(typed_schema: Any) -> TypedLayout:
    """The table and dead-letter layouts of a typed read's schema: the source's columns with
    a typed `value` replaced by its fields (one that shares a source column's name is
    `value_<name>`), the schema id columns; the dead-letter table has the bytes as received
    and the reason."""
    from loglake.spark.typed import DECODE_ERROR, SCHEMA_ID_COLUMNS, UNDECODED_COLUMNS

    names = [f.name for f in typed_schema.fields]
    extra = {DECODE_ERROR, *UNDECODED_COLUMNS.values()}
    source_cols = [n for n in names if n not in extra and n not in SCHEMA_ID_COLUMNS.values()]
    value = next(f for f in typed_schema.fields if f.name == "value")
    value_typed = SCHEMA_ID_COLUMNS["value"] in names
    table: list[tuple[str, str, str | None]] = [
        (n, n, None) for n in source_cols if not (value_typed and n == "value")
    ]
    table += [(n, n, None) for n in SCHEMA_ID_COLUMNS.values() if n in names]
    if value_typed:
        taken = {t[0] for t in table}
        for f in value.dataType.fields:
            name = f.name if f.name not in taken else f"value_{f.name}"
            if name in taken:
                raise IcebergExportError(f"the value field {f.name} has no column name left (value_{f.name} is taken)")
            taken.add(name)
            table.append((name, "value", f.name))
    dlq: list[tuple[str, str, str | None]] = []
    for n in source_cols:
        dlq.append((n, UNDECODED_COLUMNS.get(n, n), None))
    dlq.append((REASON_COLUMN, REASON_COLUMN, None))
    return TypedLayout(tuple(table), tuple(dlq))


def _project(data: Any, layout: tuple[tuple[str, str, str | None], ...], schema: Any) -> Any:
    """The columns of `layout` from a typed read's Arrow table, cast to `schema`."""
    import pyarrow as pa

    from loglake.spark.typed import DECODE_ERROR

    cols = []
    struct_children: dict[str, dict[str, Any]] = {}
    for _name, col, sub in layout:
        if col == REASON_COLUMN:
            arr = data.column(DECODE_ERROR)
        elif sub is not None:
            if col not in struct_children:
                parent = data.column(col).combine_chunks()
                struct_children[col] = {
                    parent.type.field(i).name: child for i, child in enumerate(parent.flatten())
                }
            arr = struct_children[col][sub]
        else:
            arr = data.column(col)
        cols.append(arr)
    return pa.Table.from_arrays(cols, schema=pa.schema([f for f in schema])) if cols else None


def _typed_file_writer(
    table_json: str,
    dlq_json: str,
    io_props: dict[str, str],
    layout: TypedLayout,
    table_schema: Any,
    dlq_schema: Any,
    dlq_from: dict[TopicPartition, int],
    typed: Typed,
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The mapInArrow function of a typed export: a task's rows (the source's, undecoded) are
    decoded with `typed` here, in the one pass that writes them, so Spark moves only the
    source's columns; the decoded rows become data files of the table, the undecodable ones
    (at or past the dead-letter table's offsets `dlq_from`) files of the dead-letter table; it
    yields (which table, pickled DataFile) rows."""

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyiceberg.io import load_file_io
        from pyiceberg.io.pyarrow import _dataframe_to_data_files
        from pyiceberg.table.metadata import TableMetadataUtil

        from loglake.spark.typed import DECODE_ERROR

        got = [typed.decode(b) for b in batches if b.num_rows]
        if not got:
            return
        data = pa.Table.from_batches(got)
        failed = pc.is_valid(data.column(DECODE_ERROR))
        if data.column(DECODE_ERROR).null_count == data.num_rows:  # nothing failed: no copies
            good, bad = data, data.slice(0, 0)
        else:
            good, bad = data.filter(pc.invert(failed)), data.filter(failed)
        out: list[tuple[str, bytes]] = []
        parts = [
            ("table", table_json, good, layout.table, table_schema),
            ("dlq", dlq_json, bad, layout.dlq, dlq_schema),
        ]
        for which, meta_json, rows, cols, schema in parts:
            if which == "dlq" and rows.num_rows and dlq_from:
                # a run that landed these in the dead-letter table and died before the table's
                # commit: keep only what the dead-letter table does not hold yet
                keep = [
                    off >= dlq_from.get((t, p), 0)
                    for t, p, off in zip(
                        rows.column("topic").to_pylist(),
                        rows.column("partition").to_pylist(),
                        rows.column("offset").to_pylist(),
                        strict=True,
                    )
                ]
                rows = rows.filter(pa.array(keep))
            if not rows.num_rows:
                continue
            projected = _project(rows, cols, schema)
            metadata = TableMetadataUtil.parse_raw(meta_json)
            io = load_file_io(io_props, metadata.location)
            for f in _dataframe_to_data_files(metadata, projected, io, write_uuid=uuid.uuid4()):
                out.append((which, pickle.dumps(f)))
        if out:
            yield pa.RecordBatch.from_pydict(
                {"table": [w for w, _ in out], "file": [b for _, b in out]},
                schema=pa.schema([("table", pa.string()), ("file", pa.binary())]),
            )

    return write


def registry_options(registry_url: str | None, topic: str, value_format: str | None, key_format: str | None) -> dict[str, str]:
    """The source options of a typed export: each `registry` format becomes the format its
    subject's latest version has (Avro, JSON Schema, Protobuf)."""
    from loglake.spark.typed import FORMAT_OF, RegistryClient, TypedColumnsError, subject_of

    if registry_url is None:
        raise IcebergExportError("--value-format/--key-format registry needs --registry-url (the schema registry's URL)")
    client = RegistryClient(registry_url)
    out = {"schemaRegistryUrl": registry_url}
    for field, fmt, option in (("value", value_format, "valueFormat"), ("key", key_format, "keyFormat")):
        if fmt != REGISTRY_FORMAT:
            continue
        try:
            latest = client.latest(subject_of(topic, field))
        except TypedColumnsError as exc:
            raise IcebergExportError(str(exc)) from None
        out[option] = FORMAT_OF[latest.schema_type].value
    return out


# ---- the export ----------------------------------------------------------------------------------


@dataclass
class IcebergBatch:
    batch: int
    rows: int
    files: int
    seconds: float
    snapshot_id: int | None
    #: typed exports: records of the batch landed in the dead-letter table
    dead_letters: int = 0


@dataclass
class IcebergExportResult:
    batches: int
    rows: int
    seconds: float
    snapshot_id: int | None
    dead_letters: int = 0


def _pause_before_commit(files: list[str]) -> None:
    marker = os.environ.get(PAUSE_ENV)
    if not marker:
        return
    with open(marker, "w") as f:
        json.dump(files, f)
    log.warning("iceberg: %s is set: pausing before the commit (test hook)", PAUSE_ENV)
    deadline = time.monotonic() + PAUSE_MAX_S
    while time.monotonic() < deadline:
        time.sleep(0.2)


def _commit(
    table: Any,
    files: list[Any],
    before: Mapping[TopicPartition, int],
    new: Mapping[TopicPartition, int],
    source: Mapping[str, str],
    name: str,
) -> int | None:
    """Commit `files` as one append whose summary moves the offsets to `new`. None when another
    writer moved the offsets this batch read (nothing is committed, the files are deleted)."""
    from pyiceberg.exceptions import CommitFailedException

    for attempt in range(COMMIT_ATTEMPTS):
        table.refresh()
        now, table_source = committed_offsets(table)
        _check_source(table_source, source, name)
        if any(now.get(tp) != before.get(tp) for tp in new):
            log.warning(
                "iceberg: another writer landed offsets of this batch in %s; dropping its %d files",
                name,
                len(files),
            )
            for f in files:
                try:
                    table.io.delete(f.file_path)
                except OSError:
                    pass  # an orphan no snapshot names: harmless
            return None
        merged = {**now, **new}
        tx = table.transaction()
        with tx.update_snapshot(snapshot_properties=offsets_summary(merged, source)).fast_append() as app:
            for f in files:
                app.append_data_file(f)
        try:
            tx.commit_transaction()
        except CommitFailedException as exc:
            log.info(
                "iceberg: commit attempt %d on %s lost a race (%s); re-checking offsets",
                attempt + 1,
                name,
                exc,
            )
            continue
        snap = table.current_snapshot()
        return int(snap.snapshot_id) if snap is not None else None
    raise IcebergExportError(
        f"could not commit to {name} in {COMMIT_ATTEMPTS} attempts (other writers kept winning)"
    )


def export_iceberg(
    spark: Any,
    path: str,
    topic: str,
    *,
    catalog_uri: str,
    table_name: str,
    warehouse: str | None,
    catalog_name: str = CATALOG_NAME,
    value_schema: Any = None,
    value_format: str | None = None,
    continuous: float | None = None,
    source_options: dict[str, str] | None = None,
    on_batch: Callable[[IcebergBatch], None] | None = None,
    max_batch_records: int = MAX_BATCH_RECORDS,
    key_format: str | None = None,
    registry_url: str | None = None,
) -> IcebergExportResult:
    """Land `topic` in the Iceberg table `table_name`, resuming from the table's own offsets.

    Without `continuous` it runs until it has caught up with the end sealed when it started (with
    kafka.bootstrap.servers in `source_options`: the broker's end, the tail read through it);
    with it, a micro-batch every `continuous` seconds until interrupted.

    `value_format`/`key_format` "registry": values (keys) in Confluent's wire format are decoded
    with the registry at `registry_url` into typed columns (the value's fields become columns,
    and new fields of a newer subject version new columns); records that cannot be decoded
    land in the dead-letter table `<table_name>_dlq` with the reason. Its snapshots carry
    offsets too; it is committed before the table, and a batch redone after a crash between
    the two adds to it only the records past its offsets."""
    from pyspark.sql import functions as F

    from loglake.spark.broker import metadata
    from loglake.spark.pipeline import export_options, infer_json_schema, with_value_columns
    from loglake.spark.source import register, source_schema

    register(spark)
    options = export_options(source_options)
    typed = REGISTRY_FORMAT in (value_format, key_format)
    if typed:
        options.update(registry_options(registry_url, topic, value_format, key_format))
        value_format = None if value_format == REGISTRY_FORMAT else value_format
    elif key_format is not None:
        raise IcebergExportError(f"--key-format must be registry, not {key_format!r}")
    include_headers = parse_bool("includeHeaders", options_of_table(options).get("includeheaders", "false"))
    read_opts = parse_read_options({"path": path, "subscribe": topic, **options}, "batch")
    source = {"store": read_opts.store_url, "topic": topic}
    if value_format == "json" and value_schema is None:
        value_schema = infer_json_schema(spark, path, topic, options)
    catalog = open_catalog(catalog_uri, warehouse, options, catalog_name)

    dlq = None
    if typed:
        _, planned = _typed_read(options, topic, include_headers)
        typed_table, typed_dlq = typed_layout(planned).spark_schemas(planned)
        table = load_or_create_table(catalog, table_name, iceberg_arrow_schema(typed_table))
        dlq = load_or_create_table(catalog, dlq_name(table_name), iceberg_arrow_schema(typed_dlq))
    else:
        base_schema = source_schema(include_headers)
        empty = with_value_columns(spark.createDataFrame([], base_schema), value_schema)
        table = load_or_create_table(catalog, table_name, iceberg_arrow_schema(empty.schema))
    started = time.monotonic()
    target: dict[TopicPartition, int] | None = None
    rows = batches = dead_letters = 0
    snapshot_id: int | None = None
    try:
        for _ in range(MAX_BATCHES):
            t0 = time.monotonic()
            table.refresh()
            before, table_source = committed_offsets(table)
            _check_source(table_source, source, table_name)
            # with kafka.bootstrap.servers: the broker's end, the tail read through it (hybrid reads)
            meta = metadata(read_opts)
            parts = select_partitions(read_opts, meta)
            latest = {pm.tp: pm.end for pm in parts}
            if target is None and not continuous:
                target = dict(latest)  # AvailableNow: what is there now, then stop
            if target is not None:
                latest = {tp: min(off, target.get(tp, off)) for tp, off in latest.items()}
            starts = {pm.tp: before.get(pm.tp, pm.log_start) for pm in parts}
            ends = rate_limit(starts, latest, max_batch_records)
            todo = {tp: e for tp, e in ends.items() if e > starts[tp]}
            if not todo:
                if not continuous:
                    break
                time.sleep(continuous)
                continue
            # a typed export reads the records undecoded: its writer decodes them (one pass)
            df = _load(
                spark,
                path,
                topic,
                {
                    **(options if dlq is None else {k: v for k, v in options.items() if k.lower() not in TYPED_OPTIONS}),
                    "startingOffsets": json.dumps(to_offset_dict({tp: starts[tp] for tp in todo})),
                    "endingOffsets": json.dumps(to_offset_dict(todo)),
                },
            )
            dlq_files: list[Any] = []
            if dlq is not None:
                typed_read, planned = _typed_read(options, topic, include_headers)  # the latest versions now
                layout = typed_layout(planned)
                typed_table, typed_dlq = layout.spark_schemas(planned)
                table_arrow = iceberg_arrow_schema(typed_table)
                table = load_or_create_table(catalog, table_name, table_arrow)
                dlq = load_or_create_table(catalog, dlq_name(table_name), iceberg_arrow_schema(typed_dlq))
                dlq_before, dlq_source = committed_offsets(dlq)
                _check_source(dlq_source, source, dlq_name(table_name))
                typed_writer = _typed_file_writer(
                    table.metadata.model_dump_json(),
                    dlq.metadata.model_dump_json(),
                    dict(table.io.properties),
                    layout,
                    table_arrow,
                    iceberg_arrow_schema(typed_dlq),
                    {tp: off for tp, off in dlq_before.items() if off > starts.get(tp, 0)},
                    typed_read,
                )
                out = df.mapInArrow(typed_writer, "table string, file binary")
                try:
                    landed = [(r[0], pickle.loads(r[1])) for r in out.collect()]
                except Exception as exc:  # Spark's errors (Py4J, Python worker) carry whole traces
                    raise IcebergExportError(f"export batch failed: {spark_error(exc)}") from None
                files = [f for w, f in landed if w == "table"]
                dlq_files = [f for w, f in landed if w == "dlq"]
            else:
                df = with_value_columns(df, value_schema)
                table = load_or_create_table(catalog, table_name, iceberg_arrow_schema(df.schema))
                writer = _file_writer(table.metadata.model_dump_json(), dict(table.io.properties))
                out = df.select(*[F.col(c) for c in df.columns]).mapInArrow(writer, "file binary")
                try:
                    files = [pickle.loads(r[0]) for r in out.collect()]
                except Exception as exc:  # Spark's errors (Py4J, Python worker) carry whole traces
                    raise IcebergExportError(f"export batch failed: {spark_error(exc)}") from None
            n = sum(int(f.record_count) for f in files)
            _pause_before_commit([f.file_path for f in files + dlq_files])
            if dlq_files:
                # the dead-letter table first: a crash before the table's commit redoes the batch,
                # and the redo adds to it only what is past the offsets committed here
                assert dlq is not None
                new_dlq = {tp: max(off, dlq_before.get(tp, 0)) for tp, off in todo.items()}
                if _commit(dlq, dlq_files, dlq_before, new_dlq, source, dlq_name(table_name)) is None:
                    for f in files:
                        try:
                            table.io.delete(f.file_path)
                        except OSError:
                            pass  # an orphan no snapshot names: harmless
                    continue
            committed = _commit(table, files, before, todo, source, table_name)
            if committed is None:
                continue
            snapshot_id = committed
            rows += n
            dead = sum(int(f.record_count) for f in dlq_files)
            dead_letters += dead
            if on_batch is not None:
                on_batch(IcebergBatch(batches, n, len(files), time.monotonic() - t0, snapshot_id, dead))
            batches += 1
            if continuous:
                time.sleep(continuous)
    except KeyboardInterrupt:
        pass
    return IcebergExportResult(batches, rows, time.monotonic() - started, snapshot_id, dead_letters)


def _typed_read(options: Mapping[str, str], topic: str, include_headers: bool) -> tuple[Typed, Any]:
    """(the typed columns the source would read with `options` (registry_options), each
    subject's latest version now; the Spark schema of that read)."""
    from loglake.spark.options import LoglakeOptionError, parse_typed_options
    from loglake.spark.source import Typed, reader_specs, typed_schema

    try:
        specs = reader_specs(parse_typed_options({"subscribe": topic, **options}))
    except LoglakeOptionError as exc:  # a reader schema Spark columns cannot take
        raise IcebergExportError(str(exc)) from None
    schema = typed_schema(include_headers, specs)
    return Typed(specs, schema), schema


def _load(spark: Any, path: str, topic: str, options: Mapping[str, str]) -> Any:
    reader = spark.read.format("loglake").option("path", path).option("subscribe", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


# ---- compact-table -------------------------------------------------------------------------------


@dataclass
class CompactResult:
    partitions: int
    files_before: int
    files_after: int
    snapshot_id: int | None


def _compaction_plan(table: Any, small_file_bytes: int) -> list[list[Any]]:
    """Groups of small live files to rewrite, each from one day partition (and one partition
    spec), each at most COMPACT_GROUP_BYTES; a group of one file is left alone."""
    by_partition: dict[tuple[int, Any], list[Any]] = {}
    for task in table.scan().plan_files():
        f = task.file
        if f.file_size_in_bytes < small_file_bytes and not task.delete_files:
            by_partition.setdefault((f.spec_id, f.partition), []).append(task)
    groups: list[list[Any]] = []
    for _, tasks in sorted(by_partition.items(), key=lambda kv: repr(kv[0])):
        group: list[Any] = []
        size = 0
        for task in sorted(tasks, key=lambda t: t.file.file_path):
            if group and size + task.file.file_size_in_bytes > COMPACT_GROUP_BYTES:
                groups.append(group)
                group, size = [], 0
            group.append(task)
            size += task.file.file_size_in_bytes
        groups.append(group)
    return [g for g in groups if len(g) > 1]


def compact_table(
    catalog: Any, name: str, *, small_file_bytes: int = COMPACT_SMALL_FILE_BYTES
) -> CompactResult:
    """Rewrite each day partition's small files into one, as one snapshot that removes the old
    files and adds the new ones (rows unchanged). The snapshot carries the table's export
    offsets forward, so an export resumes from it like from an append.

    pyiceberg writes that snapshot with the `overwrite` operation (it cannot write `replace`);
    like any commit it is optimistic: if another commit lands between plan and commit, the
    rewritten files are deleted and the whole compaction is planned again."""
    from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files

    for attempt in range(COMPACT_ATTEMPTS):
        try:
            table = catalog.load_table(name)
        except NoSuchTableError:
            raise IcebergExportError(f"no table {name} in the catalog") from None
        groups = _compaction_plan(table, small_file_bytes)
        if not groups:
            return CompactResult(0, 0, 0, None)
        offsets, source = committed_offsets(table)
        props = offsets_summary(offsets, source) if source is not None else {}
        props["loglake.compacted-files"] = str(sum(len(g) for g in groups))
        new_files: list[Any] = []
        for group in groups:
            scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
            data = scan.to_table(group)
            new_files.extend(
                _dataframe_to_data_files(table.metadata, data, table.io, write_uuid=uuid.uuid4())
            )
        tx = table.transaction()
        with tx.update_snapshot(snapshot_properties=props).overwrite() as rewrite:
            for group in groups:
                for task in group:
                    rewrite.delete_data_file(task.file)
            for f in new_files:
                rewrite.append_data_file(f)
        try:
            tx.commit_transaction()
        except CommitFailedException as exc:
            log.info(
                "iceberg: compaction attempt %d of %s lost a race (%s); planning again",
                attempt + 1,
                name,
                exc,
            )
            for f in new_files:
                try:
                    table.io.delete(f.file_path)
                except OSError:
                    pass  # an orphan no snapshot names: harmless
            continue
        snap = table.current_snapshot()
        return CompactResult(
            len(groups),
            sum(len(g) for g in groups),
            len(new_files),
            int(snap.snapshot_id) if snap is not None else None,
        )
    raise IcebergExportError(f"could not commit the compaction of {name} in {COMPACT_ATTEMPTS} attempts")
