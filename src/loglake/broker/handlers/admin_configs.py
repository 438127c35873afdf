"""DescribeConfigs (32), AlterConfigs (33), IncrementalAlterConfigs (44): topic, broker and group resources.

Topic configs are the engine's (`loglake.engine.config`): per-topic overrides on top of the
broker-wide topic defaults on top of built-in defaults. Their type, default, documentation,
read-only flag and Kafka synonym all come from the engine's one table, `TOPIC_CONFIG_KEYS`. A
value's source is DYNAMIC_TOPIC_CONFIG for an override, else the source of the broker setting
behind its default (``retention.ms`` -> ``log.retention.ms``): DYNAMIC_BROKER_CONFIG or
DYNAMIC_DEFAULT_BROKER_CONFIG when that setting was changed at runtime, STATIC_BROKER_CONFIG
from `[topic_defaults]`, DEFAULT_CONFIG otherwise; synonyms list those layers, highest first.

Broker configs (resource 4, named by this node id, or "" for the cluster-wide default) are
`loglake.broker.dynamic_config`'s: every broker setting described, a few dynamic, as the one table
of broker settings (`loglake.broker.settings.BROKER_SETTINGS`) says. Group configs
(resource 32) are `loglake.broker.group_configs`'. BROKER_LOGGER (8) is refused.

AlterConfigs replaces a resource's whole set (a topic's overrides, a broker scope's or a group's
dynamic configs), as Kafka's does; IncrementalAlterConfigs merges SET / DELETE / APPEND /
SUBTRACT into the current set (APPEND and SUBTRACT only for list configs). All are serialized by
one lock so that merges do not lose each other's writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext
from loglake.broker.dynamic_config import DYNAMIC_TOPIC_CONFIG, config_entry
from loglake.broker.group_configs import canonical_value
from loglake.broker.handlers.admin_common import (
    CONFIG_ALTER_LOCK,
    INVALID_CONFIG,
    RESOURCE_BROKER,
    RESOURCE_BROKER_LOGGER,
    RESOURCE_GROUP,
    RESOURCE_TOPIC,
    AdminError,
    duplicates,
    engine_call,
    failure,
)
from loglake.broker.handlers.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    GROUP_AUTHORIZATION_FAILED,
    INVALID_REQUEST,
    NONE,
    TOPIC_AUTHORIZATION_FAILED,
)
from loglake.broker.protocol import DecodedRequest
from loglake.broker.protocol.kafka_types import KafkaStruct
from loglake.broker.security.authorized import CLUSTER, GROUP, TOPIC, AclOperation, denied
from loglake.broker.security.authorizer import CLUSTER_NAME
from loglake.engine.config import TOPIC_CONFIGS, ConfigType, TopicConfig, validate_topic_name
from loglake.engine.types import TopicInfo

# IncrementalAlterConfigs operations.
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3


def topic_config_entries(
    ctx: BrokerContext, config: TopicConfig, keys: Iterable[str] | None = None, *,
    include_synonyms: bool = False, include_documentation: bool = False,
) -> list[dict[str, object]]:
    """DescribeConfigs entries of a topic's configuration (every config, or those in `keys`)."""
    defaults = ctx.engine.config.topic_defaults
    wanted = None if keys is None else set(keys)
    out: list[dict[str, object]] = []
    for name, (value, is_default) in config.effective(defaults).items():
        if wanted is not None and name not in wanted:
            continue
        key = TOPIC_CONFIGS[name]
        layers = _default_layers(ctx, name)
        source = layers[0][0] if is_default else DYNAMIC_TOPIC_CONFIG
        synonyms: list[dict[str, object]] = []
        if include_synonyms:
            if not is_default:
                synonyms.append({"name": name, "value": value, "source": DYNAMIC_TOPIC_CONFIG})
            synonyms += [{"name": n, "value": v, "source": s} for s, n, v in layers]
        out.append(
            config_entry(name, value, source, key.type, key.doc if include_documentation else None,
                         read_only=key.read_only, synonyms=synonyms)
        )
    return out


