"""The `loglake` Python data source: batch and streaming reads of sealed segments (and, given
kafka.bootstrap.servers, of the live tail through the broker), writes through a running broker.
See docs/SPARK.md."""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from loglake.spark.broker import metadata
from loglake.spark.model import Slice, TopicPartition
from loglake.spark.options import (
    LoglakeOptionError,
    ReadOptions,
    TypedOptions,
    WriteOptions,
    parse_bool,
    parse_read_options,
    parse_typed_options,
    parse_write_options,
)
from loglake.spark.plan import (
    BrokerRange,
    DataLossError,
    Metadata,
    OffsetDict,
    cached_store,
    check_range,
    from_offset_dict,
    ranges_for,
    rate_limit,
    resolve_offset,
    select_partitions,
    split_slices,
    to_offset_dict,
)
from loglake.spark.typed import DECODE_ERROR, SCHEMA_ID_COLUMNS, UNDECODED_COLUMNS, ReaderSpec
from loglake.store import ObjectNotFoundError

log = logging.getLogger("loglake.spark")

try:  # Spark >= 4.2: admission control (ReadLimit) and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    HAS_READ_LIMITS = True
    _AvailableNowBase: Any = SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - Spark 4.0/4.1
    HAS_READ_LIMITS = False
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[misc,assignment]

    class _AvailableNowBase:  # type: ignore[no-redef]
        pass


