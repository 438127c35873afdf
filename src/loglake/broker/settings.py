"""The broker's settings: one table (`BROKER_SETTINGS`), and one loader for the three sources.

The table has a row per setting of `BrokerConfig` (and per engine setting Kafka has a name for):
its Kafka name, DescribeConfigs type, default, inclusive bounds, one line of documentation and
whether it is dynamic. Everything else is derived from it: `BrokerConfig`'s defaults and range
checks, the dynamic broker configs and the DescribeConfigs answer of the BROKER resource
(`loglake.broker.dynamic_config`), and README.md's table of settings (scripts/settings_table.py;
tests/test_broker_settings_table.py fails when it is stale). Engine settings (`EngineConfig`, the
TOML table ``[engine]``) stay the engine's: a row for one names it, and takes its default and
range from the engine.

Every field of `BrokerConfig` is a setting; every field of `EngineConfig` is one too, under the
TOML table ``[engine]``. A value can come from

* a flag (``--listen``; the serve command passes flags it was given),
* the environment: ``LOGLAKE_<NAME>`` for broker settings, ``LOGLAKE_ENGINE__<NAME>`` for engine
  settings (``LOGLAKE_<NAME>`` also works for an engine setting whose name no broker setting has,
  e.g. ``LOGLAKE_MEMORY_BUDGET_BYTES``),
* the TOML file given with ``--config`` (top level, ``[engine]``, ``[topic_defaults]``),
* the default,

in that order of precedence. Each value is checked for its type and, where its row has bounds,
its range, and an error names the setting, the bad value, where it came from (``--flag``,
``LOGLAKE_X``, ``FILE:LINE``) and what is allowed. `Loaded.sources` keeps where every effective
value came from, for ``loglake serve --print-config``.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from enum import Enum
from typing import Any, TypeVar

from loglake.broker.kafka_broker_configs import KAFKA_BROKER_CONFIGS, READ_ONLY, KafkaBrokerConfig
from loglake.broker.txn.coordinator import TxnSettings
from loglake.engine.config import PARTITIONS_PER_TOPIC_MAX, TOPIC_CONFIGS, ConfigType, EngineConfig
from loglake.errors import ConfigError
from loglake.logsafe import RATE_LIMIT_INTERVAL_S

#: Cluster mode flushes its buffered batches to one bucket object at this size (KafScale's
#: default, 4 MB)...
OBJECT_FLUSH_BYTES = 4 * 1024 * 1024
#: ...or once the oldest buffered batch is this old (KafScale's default, 500 ms).
OBJECT_FLUSH_MS = 500
#: Bound on the flush buffer's bytes: buffered plus the flush in flight (16 flushes' worth at the
#: default); `object_flush_bytes` may not pass it (loglake.cluster.flusher).
FLUSH_BUFFER_BYTES_MAX = 64 * 1024 * 1024
#: A cluster broker that has not reached etcd or the bucket for this long stops leading and hands
#: its partitions to the others (loglake.cluster.health): above the lease TTL's default (3 s), so
#: an etcd member's election passes first, and above a few failed PUT retries, so one slow S3
#: answer does not move partitions.
CLUSTER_UNREACHABLE_RELEASE_MS = 5000

ENV_PREFIX = "LOGLAKE_"
ENGINE_ENV_PREFIX = "LOGLAKE_ENGINE__"
#: Fields of BrokerConfig that are not settings themselves: TOML tables, and where values came from.
TABLES = ("engine", "topic_defaults", "sources")
#: EngineConfig fields that are no setting: topic defaults have their own table, and accepting a
#: loss of acknowledged data is a one-time decision (`serve --accept-data-loss`), never a default.
NOT_SETTINGS = frozenset({"topic_defaults", "accept_data_loss"})
#: Name prefix of a row that names an engine setting (as ``--print-config`` and DescribeConfigs do).
ENGINE_PREFIX = "engine."
INT32_MAX = 2**31 - 1
KIB = 1024
MIB = 1024 * KIB
DAY_MS = 24 * 3600 * 1000

#: What a setting may hold: TOML's scalars, a list of strings as a tuple, or None (unset).
SettingValue = bool | int | float | str | tuple[str, ...] | None
#: A value `check_value` accepted, as the setting's type: a list setting as a list, a table as a dict.
CheckedValue = bool | int | float | str | list[str] | dict[str, object]


class Dynamic(Enum):
    """Whether AlterConfigs may change a setting on the running broker, and where (Kafka's update modes)."""

    #: Only at start-up (file, environment, flag); DescribeConfigs says read_only.
    READ_ONLY = "read-only"
    #: On this broker's resource (its node id) only.
    PER_BROKER = "per-broker"
    #: On this broker's resource or the cluster-wide default one ("").
    CLUSTER_WIDE = "cluster-wide"


@dataclass(frozen=True)
class BrokerSetting:
    """One row of the table: a broker setting (or an engine setting Kafka has a name for)."""

    #: The `BrokerConfig` field (the TOML key; ``LOGLAKE_<NAME>``), or ``engine.<EngineConfig field>``.
    name: str
    #: Kafka's name for it; None where Kafka has none (DescribeConfigs then uses `name`).
    kafka: str | None
    #: The type DescribeConfigs v3+ reports.
    type: ConfigType
    default: SettingValue
    #: Inclusive [low, high] of a number, or None (unbounded, or checked where it acts).
    bounds: tuple[int, int] | None
    #: One line, as DescribeConfigs documents it and README.md's table shows it.
    doc: str
    dynamic: Dynamic = Dynamic.READ_ONLY
    #: Described with a null value (URLs may carry credentials; passwords).
    sensitive: bool = False
    #: More Kafka names described with the same value (``broker.id`` beside ``node.id``).
    aliases: tuple[str, ...] = ()
    #: What separates the items of a list setting written as one string, and joins them when it
    #: is described. Not a comma: the string is handed whole to the setting's owner, which splits
    #: it (super_users: `loglake.broker.config.split_principals`), and a TOML array's elements are
    #: taken as they are.
    separator: str = ","

    @property
    def described_as(self) -> str:
        """The name DescribeConfigs and AlterConfigs know it by."""
        return self.kafka or self.name

    @property
    def engine_field(self) -> str | None:
        """The `EngineConfig` field of an engine row, else None."""
        return self.name[len(ENGINE_PREFIX):] if self.name.startswith(ENGINE_PREFIX) else None

    def allowed(self) -> str:
        """The bounds as every message about them and README.md's table show them."""
        if self.bounds is None:
            raise ValueError(f"setting {self.name} has no bounds")
        return f"[{self.bounds[0]}, {self.bounds[1]}]"

    def in_bounds(self, value: float) -> bool:
        return self.bounds is None or self.bounds[0] <= value <= self.bounds[1]


def _engine_default(name: str) -> SettingValue:
    """An engine setting's default, from its owner (`EngineConfig`)."""
    (f,) = (f for f in fields(EngineConfig) if f.name == name)
    if f.default is MISSING:
        raise TypeError(f"engine setting {name} has no plain default")
    value: SettingValue = f.default
    return value


_S, _CW = BrokerSetting, Dynamic.CLUSTER_WIDE
_INT, _LONG, _DOUBLE, _STRING, _BOOLEAN, _LIST, _PASSWORD = (
    ConfigType.INT, ConfigType.LONG, ConfigType.DOUBLE, ConfigType.STRING, ConfigType.BOOLEAN, ConfigType.LIST,
    ConfigType.PASSWORD,
)
_TXN = TxnSettings()

#: Every broker setting, in the order README.md lists them. Kafka's type where Kafka names the
#: setting; loglake's own numbers are LONG, as DescribeConfigs has always reported them. A default
#: or bound that a module acting on it owns (and that is cheap to import) is taken from there.
BROKER_SETTING_ROWS: tuple[BrokerSetting, ...] = (
    # where the data is, where clients connect
    _S("data_dir", "log.dirs", _STRING, "./loglake-data", None, "The data directory."),
    _S("cold_store", None, _STRING, None, None,
       "The cold tier, s3://bucket/prefix or file:///dir: sealed segments and metadata go there.", sensitive=True),
    _S("listen", "listeners", _STRING, ("127.0.0.1:9092",), None,
       "Where the broker listens: PROTOCOL://HOST:PORT (a bare HOST:PORT is PLAINTEXT), one per protocol."),
    _S("advertised_listener", "advertised.listeners", _STRING, (), None,
       "The address clients are told to connect to, per listener (by protocol; a bare HOST:PORT by position)."),
    _S("port_file", None, _STRING, None, None, "Write the listening ports there once accepting, one per line in listener order."),
    _S("metrics_listen", None, _STRING, None, None, "HOST:PORT of Prometheus /metrics, /healthz and /readyz."),
    _S("schema_registry_listen", None, _STRING, None, None,
       "[http://|https://]HOST:PORT of the Confluent-compatible schema registry's REST API (https: the ssl_* certificate; docs/SCHEMA_REGISTRY.md)."),
    # TLS, SASL, ACLs (docs/SECURITY.md)
    _S("ssl_cert", None, _STRING, None, None, "PEM certificate chain of SSL and SASL_SSL listeners."),
    _S("ssl_key", None, _STRING, None, None, "PEM private key of ssl_cert (unless it is in that file)."),
    _S("ssl_key_password", "ssl.key.password", _PASSWORD, None, None, "Password of an encrypted ssl_key.", sensitive=True),
    _S("ssl_ca", None, _STRING, None, None, "PEM CA certificates that client certificates must chain to."),
    _S("ssl_client_auth", "ssl.client.auth", _STRING, "none", None,
       "Whether SSL listeners ask for a client certificate: none, requested or required."),
    _S("ssl_principal_mapping_rules", "ssl.principal.mapping.rules", _STRING, "DEFAULT", None,
       "How a client certificate's subject DN becomes the principal name."),
    _S("sasl_enabled_mechanisms", "sasl.enabled.mechanisms", _LIST, "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512", None,
       "What SASL listeners offer: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER (with sasl_oauthbearer_validator)."),
    _S("connection_failed_authentication_delay_ms", "connection.failed.authentication.delay.ms", _INT, 100, (0, 60_000),
       "How long a connection whose SASL authentication failed stays open after the error is sent."),
    # KIP-368; Kafka's is a LONG with no bound: a year is past any session a client would keep
    _S("connections_max_reauth_ms", "connections.max.reauth.ms", _LONG, 0, (0, 365 * DAY_MS),
       "SASL session lifetime told to clients; a connection not re-authenticated within it is closed at its next request; 0: off."),
    # SASL/OAUTHBEARER (loglake.broker.security.oauthbearer; docs/SECURITY.md): off unless a validator is named
    _S("sasl_oauthbearer_validator", None, _STRING, None, None,
       "How OAUTHBEARER tokens are checked: unsecured (unsigned JWTs, Kafka's unsecured validator: tests only) or jwks; unset: off."),
    _S("sasl_oauthbearer_jwks_endpoint_url", "sasl.oauthbearer.jwks.endpoint.url", _STRING, None, None,
       "The identity provider's JWKS (https://, http:// or file:///): the keys OAUTHBEARER tokens must be signed with."),
    _S("sasl_oauthbearer_jwks_endpoint_refresh_ms", "sasl.oauthbearer.jwks.endpoint.refresh.ms", _LONG, 3_600_000, (1000, DAY_MS),
       "How long fetched JWKS keys are kept before they are fetched again (an unknown key id fetches at once)."),
    _S("sasl_oauthbearer_expected_issuer", "sasl.oauthbearer.expected.issuer", _STRING, None, None,
       "The iss claim a JWKS-checked token must carry; unset: not checked."),
    _S("sasl_oauthbearer_expected_audience", "sasl.oauthbearer.expected.audience", _LIST, None, None,
       "Audiences, one of which a JWKS-checked token's aud claim must name; unset: not checked."),
    _S("sasl_oauthbearer_sub_claim_name", "sasl.oauthbearer.sub.claim.name", _STRING, "sub", None,
       "The token claim that names the principal (User:<its value>)."),
    _S("sasl_oauthbearer_scope_claim_name", "sasl.oauthbearer.scope.claim.name", _STRING, "scope", None,
       "The token claim holding its scopes (a string, or a list of non-empty strings), logged with the login."),
    _S("sasl_oauthbearer_clock_skew_seconds", "sasl.oauthbearer.clock.skew.seconds", _INT, 30, (0, 3600),
       "Clock difference allowed when a token's exp, nbf and iat are checked."),
    # Kafka has no failed-login throttle (loglake.broker.security.login_throttle, docs/SECURITY.md)
    _S("sasl_login_failures_per_source", None, _LONG, 20, (0, 1_000_000),
       "Failed SASL logins from one address (IPv6: its /64) per window before its logins are refused unchecked; 0: no limit."),
    _S("sasl_login_failures_per_principal", None, _LONG, 40, (0, 1_000_000),
       "Failed SASL logins as one principal, all addresses together, per window before its logins are refused unchecked; 0: no limit."),
    _S("sasl_login_failure_window_ms", None, _LONG, 60_000, (1000, DAY_MS),
       "The window of the failed-login limits: each limit's worth of failures is forgotten per window."),
    _S("allow_unauthenticated_public_listener", None, _BOOLEAN, False, None,
       "Start even though a listener without client authentication is on a non-loopback address."),
    # separated by ";" as in Kafka: a certificate principal (User:CN=admin,OU=eng) holds commas
    _S("super_users", "super.users", _STRING, (), None,
       "Principals (User:admin) every ACL check allows, separated by ';' (a TOML array: one per element).",
       separator=";"),
    _S("allow_everyone_if_no_acl_found", "allow.everyone.if.no.acl.found", _BOOLEAN, None, None,
       "Whether a resource no ACL names is open to everyone; unset: only while no listener authenticates clients."),
    _S("event_loop", None, _STRING, "asyncio", None, "The event loop: asyncio, or uvloop (the fast extra)."),
    # cluster mode (docs/CLUSTER.md)
    _S("node_id", "node.id", _INT, 0, (0, INT32_MAX), "This broker's id; in cluster mode unique among live brokers.",
       aliases=("broker.id",)),
    _S("cluster", None, _STRING, None, None,
       "Cluster mode: etcd://HOST:PORT[,HOST:PORT...]/PREFIX; unset runs one broker on its own data directory."),
    _S("rack", "broker.rack", _STRING, None, None, "This broker's rack, in its cluster registration and Metadata."),
    # at least etcd's own shortest lease with default timings (about 1.5 s)
    _S("cluster_lease_ttl_s", None, _LONG, 3, (2, 3600),
       "Cluster mode: TTL of the broker's etcd lease; a dead broker's partitions move about this long (+0.5 s) after it stopped."),
    _S("object_flush_bytes", None, _LONG, OBJECT_FLUSH_BYTES, (KIB, FLUSH_BUFFER_BYTES_MAX),
       "Cluster mode: flush the buffered batches of every partition to one bucket object at this many bytes."),
    _S("object_flush_ms", None, _LONG, OBJECT_FLUSH_MS, (1, 3_600_000),
       "Cluster mode: flush them once the oldest buffered batch is this old."),
    _S("cluster_unreachable_release_ms", None, _LONG, CLUSTER_UNREACHABLE_RELEASE_MS, (500, 600_000),
       "Cluster mode: a broker that has not reached etcd or the bucket for this long leads nothing (its partitions move) and is not ready."),
    _S("cluster_maintenance_interval_ms", None, _LONG, 10_000, (100, DAY_MS),
       "Cluster mode: how often a broker merges its partitions' flush ranges into segments and sweeps unreferenced objects."),
    # topics
    _S("auto_create_topics", "auto.create.topics.enable", _BOOLEAN, True, None,
       "Create unknown topics on metadata requests and produce."),
    _S("default_partitions", "num.partitions", _INT, 1, (1, PARTITIONS_PER_TOPIC_MAX),
       "Partitions of auto-created topics and of CreateTopics with -1."),
    # connections and requests (docs/RELIABILITY.md, "Overload")
    _S("max_frame_bytes", "socket.request.max.bytes", _INT, 100 * MIB, (MIB, INT32_MAX), "Largest request accepted, in bytes."),
    _S("max_inflight_per_connection", None, _LONG, 64, (1, 10_000),
       "Requests other than Produce one connection may have in flight before the broker stops reading from it "
       "(Produce requests are bounded by their bytes: docs/RELIABILITY.md, \"Overload\")."),
    _S("idle_timeout_ms", "connections.max.idle.ms", _LONG, 600_000, (1000, 7 * DAY_MS), "Close connections idle this long.",
       dynamic=_CW),
    # Kafka has none: a request must arrive within this of its first byte (a stalled half-frame
    # would otherwise hold its bytes until the idle timeout)
    _S("frame_receive_timeout_ms", None, _LONG, 30_000, (100, DAY_MS),
       "Close a connection whose request has not fully arrived this long after its first byte."),
    # Kafka's max.connections is an INT defaulting to Int.MaxValue ("no bound"): any int32 from 1 is taken.
    _S("max_connections", "max.connections", _INT, 10_000, (1, INT32_MAX),
       "Most concurrent client connections; new ones beyond it are closed at once.", dynamic=_CW),
    # Kafka's default is -1 (no bound); loglake bounds it (docs/RELIABILITY.md, "Overload")
    _S("queued_max_request_bytes", "queued.max.request.bytes", _LONG, 128 * MIB, (MIB, 2**40),
       "Request bytes read and not yet handled, all connections; while spent, connections are not read."),
    _S("log_rate_limit_ms", None, _LONG, int(RATE_LIMIT_INTERVAL_S * 1000), (0, DAY_MS),
       "Repeats of one warning (same condition, same peer) within this are summarised in one line; 0 logs each."),
    # classic consumer groups (docs/GROUPS.md)
    _S("group_initial_rebalance_delay_ms", "group.initial.rebalance.delay.ms", _INT, 3000, (0, 300_000),
       "How long the first rebalance of a new classic group waits for more members."),
    _S("group_min_session_timeout_ms", "group.min.session.timeout.ms", _INT, 6000, (1, INT32_MAX),
       "Smallest session timeout a classic member may ask for."),
    _S("group_max_session_timeout_ms", "group.max.session.timeout.ms", _INT, 1_800_000, (1, INT32_MAX),
       "Largest session timeout a classic member may ask for."),
    _S("offsets_retention_minutes", "offsets.retention.minutes", _INT, 10080, (1, 10 * 365 * 24 * 60),
       "Committed offsets of a group that stayed empty this long expire."),
    # KIP-848 consumer groups: checked against each other by ConsumerLimits.check (docs/GROUPS.md)
    _S("group_consumer_session_timeout_ms", "group.consumer.session.timeout.ms", _INT, 45_000, None,
       "Session timeout of consumer-protocol (KIP-848) members."),
    _S("group_consumer_min_session_timeout_ms", "group.consumer.min.session.timeout.ms", _INT, 45_000, None,
       "Smallest consumer.session.timeout.ms a group may set."),
    _S("group_consumer_max_session_timeout_ms", "group.consumer.max.session.timeout.ms", _INT, 60_000, None,
       "Largest consumer.session.timeout.ms a group may set."),
    _S("group_consumer_heartbeat_interval_ms", "group.consumer.heartbeat.interval.ms", _INT, 5_000, None,
       "Heartbeat interval given to consumer-protocol members."),
    _S("group_consumer_min_heartbeat_interval_ms", "group.consumer.min.heartbeat.interval.ms", _INT, 5_000, None,
       "Smallest consumer.heartbeat.interval.ms a group may set."),
    _S("group_consumer_max_heartbeat_interval_ms", "group.consumer.max.heartbeat.interval.ms", _INT, 15_000, None,
       "Largest consumer.heartbeat.interval.ms a group may set."),
    _S("group_consumer_max_size", "group.consumer.max.size", _INT, 1000, None, "Most members of a consumer-protocol group."),
    _S("group_consumer_assignors", "group.consumer.assignors", _LIST, "uniform,range", None,
       "Server-side assignors (uniform, range); the first is the default."),
    _S("group_consumer_migration_policy", "group.consumer.migration.policy", _STRING, "bidirectional", None,
       "Which empty groups may change between the classic and consumer protocols."),
    # KIP-932 share groups (docs/SHARE_GROUPS.md); bounds are Kafka 4.1's
    _S("group_share_session_timeout_ms", "group.share.session.timeout.ms", _INT, 45_000, (1000, INT32_MAX),
       "A share-group member that does not heartbeat for this long leaves the group."),
    _S("group_share_min_session_timeout_ms", "group.share.min.session.timeout.ms", _INT, 45_000, (1000, INT32_MAX),
       "Smallest share.session.timeout.ms a share group may set."),
    _S("group_share_max_session_timeout_ms", "group.share.max.session.timeout.ms", _INT, 60_000, (1000, INT32_MAX),
       "Largest share.session.timeout.ms a share group may set."),
    _S("group_share_heartbeat_interval_ms", "group.share.heartbeat.interval.ms", _INT, 5_000, (1000, INT32_MAX),
       "Heartbeat interval given to share-group members."),
    _S("group_share_min_heartbeat_interval_ms", "group.share.min.heartbeat.interval.ms", _INT, 5_000, (1000, INT32_MAX),
       "Smallest share.heartbeat.interval.ms a share group may set."),
    _S("group_share_max_heartbeat_interval_ms", "group.share.max.heartbeat.interval.ms", _INT, 15_000, (1000, INT32_MAX),
       "Largest share.heartbeat.interval.ms a share group may set."),
    _S("group_share_max_size", "group.share.max.size", _INT, 200, (1, 1000), "Most members of a share group."),
    _S("group_share_record_lock_duration_ms", "group.share.record.lock.duration.ms", _INT, 30_000, (1000, 3_600_000),
       "How long a share consumer holds the records it acquired before they become available again."),
    _S("group_share_delivery_count_limit", "group.share.delivery.count.limit", _INT, 5, (2, 10),
       "Deliveries of a record before a share group archives it instead of delivering it again."),
    _S("group_share_partition_max_record_locks", "group.share.partition.max.record.locks", _INT, 2000, (100, 10_000),
       "Most in-flight records (acquired or not yet past the start offset) per share-partition."),
    _S("group_share_max_share_sessions", "group.share.max.share.sessions", _INT, 2000, (1, 1_000_000),
       "Most share sessions (one per share consumer and broker) the broker keeps."),
    # KIP-227 fetch sessions (docs/PROTOCOL.md, "Fetch sessions")
    _S("max_incremental_fetch_session_cache_slots", "max.incremental.fetch.session.cache.slots", _INT, 1000, (0, 1_000_000),
       "Most incremental fetch sessions (KIP-227) the broker keeps; 0: none."),
    _S("min_incremental_fetch_session_eviction_ms", "min.incremental.fetch.session.eviction.ms", _INT, 120_000, (100, DAY_MS),
       "Fetch sessions idle this long are evicted; younger ones are not displaced by bigger ones."),
    _S("fetch_session_max_partitions", None, _LONG, 10_000, (1, 1_000_000), "Most partitions one fetch session may hold."),
    # transactions (docs/TRANSACTIONS.md)
    _S("transaction_max_timeout_ms", "transaction.max.timeout.ms", _INT, _TXN.max_timeout_ms, (1, INT32_MAX),
       "Largest transaction.timeout.ms a producer may ask for."),
    _S("transactional_id_expiration_ms", "transactional.id.expiration.ms", _INT, _TXN.id_expiration_ms, (1, INT32_MAX),
       "Transactional ids idle this long are forgotten."),
    _S("transaction_abort_timed_out_transaction_cleanup_interval_ms",
       "transaction.abort.timed.out.transaction.cleanup.interval.ms", _INT, _TXN.cleanup_interval_ms, (1, INT32_MAX),
       "How often transactions past their timeout are aborted."),
    _S("transactional_ids_max", None, _LONG, _TXN.ids_max, (1, 10_000_000),
       "Most transactional ids kept; a new one past it gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED."),
    # client quotas (docs/SECURITY.md, "Quotas")
    _S("quota_window_num", "quota.window.num", _INT, 11, (2, 1000), "Samples a client's rates are measured over."),
    _S("quota_window_size_seconds", "quota.window.size.seconds", _INT, 1, (1, 3600), "Length of one sample, in seconds."),
    # engine settings Kafka has a name for: default and range are the engine's (EngineConfig.validate)
    _S("engine.cleaner_io_max_bytes_per_second", "log.cleaner.io.max.bytes.per.second", _DOUBLE,
       _engine_default("cleaner_io_max_bytes_per_second"), None,
       "Cleaner and merger I/O, read plus written, in bytes per second (0 = unlimited).", dynamic=_CW),
    _S("engine.cleaner_threads", "log.cleaner.threads", _INT, _engine_default("cleaner_threads"), None,
       "Cleaner threads; 0 turns compaction and merging off."),
    _S("engine.cleaner_dedupe_buffer_bytes", "log.cleaner.dedupe.buffer.size", _LONG,
       _engine_default("cleaner_dedupe_buffer_bytes"), None, "Compaction's key map bound, in bytes."),
    _S("engine.cleaner_backoff_ms", "log.cleaner.backoff.ms", _LONG, _engine_default("cleaner_backoff_ms"), None,
       "Pause between cleaner passes that found nothing to do."),
)
#: The table by `BrokerSetting.name`.
BROKER_SETTINGS: Mapping[str, BrokerSetting] = {s.name: s for s in BROKER_SETTING_ROWS}
#: Topic configs whose broker-wide default (their Kafka broker synonym, `TopicConfigKey.broker_synonym`)
#: AlterConfigs may change at runtime, on the node or cluster-wide: the ones that only time or size
#: work when it happens (see loglake.broker.dynamic_config for why).
DYNAMIC_TOPIC_DEFAULTS = (
    "retention.ms", "retention.bytes", "segment.ms", "segment.bytes", "max.message.bytes",
    "delete.retention.ms", "min.cleanable.dirty.ratio", "min.compaction.lag.ms", "max.compaction.lag.ms",
    "flush.messages", "flush.ms",
)

#: Kafka broker configs no row of the table carries (by its Kafka name or an alias) and no topic
#: config's broker default is: loglake does not act on them. DescribeConfigs lists them with
#: Kafka's default; those Kafka can change at runtime (`INERT_DYNAMIC`) AlterConfigs accepts and
#: stores with no effect, the read-only ones it refuses as Kafka does (docs/OPERATIONS.md).
KAFKA_ONLY: Mapping[str, KafkaBrokerConfig] = {
    name: k for name, k in KAFKA_BROKER_CONFIGS.items()
    if name not in {n for s in BROKER_SETTING_ROWS for n in (s.described_as, *s.aliases)}
    and name not in {t.broker_synonym for t in TOPIC_CONFIGS.values()}
}
#: The Kafka-only configs AlterConfigs accepts and stores ("accepted, no effect here").
INERT_DYNAMIC: Mapping[str, KafkaBrokerConfig] = {n: k for n, k in KAFKA_ONLY.items() if k.mode != READ_ONLY}

_T = TypeVar("_T", bool, int, str)


def default_of(name: str, kind: type[_T]) -> _T:
    """A broker setting's default from the table, as `BrokerConfig` declares it."""
    value = BROKER_SETTINGS[name].default
    if not isinstance(value, kind):
        raise TypeError(f"broker setting {name}: default {value!r} is not a {kind.__name__}")
    return value


def list_default(name: str) -> Callable[[], list[str]]:
    """The default factory of a list setting (a fresh list per `BrokerConfig`)."""
    value = BROKER_SETTINGS[name].default
    if not isinstance(value, tuple):
        raise TypeError(f"broker setting {name}: default {value!r} is not a tuple of strings")
    items = [str(v) for v in value]
    return lambda: list(items)


@dataclass
class Loaded:
    """Values by setting name (engine settings as ``engine.NAME``) and where each came from."""

    # Each of the type its BrokerConfig field declares (check_value saw to it): the config is built
    # from this mapping, which no type spells.
    values: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, object] = field(default_factory=dict)
    topic_defaults: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)


