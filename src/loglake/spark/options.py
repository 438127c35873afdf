"""Options of the `loglake` Spark data source: parsing and validation (no pyspark needed).

Names and meanings follow Spark's Kafka source (`subscribe`, `startingOffsets`, ...); option
names are case-insensitive, as everywhere in Spark. Anything unknown or contradictory raises
`LoglakeOptionError` (a ValueError) naming the option, before any data is touched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlencode, urlsplit, urlunsplit

from loglake.spark.typed import Format

#: Offsets in startingOffsets/endingOffsets JSON with a special meaning (as in Kafka).
EARLIEST = -2
LATEST = -1

Mode = Literal["batch", "stream", "write"]


class LoglakeOptionError(ValueError):
    """An option of the loglake data source is unknown, malformed or contradicts another."""


#: The options of a typed read (lower case, as options are compared): the formats of keys and
#: values and the schema registry's URL (loglake.spark.typed).
TYPED_OPTIONS = frozenset({"valueformat", "keyformat", "schemaregistryurl"})


#: Options of the reader (lower-case). `path` is also what `.load(path)` sets.
READ_OPTIONS = frozenset(
    {
        "path",
        "subscribe",
        "subscribepattern",
        "assign",
        "startingoffsets",
        "endingoffsets",
        "startingtimestamp",
        "endingtimestamp",
        "startingoffsetsbytimestamp",
        "endingoffsetsbytimestamp",
        "startingoffsetsbytimestampstrategy",
        "maxoffsetspertrigger",
        "minpartitions",
        "failondataloss",
        "includeheaders",
        "coldpath",
        "kafka.isolation.level",
        *TYPED_OPTIONS,
    }
)
#: Java client settings librdkafka (the client the source and sink use) does not have: refused,
#: naming what to use instead, rather than failing in librdkafka with "No such configuration property".
JAVA_ONLY_KAFKA = {
    "ssl.truststore.location": "kafka.ssl.ca.location (the CA certificates as a PEM file)",
    "ssl.truststore.password": "kafka.ssl.ca.location (a PEM file needs no password)",
    "ssl.truststore.type": "kafka.ssl.ca.location (a PEM file)",
    "ssl.truststore.certificates": "kafka.ssl.ca.pem",
    "ssl.keystore.type": "kafka.ssl.keystore.location (PKCS#12) or kafka.ssl.certificate.location + kafka.ssl.key.location (PEM)",
    "ssl.keystore.certificate.chain": "kafka.ssl.certificate.pem",
    "ssl.keystore.key": "kafka.ssl.key.pem",
    "ssl.protocol": "nothing: librdkafka negotiates the newest TLS version both sides support",
    "sasl.jaas.config": "kafka.sasl.username and kafka.sasl.password (or kafka.sasl.oauthbearer.*)",
    "sasl.login.callback.handler.class": "kafka.sasl.oauthbearer.* (librdkafka has no Java callbacks)",
    "sasl.client.callback.handler.class": "kafka.sasl.username and kafka.sasl.password",
    "key.deserializer": "nothing: the source returns key and value as bytes (cast them in Spark)",
    "value.deserializer": "nothing: the source returns key and value as bytes (cast them in Spark)",
    "key.serializer": "nothing: the sink writes key and value as given (binary or string columns)",
    "value.serializer": "nothing: the sink writes key and value as given (binary or string columns)",
    "interceptor.classes": "nothing: librdkafka has no Java interceptors",
}
#: Consumer settings the hybrid reader owns (it reads fixed offset ranges with no consumer
#: group, as Spark's Kafka source does): refused with the option that does the job.
READER_OWNED_KAFKA = {
    "group.id": "no consumer group is used: each task reads its own offset range with assign()",
    "auto.offset.reset": "use startingOffsets",
    "enable.auto.commit": "offsets are kept in Spark's checkpoint, never committed to the broker",
    "enable.partition.eof": "the reader needs it to finish a range",
}
#: Values of kafka.isolation.level (Spark's Kafka source passes it to its consumers; the same
#: default: read_uncommitted).
ISOLATION_LEVELS = ("read_uncommitted", "read_committed")
#: Options of the writer (lower-case); `kafka.*` producer settings are passed through too.
WRITE_OPTIONS = frozenset({"topic", "includeheaders", "path"})
#: Options Spark itself may add to a source's or sink's options; accepted and ignored.
SPARK_OPTIONS = frozenset({"checkpointlocation", "queryname", "__partition_columns"})
#: S3 options turned into the store URL's query string (`s3.endpoint_url` -> `endpoint_url=`).
S3_PREFIX = "s3."


@dataclass(frozen=True)
class OffsetSpec:
    """Where to start or stop in each partition.

    kind: "earliest" | "latest" | "offsets" (per-partition JSON, -2/-1 allowed) |
    "timestamp" (one timestamp for all partitions) | "timestamps" (per-partition JSON).
    """

    kind: str
    per_partition: dict[tuple[str, int], int] = field(default_factory=dict)
    timestamp: int = 0


@dataclass(frozen=True)
class ReadOptions:
    store_url: str
    path: str
    cold_url: str | None = None
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    assign: dict[str, tuple[int, ...]] | None = None
    starting: OffsetSpec = OffsetSpec("earliest")
    ending: OffsetSpec = OffsetSpec("latest")
    timestamp_strategy: str = "error"
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    isolation: str = "read_uncommitted"
    #: kafka.bootstrap.servers: hybrid reads (the sealed part from the stores, the tail after it
    #: through the broker); None: sealed segments only
    bootstrap_servers: str | None = None
    #: the other kafka.* options (security, timeouts, ...) as librdkafka settings, sorted
    kafka_config: tuple[tuple[str, str], ...] = ()
    #: valueFormat / keyFormat: values / keys decoded from Confluent's wire format into typed
    #: columns with the registry at schemaRegistryUrl (loglake.spark.typed); None: bytes
    value_format: Format | None = None
    key_format: Format | None = None
    schema_registry_url: str | None = None

    @property
    def typed(self) -> bool:
        return self.value_format is not None or self.key_format is not None

    @property
    def typed_topic(self) -> str:
        """The one topic a typed read reads (its subjects are `<topic>-value`, `<topic>-key`)."""
        if self.subscribe:
            return self.subscribe[0]
        assert self.assign is not None
        return next(iter(self.assign))

    @property
    def read_committed(self) -> bool:
        return self.isolation == "read_committed"

    @property
    def hybrid(self) -> bool:
        return self.bootstrap_servers is not None

    def matches(self, topic: str) -> bool:
        if self.subscribe:
            return topic in self.subscribe
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return self.assign is not None and topic in self.assign


@dataclass(frozen=True)
class WriteOptions:
    bootstrap_servers: str
    topic: str | None
    producer_config: dict[str, str]


def _lower(options: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in options.items():
        key = str(k).lower()
        if key in out:
            raise LoglakeOptionError(f"option {k!r} is given twice (option names are case-insensitive)")
        out[key] = "" if v is None else str(v)
    return out


def parse_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise LoglakeOptionError(f"option {name} must be true or false, got {value!r}")


def parse_positive_int(name: str, value: str) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise LoglakeOptionError(f"option {name} must be a positive integer, got {value!r}") from None
    if n <= 0:
        raise LoglakeOptionError(f"option {name} must be a positive integer, got {value!r}")
    return n


def _parse_json_object(name: str, value: str, accepted: str) -> dict[str, Any]:
    """`value` as a JSON object; anything else fails naming the forms the option takes."""
    try:
        doc = json.loads(value)
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        raise LoglakeOptionError(f"option {name} must be {accepted}, got {value!r}")
    return doc


#: What a per-partition offsets JSON looks like (Spark's Kafka source's form).
OFFSETS_JSON = 'a JSON object of per-partition offsets like {"topic": {"0": 23, "1": -2}}'
#: What a per-partition timestamps JSON looks like.
TIMESTAMPS_JSON = (
    'a JSON object of per-partition timestamps (ms since the epoch) like {"topic": {"0": 1700000000000}}'
)


def offsets_forms(prefix: str, mode: Mode) -> str:
    """The forms startingOffsets (prefix 'starting') or endingOffsets takes in `mode`, as an
    error message names them."""
    if prefix == "ending":
        return f"latest or {OFFSETS_JSON} (-1 latest)"
    if mode == "batch":  # a batch query cannot start at latest
        return f"earliest or {OFFSETS_JSON} (-2 earliest)"
    return f"earliest, latest or {OFFSETS_JSON} (-2 earliest, -1 latest)"


def parse_partition_json(
    name: str, value: str, *, allow_special: bool, accepted: str = OFFSETS_JSON
) -> dict[tuple[str, int], int]:
    """`{"topic": {"0": 23, "1": -2}}` -> {(topic, 0): 23, (topic, 1): -2}."""
    doc = _parse_json_object(name, value, accepted)
    out: dict[tuple[str, int], int] = {}
    for topic, parts in doc.items():
        if not isinstance(parts, dict):
            raise LoglakeOptionError(
                f"option {name}: topic {topic!r} must map partitions to numbers ({accepted})"
            )
        for p, v in parts.items():
            try:
                partition = int(p)
            except ValueError:
                raise LoglakeOptionError(
                    f"option {name}: partition {p!r} of {topic!r} is not a number"
                ) from None
            if isinstance(v, bool) or not isinstance(v, int):
                raise LoglakeOptionError(
                    f"option {name}: value for {topic}-{p} must be an integer, got {v!r}"
                )
            if v < 0 and not (allow_special and v in (EARLIEST, LATEST)):
                raise LoglakeOptionError(f"option {name}: value {v} for {topic}-{p} is negative")
            out[(topic, partition)] = v
    return out


def parse_assign(value: str) -> dict[str, tuple[int, ...]]:
    doc = _parse_json_object("assign", value, 'a JSON object of topics to partition lists like {"t": [0, 1]}')
    out: dict[str, tuple[int, ...]] = {}
    for topic, parts in doc.items():
        if not isinstance(parts, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts
        ):
            raise LoglakeOptionError(
                f'option assign: topic {topic!r} must map to a list of partition numbers, like {{"t": [0, 1]}}'
            )
        out[topic] = tuple(sorted(set(parts)))
    if not out:
        raise LoglakeOptionError("option assign names no topic")
    return out


def _parse_timestamp(name: str, value: str) -> int:
    try:
        ts = int(value.strip())
    except ValueError:
        raise LoglakeOptionError(
            f"option {name} must be milliseconds since the epoch, got {value!r}"
        ) from None
    if ts < 0:
        raise LoglakeOptionError(f"option {name} must not be negative, got {value!r}")
    return ts


def _offset_spec(opts: dict[str, str], prefix: str, mode: Mode) -> OffsetSpec:
    """The starting (prefix='starting') or ending (prefix='ending') spec of a reader."""
    given = [
        n for n in (f"{prefix}offsets", f"{prefix}timestamp", f"{prefix}offsetsbytimestamp") if n in opts
    ]
    pretty = {
        f"{prefix}offsets": f"{prefix}Offsets",
        f"{prefix}timestamp": f"{prefix}Timestamp",
        f"{prefix}offsetsbytimestamp": f"{prefix}OffsetsByTimestamp",
    }
    if len(given) > 1:
        raise LoglakeOptionError(
            "options " + " and ".join(pretty[g] for g in given) + " contradict each other: give only one"
        )
    default = OffsetSpec("earliest" if prefix == "starting" else "latest")
    if not given:
        return default
    name = given[0]
    value = opts[name]
    if name.endswith("bytimestamp"):
        per = parse_partition_json(pretty[name], value, allow_special=False, accepted=TIMESTAMPS_JSON)
        return OffsetSpec("timestamps", per_partition=per)
    if name.endswith("timestamp"):
        return OffsetSpec("timestamp", timestamp=_parse_timestamp(pretty[name], value))
    v = value.strip().lower()
    if v in ("earliest", "latest"):
        if prefix == "starting" and v == "latest" and mode == "batch":
            raise LoglakeOptionError(
                f"option startingOffsets=latest is not allowed in a batch query: use {offsets_forms(prefix, mode)}"
            )
        if prefix == "ending" and v == "earliest":
            raise LoglakeOptionError(
                f"option endingOffsets=earliest is not allowed: use {offsets_forms(prefix, mode)}"
            )
        return OffsetSpec(v)
    per = parse_partition_json(pretty[name], value, allow_special=True, accepted=offsets_forms(prefix, mode))
    for (t, p), off in per.items():
        if prefix == "starting" and off == LATEST and mode == "batch":
            raise LoglakeOptionError(
                f"option startingOffsets: -1 (latest) for {t}-{p} is not allowed in a batch query"
            )
        if prefix == "ending" and off == EARLIEST:
            raise LoglakeOptionError(f"option endingOffsets: -2 (earliest) for {t}-{p} is not allowed")
    return OffsetSpec("offsets", per_partition=per)


def store_url_from(opts: Mapping[str, str], *, data_dir: bool = True) -> str:
    """The store URL for `path` plus any `s3.*` options as its query (`s3.region=x` -> `?region=x`).

    A loglake data directory (it has a `segments/` folder) means its hot segment store."""
    path = opts.get("path", "").strip()
    if not path:
        raise LoglakeOptionError("option path is required: a loglake data directory or a segment store URL")
    extra = {k[len(S3_PREFIX) :]: v for k, v in opts.items() if k.startswith(S3_PREFIX)}
    if "://" not in path or path.startswith("file://"):
        import os

        local = path[len("file://") :] if path.startswith("file://") else path
        local = os.path.abspath(local)
        if extra and not any(
            str(v).startswith("s3://") for k, v in opts.items() if k in ("path", "coldpath")
        ):
            raise LoglakeOptionError(f"s3.* options given but path {path!r} is not an s3:// URL")
        if data_dir and os.path.isdir(os.path.join(local, "segments")):
            local = os.path.join(local, "segments")
        return local
    if not extra:
        return path
    parts = urlsplit(path)
    query = parts.query + ("&" if parts.query else "") + urlencode(sorted(extra.items()))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def cold_url_from(opts: Mapping[str, str]) -> str | None:
    """The cold-tier store URL (option coldPath), with the s3.* options applied like path's."""
    cold = opts.get("coldpath", "").strip()
    if cold:
        return store_url_from({**opts, "path": cold}, data_dir=False)
    path = opts.get("path", "").strip()
    if not path:
        return None
    if "://" not in path or path.startswith("file://"):
        import os

        local = os.path.abspath(path[len("file://") :] if path.startswith("file://") else path)
        if os.path.isdir(os.path.join(local, "segments")):
            return None  # a data directory: its cold segments are elsewhere (coldPath)
    # `path` is a segment store itself (e.g. the bucket a broker tiers to): the cold segments
    # its meta.json lists are in it.
    return store_url_from(opts, data_dir=False)


