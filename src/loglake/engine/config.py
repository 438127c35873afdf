"""Engine and topic configuration.

Topic configs use Kafka's names where Kafka has one, with string values as on the wire
(CreateTopics, DescribeConfigs). `TOPIC_CONFIG_KEYS` is the one table of them (type, default,
accepted values, documentation, Kafka broker synonym); `TopicConfig.parse` turns them into typed
values and rejects unknown names and bad values with ConfigError, as Kafka's LogConfig.validate does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import IntEnum
from typing import Any

from loglake.errors import ConfigError, InvalidTopicError
from loglake.meta.log import (
    META_CHECKPOINT_BYTES_DEFAULT,
    META_CHECKPOINT_RECORDS_DEFAULT,
    META_LOG_FILE_BYTES_DEFAULT,
)
from loglake.meta.publish import META_PUBLISH_INTERVAL_MS_DEFAULT
from loglake.meta.state import PARTITIONS_PER_TOPIC_MAX as _META_PARTITIONS_MAX
from loglake.records.compression import codec_from_name
from loglake.wal.shard import (
    WAL_FILE_BYTES_DEFAULT,
    WAL_FSYNC_INTERVAL_MS_DEFAULT,
    WAL_GROUP_BYTES_MAX_DEFAULT,
    WAL_QUEUE_BYTES_MAX_DEFAULT,
    Durability,
)

#: Default bound on the WAL a restart reads and replays (`EngineConfig.wal_replay_bytes_max`): with
#: the files that roll while the seals run, under a second of recovery on the development VM
#: (docs/RELIABILITY.md, "Restart time").
WAL_REPLAY_BYTES_MAX_DEFAULT = 256 * 1024 * 1024
#: Default free-space reserve: room for what no admitted append pays for — metadata log files
#: (4 MiB) and checkpoints, compaction's output. WAL rolls and seals of admitted data are counted
#: on top of it before produce is admitted (loglake.engine.space).
STORAGE_MIN_FREE_BYTES_DEFAULT = 128 * 1024 * 1024
#: ...or 1 % of the filesystem, whichever is larger (big disks get a proportionate margin).
STORAGE_MIN_FREE_PERCENT_DEFAULT = 1.0

TOPIC_NAME_RE = re.compile(r"^[a-zA-Z0-9._-]+$")
#: Kafka's limit on topic name length.
TOPIC_NAME_CHARS_MAX = 249
#: Upper bound on partitions per topic (each partition owns buffers and a segment chain): defined
#: with the metadata state, whose replay refuses records above it.
PARTITIONS_PER_TOPIC_MAX = _META_PARTITIONS_MAX


def validate_topic_name(name: str) -> None:
    if not name or len(name) > TOPIC_NAME_CHARS_MAX:
        raise InvalidTopicError(f"topic name must be 1..{TOPIC_NAME_CHARS_MAX} characters: {name!r}")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if not TOPIC_NAME_RE.match(name):
        raise InvalidTopicError(f"topic name {name!r} has characters outside [a-zA-Z0-9._-]")


class ConfigType(IntEnum):
    """A config's type, numbered as Kafka's ConfigEntry.ConfigType (DescribeConfigs v3+ sends it)."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


#: The values a config of each integer type can hold (Kafka's ConfigDef types: a Java short, int
#: and long); a value outside is not a number of that type, whatever the config's own bounds.
INTEGER_RANGES: Mapping[ConfigType, tuple[int, int]] = {
    ConfigType.SHORT: (-(2**15), 2**15 - 1),
    ConfigType.INT: (-(2**31), 2**31 - 1),
    ConfigType.LONG: (-(2**63), 2**63 - 1),
}


#: confluent.{key,value}.schema.validation values: off, the header checked, the record decoded.
SCHEMA_VALIDATIONS = ("false", "true", "full")
#: confluent.{key,value}.subject.name.strategy values (Confluent's serializer class names), the default first.
SUBJECT_NAME_STRATEGIES = (
    "io.confluent.kafka.serializers.subject.TopicNameStrategy",
    "io.confluent.kafka.serializers.subject.RecordNameStrategy",
    "io.confluent.kafka.serializers.subject.TopicRecordNameStrategy",
)