def source_schema(include_headers: bool) -> StructType:
    """Spark's Kafka source schema (plus `headers` with includeHeaders=true)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


def typed_schema(include_headers: bool, specs: Sequence[ReaderSpec]) -> StructType:
    """The source's schema with the typed columns of `specs`: `key`/`value` the reader schema's
    struct, then `key_schema_id`/`value_schema_id`, `decode_error`, `undecoded_key`,
    `undecoded_value` (loglake.spark.typed)."""
    base = source_schema(include_headers)
    if not specs:
        return base
    typed = {
        spec.field: StructType.fromJson(
            {"type": "struct", "fields": [{"name": spec.field, "type": spec.column_type, "nullable": True, "metadata": {}}]}
        ).fields[0]
        for spec in specs
    }
    fields = [typed.get(f.name, f) for f in base.fields]
    fields += [StructField(SCHEMA_ID_COLUMNS[spec.field], IntegerType()) for spec in specs]
    fields += [
        StructField(DECODE_ERROR, StringType()),
        StructField(UNDECODED_COLUMNS["key"], BinaryType()),
        StructField(UNDECODED_COLUMNS["value"], BinaryType()),
    ]
    return StructType(fields)


def reader_specs(typed: TypedOptions | None) -> list[ReaderSpec]:
    """The reader specs of a typed read (each subject's latest version now): key first."""
    if typed is None:
        return []
    from loglake.spark.typed import RegistryClient, TypedColumnsError, resolve_reader

    registry = RegistryClient(typed.schema_registry_url)
    wanted = (("key", typed.key_format), ("value", typed.value_format))
    try:
        return [resolve_reader(registry, typed.topic, field, fmt) for field, fmt in wanted if fmt is not None]
    except TypedColumnsError as exc:
        raise LoglakeOptionError(str(exc)) from None


class Typed:
    """A reader's typed columns: the specs fixed at planning and the output's Arrow schema (made
    on the executor, where the batches are decoded)."""

    def __init__(self, specs: Sequence[ReaderSpec], schema: StructType) -> None:
        self.specs = list(specs)
        self.schema_json = schema.json()
        self._arrow: pa.Schema | None = None

    def arrow_schema(self) -> pa.Schema:
        if self._arrow is None:
            from pyspark.sql.pandas.types import to_arrow_schema

            self._arrow = to_arrow_schema(StructType.fromJson(json.loads(self.schema_json)), timezone="UTC")
        return self._arrow

    def decode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        from loglake.spark.typed import decode_batch

        return decode_batch(batch, self.specs, self.arrow_schema())


class SlicePartition(InputPartition):
    """A Spark input partition: one segment slice, or one range read through the broker (small
    and picklable)."""

    def __init__(self, value: Slice | BrokerRange) -> None:
        super().__init__(value)
        self.value: Slice | BrokerRange = value


def _tail(opts: ReadOptions) -> Any:
    """Timestamp lookups past the sealed segments (hybrid reads only)."""
    if not opts.hybrid:
        return None
    from loglake.spark.broker import broker_view

    return broker_view(opts).offset_for_timestamp


def _read(sl: Slice | BrokerRange, opts: ReadOptions, typed: Typed | None = None) -> Iterator[pa.RecordBatch]:
    if typed is None:
        yield from _read_raw(sl, opts)
        return
    for batch in _read_raw(sl, opts):
        yield typed.decode(batch)


def _read_raw(sl: Slice | BrokerRange, opts: ReadOptions) -> Iterator[pa.RecordBatch]:
    from loglake.spark.reader import read_slice

    if isinstance(sl, BrokerRange):
        from loglake.spark.broker import read_range

        yield from read_range(sl, opts)
        return

    upto = sl.start  # the offsets below were yielded already
    try:
        for batch in read_slice(sl, opts.include_headers):
            if batch.num_rows:
                upto = batch.column("offset")[-1].as_py() + 1
            yield batch
    except ObjectNotFoundError:
        if opts.hybrid:
            # compaction or merging replaced the segment since planning, or retention deleted
            # it: the broker has whatever is left of those offsets (and reports what is gone)
            from loglake.spark.broker import read_range

            log.info(
                "loglake: segment %s is gone since planning; reading %s-%d offsets %d..%d through the broker",
                sl.key, sl.topic, sl.partition, upto, sl.end - 1,
            )  # fmt: skip
            yield from read_range(BrokerRange(sl.topic, sl.partition, upto, sl.end), opts)
            return
        msg = f"segment {sl.key} ({sl.topic}-{sl.partition} offsets {sl.start}..{sl.end - 1}) is gone (retention?)"
        if opts.fail_on_data_loss:
            raise DataLossError(msg + "; set failOnDataLoss=false to skip it") from None
        log.warning("loglake: %s; skipped (failOnDataLoss=false)", msg)


def _plan_partitions(
    opts: ReadOptions, ranges: dict[TopicPartition, tuple[int, int]], meta: Metadata
) -> list[InputPartition]:
    """Input partitions for `ranges`. With hybrid reads the seam of each partition is fixed
    here, from `meta`: what was sealed when it was read."""
    slices: list[Slice | BrokerRange] = []
    for tp, (lo, hi) in sorted(ranges.items()):
        if hi <= lo:
            continue
        pm = meta.partitions.get(tp)
        if pm is None:
            if hi > lo:
                msg = f"{tp[0]}-{tp[1]} no longer exists (offsets {lo}..{hi - 1} are gone)"
                if opts.fail_on_data_loss:
                    raise DataLossError(msg + "; set failOnDataLoss=false to skip it")
                log.warning("loglake: %s; skipped", msg)
            continue
        lo, hi = check_range(pm, lo, hi, opts.fail_on_data_loss)
        slices.extend(ranges_for(opts.store_url, pm, lo, hi, opts.cold_url, committed=opts.read_committed))
    planned = split_slices(slices, opts.min_partitions)
    # broker ranges first: a record through a consumer costs several times one decoded from a
    # segment, so they start early instead of being the last tasks of the stage
    planned.sort(key=lambda r: not isinstance(r, BrokerRange))
    return [SlicePartition(s) for s in planned]


class LoglakeBatchReader(DataSourceReader):
    def __init__(self, opts: ReadOptions, typed: Typed | None = None) -> None:
        self.opts = opts
        self.typed = typed

    def offset_ranges(self, meta: Metadata | None = None) -> dict[TopicPartition, tuple[int, int]]:
        opts = self.opts
        store = cached_store(opts.store_url)
        meta = meta or metadata(opts)
        tail = _tail(opts)
        ranges: dict[TopicPartition, tuple[int, int]] = {}
        for pm in select_partitions(opts, meta):
            start = resolve_offset(
                opts.starting,
                pm,
                store,
                starting=True,
                strategy=opts.timestamp_strategy,
                cold_url=opts.cold_url,
                tail=tail,
            )
            end = resolve_offset(opts.ending, pm, store, starting=False, cold_url=opts.cold_url, tail=tail)
            if start > end:
                raise LoglakeOptionError(
                    f"starting offset {start} is after ending offset {end} for {pm.topic}-{pm.partition}"
                )
            ranges[pm.tp] = (start, end)
        return ranges

    def partitions(self) -> Sequence[InputPartition]:
        meta = metadata(self.opts)
        return _plan_partitions(self.opts, self.offset_ranges(meta), meta)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SlicePartition):  # Spark's placeholder when there is no data
            return iter(())
        return _read(partition.value, self.opts, self.typed)


