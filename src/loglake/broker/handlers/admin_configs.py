"""DescribeConfigs (32), AlterConfigs (33), IncrementalAlterConfigs (44).

Topic configs are the engine's (`loglake.engine.config`): per-topic overrides on top of the
broker's topic defaults (`[topic_defaults]`) on top of built-in defaults. Their type, default,
documentation, read-only flag and Kafka synonym all come from the engine's one table,
`TOPIC_CONFIG_KEYS`. A value's source is
DYNAMIC_TOPIC_CONFIG for an override, STATIC_BROKER_CONFIG for a broker topic default and
DEFAULT_CONFIG otherwise; synonyms name the Kafka broker setting behind each default
(``retention.ms`` -> ``log.retention.ms``).

Broker configs are read-only: a small set that describes this broker (so tools that describe a
broker work). loglake has no dynamic broker configs; altering a BROKER resource is refused with
INVALID_REQUEST and a message that says so.

AlterConfigs replaces a topic's whole override set, as Kafka's does; IncrementalAlterConfigs
merges SET / DELETE / APPEND / SUBTRACT into the current overrides (APPEND and SUBTRACT only for
list configs). Both are serialized by one lock so that merges do not lose each other's writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from loglake.broker.config import BrokerConfig
from loglake.broker.context import BrokerContext
from loglake.broker.handlers.admin_common import (
    CONFIG_ALTER_LOCK,
    INVALID_CONFIG,
    RESOURCE_BROKER,
    RESOURCE_BROKER_LOGGER,
    RESOURCE_TOPIC,
    AdminError,
    duplicates,
    engine_call,
    failure,
)
from loglake.broker.handlers.errors import INVALID_REQUEST, NONE
from loglake.broker.protocol import DecodedRequest
from loglake.engine.config import TOPIC_CONFIGS, ConfigType, TopicConfig, validate_topic_name
from loglake.engine.types import TopicInfo

# ConfigSource (DescribeConfigsResponse.ConfigSource / synonym Source).
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

# IncrementalAlterConfigs operations.
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3

_BROKER_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(BrokerConfig)}


def _entry(
    name: str, value: str | None, source: int, config_type: int, doc: str | None, *,
    read_only: bool, synonyms: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "read_only": read_only,
        "is_default": source == DEFAULT_CONFIG,
        "config_source": source,
        "is_sensitive": False,
        "synonyms": synonyms,
        "config_type": config_type,
        "documentation": doc,
    }


def topic_config_entries(
    ctx: BrokerContext, config: TopicConfig, keys: Iterable[str] | None = None, *,
    include_synonyms: bool = False, include_documentation: bool = False,
) -> list[dict[str, Any]]:
    """DescribeConfigs entries of a topic's configuration (every config, or those in `keys`)."""
    defaults = ctx.engine.config.topic_defaults
    wanted = None if keys is None else set(keys)
    out: list[dict[str, Any]] = []
    for name, (value, is_default) in config.effective(defaults).items():
        if wanted is not None and name not in wanted:
            continue
        key = TOPIC_CONFIGS[name]
        broker_name = key.broker_synonym or name
        if not is_default:
            source = DYNAMIC_TOPIC_CONFIG
        else:
            source = STATIC_BROKER_CONFIG if name in defaults else DEFAULT_CONFIG
        synonyms: list[dict[str, Any]] = []
        if include_synonyms:
            if not is_default:
                synonyms.append({"name": name, "value": value, "source": DYNAMIC_TOPIC_CONFIG})
            if name in defaults:
                synonyms.append({"name": broker_name, "value": str(defaults[name]), "source": STATIC_BROKER_CONFIG})
            synonyms.append({"name": broker_name, "value": key.default, "source": DEFAULT_CONFIG})
        out.append(
            _entry(name, value, source, key.type, key.doc if include_documentation else None,
                   read_only=key.read_only, synonyms=synonyms)
        )
    return out