@dataclass(frozen=True, slots=True)
class TopicConfigKey:
    """One topic config: what the engine accepts and what DescribeConfigs reports about it.

    Values are strings as on the wire. INT and LONG values must lie in [low, high] (None: no
    bound); STRING and LIST values must be among `choices` when given (a LIST is a comma list of
    them); `check` validates what the rest cannot express and returns the value to keep.
    """

    name: str
    type: ConfigType
    default: str
    doc: str
    #: The Kafka broker setting that supplies the default (DescribeConfigs' synonym for it);
    #: None for loglake's own configs, which have no broker-wide setting.
    broker_synonym: str | None = None
    low: int | None = None
    high: int | None = None
    choices: tuple[str, ...] = ()
    check: Callable[[str, str], str] | None = None
    #: Reported as read-only by DescribeConfigs and refused as an override.
    read_only: bool = False

    def parse(self, raw: str) -> Any:
        """The typed value of `raw`, or ConfigError (as Kafka's LogConfig.validate rejects it)."""
        name = self.name
        if self.type in (ConfigType.INT, ConfigType.LONG):
            try:
                value = int(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r}: not an integer") from None
            type_low, type_high = INTEGER_RANGES[self.type]
            low = type_low if self.low is None else self.low
            high = type_high if self.high is None else self.high
            if not low <= value <= high:
                raise ConfigError(f"{name}={value}: must be in [{low}, {high}]")
            return value
        if self.type is ConfigType.DOUBLE:
            try:
                number = float(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r}: not a number") from None
            if number != number or (self.low is not None and number < self.low) or (self.high is not None and number > self.high):
                raise ConfigError(f"{name}={raw}: must be in [{self.low}, {self.high}]")
            return number
        if self.check is not None:
            return self.check(name, raw)
        if self.type is ConfigType.LIST:
            items = [x.strip() for x in raw.split(",") if x.strip()]
            if not items or any(x not in self.choices for x in items):
                raise ConfigError(f"{name}={raw!r}: must be a comma list of {', '.join(self.choices)}")
            return ",".join(items)
        if self.choices and raw not in self.choices:
            raise ConfigError(f"{name}={raw!r}: must be one of {', '.join(self.choices)}")
        return raw


def _compression_type(name: str, raw: str) -> str:
    """`producer` (keep batches as sent), `uncompressed`, or a codec name (any case)."""
    if raw not in ("producer", "uncompressed"):
        codec_from_name(raw)
    return raw


