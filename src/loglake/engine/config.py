"""Engine and topic configuration.

Topic configs use Kafka's names where Kafka has one, with string values as on the wire
(CreateTopics, DescribeConfigs). `TopicConfig.parse` turns them into typed values and rejects
unknown names and bad values with ConfigError, as Kafka's LogConfig.validate does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from loglake.errors import ConfigError, InvalidTopicError
from loglake.meta.log import (
    META_CHECKPOINT_BYTES_DEFAULT,
    META_CHECKPOINT_RECORDS_DEFAULT,
    META_LOG_FILE_BYTES_DEFAULT,
)
from loglake.meta.publish import META_PUBLISH_INTERVAL_MS_DEFAULT
from loglake.records.compression import codec_from_name
from loglake.wal.shard import (
    WAL_FILE_BYTES_DEFAULT,
    WAL_FSYNC_INTERVAL_MS_DEFAULT,
    WAL_GROUP_BYTES_MAX_DEFAULT,
    WAL_QUEUE_BYTES_MAX_DEFAULT,
    Durability,
)

TOPIC_NAME_RE = re.compile(r"^[a-zA-Z0-9._-]+$")
#: Kafka's limit on topic name length.
TOPIC_NAME_CHARS_MAX = 249
#: Upper bound on partitions per topic: each partition owns buffers and a segment chain.
PARTITIONS_PER_TOPIC_MAX = 10_000


def validate_topic_name(name: str) -> None:
    if not name or len(name) > TOPIC_NAME_CHARS_MAX:
        raise InvalidTopicError(f"topic name must be 1..{TOPIC_NAME_CHARS_MAX} characters: {name!r}")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if not TOPIC_NAME_RE.match(name):
        raise InvalidTopicError(f"topic name {name!r} has characters outside [a-zA-Z0-9._-]")


# name -> (default, kind); kinds: int, long, enum:<a|b>, compression, durability
_TOPIC_CONFIGS: dict[str, tuple[str, str]] = {
    # Unsealed data lives in memory, so segments are far smaller than Kafka's 1 GiB default.
    "segment.bytes": ("67108864", "int:14:1073741824"),
    # Seal an idle partition after an hour so the WAL behind it can be truncated.
    "segment.ms": ("3600000", "long:1"),
    # loglake-specific: seal after this many records (0 disables).
    "segment.records": ("1000000", "long:0"),
    "retention.ms": ("604800000", "long:-1"),
    "retention.bytes": ("-1", "long:-1"),
    "cleanup.policy": ("delete", "list:delete|compact"),
    "compression.type": ("producer", "compression"),
    "max.message.bytes": ("1048588", "int:0:268435456"),
    "message.timestamp.type": ("CreateTime", "enum:CreateTime|LogAppendTime"),
    "delete.retention.ms": ("86400000", "long:0"),
    "min.insync.replicas": ("1", "int:1:1"),
    "durability": ("fsync", "enum:fsync|disk|memory|ephemeral"),
    # Tiering (with a cold store): keep this many newest sealed segments on local disk...
    "hot.retain.segments": ("4", "int:0:1000000"),
    # ...and at most this many bytes of them (0 = no byte bound); the stricter bound wins.
    "hot.retain.bytes": ("0", "long:0"),
}

TOPIC_CONFIG_NAMES = tuple(_TOPIC_CONFIGS)


def _check(name: str, raw: str, kind: str) -> Any:
    parts = kind.split(":")
    head = parts[0]
    if head in ("int", "long"):
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r}: not an integer") from None
        low = int(parts[1]) if len(parts) > 1 else None
        high = int(parts[2]) if len(parts) > 2 else None
        if (low is not None and value < low) or (high is not None and value > high):
            raise ConfigError(f"{name}={value}: must be in [{low}, {high if high is not None else 'inf'}]")
        return value
    if head == "enum":
        options = parts[1].split("|")
        if raw not in options:
            raise ConfigError(f"{name}={raw!r}: must be one of {', '.join(options)}")
        return raw
    if head == "list":
        options = parts[1].split("|")
        items = [x.strip() for x in raw.split(",") if x.strip()]
        if not items or any(x not in options for x in items):
            raise ConfigError(f"{name}={raw!r}: must be a comma list of {', '.join(options)}")
        return ",".join(items)
    if head == "compression":
        if raw in ("producer", "uncompressed"):
            return raw
        codec_from_name(raw)
        return raw
    raise AssertionError(kind)


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
    hot_retain_segments: int = 4
    hot_retain_bytes: int = 0
    overrides: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, overrides: Mapping[str, str] | None = None, defaults: Mapping[str, str] | None = None) -> TopicConfig:
        overrides = dict(overrides or {})
        merged: dict[str, Any] = {}
        for name, (default, kind) in _TOPIC_CONFIGS.items():
            merged[name] = _check(name, (defaults or {}).get(name, default), kind)
        for name, raw in overrides.items():
            if name not in _TOPIC_CONFIGS:
                raise ConfigError(f"unknown topic config {name!r}; known: {', '.join(TOPIC_CONFIG_NAMES)}")
            merged[name] = _check(name, str(raw), _TOPIC_CONFIGS[name][1])
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
            durability=Durability.parse(merged["durability"]),
            hot_retain_segments=merged["hot.retain.segments"],
            hot_retain_bytes=merged["hot.retain.bytes"],
            overrides={k: str(v) for k, v in overrides.items()},
        )

    def effective(self, defaults: Mapping[str, str] | None = None) -> dict[str, tuple[str, bool]]:
        """Every config name -> (value, is_default), as DescribeConfigs reports them."""
        out: dict[str, tuple[str, bool]] = {}
        for name, (default, _kind) in _TOPIC_CONFIGS.items():
            if name in self.overrides:
                out[name] = (self.overrides[name], False)
            else:
                out[name] = ((defaults or {}).get(name, default), True)
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

    def validate(self) -> None:
        if not 1 <= self.wal_shards <= 64:
            raise ConfigError(f"wal_shards={self.wal_shards}: must be in [1, 64]")
        if self.wal_file_bytes < 64 * 1024:
            raise ConfigError("wal_file_bytes must be at least 64 KiB")
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
        if self.meta_publish_interval_ms < 0:
            raise ConfigError("meta_publish_interval_ms must not be negative")
        if self.cold_range_cache_bytes < 0 or self.cold_read_ahead_segments < 0:
            raise ConfigError("cold cache sizes and read-ahead must not be negative")
        unknown = sorted(set(self.topic_defaults) - set(TOPIC_CONFIG_NAMES))
        if unknown:
            raise ConfigError(
                f"unknown topic config default(s) {', '.join(map(repr, unknown))} (in TOML, quote dotted names: "
                f'"retention.ms" = "86400000"); known: {", ".join(TOPIC_CONFIG_NAMES)}'
            )
        topic = TopicConfig.parse(None, self.topic_defaults)
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