def kafka_client_options(opts: Mapping[str, str], owned: Mapping[str, str]) -> dict[str, str]:
    """The `kafka.*` options (lower-cased names) as librdkafka settings, without the `kafka.`
    prefix, as Spark's Kafka source and sink pass them to their clients. Java-only names and
    settings the caller owns are refused with what to use instead; librdkafka itself checks the
    rest when the first client is made."""
    out: dict[str, str] = {}
    for k, v in opts.items():
        if not k.startswith("kafka."):
            continue
        name = k[len("kafka.") :]
        if name in JAVA_ONLY_KAFKA:
            raise LoglakeOptionError(
                f"option {k} is a Java client setting that librdkafka (the client loglake's Spark "
                f"source and sink use) does not have; use {JAVA_ONLY_KAFKA[name]}"
            )
        if name in owned:
            raise LoglakeOptionError(f"option {k} cannot be set: {owned[name]}")
        out[name] = v
    return out


def parse_read_options(options: Mapping[str, Any], mode: Mode) -> ReadOptions:
    opts = _lower(options)
    servers = opts.get("kafka.bootstrap.servers", "").strip() or None
    for k in opts:
        if k in READ_OPTIONS or k in SPARK_OPTIONS or k.startswith(S3_PREFIX):
            continue
        if k.startswith("kafka.") and servers is None:
            raise LoglakeOptionError(
                f"option {k!r} is used only with kafka.bootstrap.servers (hybrid reads through a broker); "
                "without it the reader reads sealed segments from `path` and takes only kafka.isolation.level"
            )
        if k.startswith("kafka."):
            continue
        raise LoglakeOptionError(
            f"unknown option {k!r} for the loglake source (known: {', '.join(sorted(READ_OPTIONS))})"
        )
    chosen = [n for n in ("subscribe", "subscribepattern", "assign") if n in opts]
    if len(chosen) != 1:
        raise LoglakeOptionError(
            "exactly one of the options subscribe, subscribePattern, assign must be given"
            + (f" (got {', '.join(chosen)})" if chosen else "")
        )
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    assign: dict[str, tuple[int, ...]] | None = None
    if "subscribe" in opts:
        subscribe = tuple(dict.fromkeys(t.strip() for t in opts["subscribe"].split(",") if t.strip()))
        if not subscribe:
            raise LoglakeOptionError("option subscribe names no topic")
    elif "subscribepattern" in opts:
        pattern = opts["subscribepattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise LoglakeOptionError(
                f"option subscribePattern {pattern!r} is not a valid regex: {exc}"
            ) from None
    else:
        assign = parse_assign(opts["assign"])
    starting = _offset_spec(opts, "starting", mode)
    ending = _offset_spec(opts, "ending", mode)
    if mode == "stream" and any(
        k in opts for k in ("endingoffsets", "endingtimestamp", "endingoffsetsbytimestamp")
    ):
        raise LoglakeOptionError(
            "ending offsets (endingOffsets, endingTimestamp, ...) are not allowed in a streaming query"
        )
    value_format, key_format, registry_url = _typed_options(opts, subscribe, assign)
    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise LoglakeOptionError(
            f"option startingOffsetsByTimestampStrategy must be error or latest, got {strategy!r}"
        )
    return ReadOptions(
        store_url=store_url_from(opts),
        path=opts.get("path", ""),
        cold_url=cold_url_from(opts),
        subscribe=subscribe,
        pattern=pattern,
        assign=assign,
        starting=starting,
        ending=ending,
        timestamp_strategy=strategy,
        max_offsets_per_trigger=(
            parse_positive_int("maxOffsetsPerTrigger", opts["maxoffsetspertrigger"])
            if "maxoffsetspertrigger" in opts
            else None
        ),
        min_partitions=parse_positive_int("minPartitions", opts["minpartitions"])
        if "minpartitions" in opts
        else None,
        fail_on_data_loss=parse_bool("failOnDataLoss", opts.get("failondataloss", "true")),
        include_headers=parse_bool("includeHeaders", opts.get("includeheaders", "false")),
        isolation=_isolation(opts.get("kafka.isolation.level", ISOLATION_LEVELS[0])),
        bootstrap_servers=servers,
        value_format=value_format,
        key_format=key_format,
        schema_registry_url=registry_url,
        kafka_config=tuple(
            sorted(
                kafka_client_options(
                    {
                        k: v
                        for k, v in opts.items()
                        if k not in ("kafka.bootstrap.servers", "kafka.isolation.level")
                    },
                    READER_OWNED_KAFKA,
                ).items()
            )
        ),
    )