def _default_layers(ctx: BrokerContext, name: str) -> list[tuple[int, str, str | None]]:
    return ctx.broker_configs.topic_default_layers(name)


def _topic_info(ctx: BrokerContext, name: str) -> TopicInfo:
    validate_topic_name(name)
    return ctx.engine.topic(name)


#: Config resource type -> (ACL resource type, the error a refusal answers with).
_ACL_OF_CONFIG = {
    RESOURCE_TOPIC: (TOPIC, TOPIC_AUTHORIZATION_FAILED),
    RESOURCE_BROKER: (CLUSTER, CLUSTER_AUTHORIZATION_FAILED),
    RESOURCE_BROKER_LOGGER: (CLUSTER, CLUSTER_AUTHORIZATION_FAILED),
    RESOURCE_GROUP: (GROUP, GROUP_AUTHORIZATION_FAILED),
}


def _refused(
    ctx: BrokerContext, conn: Conn, operation: int, resources: list[KafkaStruct]
) -> dict[tuple[int, str], int]:
    """(config resource type, name) -> the authorization error of each resource the principal may
    not `operation` (DESCRIBE_CONFIGS or ALTER_CONFIGS); broker resources are the cluster's."""
    out: dict[tuple[int, str], int] = {}
    for config_type, (acl_type, code) in _ACL_OF_CONFIG.items():
        names = [r.resource_name for r in resources if r.resource_type == config_type]
        if not names:
            continue
        acl_names = [CLUSTER_NAME] if acl_type == CLUSTER else names
        refused = denied(ctx, conn, operation, acl_type, acl_names)
        out.update({(config_type, n): code for n in names if (CLUSTER_NAME if acl_type == CLUSTER else n) in refused})
    return out