def broker_config_entries(
    ctx: BrokerContext, keys: Iterable[str] | None = None, *,
    include_synonyms: bool = False, include_documentation: bool = False,
) -> list[dict[str, Any]]:
    """A small read-only description of this broker, with Kafka's setting names."""
    conf = ctx.config

    def configured(field: str, value: Any) -> int:
        return DEFAULT_CONFIG if _BROKER_DEFAULTS.get(field) == value else STATIC_BROKER_CONFIG

    items: list[tuple[str, str | None, int, int, str]] = [
        ("broker.id", str(ctx.node_id), configured("node_id", ctx.node_id), ConfigType.INT, "This broker's id (--node-id)."),
        ("node.id", str(ctx.node_id), configured("node_id", ctx.node_id), ConfigType.INT, "This broker's id (--node-id)."),
        ("log.dirs", ctx.engine.data_dir, STATIC_BROKER_CONFIG, ConfigType.STRING, "The data directory (--data-dir)."),
        ("listeners", f"PLAINTEXT://{conf.listen}", STATIC_BROKER_CONFIG, ConfigType.STRING, "Where the broker listens."),
        (
            "advertised.listeners",
            f"PLAINTEXT://{ctx.advertised_host}:{ctx.advertised_port}",
            configured("advertised_listener", conf.advertised_listener),
            ConfigType.STRING,
            "The address clients are told to connect to.",
        ),
        (
            "auto.create.topics.enable",
            "true" if conf.auto_create_topics else "false",
            configured("auto_create_topics", conf.auto_create_topics),
            ConfigType.BOOLEAN,
            "Create unknown topics on metadata requests and produce.",
        ),
        ("num.partitions", str(conf.default_partitions), configured("default_partitions", conf.default_partitions),
         ConfigType.INT, "Partitions of auto-created topics and of CreateTopics with -1."),
        ("default.replication.factor", "1", DEFAULT_CONFIG, ConfigType.INT, "Always 1: loglake is a single broker."),
        ("offsets.topic.replication.factor", "1", DEFAULT_CONFIG, ConfigType.SHORT, "Always 1: loglake is a single broker."),
        ("socket.request.max.bytes", str(conf.max_frame_bytes), configured("max_frame_bytes", conf.max_frame_bytes),
         ConfigType.INT, "Largest request accepted, in bytes."),
    ]
    topic_defaults = ctx.engine.config.topic_defaults
    effective = TopicConfig.parse(None, topic_defaults).effective(topic_defaults)
    for name, key in TOPIC_CONFIGS.items():
        if key.broker_synonym is None:
            continue  # a loglake topic config without a Kafka broker setting
        source = STATIC_BROKER_CONFIG if name in topic_defaults else DEFAULT_CONFIG
        items.append(
            (key.broker_synonym, effective[name][0], source, key.type, f"Default of topic config {name}: {key.doc}")
        )
    wanted = None if keys is None else set(keys)
    out: list[dict[str, Any]] = []
    for name, value, source, config_type, doc in items:
        if wanted is not None and name not in wanted:
            continue
        synonyms = [{"name": name, "value": value, "source": source}] if include_synonyms else []
        out.append(
            _entry(name, value, source, config_type, doc if include_documentation else None,
                   read_only=True, synonyms=synonyms)
        )
    return out


def _check_broker_name(ctx: BrokerContext, name: str) -> None:
    if name not in ("", str(ctx.node_id)):
        raise AdminError(
            INVALID_REQUEST, f"Unexpected broker id, expected {ctx.node_id} or empty string, but received {name}"
        )


def _topic_info(ctx: BrokerContext, name: str) -> TopicInfo:
    validate_topic_name(name)
    return ctx.engine.topic(name)


async def describe_configs(ctx: BrokerContext, conn: Any, req: DecodedRequest) -> dict[str, Any]:
    body = req.body
    synonyms = bool(getattr(body, "include_synonyms", False))
    docs = bool(getattr(body, "include_documentation", False))
    results: list[dict[str, Any]] = []
    for res in body.resources:
        rtype, name = res.resource_type, res.resource_name
        # Kafka describes every config when the key list is null or empty.
        keys = list(res.configuration_keys) if res.configuration_keys else None
        result: dict[str, Any] = {"resource_type": rtype, "resource_name": name, "error_code": NONE,
                                  "error_message": None, "configs": []}
        try:
            if rtype == RESOURCE_TOPIC:
                config = _topic_info(ctx, name).config
                result["configs"] = topic_config_entries(
                    ctx, config, keys, include_synonyms=synonyms, include_documentation=docs
                )
            elif rtype == RESOURCE_BROKER:
                _check_broker_name(ctx, name)
                result["configs"] = broker_config_entries(
                    ctx, keys, include_synonyms=synonyms, include_documentation=docs
                )
            else:
                raise AdminError(INVALID_REQUEST, f"Unsupported resource type {rtype}")
        except Exception as exc:
            result["error_code"], result["error_message"] = failure(exc, f"DescribeConfigs {rtype}/{name}")
        results.append(result)
    return {"throttle_time_ms": 0, "results": results}