#: Every topic config, with Kafka's name where Kafka has one. The one table: the engine parses
#: with it, the broker's DescribeConfigs/AlterConfigs read it, README.md lists it (a test checks).
TOPIC_CONFIG_KEYS: tuple[TopicConfigKey, ...] = (
    # Unsealed data lives in memory, so segments are far smaller than Kafka's 1 GiB default.
    TopicConfigKey("segment.bytes", ConfigType.INT, "67108864",
                   "Seal the open segment of a partition at this size.",
                   "log.segment.bytes", low=14, high=1073741824),
    # Seal an idle partition after an hour so the WAL behind it can be truncated.
    TopicConfigKey("segment.ms", ConfigType.LONG, "3600000",
                   "Seal the open segment of a partition after this long.",
                   "log.roll.ms", low=1),
    TopicConfigKey("segment.records", ConfigType.LONG, "1000000",
                   "Seal the open segment after this many records (0 = never).",
                   low=0),
    TopicConfigKey("retention.ms", ConfigType.LONG, "604800000",
                   "Delete whole segments older than this (-1 = keep forever).",
                   "log.retention.ms", low=-1),
    TopicConfigKey("retention.bytes", ConfigType.LONG, "-1",
                   "Delete the oldest segments above this size per partition (-1 = no limit).",
                   "log.retention.bytes", low=-1),
    TopicConfigKey("cleanup.policy", ConfigType.LIST, "delete",
                   "delete and/or compact.",
                   "log.cleanup.policy", choices=("delete", "compact")),
    TopicConfigKey("compression.type", ConfigType.STRING, "producer",
                   "Codec batches are stored with; producer keeps the producer's.",
                   "compression.type", check=_compression_type),
    TopicConfigKey("max.message.bytes", ConfigType.INT, "1048588",
                   "Largest record batch accepted, in bytes.",
                   "message.max.bytes", low=0, high=268435456),
    TopicConfigKey("message.timestamp.type", ConfigType.STRING, "CreateTime",
                   "CreateTime or LogAppendTime.",
                   "log.message.timestamp.type", choices=("CreateTime", "LogAppendTime")),
    TopicConfigKey("delete.retention.ms", ConfigType.LONG, "86400000",
                   "How long compaction keeps tombstones.",
                   "log.cleaner.delete.retention.ms", low=0),
    TopicConfigKey("min.cleanable.dirty.ratio", ConfigType.DOUBLE, "0.5",
                   "Compaction: clean a partition once its uncleaned share of sealed bytes reaches this.",
                   "log.cleaner.min.cleanable.ratio", low=0, high=1),
    TopicConfigKey("min.compaction.lag.ms", ConfigType.LONG, "0",
                   "Compaction: records newer than this stay uncompacted.",
                   "log.cleaner.min.compaction.lag.ms", low=0),
    TopicConfigKey("max.compaction.lag.ms", ConfigType.LONG, "9223372036854775807",
                   "Compaction: a record stays uncompacted at most this long, whatever the dirty ratio.",
                   "log.cleaner.max.compaction.lag.ms", low=1),
    TopicConfigKey("min.insync.replicas", ConfigType.INT, "1",
                   "Always 1: loglake has a single replica.",
                   "min.insync.replicas", low=1, high=1),
    # Kafka's fsync policy. Accepted, stored and described for Kafka tools; `durability` governs
    # when loglake syncs (README: a WAL shared by every topic has no per-topic fsync cadence).
    TopicConfigKey("flush.messages", ConfigType.LONG, "9223372036854775807",
                   "Accepted for Kafka compatibility and stored; loglake's durability config governs syncing.",
                   "log.flush.interval.messages", low=1),
    TopicConfigKey("flush.ms", ConfigType.LONG, "9223372036854775807",
                   "Accepted for Kafka compatibility and stored; loglake's durability config governs syncing.",
                   "log.flush.interval.ms", low=0),
    TopicConfigKey("durability", ConfigType.STRING, "fsync",
                   "When appends are acknowledged: fsync, disk, memory or ephemeral.",
                   choices=tuple(d.name.lower() for d in Durability)),
    # Tiering (with a cold store): keep this many newest sealed segments on local disk...
    TopicConfigKey("hot.retain.segments", ConfigType.INT, "4",
                   "With a cold store: newest sealed segments kept on local disk (0 = relocate each at once).",
                   low=0, high=1000000),
    # ...and at most this many bytes of them (0 = no byte bound); the stricter bound wins.
    TopicConfigKey("hot.retain.bytes", ConfigType.LONG, "0",
                   "With a cold store: at most this many bytes of sealed segments on local disk "
                   "(0 = no byte bound); the stricter of the two hot.retain bounds wins.",
                   low=0),
    # Validated topics, by Confluent Server's names (docs/SCHEMA_REGISTRY.md "Validated topics"):
    # produced keys / values must carry the wire-format header of a schema id registered under
    # the topic's subject; full also decodes them with that schema.
    *(TopicConfigKey(f"confluent.{part}.schema.validation", ConfigType.STRING, "false",
                     f"Refuse records whose {part} is not in the schema registry's wire format with a schema id "
                     "of the topic's subject (true), or does not decode with that schema (full).",
                     choices=SCHEMA_VALIDATIONS) for part in ("key", "value")),
    *(TopicConfigKey(f"confluent.{part}.subject.name.strategy", ConfigType.STRING, SUBJECT_NAME_STRATEGIES[0],
                     f"How a validated topic's {part} subject is named: from the topic (<topic>-{part}), "
                     "the record's name, or both.",
                     choices=SUBJECT_NAME_STRATEGIES) for part in ("key", "value")),
)