#: What valueFormat / keyFormat take.
FORMATS_TEXT = ", ".join(f.value for f in Format)


def _typed_options(
    opts: Mapping[str, str], subscribe: tuple[str, ...], assign: dict[str, tuple[int, ...]] | None
) -> tuple[Format | None, Format | None, str | None]:
    """(valueFormat, keyFormat, schemaRegistryUrl), checked: a format needs the registry's URL
    and one topic (its subjects are the topic's)."""
    formats: list[Format | None] = []
    for name, pretty in (("valueformat", "valueFormat"), ("keyformat", "keyFormat")):
        raw = opts.get(name, "").strip().lower()
        if not raw:
            formats.append(None)
            continue
        try:
            formats.append(Format(raw))
        except ValueError:
            raise LoglakeOptionError(f"option {pretty} must be one of {FORMATS_TEXT}, got {opts[name]!r}") from None
    url = opts.get("schemaregistryurl", "").strip() or None
    if not any(formats):
        if url is not None:
            raise LoglakeOptionError("option schemaRegistryUrl is used only with valueFormat or keyFormat")
        return None, None, None
    if url is None:
        raise LoglakeOptionError(
            "option schemaRegistryUrl is required with valueFormat/keyFormat: the schema registry's URL "
            "(a broker's is its --schema-registry-listen address, http://HOST:PORT)"
        )
    if not url.startswith(("http://", "https://")):
        raise LoglakeOptionError(f"option schemaRegistryUrl must be an http(s):// URL, got {url!r}")
    topics = subscribe or tuple(assign or ())
    if len(topics) != 1:
        raise LoglakeOptionError(
            "valueFormat/keyFormat read one topic (its subjects <topic>-value and <topic>-key): "
            "subscribe to exactly one topic (or assign partitions of one)"
        )
    return formats[0], formats[1], url