def _check_alterable(ctx: BrokerContext, rtype: int, name: str) -> None:
    if rtype in (RESOURCE_BROKER, RESOURCE_BROKER_LOGGER):
        raise AdminError(
            INVALID_REQUEST,
            "loglake has no dynamic broker configs: set them in the config file, environment or flags "
            "and restart the broker",
        )
    if rtype != RESOURCE_TOPIC:
        raise AdminError(INVALID_REQUEST, f"Unsupported resource type {rtype}")
    validate_topic_name(name)


def _check_config_names(configs: list[Any]) -> None:
    dup = duplicates([c.name for c in configs])
    if dup:
        raise AdminError(INVALID_REQUEST, f"Error due to duplicate config keys: {', '.join(sorted(dup))}")


def _null_value(name: str) -> AdminError:
    return AdminError(INVALID_CONFIG, f"Null value not supported for topic configs: {name}")


async def _alter_resources(
    ctx: BrokerContext, req: DecodedRequest, incremental: bool
) -> dict[str, Any]:
    body = req.body
    validate_only = bool(body.validate_only)
    dup = duplicates([(r.resource_type, r.resource_name) for r in body.resources])
    responses: list[dict[str, Any]] = []
    for res in body.resources:
        rtype, name = res.resource_type, res.resource_name
        code, message = NONE, None
        try:
            if (rtype, name) in dup:
                raise AdminError(INVALID_REQUEST, f"Duplicate resource in request: type {rtype}, name {name!r}")
            _check_alterable(ctx, rtype, name)
            configs = list(res.configs)
            _check_config_names(configs)
            async with CONFIG_ALTER_LOCK.get():
                info = ctx.engine.topic(name)
                if incremental:
                    overrides = apply_incremental(ctx, info.config, configs)
                else:
                    overrides = {}
                    for c in configs:
                        if c.value is None:
                            raise _null_value(c.name)
                        overrides[c.name] = c.value
                await engine_call(ctx, ctx.engine.alter_topic_config, name, overrides, validate_only=validate_only)
        except Exception as exc:
            code, message = failure(exc, f"{'Incremental' if incremental else ''}AlterConfigs {rtype}/{name}")
        responses.append(
            {"error_code": code, "error_message": message, "resource_type": rtype, "resource_name": name}
        )
    return {"throttle_time_ms": 0, "responses": responses}


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def apply_incremental(ctx: BrokerContext, config: TopicConfig, ops: list[Any]) -> dict[str, str]:
    """The topic's new override set after IncrementalAlterConfigs `ops` (validated by the engine)."""
    overrides = dict(config.overrides)
    effective = config.effective(ctx.engine.config.topic_defaults)
    for op in ops:
        name, value, kind = op.name, op.value, op.config_operation
        if kind == OP_DELETE:
            overrides.pop(name, None)  # deleting an unset (or unknown) config is a no-op, as in Kafka
            continue
        if kind not in (OP_SET, OP_APPEND, OP_SUBTRACT):
            raise AdminError(INVALID_REQUEST, f"Unknown config operation {kind} for {name}")
        key = TOPIC_CONFIGS.get(name)
        if key is None:
            raise AdminError(INVALID_CONFIG, f"Unknown topic config name: {name}")
        if value is None:
            raise _null_value(name)
        if kind == OP_SET:
            overrides[name] = value
            continue
        verb = "append" if kind == OP_APPEND else "subtract"
        if key.type != ConfigType.LIST:
            raise AdminError(INVALID_CONFIG, f"Config value {verb} is not allowed for config key: {name}")
        current = _split(overrides[name] if name in overrides else effective[name][0])
        given = _split(value)
        if kind == OP_APPEND:
            items = list(dict.fromkeys(current + given))
        else:
            items = [v for v in current if v not in given]
        overrides[name] = ",".join(items)
    return overrides


async def alter_configs(ctx: BrokerContext, conn: Any, req: DecodedRequest) -> dict[str, Any]:
    return await _alter_resources(ctx, req, incremental=False)


async def incremental_alter_configs(ctx: BrokerContext, conn: Any, req: DecodedRequest) -> dict[str, Any]:
    return await _alter_resources(ctx, req, incremental=True)