#: name -> key, in the table's order (DescribeConfigs lists configs in this order).
TOPIC_CONFIGS: Mapping[str, TopicConfigKey] = {k.name: k for k in TOPIC_CONFIG_KEYS}
TOPIC_CONFIG_NAMES = tuple(TOPIC_CONFIGS)


@dataclass(frozen=True)
class TopicConfig:
    """Typed topic configuration; `overrides` keeps exactly what the user set."""

    segment_bytes: int
    segment_ms: int
    segment_records: int
    retention_ms: int
    retention_bytes: int
    cleanup_policy: str
    compression_type: str
    max_message_bytes: int
    log_append_time: bool
    delete_retention_ms: int
    durability: Durability
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = 2**63 - 1
    hot_retain_segments: int = 4
    hot_retain_bytes: int = 0
    #: confluent.key/value.schema.validation and .subject.name.strategy (SCHEMA_VALIDATIONS,
    #: SUBJECT_NAME_STRATEGIES)
    key_schema_validation: str = "false"
    value_schema_validation: str = "false"
    key_subject_name_strategy: str = SUBJECT_NAME_STRATEGIES[0]
    value_subject_name_strategy: str = SUBJECT_NAME_STRATEGIES[0]
    overrides: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, overrides: Mapping[str, str] | None = None, defaults: Mapping[str, str] | None = None) -> TopicConfig:
        overrides = dict(overrides or {})
        merged: dict[str, Any] = {}
        for name, key in TOPIC_CONFIGS.items():
            merged[name] = key.parse((defaults or {}).get(name, key.default))
        for name, raw in overrides.items():
            known = TOPIC_CONFIGS.get(name)
            if known is None:
                raise ConfigError(f"unknown topic config {name!r}; known: {', '.join(TOPIC_CONFIG_NAMES)}")
            if known.read_only:
                raise ConfigError(f"topic config {name!r} is read-only")
            merged[name] = known.parse(str(raw))
        return cls(
            segment_bytes=merged["segment.bytes"],
            segment_ms=merged["segment.ms"],
            segment_records=merged["segment.records"],
            retention_ms=merged["retention.ms"],
            retention_bytes=merged["retention.bytes"],
            cleanup_policy=merged["cleanup.policy"],
            compression_type=merged["compression.type"],
            max_message_bytes=merged["max.message.bytes"],
            log_append_time=merged["message.timestamp.type"] == "LogAppendTime",
            delete_retention_ms=merged["delete.retention.ms"],
            min_cleanable_dirty_ratio=merged["min.cleanable.dirty.ratio"],
            min_compaction_lag_ms=merged["min.compaction.lag.ms"],
            max_compaction_lag_ms=merged["max.compaction.lag.ms"],
            durability=Durability.parse(merged["durability"]),
            hot_retain_segments=merged["hot.retain.segments"],
            hot_retain_bytes=merged["hot.retain.bytes"],
            key_schema_validation=merged["confluent.key.schema.validation"],
            value_schema_validation=merged["confluent.value.schema.validation"],
            key_subject_name_strategy=merged["confluent.key.subject.name.strategy"],
            value_subject_name_strategy=merged["confluent.value.subject.name.strategy"],
            overrides={k: str(v) for k, v in overrides.items()},
        )

    @property
    def compacted(self) -> bool:
        """cleanup.policy includes compact: every record must have a key (Kafka's rule)."""
        return "compact" in self.cleanup_policy.split(",")

    def effective(self, defaults: Mapping[str, str] | None = None) -> dict[str, tuple[str, bool]]:
        """Every config name -> (value, is_default), as DescribeConfigs reports them."""
        out: dict[str, tuple[str, bool]] = {}
        for name, key in TOPIC_CONFIGS.items():
            if name in self.overrides:
                out[name] = (self.overrides[name], False)
            else:
                out[name] = ((defaults or {}).get(name, key.default), True)
        return out


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