async def describe_configs(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    body = req.body
    synonyms = bool(getattr(body, "include_synonyms", False))
    docs = bool(getattr(body, "include_documentation", False))
    results: list[dict[str, object]] = []
    refused = _refused(ctx, conn, AclOperation.DESCRIBE_CONFIGS, list(body.resources))
    for res in body.resources:
        rtype, name = res.resource_type, res.resource_name
        # Kafka describes every config when the key list is null or empty.
        keys = list(res.configuration_keys) if res.configuration_keys else None
        result: dict[str, object] = {"resource_type": rtype, "resource_name": name, "error_code": NONE,
                                  "error_message": None, "configs": []}
        try:
            if (rtype, name) in refused:
                raise AdminError(refused[(rtype, name)], "Authorization failed.")
            if rtype == RESOURCE_TOPIC:
                config = _topic_info(ctx, name).config
                result["configs"] = topic_config_entries(
                    ctx, config, keys, include_synonyms=synonyms, include_documentation=docs
                )
            elif rtype == RESOURCE_BROKER:
                result["configs"] = ctx.broker_configs.describe(name, keys, synonyms=synonyms, docs=docs)
            elif rtype == RESOURCE_GROUP:
                result["configs"] = ctx.group_configs.describe(name, keys, synonyms=synonyms, docs=docs)
            else:
                raise AdminError(INVALID_REQUEST, f"Unsupported resource type {rtype}")
        except Exception as exc:
            result["error_code"], result["error_message"] = failure(exc, f"DescribeConfigs {rtype}/{name}")
        results.append(result)
    return {"throttle_time_ms": 0, "results": results}


def _check_config_names(configs: list[KafkaStruct]) -> None:
    dup = duplicates([c.name for c in configs])
    if dup:
        raise AdminError(INVALID_REQUEST, f"Error due to duplicate config keys: {', '.join(sorted(dup))}")


def _null_value(name: str) -> AdminError:
    return AdminError(INVALID_CONFIG, f"Null value not supported for topic configs: {name}")


async def _alter_topic(
    ctx: BrokerContext, name: str, configs: list[KafkaStruct], incremental: bool, validate_only: bool
) -> None:
    validate_topic_name(name)
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


def merge_dynamic(
    current: dict[str, str], ops: list[KafkaStruct], incremental: bool, parse: Callable[[str, str | None], str]
) -> dict[str, str]:
    """A broker scope's or group's new config set: `ops` replace (AlterConfigs) or merge into (Incremental)
    `current`; `parse(name, value)` refuses unknown or read-only names and bad values."""
    if not incremental:
        return {c.name: parse(c.name, c.value) for c in ops}
    new = dict(current)
    for op in ops:
        name, kind = op.name, op.config_operation
        if kind == OP_DELETE:
            new.pop(name, None)  # deleting an unset config is a no-op, as in Kafka
        elif kind == OP_SET:
            new[name] = parse(name, op.value)
        elif kind in (OP_APPEND, OP_SUBTRACT):
            parse(name, op.value)  # unknown or read-only first, as Kafka reports them
            verb = "append" if kind == OP_APPEND else "subtract"
            raise AdminError(INVALID_CONFIG, f"Config value {verb} is not allowed for config key: {name}")
        else:
            raise AdminError(INVALID_REQUEST, f"Unknown config operation {kind} for {name}")
    return new


async def _alter_one(ctx: BrokerContext, rtype: int, name: str, configs: list[KafkaStruct], incremental: bool,
                     validate_only: bool) -> None:
    if rtype == RESOURCE_TOPIC:
        await _alter_topic(ctx, name, configs, incremental, validate_only)
    elif rtype == RESOURCE_BROKER:
        brokers = ctx.broker_configs
        brokers.check_scope(name)
        new = merge_dynamic(brokers.current(name), configs, incremental, lambda n, v: brokers.parse(name, n, v))
        await engine_call(ctx, brokers.alter, name, new, validate_only=validate_only)
    elif rtype == RESOURCE_GROUP:
        groups = ctx.group_configs
        new = merge_dynamic(groups.current(name), configs, incremental, _group_value)
        await engine_call(ctx, groups.alter, name, new, validate_only=validate_only)
    elif rtype == RESOURCE_BROKER_LOGGER:
        raise AdminError(INVALID_REQUEST, "loglake has no dynamic broker loggers: set --log-level and restart")
    else:
        raise AdminError(INVALID_REQUEST, f"Unsupported resource type {rtype}")


def _group_value(name: str, value: str | None) -> str:
    return canonical_value(name, value)


async def _alter_resources(
    ctx: BrokerContext, conn: Conn, req: DecodedRequest, incremental: bool
) -> dict[str, object]:
    body = req.body
    validate_only = bool(body.validate_only)
    dup = duplicates([(r.resource_type, r.resource_name) for r in body.resources])
    responses: list[dict[str, object]] = []
    refused = _refused(ctx, conn, AclOperation.ALTER_CONFIGS, list(body.resources))
    for res in body.resources:
        rtype, name = res.resource_type, res.resource_name
        code, message = NONE, None
        try:
            if (rtype, name) in refused:
                raise AdminError(refused[(rtype, name)], "Authorization failed.")
            if (rtype, name) in dup:
                raise AdminError(INVALID_REQUEST, f"Duplicate resource in request: type {rtype}, name {name!r}")
            configs = list(res.configs)
            _check_config_names(configs)
            async with CONFIG_ALTER_LOCK.get():
                await _alter_one(ctx, rtype, name, configs, incremental, validate_only)
        except Exception as exc:
            code, message = failure(exc, f"{'Incremental' if incremental else ''}AlterConfigs {rtype}/{name}")
        responses.append(
            {"error_code": code, "error_message": message, "resource_type": rtype, "resource_name": name}
        )
    return {"throttle_time_ms": 0, "responses": responses}


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def apply_incremental(ctx: BrokerContext, config: TopicConfig, ops: list[KafkaStruct]) -> dict[str, str]:
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


async def alter_configs(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    return await _alter_resources(ctx, conn, req, incremental=False)


async def incremental_alter_configs(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> dict[str, object]:
    return await _alter_resources(ctx, conn, req, incremental=True)