class LoglakeStreamReader(DataSourceStreamReader, _AvailableNowBase):  # type: ignore[misc]
    """Micro-batch reads. Offsets: {topic: {"partition": next offset}}; a partition's latest
    offset is its sealed end (hybrid reads: the broker's end). maxOffsetsPerTrigger is spread
    over partitions like Kafka's."""

    def __init__(self, opts: ReadOptions, typed: Typed | None = None) -> None:
        self.opts = opts
        self.typed = typed
        self._target: dict[TopicPartition, int] | None = None
        self._last: dict[TopicPartition, int] | None = None

    def _latest(self) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
        """(end, log start) of every subscribed partition."""
        meta = metadata(self.opts)
        parts = select_partitions(self.opts, meta)
        return {pm.tp: pm.end for pm in parts}, {pm.tp: pm.log_start for pm in parts}

    def initialOffset(self) -> OffsetDict:
        opts = self.opts
        store = cached_store(opts.store_url)
        meta = metadata(opts)
        tail = _tail(opts)
        offsets = {
            pm.tp: resolve_offset(
                opts.starting,
                pm,
                store,
                starting=True,
                strategy=opts.timestamp_strategy,
                cold_url=opts.cold_url,
                tail=tail,
            )
            for pm in select_partitions(opts, meta)
        }
        return to_offset_dict(offsets)

    def getDefaultReadLimit(self) -> Any:
        if not HAS_READ_LIMITS:  # pragma: no cover
            return None
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target, _ = self._latest()

    def latestOffset(self, start: OffsetDict | None = None, limit: Any = None) -> OffsetDict:
        latest, log_start = self._latest()
        if self._target is not None:
            latest = {tp: min(latest.get(tp, off), off) for tp, off in self._target.items()}
        if start is not None:
            begin = from_offset_dict(start)
            cap: int | None = None
            if HAS_READ_LIMITS and isinstance(limit, ReadMaxRows):
                cap = int(limit.max_rows)
        elif self._last is not None:  # Spark 4.0/4.1: latestOffset() without arguments
            begin = dict(self._last)
            cap = self.opts.max_offsets_per_trigger
        else:  # first call of an old-API query: we do not know where it resumes, read all
            begin, cap = {}, None
        # new partitions start at their log start (as Kafka's source does)
        starts = {tp: begin.get(tp, log_start.get(tp, 0)) for tp in latest}
        if cap is not None:
            latest = rate_limit(starts, latest, cap)
        merged = dict(begin)
        for tp, off in latest.items():
            merged[tp] = max(off, begin[tp]) if tp in begin else off
        self._last = merged
        return to_offset_dict(merged)

    def reportLatestOffset(self) -> OffsetDict | None:
        latest, _ = self._latest()
        return to_offset_dict(latest)

    def partitions(self, start: OffsetDict, end: OffsetDict) -> Sequence[InputPartition]:
        s, e = from_offset_dict(start), from_offset_dict(end)
        meta = metadata(self.opts)
        ranges: dict[TopicPartition, tuple[int, int]] = {}
        for tp, hi in e.items():
            lo = s.get(tp)
            if lo is None:  # a partition that appeared in this micro-batch
                pm = meta.partitions.get(tp)
                lo = pm.log_start if pm is not None else hi
            ranges[tp] = (lo, hi)
        return _plan_partitions(self.opts, ranges, meta)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SlicePartition):  # Spark's placeholder when there is no data
            return iter(())
        return _read(partition.value, self.opts, self.typed)

    def commit(self, end: OffsetDict) -> None:
        log.debug("loglake: committed %s", end)


# ---- writing -----------------------------------------------------------------------------------