@dataclass
class EngineConfig:
    """Process-wide engine settings. Limits are checked against each other in `validate()`."""

    wal_shards: int = field(default_factory=lambda: max(1, min(os.cpu_count() or 1, 4)))
    wal_file_bytes: int = WAL_FILE_BYTES_DEFAULT
    wal_group_bytes_max: int = WAL_GROUP_BYTES_MAX_DEFAULT
    wal_queue_bytes_max: int = WAL_QUEUE_BYTES_MAX_DEFAULT
    wal_fsync_interval_ms: int = WAL_FSYNC_INTERVAL_MS_DEFAULT
    #: Keep the next WAL file ready per shard (wal/spare.py): a recycled obsolete WAL file, else one
    #: written with zeros. Rolls become a rename and WAL fdatasyncs never wait for a journal commit.
    #: Costs up to two more wal_file_bytes of disk per shard (one recycled file and one of zeros).
    wal_spare_file: bool = True
    #: Most bytes of WAL files one shard keeps. Past it, the partitions whose unsealed data holds
    #: the oldest file are sealed, so that file can go: an idle partition's tail never makes the
    #: WAL grow for up to its segment.ms (an hour by default) while busy ones write past it.
    wal_max_bytes: int = 1024 * 1024 * 1024
    #: Most bytes of WAL files all shards together keep, and so the most a restart after a crash
    #: reads and replays (its time grows with them; docs/RELIABILITY.md, "Restart time"). Past it,
    #: the partitions whose unsealed data holds the oldest files of the shards with the most are
    #: sealed, so those files can go. Each shard's active file stays: the bound in effect is at
    #: least a file per shard and one more (`wal_replay_bound`).
    wal_replay_bytes_max: int = WAL_REPLAY_BYTES_MAX_DEFAULT
    #: Global budget for unsealed (in-memory) partition data.
    memory_budget_bytes: int = 512 * 1024 * 1024
    #: Fraction of the budget at which an emergency seal starts.
    memory_pressure_ratio: float = 0.75
    #: How long an append waits for memory before failing with a retriable error.
    memory_wait_ms: int = 30_000
    #: Worker threads that build and publish sealed segments.
    seal_threads: int = 2
    #: How often the background tick checks age-based sealing and retention.
    maintenance_interval_ms: int = 200
    #: How often the acknowledged ends of durability=fsync partitions are recorded in the
    #: metadata (engine/acked.py): a loss of acknowledged data older than this is told from a
    #: torn write at recovery.
    acked_end_interval_ms: int = 1000
    #: Open a data directory that lost acknowledged records (engine/acked.py): the loss is
    #: logged, the offsets stay reserved. Off: such a directory refuses to open.
    accept_data_loss: bool = False
    #: Topic config defaults (Kafka names), e.g. {"durability": "disk"}.
    topic_defaults: dict[str, str] = field(default_factory=dict)
    #: Where sealed segments go; None = "<data_dir>/segments".
    hot_store_url: str | None = None
    #: Segment read cache of parsed indexes (entries), bounded.
    segment_index_cache_entries: int = 4096
    #: Cold store URL (file:///path, s3://bucket/prefix?...); None = no tiering.
    cold_store_url: str | None = None
    #: Bytes of cold segment ranges cached in memory (LRU).
    cold_range_cache_bytes: int = 256 * 1024 * 1024
    #: Parsed cold segment footers (trailer + index) cached.
    cold_footer_cache_entries: int = 10_000
    #: Read-ahead for sequential cold readers (0 = off).
    cold_read_ahead_segments: int = 1
    #: Threads for cold reads: a slow bucket only ever ties up these.
    cold_read_threads: int = 4
    #: Segments uploaded to the cold store at once.
    relocation_threads: int = 2
    #: Wait after a failed upload before that segment is tried again.
    relocation_retry_ms: int = 5_000
    #: Metadata checkpoint after this many metadata log records since the last one...
    meta_checkpoint_records: int = META_CHECKPOINT_RECORDS_DEFAULT
    #: ...or this many bytes of them, whichever comes first.
    meta_checkpoint_bytes: int = META_CHECKPOINT_BYTES_DEFAULT
    #: Preallocated size of a metadata log file.
    meta_log_file_bytes: int = META_LOG_FILE_BYTES_DEFAULT
    #: Longest a durable metadata change waits before it is copied to the object stores.
    meta_publish_interval_ms: int = META_PUBLISH_INTERVAL_MS_DEFAULT

    #: Compaction's key map bound (Kafka: log.cleaner.dedupe.buffer.size); a partition whose
    #: dirty keys do not fit is cleaned in several passes.
    cleaner_dedupe_buffer_bytes: int = 128 * 1024 * 1024
    #: Cleaner and merger I/O, read plus written (Kafka: log.cleaner.io.max.bytes.per.second).
    cleaner_io_max_bytes_per_second: int = 50 * 1024 * 1024
    #: Cleaner threads (Kafka: log.cleaner.threads); 0 turns compaction and merging off.
    cleaner_threads: int = 1
    #: Run compaction and merging in worker processes (one per cleaner thread), so their
    #: CPU-bound record work never takes the GIL from produce and fetch. Off, or when the stores
    #: cannot be reopened by URL in another process, they run on the cleaner's threads.
    cleaner_process: bool = True
    #: Pause between cleaner passes over all partitions when there was nothing to do
    #: (Kafka: log.cleaner.backoff.ms).
    cleaner_backoff_ms: int = 15_000
    #: Merge adjacent small sealed segments of a partition (same tier) once at least this many
    #: fit together within segment.bytes (0 = no merging)...
    merge_min_segments: int = 8
    #: ...and each of them was sealed at least this long ago (fresh segments are the ones tail
    #: readers and relocation are busy with).
    merge_min_age_ms: int = 300_000
    #: Background scrubber: bytes per second of sealed segments re-verified (batch CRCs, data
    #: CRC, hash chain) while the broker runs; 0 turns it off (loglake.engine.scrubber).
    scrub_bytes_per_second: int = 0
    #: Pause between two full scrub passes over every sealed segment.
    scrub_interval_ms: int = 3_600_000

    #: Free-space reserve of the data directory's filesystem: when free space less what loglake
    #: owes (seals of unsealed data, WAL files ahead) falls below the larger of this and
    #: `storage_min_free_percent`, produce is refused with KAFKA_STORAGE_ERROR (StorageFullError);
    #: metadata and checkpoints still have the reserve (loglake.engine.space; RELIABILITY.md
    #: "Disk full"). 0 with 0 % turns the reserve off.
    storage_min_free_bytes: int = STORAGE_MIN_FREE_BYTES_DEFAULT
    #: ...or this share of the filesystem, in percent, whichever is larger.
    storage_min_free_percent: float = STORAGE_MIN_FREE_PERCENT_DEFAULT
    #: How often free space is read (statvfs) while writable; while full, a refused produce reads
    #: it again at most every 100 ms.
    storage_space_check_interval_ms: int = 1_000

    @property
    def wal_replay_bound(self) -> int:
        """`wal_replay_bytes_max`, but at least a WAL file per shard and one more: the active
        files never go, and one closed file is what sealing has to let go at a time."""
        return max(self.wal_replay_bytes_max, (self.wal_shards + 1) * self.wal_file_bytes)

    def validate(self) -> None:
        if not 0 <= self.storage_min_free_bytes <= 2**50:
            raise ConfigError(f"storage_min_free_bytes={self.storage_min_free_bytes}: must be in [0, 2**50]")
        if not 0.0 <= self.storage_min_free_percent <= 50.0:
            raise ConfigError(f"storage_min_free_percent={self.storage_min_free_percent}: must be in [0, 50]")
        if not 10 <= self.storage_space_check_interval_ms <= 60_000:
            raise ConfigError(
                f"storage_space_check_interval_ms={self.storage_space_check_interval_ms}: must be in [10, 60000]"
            )
        if self.cleaner_dedupe_buffer_bytes < 1024 * 1024:
            raise ConfigError("cleaner_dedupe_buffer_bytes must be at least 1 MiB")
        if self.scrub_bytes_per_second < 0 or self.scrub_interval_ms < 0:
            raise ConfigError("scrub_bytes_per_second and scrub_interval_ms must be >= 0")
        if self.cleaner_io_max_bytes_per_second < 0 or self.cleaner_threads < 0 or self.cleaner_backoff_ms < 1:
            raise ConfigError("cleaner_io_max_bytes_per_second and cleaner_threads must be >= 0, cleaner_backoff_ms >= 1")
        if self.merge_min_segments == 1 or self.merge_min_segments < 0 or self.merge_min_age_ms < 0:
            raise ConfigError("merge_min_segments must be 0 (off) or at least 2, merge_min_age_ms >= 0")
        if not 1 <= self.wal_shards <= 64:
            raise ConfigError(f"wal_shards={self.wal_shards}: must be in [1, 64]")
        if self.wal_file_bytes < 64 * 1024:
            raise ConfigError("wal_file_bytes must be at least 64 KiB")
        if self.wal_max_bytes < 2 * self.wal_file_bytes:
            raise ConfigError("wal_max_bytes must be at least twice wal_file_bytes")
        if self.wal_replay_bytes_max < 2 * self.wal_file_bytes:
            raise ConfigError("wal_replay_bytes_max must be at least twice wal_file_bytes")
        if self.wal_group_bytes_max > self.wal_queue_bytes_max:
            raise ConfigError("wal_group_bytes_max must not exceed wal_queue_bytes_max")
        if self.memory_budget_bytes < 4 * 1024 * 1024:
            raise ConfigError("memory_budget_bytes must be at least 4 MiB")
        if not 0.1 <= self.memory_pressure_ratio < 1.0:
            raise ConfigError("memory_pressure_ratio must be in [0.1, 1.0)")
        if self.seal_threads < 1:
            raise ConfigError("seal_threads must be at least 1")
        if self.cold_read_threads < 1 or self.relocation_threads < 1:
            raise ConfigError("cold_read_threads and relocation_threads must be at least 1")
        if self.meta_checkpoint_records < 1 or self.meta_checkpoint_bytes < 4096:
            raise ConfigError("meta_checkpoint_records must be >= 1 and meta_checkpoint_bytes >= 4096")
        if self.meta_log_file_bytes < 64 * 1024:
            raise ConfigError("meta_log_file_bytes must be at least 64 KiB")
        if not 10 <= self.acked_end_interval_ms <= 3_600_000:
            raise ConfigError("acked_end_interval_ms must be in 10..3600000")
        if self.meta_publish_interval_ms < 0:
            raise ConfigError("meta_publish_interval_ms must not be negative")
        if self.cold_range_cache_bytes < 0 or self.cold_read_ahead_segments < 0:
            raise ConfigError("cold cache sizes and read-ahead must not be negative")
        self.check_topic_defaults(self.topic_defaults)

    def check_topic_defaults(self, defaults: Mapping[str, str]) -> None:
        """ConfigError unless `defaults` are known topic configs with valid values that fit this engine."""
        unknown = sorted(set(defaults) - set(TOPIC_CONFIG_NAMES))
        if unknown:
            raise ConfigError(
                f"unknown topic config default(s) {', '.join(map(repr, unknown))} (in TOML, quote dotted names: "
                f'"retention.ms" = "86400000"); known: {", ".join(TOPIC_CONFIG_NAMES)}'
            )
        topic = TopicConfig.parse(None, defaults)
        if topic.max_message_bytes > self.memory_budget_bytes // 4:
            raise ConfigError("max.message.bytes must be at most a quarter of memory_budget_bytes")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ConfigError(f"unknown engine option(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        config = cls(**kwargs)
        config.validate()
        return config
