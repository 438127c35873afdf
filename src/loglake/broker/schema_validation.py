"""Validated topics: Confluent Server's broker-side schema ID validation, by its topic configs.

A topic with `confluent.value.schema.validation` (or `.key.`) set to `true` takes a produced
record only when its value (key) is in the schema registry's wire format — magic byte 0, then a
4-byte big-endian schema id — naming an id the registry holds under the record's subject:
`<topic>-value` (TopicNameStrategy, the default), the schema's record name (RecordNameStrategy) or
`<topic>-<record name>` (TopicRecordNameStrategy), as `confluent.value.subject.name.strategy`
says. That costs a header read per record, not a decode. `full` also decodes the payload with the
schema: Avro's binary encoding read to its end, a JSON document valid against the JSON Schema;
for Protobuf the message indexes are checked against the schema's messages (the message itself
is not decoded). A null key or value (a tombstone) is never checked.

A partition's records with any refused record are refused whole with INVALID_RECORD and each
refused record's index in `record_errors` (KIP-467), as Confluent Server answers; the request's
other partitions are unaffected. The registry is the broker's own (loglake.registry, over the
metadata store: in cluster mode every broker checks against the one registry).
"""

from __future__ import annotations

import io
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from loglake.engine import Engine
from loglake.engine.config import SUBJECT_NAME_STRATEGIES, TopicConfig
from loglake.errors import CorruptRecordError, InvalidRecordError
from loglake.meta.schemas import SchemaTable
from loglake.records.batch import Buffer, peek_header
from loglake.records.decode import RecordColumns, decode_batch_columns

if TYPE_CHECKING:  # the registry's formats need its extra: imported when a record needs them
    from loglake.registry import SchemaRegistry
    from loglake.registry.formats import ParsedSchema

__all__ = ["RECORD_ERRORS_MAX", "WIRE_HEADER_BYTES", "SchemaValidator"]

#: Magic byte 0 and the 4-byte schema id before every payload of the registry's wire format.
WIRE_HEADER_BYTES = 5
#: Refused records named one by one in a response (the rest are counted in its message).
RECORD_ERRORS_MAX = 100
#: Decoders (`full`) kept, by schema id: an id's schema never changes.
DECODERS_MAX = 1024

_TOPIC_NAME, _RECORD_NAME, _TOPIC_RECORD_NAME = SUBJECT_NAME_STRATEGIES

Decoder = Callable[[bytes], None]