@dataclass(frozen=True)
class TypedOptions:
    """The options of a typed read alone (what the source's schema depends on)."""

    topic: str
    value_format: Format | None
    key_format: Format | None
    schema_registry_url: str


def parse_typed_options(options: Mapping[str, Any]) -> TypedOptions | None:
    """valueFormat / keyFormat / schemaRegistryUrl of a reader's options, checked as
    parse_read_options checks them; None when neither format is given. The source's schema
    comes from them before the reader (and its mode) is known."""
    opts = _lower(options)
    subscribe = tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip())
    assign = parse_assign(opts["assign"]) if "assign" in opts and not subscribe else None
    value_format, key_format, url = _typed_options(opts, subscribe, assign)
    if url is None:
        return None
    return TypedOptions((subscribe or tuple(assign or ()))[0], value_format, key_format, url)


def _isolation(value: str) -> str:
    v = value.strip().lower()
    if v not in ISOLATION_LEVELS:
        raise LoglakeOptionError(
            f"option kafka.isolation.level must be read_uncommitted or read_committed, got {value!r}"
        )
    return v


def parse_write_options(options: Mapping[str, Any]) -> WriteOptions:
    opts = _lower(options)
    producer = kafka_client_options(opts, {})
    for k in opts:
        if not k.startswith("kafka.") and k not in WRITE_OPTIONS and k not in SPARK_OPTIONS:
            raise LoglakeOptionError(
                f"unknown option {k!r} for the loglake sink (known: kafka.bootstrap.servers, kafka.*, topic)"
            )
    servers = producer.pop("bootstrap.servers", "").strip()
    if not servers:
        raise LoglakeOptionError("option kafka.bootstrap.servers is required to write to loglake")
    topic = opts.get("topic", "").strip() or None
    return WriteOptions(bootstrap_servers=servers, topic=topic, producer_config=producer)
