"""One module per Kafka API. Each exports `handle(ctx, conn, req)` returning the response
(a kafka-python response object, a mapping of its fields, or for Fetch a FetchResponseData),
or None for requests that get no response (Produce with acks=0). ApiVersions is answered here:
its answer is this registry's `ADVERTISED`."""

from __future__ import annotations

import importlib

from loglake.broker.conn import Conn
from loglake.broker.context import BrokerContext, Handler
from loglake.broker.protocol.api_keys import ApiKey
from loglake.broker.protocol.codec import DecodedRequest, api_versions_body
from loglake.broker.protocol.kafka_types import KafkaStruct
from loglake.broker.protocol.versions import DEFAULT_TABLE, SUPPORTED, VersionTable

HANDLERS: dict[int, Handler] = {}


def api_name(api_key: int) -> str:
    entry = SUPPORTED.get(api_key)
    return entry.name if entry is not None else f"api{api_key}"


async def _api_versions(ctx: BrokerContext, conn: Conn, req: DecodedRequest) -> KafkaStruct:
    """ApiVersions (18): the versions we support; v3+ bodies come with the v0 response header."""
    return api_versions_body(ADVERTISED, req.api_version)


def _register() -> None:
    from loglake.broker.handlers import (
        fetch,
        find_coordinator,
        init_producer_id,
        list_offsets,
        metadata,
        produce,
    )

    for module, key in (
        (produce, ApiKey.PRODUCE),
        (fetch, ApiKey.FETCH),
        (list_offsets, ApiKey.LIST_OFFSETS),
        (metadata, ApiKey.METADATA),
        (find_coordinator, ApiKey.FIND_COORDINATOR),
        (init_producer_id, ApiKey.INIT_PRODUCER_ID),
    ):
        HANDLERS[key] = module.handle
    HANDLERS[ApiKey.API_VERSIONS] = _api_versions
    # Admin and group APIs: modules that export a HANDLERS table of their own.
    for name in (
        "admin", "acls", "groups", "consumer_groups", "leader_epoch", "log_dirs", "producers", "offset_delete", "txn",
        "sasl", "scram_admin", "client_quotas", "share_groups",
    ):
        try:
            module = importlib.import_module(f"loglake.broker.handlers.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"loglake.broker.handlers.{name}":
                raise
            continue
        HANDLERS.update(module.HANDLERS)


_register()

#: What ApiVersions advertises and the decoder accepts: only APIs that have a handler.
ADVERTISED: VersionTable = DEFAULT_TABLE.without(*(key for key in SUPPORTED if key not in HANDLERS))