def _kind(f: dataclasses.Field[object]) -> type:
    """The Python type a setting holds, from its annotation (`from __future__` makes it a string)."""
    ann = str(f.type).replace(" ", "")
    for name, kind in (("bool", bool), ("int", int), ("float", float), ("str", str), ("dict", dict), ("list", list)):
        if ann == name or ann.startswith(f"{name}|") or ann.startswith(f"{name}[") or ann.endswith(f"|{name}"):
            return kind
    raise TypeError(f"setting {f.name}: unsupported annotation {f.type!r}")


def _default(f: dataclasses.Field[object]) -> object:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None


def _describe(kind: type) -> str:
    return {
        bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a table",
        list: "a list of strings (or one comma-separated string)",
    }[kind]


def check_value(name: str, kind: type, value: object, source: str, *, from_text: bool) -> CheckedValue:
    """`value` as the setting's type, or ConfigError naming setting, value, source and what is allowed."""
    shown = f"{name}={value!r} (from {source})"
    if kind is list:
        # A list setting (listeners): a TOML array or tuple of strings, or a comma-separated string.
        # One with another separator (super_users) is its owner's to split: a string stays whole,
        # an array is taken element by element.
        split = BROKER_SETTINGS[name].separator == "," if name in BROKER_SETTINGS else True
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()] if split else value
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            if not split:
                return [v.strip() for v in value if v.strip()]
            return [part.strip() for v in value for part in v.split(",") if part.strip()]
        raise ConfigError(f"{shown}: expected {_describe(kind)}, got {type(value).__name__}")
    if from_text and kind is not str:
        text = str(value).strip()
        try:
            if kind is bool:
                if text.lower() in ("1", "true", "yes", "on"):
                    value = True
                elif text.lower() in ("0", "false", "no", "off"):
                    value = False
                else:
                    raise ValueError(text)
            elif kind is int:
                value = int(text.replace("_", ""))
            elif kind is float:
                value = float(text)
        except ValueError:
            raise ConfigError(f"{shown}: expected {_describe(kind)}") from None
    checked: CheckedValue
    if (kind is bool and isinstance(value, bool)) or (kind is int and isinstance(value, int) and not isinstance(value, bool)):
        checked = value
    elif kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        checked = float(value)
    elif (kind is str and isinstance(value, str)) or (kind is dict and isinstance(value, dict)):
        checked = value
    else:
        raise ConfigError(f"{shown}: expected {_describe(kind)}, got {type(value).__name__}")
    setting = BROKER_SETTINGS.get(name)
    if (
        setting is not None and setting.bounds is not None and isinstance(checked, int | float)
        and not setting.in_bounds(checked)
    ):
        raise ConfigError(f"{shown}: out of range, allowed {setting.allowed()}")
    return checked