class SchemaValidator:
    """Checks produced records of validated topics against the broker's schema registry."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._decoders: OrderedDict[int, Decoder] = OrderedDict()
        self._registry: SchemaRegistry | None = None  # made on the first need

    def check(self, topic: str, records: Buffer) -> None:
        """InvalidRecordError (with record_errors) when a record of `records` breaks the topic's
        validation; nothing for a topic that validates neither keys nor values."""
        config = self.engine.topic(topic).config
        if config.key_schema_validation == "false" and config.value_schema_validation == "false":
            return
        table: SchemaTable = self.engine.meta.read(lambda s: s.schemas)
        # a header's verdict, by part and header: a request's records mostly share one schema id,
        # so its subject is looked up once, not once a record
        verdicts: dict[tuple[str, bytes], str | None] = {}
        headers_only = "full" not in (config.key_schema_validation, config.value_schema_validation)
        errors: list[tuple[int, str]] = []
        refused = 0
        index = 0
        pos = 0
        while pos < len(records):
            header = peek_header(records, pos)
            if header.is_control:
                pos += header.size
                continue
            _h, columns = decode_batch_columns(records, pos)
            pos += header.size
            if headers_only and self._all_good(topic, config, table, columns, verdicts):
                index += len(columns.values)
                continue
            for key, value in zip(columns.keys, columns.values, strict=True):
                problem = self._problem(topic, config, table, key, value, verdicts)
                if problem is not None:
                    refused += 1
                    if len(errors) < RECORD_ERRORS_MAX:
                        errors.append((index, problem))
                index += 1
        if errors:
            first = errors[0][1]
            raise InvalidRecordError(
                f"{refused} of {index} record(s) of topic {topic!r} refused by its schema validation "
                f"(first, record {errors[0][0]}: {first})",
                record_errors=errors,
            )

    def _all_good(self, topic: str, config: TopicConfig, table: SchemaTable, columns: RecordColumns,
                  verdicts: dict[tuple[str, bytes], str | None]) -> bool:
        """Whether every record of a batch passes a header-only (`true`) validation: each distinct
        header checked once (a set built in one C-level pass, not a Python step a record)."""
        for part, column, level, strategy in (
            ("key", columns.keys, config.key_schema_validation, config.key_subject_name_strategy),
            ("value", columns.values, config.value_schema_validation, config.value_subject_name_strategy),
        ):
            if level == "false":
                continue
            for head in {data[:WIRE_HEADER_BYTES] for data in column if data is not None}:
                if self._header_problem(topic, part, head, strategy, table, verdicts) is not None:
                    return False
        return True

    def _problem(self, topic: str, config: TopicConfig, table: SchemaTable, key: bytes | None,
                 value: bytes | None, verdicts: dict[tuple[str, bytes], str | None]) -> str | None:
        for part, data, level, strategy in (
            ("key", key, config.key_schema_validation, config.key_subject_name_strategy),
            ("value", value, config.value_schema_validation, config.value_subject_name_strategy),
        ):
            if level == "false" or data is None:
                continue
            problem = self._header_problem(topic, part, data[:WIRE_HEADER_BYTES], strategy, table, verdicts)
            if problem is None and level == "full":
                problem = self._decode_problem(data)
            if problem is not None:
                return f"{part}: {problem}"
        return None

    def _header_problem(self, topic: str, part: str, head: bytes, strategy: str, table: SchemaTable,
                        verdicts: dict[tuple[str, bytes], str | None]) -> str | None:
        """What is wrong with a record's first WIRE_HEADER_BYTES (its whole data when shorter),
        remembered in `verdicts`: the verdict depends on nothing else."""
        if (part, head) in verdicts:
            return verdicts[(part, head)]
        verdict = self._check_header(topic, part, head, strategy, table)
        verdicts[(part, head)] = verdict
        return verdict

    def _check_header(self, topic: str, part: str, head: bytes, strategy: str, table: SchemaTable) -> str | None:
        if len(head) < WIRE_HEADER_BYTES or head[0] != 0:
            return "not in the schema registry's wire format (magic byte 0 and a 4-byte schema id)"
        schema_id = int.from_bytes(head[1:WIRE_HEADER_BYTES], "big")
        if schema_id not in table.schemas:
            return f"schema id {schema_id} is unknown to the registry"
        if strategy == _TOPIC_NAME:
            subject = f"{topic}-{part}"
        else:
            name = self._record_name(schema_id)
            if name is None:
                return f"schema id {schema_id} names no record, which {strategy.rsplit('.', 1)[-1]} needs"
            subject = name if strategy == _RECORD_NAME else f"{topic}-{name}"
        versions = table.subjects.get(subject, {})
        if not any(rv.schema_id == schema_id and not rv.deleted for rv in versions.values()):
            return f"schema id {schema_id} is not registered under subject {subject!r}"
        return None

    def _decode_problem(self, data: bytes) -> str | None:
        """`full`: what keeps a payload whose header passed from decoding with its schema."""
        schema_id = int.from_bytes(data[1:WIRE_HEADER_BYTES], "big")
        try:
            self._decoder(schema_id)(data[WIRE_HEADER_BYTES:])
        except Exception as exc:  # any decoding failure refuses the record
            return f"does not decode with schema id {schema_id}: {type(exc).__name__}: {str(exc)[:200]}"
        return None

    # ---- the registry (its extra): record names and decoders -------------------------------

    def _service(self) -> SchemaRegistry:
        with self._lock:
            if self._registry is None:
                from loglake.registry import SchemaRegistry

                self._registry = SchemaRegistry(self.engine.meta, self.engine.check_writable)
            return self._registry

    def _record_name(self, schema_id: int) -> str | None:
        from loglake.registry.formats import record_name

        parsed = self._service().parsed_by_id(schema_id)
        return None if parsed is None else record_name(parsed)

    def _decoder(self, schema_id: int) -> Decoder:
        with self._lock:
            hit = self._decoders.get(schema_id)
            if hit is not None:
                self._decoders.move_to_end(schema_id)
                return hit
        parsed = self._service().parsed_by_id(schema_id)
        if parsed is None:
            raise ValueError(f"schema id {schema_id} is gone")
        decoder = _decoder_of(parsed)
        with self._lock:
            self._decoders[schema_id] = decoder
            while len(self._decoders) > DECODERS_MAX:
                self._decoders.popitem(last=False)
        return decoder


def _decoder_of(parsed: ParsedSchema) -> Decoder:
    """A function that raises when a payload (after the 5-byte header) does not decode."""
    from loglake.registry.formats import SchemaType

    if parsed.schema_type is SchemaType.AVRO:
        import avro.io

        reader = avro.io.DatumReader(parsed.parsed)

        def avro_decode(payload: bytes) -> None:
            stream = io.BytesIO(payload)
            reader.read(avro.io.BinaryDecoder(stream))
            if stream.tell() != len(payload):
                raise ValueError(f"{len(payload) - stream.tell()} byte(s) after the datum")

        return avro_decode
    if parsed.schema_type is SchemaType.JSON:
        import jsonschema

        validator = jsonschema.validators.validator_for(parsed.parsed)(parsed.parsed)

        def json_decode(payload: bytes) -> None:
            validator.validate(json.loads(payload))

        return json_decode
    messages = list(parsed.parsed.messages)

    def protobuf_indexes(payload: bytes) -> None:
        # Confluent's message indexes: a zigzag varint count, then that many zigzag indexes (a
        # single 0 byte: the first message); each must name a message of the schema
        count, pos = _zigzag(payload, 0)
        if count < 0 or count > len(payload):
            raise ValueError(f"message index count {count}")
        indexes = [0] if count == 0 else []
        for _ in range(count):
            value, pos = _zigzag(payload, pos)
            indexes.append(value)
        top = [m for m in messages if "." not in m]
        if not 0 <= indexes[0] < len(top):
            raise ValueError(f"message index {indexes[0]} names no message of the schema")

    return protobuf_indexes


def _zigzag(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise CorruptRecordError("truncated varint in the message indexes")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