class LoglakeCommitMessage(WriterCommitMessage):
    def __init__(self, records: int) -> None:
        self.records = records


def _check_write_schema(schema: StructType, opts: WriteOptions) -> None:
    names = {f.name: f.dataType for f in schema.fields}
    if "value" not in names:
        raise LoglakeOptionError(
            "the DataFrame to write to loglake needs a `value` column (binary or string)"
        )
    for col in ("key", "value"):
        if col in names and not isinstance(names[col], BinaryType | StringType):
            raise LoglakeOptionError(
                f"column {col} must be binary or string, not {names[col].simpleString()}"
            )
    if "topic" in names and not isinstance(names["topic"], StringType):
        raise LoglakeOptionError(f"column topic must be a string, not {names['topic'].simpleString()}")
    if "partition" in names and not isinstance(names["partition"], IntegerType):
        raise LoglakeOptionError(f"column partition must be an int, not {names['partition'].simpleString()}")
    if "timestamp" in names and not isinstance(names["timestamp"], TimestampType | LongType):
        raise LoglakeOptionError("column timestamp must be a timestamp or a long (ms since the epoch)")
    if opts.topic is None and "topic" not in names:
        raise LoglakeOptionError("no topic to write to: set the option topic or add a topic column")


class LoglakeWriter(DataSourceWriter):
    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        _check_write_schema(schema, opts)
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        from loglake.spark.writer import produce_rows

        return LoglakeCommitMessage(produce_rows(self.opts, iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.records for m in messages if isinstance(m, LoglakeCommitMessage))
        log.info("loglake: wrote %d records", total)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.records for m in messages if isinstance(m, LoglakeCommitMessage))
        log.warning(
            "loglake: write aborted; %d records already acknowledged by the broker stay in the log "
            "(the sink is at-least-once)",
            total,
        )


class LoglakeStreamWriter(DataSourceStreamWriter):
    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        _check_write_schema(schema, opts)
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        from loglake.spark.writer import produce_rows

        return LoglakeCommitMessage(produce_rows(self.opts, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        total = sum(m.records for m in messages if isinstance(m, LoglakeCommitMessage))
        log.info("loglake: micro-batch %d wrote %d records", batchId, total)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("loglake: micro-batch %d aborted; acknowledged records stay (at-least-once)", batchId)


# ---- the data source ---------------------------------------------------------------------------


class LoglakeDataSource(DataSource):
    """`spark.read.format("loglake")`: see docs/SPARK.md for the options."""

    @classmethod
    def name(cls) -> str:
        return "loglake"

    def _include_headers(self) -> bool:
        for k, v in self.options.items():
            if str(k).lower() == "includeheaders":
                return parse_bool("includeHeaders", str(v))
        return False

    def schema(self) -> StructType:
        return typed_schema(self._include_headers(), reader_specs(parse_typed_options(dict(self.options))))

    def _typed(self, opts: ReadOptions, schema: StructType) -> Typed | None:
        """The typed columns of a read, with the reader schemas the query was planned with:
        the subjects' latest versions again, which must still give `schema`."""
        if not opts.typed:
            return None
        specs = reader_specs(parse_typed_options(dict(self.options)))
        if typed_schema(opts.include_headers, specs) != schema:
            raise LoglakeOptionError(
                "a new schema version was registered while the query was planned: run it again"
            )
        return Typed(specs, schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = parse_read_options(dict(self.options), "batch")
        return LoglakeBatchReader(opts, self._typed(opts, schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = parse_read_options(dict(self.options), "stream")
        return LoglakeStreamReader(opts, self._typed(opts, schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return LoglakeWriter(parse_write_options(dict(self.options)), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return LoglakeStreamWriter(parse_write_options(dict(self.options)), schema)


#: Sessions the format is registered on: registering it again would make Spark log a WARN line
#: ("replaced a previously registered data source") for nothing.
_REGISTERED: weakref.WeakSet[Any] = weakref.WeakSet()


def register(spark: Any) -> None:
    """Register the `loglake` format on a SparkSession, once per session (the pipelines call
    it on the sessions they are given; a second call does nothing)."""
    if spark in _REGISTERED:
        return
    spark.dataSource.register(LoglakeDataSource)
    _REGISTERED.add(spark)
