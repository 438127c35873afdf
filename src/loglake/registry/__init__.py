"""A Confluent-compatible schema registry, stored in the metadata (docs/SCHEMA_REGISTRY.md).

`formats` parses Avro, JSON Schema and Protobuf schemas with their libraries, `compat` checks a
new schema against a subject's earlier ones by Confluent's levels, `service.SchemaRegistry` is
the registry over a `MetaStore` (records of loglake.meta.schemas), `api.RegistryApi` routes
Confluent's REST API to it. The broker serves the API (`loglake serve --schema-registry-listen`).
"""

from loglake.registry.api import CONTENT_TYPE, RegistryApi
from loglake.registry.service import SchemaRegistry

__all__ = ["CONTENT_TYPE", "RegistryApi", "SchemaRegistry"]