def _toml_lines(text: str) -> dict[tuple[str, str], int]:
    """(table, key) -> line number of its assignment ('' is the top level)."""
    out: dict[tuple[str, str], int] = {}
    table = ""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        header = re.match(r"^\[\s*([A-Za-z0-9_.\-]+)\s*\]", stripped)
        if header:
            table = header.group(1)
            continue
        key = re.match(r'^(?:"([^"]+)"|\'([^\']+)\'|([A-Za-z0-9_\-]+))\s*=', stripped)
        if key:
            out.setdefault((table, next(g for g in key.groups() if g is not None)), number)
    return out


def load_settings(
    broker_fields: tuple[dataclasses.Field[object], ...],
    config_file: str | None,
    env: Mapping[str, str],
    flags: Mapping[str, object],
) -> Loaded:
    """Read the three sources into checked values with their sources (see the module doc)."""
    out = Loaded()
    broker = {f.name: f for f in broker_fields if f.name not in TABLES}
    engine = {f.name: f for f in fields(EngineConfig) if f.name not in NOT_SETTINGS}
    for name, f in broker.items():
        out.values[name] = _default(f)
        out.sources[name] = "default"
    for name in engine:
        out.sources[f"engine.{name}"] = "default"
    if config_file:
        try:
            with open(config_file, "rb") as fh:
                raw_bytes = fh.read()
            raw = tomllib.loads(raw_bytes.decode("utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc}") from None
        lines = _toml_lines(raw_bytes.decode("utf-8"))

        def where(table: str, key: str) -> str:
            number = lines.get((table, key))
            return f"{config_file}:{number}" if number is not None else config_file

        for key, value in raw.items():
            name = key.replace("-", "_").replace(".", "_")
            if name == "engine":
                if not isinstance(value, dict):
                    raise ConfigError(f"engine={value!r} (from {where('', key)}): expected a table [engine]")
                for ekey, evalue in value.items():
                    ename = ekey.replace("-", "_")
                    if ename == "topic_defaults" and isinstance(evalue, dict):
                        out.topic_defaults.update({str(k): str(v) for k, v in evalue.items()})
                        continue
                    if ename not in engine:
                        raise ConfigError(f"{where('engine', ekey)}: unknown engine setting {ekey!r}; known: {', '.join(sorted(engine))}")
                    src = where("engine", ekey)
                    out.engine[ename] = check_value(f"engine.{ename}", _kind(engine[ename]), evalue, src, from_text=False)
                    out.sources[f"engine.{ename}"] = src
            elif name == "topic_defaults":
                if not isinstance(value, dict):
                    raise ConfigError(f"topic_defaults={value!r} (from {where('', key)}): expected a table [topic_defaults]")
                for tkey, tvalue in value.items():
                    out.topic_defaults[str(tkey)] = str(tvalue).lower() if isinstance(tvalue, bool) else str(tvalue)
                    out.sources[f"topic_defaults.{tkey}"] = where("topic_defaults", str(tkey))
            elif name in broker:
                src = where("", key)
                out.values[name] = check_value(name, _kind(broker[name]), value, src, from_text=False)
                out.sources[name] = src
            else:
                raise ConfigError(f"{where('', key)}: unknown setting {key!r}; known: {', '.join(sorted(broker))}, [engine], [topic_defaults]")
    for var, text in env.items():
        if var.startswith(ENGINE_ENV_PREFIX):
            ename = var[len(ENGINE_ENV_PREFIX) :].lower()
            if ename not in engine:
                raise ConfigError(f"{var}: unknown engine setting {ename!r}; known: {', '.join(sorted(engine))}")
            out.engine[ename] = check_value(f"engine.{ename}", _kind(engine[ename]), text, var, from_text=True)
            out.sources[f"engine.{ename}"] = var
        elif var.startswith(ENV_PREFIX):
            name = var[len(ENV_PREFIX) :].lower()
            if name in broker:
                out.values[name] = check_value(name, _kind(broker[name]), text, var, from_text=True)
                out.sources[name] = var
            elif name in engine and f"{ENGINE_ENV_PREFIX}{name.upper()}" not in env:
                out.engine[name] = check_value(f"engine.{name}", _kind(engine[name]), text, var, from_text=True)
                out.sources[f"engine.{name}"] = var
    for name, value in flags.items():
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        out.values[name] = check_value(name, _kind(broker[name]), value, flag, from_text=False)
        out.sources[name] = flag
    return out


def render(values: Mapping[str, object], engine: Mapping[str, object], topic_defaults: Mapping[str, str], sources: Mapping[str, str]) -> str:
    """The effective configuration as TOML, each value followed by a comment saying where it came
    from; unset optional settings are shown commented out."""

    def line(name: str, value: object, source: str) -> str:
        if value is None:
            return f"# {name} is unset  # {source}"
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, list):
            text = "[" + ", ".join('"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"' for v in value) + "]"
        elif isinstance(value, int | float):
            text = repr(value)
        else:
            text = '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
        return f"{name} = {text}  # {source}"

    lines = [line(n, v, sources.get(n, "default")) for n, v in values.items() if n not in TABLES]
    lines += ["", "[engine]"]
    lines += [line(n, v, sources.get(f"engine.{n}", "default")) for n, v in engine.items() if n not in NOT_SETTINGS]
    lines += ["", "[topic_defaults]"]
    lines += [line(f'"{n}"', v, sources.get(f"topic_defaults.{n}", "default")) for n, v in sorted(topic_defaults.items())]
    return "\n".join(lines) + "\n"


__all__ = [
    "BROKER_SETTINGS", "BROKER_SETTING_ROWS", "DYNAMIC_TOPIC_DEFAULTS", "ENGINE_ENV_PREFIX", "ENV_PREFIX", "INERT_DYNAMIC",
    "KAFKA_ONLY", "BrokerSetting", "Dynamic", "Loaded", "check_value", "default_of", "list_default", "load_settings", "render",
]
