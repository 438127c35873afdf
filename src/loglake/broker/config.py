"""Broker settings: command-line flags, a TOML file (`--config`) and LOGLAKE_* environment variables.

Precedence: flags > environment > TOML file > defaults. Engine options go in the TOML table
`[engine]` (EngineConfig field names) and topic defaults in `[topic_defaults]` (Kafka names).
Every setting is a row of `loglake.broker.settings.BROKER_SETTINGS` (Kafka name, default, bounds,
documentation, dynamic or not): the defaults below are read from it, and reading, type and range
checks live there too.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from loglake.broker.overload import rss_budget
from loglake.broker.settings import (
    BROKER_SETTINGS,
    check_value,
    default_of,
    list_default,
    load_settings,
    render,
)
from loglake.engine.config import EngineConfig
from loglake.errors import ConfigError
from loglake.extras import MissingExtraError

if TYPE_CHECKING:
    from loglake.broker.groups.limits import ConsumerLimits
    from loglake.broker.listeners import Listener
    from loglake.broker.share.limits import ShareLimits

def parse_host_port(value: str, what: str) -> tuple[str, int]:
    from loglake.broker.listeners import parse_host_port as parse

    return parse(value, what)


#: The URL schemes `--schema-registry-listen` takes; a bare HOST:PORT is the first.
REGISTRY_SCHEMES = ("http", "https")


def parse_registry_listen(value: str) -> tuple[bool, str, int]:
    """`--schema-registry-listen` [http://|https://]HOST:PORT as (whether HTTPS, host, port)."""
    scheme, sep, rest = value.partition("://")
    if not sep:
        scheme, rest = REGISTRY_SCHEMES[0], value
    if scheme.lower() not in REGISTRY_SCHEMES:
        raise ConfigError(f"--schema-registry-listen {value}: the scheme is http:// or https://, not {scheme}://")
    host, port = parse_host_port(rest, "--schema-registry-listen")
    return scheme.lower() == "https", host, port


def _simple_principal(text: str) -> bool:
    """``Type:name`` whose name has no ``=`` (so not a certificate's DN, which has commas of its own)."""
    kind, sep, name = text.strip().partition(":")
    return bool(sep and kind and name) and "=" not in name


def split_principals(value: list[str] | str, source: str) -> list[str]:
    """`super_users` as a list of ``Type:name`` principals, or ConfigError naming the bad entry.

    A string (a flag, LOGLAKE_SUPER_USERS, a TOML string) is separated by ``;``, as Kafka's
    super.users is, so a certificate principal such as ``User:CN=admin,OU=eng,O=example`` is one
    principal; a list (a TOML array) is taken element by element, never split. A piece of a
    string whose comma-separated parts are each a ``Type:name`` principal without ``=`` in the
    name (``User:a,User:b``) is still read as those principals, as before ``;`` was the separator.
    """
    if isinstance(value, str):
        out = []
        for piece in value.split(BROKER_SETTINGS["super_users"].separator):
            parts = piece.split(",")
            out += [p.strip() for p in parts] if len(parts) > 1 and all(map(_simple_principal, parts)) else [piece.strip()]
    else:
        out = [item.strip() for item in value]
    out = [p for p in out if p]
    for principal in out:
        kind, sep, name = principal.partition(":")
        if not sep or not kind or not name:
            raise ConfigError(f"super_users={principal!r} (from {source}): expected a principal like User:admin")
    return out


#: Event loops a broker can run on (setting `event_loop`).
EVENT_LOOPS = ("asyncio", "uvloop")

@dataclass
class BrokerConfig:
    """The broker's settings, each with its default from `BROKER_SETTINGS` (unset ones are None)."""

    #: `serve --accept-data-loss` only (not a dataclass field, so no setting): open a data
    #: directory that lost acknowledged records (engine/acked.py)
    accept_data_loss = False

    data_dir: str = default_of("data_dir", str)
    cold_store: str | None = None
    #: Listeners, each PROTOCOL://HOST:PORT or a bare HOST:PORT (PLAINTEXT); see loglake.broker.listeners.
    listen: list[str] = field(default_factory=list_default("listen"))
    #: What Metadata advertises per listener: matched by protocol, or by position when bare HOST:PORT.
    advertised_listener: list[str] = field(default_factory=list_default("advertised_listener"))
    port_file: str | None = None
    metrics_listen: str | None = None
    #: HOST:PORT of the schema registry's REST API (loglake.registry; off when unset)
    schema_registry_listen: str | None = None
    #: TLS of SSL listeners (docs/SECURITY.md): PEM certificate chain, private key (and its password),
    #: the CAs client certificates must chain to, and whether one is asked for: none|requested|required.
    ssl_cert: str | None = None
    ssl_key: str | None = None
    ssl_key_password: str | None = None
    ssl_ca: str | None = None
    ssl_client_auth: str = default_of("ssl_client_auth", str)
    #: Kafka's ssl.principal.mapping.rules: client certificate subject DN -> principal name.
    ssl_principal_mapping_rules: str = default_of("ssl_principal_mapping_rules", str)
    #: Kafka's sasl.enabled.mechanisms: what SASL listeners offer (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).
    sasl_enabled_mechanisms: str = default_of("sasl_enabled_mechanisms", str)
    #: Kafka's connection.failed.authentication.delay.ms: how long a connection whose SASL
    #: authentication failed is kept (answered, then closed) before it is closed.
    connection_failed_authentication_delay_ms: int = default_of("connection_failed_authentication_delay_ms", int)
    #: KIP-368: the SASL session lifetime (ms) SaslAuthenticate tells clients; 0: sessions never expire.
    connections_max_reauth_ms: int = default_of("connections_max_reauth_ms", int)
    #: SASL/OAUTHBEARER (loglake.broker.security.oauthbearer): how tokens are checked, and against what.
    sasl_oauthbearer_validator: str | None = None
    sasl_oauthbearer_jwks_endpoint_url: str | None = None
    sasl_oauthbearer_jwks_endpoint_refresh_ms: int = default_of("sasl_oauthbearer_jwks_endpoint_refresh_ms", int)
    sasl_oauthbearer_expected_issuer: str | None = None
    sasl_oauthbearer_expected_audience: str | None = None
    sasl_oauthbearer_sub_claim_name: str = default_of("sasl_oauthbearer_sub_claim_name", str)
    sasl_oauthbearer_scope_claim_name: str = default_of("sasl_oauthbearer_scope_claim_name", str)
    sasl_oauthbearer_clock_skew_seconds: int = default_of("sasl_oauthbearer_clock_skew_seconds", int)
    #: The failed-login throttle (loglake.broker.security.login_throttle): failures per source
    #: address and per principal a window takes before further logins are refused unchecked.
    sasl_login_failures_per_source: int = default_of("sasl_login_failures_per_source", int)
    sasl_login_failures_per_principal: int = default_of("sasl_login_failures_per_principal", int)
    sasl_login_failure_window_ms: int = default_of("sasl_login_failure_window_ms", int)
    #: Start even when a listener without client authentication is bound to a non-loopback address.
    allow_unauthenticated_public_listener: bool = default_of("allow_unauthenticated_public_listener", bool)
    #: Kafka's super.users: principals (``User:admin``) every ACL check allows (docs/SECURITY.md, ACLs).
    super_users: list[str] = field(default_factory=list_default("super_users"))
    #: Kafka's allow.everyone.if.no.acl.found: whether a resource no ACL names is open to everyone.
    #: Unset: true while no listener authenticates anyone (every client is User:ANONYMOUS), false
    #: once one does (SASL_*, or SSL with ssl_client_auth requested/required); see `acl_default_allow`.
    allow_everyone_if_no_acl_found: bool | None = None
    #: The event loop: "asyncio" (the standard library's) or "uvloop" (libuv's, from the `fast`
    #: extra). An explicit choice: a broker's behaviour does not change because a package appeared.
    event_loop: str = default_of("event_loop", str)
    node_id: int = default_of("node_id", int)
    #: Cluster mode (docs/CLUSTER.md): etcd://HOST:PORT[,HOST:PORT...]/PREFIX; unset runs one
    #: broker on its own data directory (the single-node mode).
    cluster: str | None = None
    #: Kafka's broker.rack: advertised in the cluster registration and Metadata's rack field.
    rack: str | None = None
    #: Cluster mode: TTL of the broker's etcd lease; a dead broker's partitions move about this
    #: long (plus ~0.5 s) after its last keep-alive (loglake.cluster.membership).
    cluster_lease_ttl_s: int = default_of("cluster_lease_ttl_s", int)
    #: Cluster mode, durability class `object`: flush the broker's buffered batches (one object
    #: for all partitions) at this many bytes or when the oldest is this old (KafScale's defaults).
    object_flush_bytes: int = default_of("object_flush_bytes", int)
    object_flush_ms: int = default_of("object_flush_ms", int)
    #: Cluster mode: how often each broker merges the flush ranges of partitions it leads into
    #: segments and sweeps flush objects no range references (loglake.cluster.plog_maint).
    cluster_maintenance_interval_ms: int = default_of("cluster_maintenance_interval_ms", int)
    #: Cluster mode: a broker that has not reached etcd or the bucket for this long stops leading,
    #: hands its partitions over and answers /readyz "not ready" (loglake.cluster.health).
    cluster_unreachable_release_ms: int = default_of("cluster_unreachable_release_ms", int)
    auto_create_topics: bool = default_of("auto_create_topics", bool)
    default_partitions: int = default_of("default_partitions", int)
    max_frame_bytes: int = default_of("max_frame_bytes", int)
    max_inflight_per_connection: int = default_of("max_inflight_per_connection", int)
    idle_timeout_ms: int = default_of("idle_timeout_ms", int)
    frame_receive_timeout_ms: int = default_of("frame_receive_timeout_ms", int)
    max_connections: int = default_of("max_connections", int)
    #: Kafka's queued.max.request.bytes: request bytes read and not yet handled, all connections
    #: together; while spent, no connection is read (loglake.broker.overload, docs/RELIABILITY.md).
    queued_max_request_bytes: int = default_of("queued_max_request_bytes", int)
    group_initial_rebalance_delay_ms: int = default_of("group_initial_rebalance_delay_ms", int)
    group_min_session_timeout_ms: int = default_of("group_min_session_timeout_ms", int)
    group_max_session_timeout_ms: int = default_of("group_max_session_timeout_ms", int)
    #: Kafka's offsets.retention.minutes: committed offsets of a group that stayed Empty this long expire.
    offsets_retention_minutes: int = default_of("offsets_retention_minutes", int)
    #: Window of rate-limited warnings (loglake.logsafe); 0 logs every repeat.
    log_rate_limit_ms: int = default_of("log_rate_limit_ms", int)
    #: KIP-848 consumer groups (Kafka's group.consumer.* names with "_" for "."); see docs/GROUPS.md.
    group_consumer_session_timeout_ms: int = default_of("group_consumer_session_timeout_ms", int)
    group_consumer_min_session_timeout_ms: int = default_of("group_consumer_min_session_timeout_ms", int)
    group_consumer_max_session_timeout_ms: int = default_of("group_consumer_max_session_timeout_ms", int)
    group_consumer_heartbeat_interval_ms: int = default_of("group_consumer_heartbeat_interval_ms", int)
    group_consumer_min_heartbeat_interval_ms: int = default_of("group_consumer_min_heartbeat_interval_ms", int)
    group_consumer_max_heartbeat_interval_ms: int = default_of("group_consumer_max_heartbeat_interval_ms", int)
    group_consumer_max_size: int = default_of("group_consumer_max_size", int)
    #: Comma-separated server-side assignors ("uniform", "range"); the first is the default.
    group_consumer_assignors: str = default_of("group_consumer_assignors", str)
    #: "disabled" | "upgrade" | "downgrade" | "bidirectional": which Empty groups may change protocol.
    group_consumer_migration_policy: str = default_of("group_consumer_migration_policy", str)
    #: KIP-932 share groups (Kafka's group.share.* names); see docs/SHARE_GROUPS.md.
    group_share_session_timeout_ms: int = default_of("group_share_session_timeout_ms", int)
    group_share_min_session_timeout_ms: int = default_of("group_share_min_session_timeout_ms", int)
    group_share_max_session_timeout_ms: int = default_of("group_share_max_session_timeout_ms", int)
    group_share_heartbeat_interval_ms: int = default_of("group_share_heartbeat_interval_ms", int)
    group_share_min_heartbeat_interval_ms: int = default_of("group_share_min_heartbeat_interval_ms", int)
    group_share_max_heartbeat_interval_ms: int = default_of("group_share_max_heartbeat_interval_ms", int)
    group_share_max_size: int = default_of("group_share_max_size", int)
    group_share_record_lock_duration_ms: int = default_of("group_share_record_lock_duration_ms", int)
    group_share_delivery_count_limit: int = default_of("group_share_delivery_count_limit", int)
    group_share_partition_max_record_locks: int = default_of("group_share_partition_max_record_locks", int)
    group_share_max_share_sessions: int = default_of("group_share_max_share_sessions", int)
    #: KIP-227 fetch sessions (docs/PROTOCOL.md): Kafka's max.incremental.fetch.session.cache.slots,
    #: min.incremental.fetch.session.eviction.ms, and loglake's bound on one session's partitions.
    max_incremental_fetch_session_cache_slots: int = default_of("max_incremental_fetch_session_cache_slots", int)
    min_incremental_fetch_session_eviction_ms: int = default_of("min_incremental_fetch_session_eviction_ms", int)
    fetch_session_max_partitions: int = default_of("fetch_session_max_partitions", int)
    #: Transactions (Kafka's names with "_" for "."; docs/TRANSACTIONS.md): the largest
    #: transaction.timeout.ms a producer may ask for, how long an idle transactional id is kept,
    #: how often timed-out transactions are aborted, and how many transactional ids are kept.
    transaction_max_timeout_ms: int = default_of("transaction_max_timeout_ms", int)
    transactional_id_expiration_ms: int = default_of("transactional_id_expiration_ms", int)
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = default_of("transaction_abort_timed_out_transaction_cleanup_interval_ms", int)
    transactional_ids_max: int = default_of("transactional_ids_max", int)
    #: Client quotas (docs/SECURITY.md, "Quotas"): rates are measured over quota_window_num samples
    #: of quota_window_size_seconds each (Kafka's quota.window.num and quota.window.size.seconds).
    quota_window_num: int = default_of("quota_window_num", int)
    quota_window_size_seconds: int = default_of("quota_window_size_seconds", int)
    engine: dict[str, object] = field(default_factory=dict)
    topic_defaults: dict[str, str] = field(default_factory=dict)
    #: setting -> where its value came from ("default", "--flag", "LOGLAKE_X", "FILE:LINE")
    sources: dict[str, str] = field(default_factory=dict, repr=False)

    def validate(self) -> None:
        """Ranges (the bounds of `BROKER_SETTINGS`), addresses, settings checked against each
        other, and the engine's settings."""
        for name, setting in BROKER_SETTINGS.items():
            if setting.bounds is not None and setting.engine_field is None:
                value = getattr(self, name)
                check_value(name, type(value), value, self.sources.get(name, "default"), from_text=False)
        self.listeners()
        from loglake.broker.security.tls import CLIENT_AUTH, PrincipalMapper

        if self.ssl_client_auth not in CLIENT_AUTH:
            raise ConfigError(
                f"ssl_client_auth={self.ssl_client_auth!r} (from {self.sources.get('ssl_client_auth', 'default')}): "
                f"expected one of {', '.join(CLIENT_AUTH)}"
            )
        PrincipalMapper(self.ssl_principal_mapping_rules)
        if self.event_loop not in EVENT_LOOPS:
            raise ConfigError(
                f"event_loop={self.event_loop!r} (from {self.sources.get('event_loop', 'default')}): "
                f"expected one of {', '.join(EVENT_LOOPS)}"
            )
        if self.event_loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
            raise MissingExtraError(f"event_loop=uvloop (from {self.sources.get('event_loop', 'default')})", "uvloop")
        if self.event_loop == "uvloop" and any(lst.tls for lst in self.listeners()):
            # Seen here: on uvloop some TLS handshakes of connections opened in quick succession
            # stall until the handshake timeout. Refused rather than half working.
            raise ConfigError(
                "event_loop=uvloop is not supported with SSL or SASL_SSL listeners yet (TLS handshakes can "
                "stall on uvloop); use the default event_loop=asyncio"
            )
        self.super_users = split_principals(self.super_users, self.sources.get("super_users", "default"))
        from loglake.broker.security.oauthbearer import OAUTHBEARER, validator
        from loglake.broker.security.sasl import enabled_mechanisms

        oauth = OAUTHBEARER in enabled_mechanisms(self.sasl_enabled_mechanisms)
        if oauth != (self.sasl_oauthbearer_validator is not None):
            raise ConfigError(
                "OAUTHBEARER needs both: in sasl_enabled_mechanisms, and a sasl_oauthbearer_validator "
                f"(unsecured or jwks); got sasl_enabled_mechanisms={self.sasl_enabled_mechanisms!r}, "
                f"sasl_oauthbearer_validator={self.sasl_oauthbearer_validator!r}"
            )
        validator(self)  # its settings checked (jwks: the URL, the extra)
        if self.metrics_listen:
            parse_host_port(self.metrics_listen, "--metrics-listen")
        if self.schema_registry_listen:
            https, _, _ = parse_registry_listen(self.schema_registry_listen)
            if https and not self.ssl_cert:
                raise ConfigError(f"--schema-registry-listen {self.schema_registry_listen}: HTTPS needs --ssl-cert "
                                  "(and --ssl-key unless the key is in that PEM file), as SSL listeners do")
            if https and self.event_loop == "uvloop":
                raise ConfigError("event_loop=uvloop is not supported with an https:// --schema-registry-listen yet "
                                  "(TLS handshakes can stall on uvloop); use the default event_loop=asyncio")
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise ConfigError(
                f"group_min_session_timeout_ms={self.group_min_session_timeout_ms} is above "
                f"group_max_session_timeout_ms={self.group_max_session_timeout_ms}"
            )
        self.engine_config()
        if self.cluster is not None:
            self._validate_cluster()
        try:
            self.consumer_group_limits().check()
            self.share_limits().check()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def _validate_cluster(self) -> None:
        """Cluster mode needs a parseable etcd URL and a shared bucket (the data dir is a cache)."""
        from loglake.meta.etcd_url import parse_cluster_url

        where = self.sources.get("cluster", "default")
        try:
            parse_cluster_url(str(self.cluster))
        except (ConfigError, ValueError) as exc:
            raise ConfigError(f"cluster={self.cluster!r} (from {where}): {exc}") from None
        if not self.cold_store:
            raise ConfigError(
                f"cluster={self.cluster!r} (from {where}) needs --cold-store: in cluster mode the bucket "
                "holds every partition's data and the data directory is only a cache"
            )

    def listeners(self) -> list[Listener]:
        """The listeners, checked: parseable, one per protocol, SSL and SASL_SSL ones with a certificate."""
        from loglake.broker.listeners import match_advertised, parse_listeners, split_list

        self.listen = split_list(self.listen)
        self.advertised_listener = split_list(self.advertised_listener)
        listeners = parse_listeners(self.listen, "--listen")
        match_advertised(listeners, self.advertised_listener)
        for lst in listeners:
            if lst.tls and not self.ssl_cert:
                raise ConfigError(f"--listen {lst.url()}: a {lst.protocol} listener needs --ssl-cert (and --ssl-key unless the key is in that PEM file)")
        return listeners

    def acl_default_allow(self) -> bool:
        """allow.everyone.if.no.acl.found as set, else whether no listener authenticates anyone."""
        if self.allow_everyone_if_no_acl_found is not None:
            return self.allow_everyone_if_no_acl_found
        return not self.authenticates()

    def authenticates(self) -> bool:
        """Whether some Kafka listener authenticates clients: SASL_*, or SSL with ssl_client_auth
        requested or required (the schema registry then asks for credentials too)."""
        return any(lst.sasl or (lst.tls and self.ssl_client_auth in ("requested", "required")) for lst in self.listeners())

    def share_limits(self) -> ShareLimits:
        """The `group.share.*` settings as the share coordinator's ShareLimits."""
        from loglake.broker.share.limits import ShareLimits

        return ShareLimits(
            session_timeout_ms=self.group_share_session_timeout_ms,
            min_session_timeout_ms=self.group_share_min_session_timeout_ms,
            max_session_timeout_ms=self.group_share_max_session_timeout_ms,
            heartbeat_interval_ms=self.group_share_heartbeat_interval_ms,
            min_heartbeat_interval_ms=self.group_share_min_heartbeat_interval_ms,
            max_heartbeat_interval_ms=self.group_share_max_heartbeat_interval_ms,
            max_size=self.group_share_max_size,
            record_lock_duration_ms=self.group_share_record_lock_duration_ms,
            delivery_count_limit=self.group_share_delivery_count_limit,
            partition_max_record_locks=self.group_share_partition_max_record_locks,
            max_share_sessions=self.group_share_max_share_sessions,
        )

    def consumer_group_limits(self) -> ConsumerLimits:
        """The `group.consumer.*` settings as the coordinator's ConsumerLimits."""
        from loglake.broker.groups.limits import ConsumerLimits

        assignors = self.group_consumer_assignors
        names = [a.strip() for a in assignors.split(",")] if isinstance(assignors, str) else list(assignors)
        return ConsumerLimits(
            session_timeout_ms=self.group_consumer_session_timeout_ms,
            min_session_timeout_ms=self.group_consumer_min_session_timeout_ms,
            max_session_timeout_ms=self.group_consumer_max_session_timeout_ms,
            heartbeat_interval_ms=self.group_consumer_heartbeat_interval_ms,
            min_heartbeat_interval_ms=self.group_consumer_min_heartbeat_interval_ms,
            max_heartbeat_interval_ms=self.group_consumer_max_heartbeat_interval_ms,
            max_size=self.group_consumer_max_size,
            assignors=tuple(n for n in names if n),
            migration_policy=self.group_consumer_migration_policy,
        )

    @classmethod
    def load(cls, config_file: str | None = None, env: Mapping[str, str] | None = None, **flags: object) -> BrokerConfig:
        """Flags > environment > TOML file > defaults, each value checked (loglake.broker.settings)."""
        loaded = load_settings(fields(cls), config_file, os.environ if env is None else env, flags)
        config = cls(**loaded.values, engine=loaded.engine, topic_defaults=loaded.topic_defaults)
        config.sources = loaded.sources
        config.validate()
        return config

    def engine_config(self) -> EngineConfig:
        """The engine's settings (the cold store flag included), validated."""
        options = dict(self.engine)
        if self.cold_store:
            options["cold_store_url"] = self.cold_store
        given = options.pop("topic_defaults", {})  # an [engine] topic_defaults table
        topic_defaults = {**(given if isinstance(given, dict) else {}), **self.topic_defaults}
        try:
            return EngineConfig.from_kwargs(**options, topic_defaults=topic_defaults, accept_data_loss=self.accept_data_loss)
        except ConfigError as exc:
            named = [f"{k} from {v}" for k, v in self.sources.items() if v != "default" and k.split(".", 1)[-1] in str(exc)]
            raise ConfigError(f"{exc} ({'; '.join(named)})" if named else str(exc)) from None

    def describe(self) -> str:
        """The effective configuration with the source of every value (`serve --print-config`)."""
        engine = self.engine_config()
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        engine_values = {f.name: getattr(engine, f.name) for f in fields(engine)}
        if values.get("ssl_key_password"):
            values["ssl_key_password"] = "(hidden)"
        sources = dict(self.sources)
        if self.cold_store:  # the engine's cold_store_url is the broker's cold_store
            sources["engine.cold_store_url"] = f"cold_store, {sources.get('cold_store', 'default')}"
        budget = f"\n# rss budget: {rss_budget(self).describe()} (docs/RELIABILITY.md, Overload)\n"
        return render(values, engine_values, engine.topic_defaults, sources) + budget
