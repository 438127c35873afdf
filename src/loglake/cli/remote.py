"""Plumbing for the commands that talk to a running broker over the Kafka protocol.

They use confluent-kafka (librdkafka), the one maintained client loglake depends on: an
AdminClient for topics, configs and groups, a Producer and a Consumer for data. This module
builds their configs (librdkafka's own log lines go to a logger that is silent unless
`--log-level DEBUG`), checks that the broker answers within `REMOTE_TIMEOUT_S`, and turns
client errors into one-line CliErrors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from typing import Annotated, Any

import typer

from loglake.cli import command_config
from loglake.cli.common import CliError

BOOTSTRAP_ENV = "LOGLAKE_BOOTSTRAP_SERVER"
#: How long a command waits for the broker to answer: connecting, a metadata request, and the
#: request timeout of each admin request.
REMOTE_TIMEOUT_S = 10.0
#: The longest wait for an admin call's result (librdkafka may retry a request within it).
ADMIN_CALL_TIMEOUT_S = 3 * REMOTE_TIMEOUT_S

BootstrapOption = Annotated[
    str | None,
    typer.Option(
        "--bootstrap-server",
        envvar=BOOTSTRAP_ENV,
        help=f"HOST:PORT of a running loglake broker: talk to it over the Kafka protocol (env {BOOTSTRAP_ENV}).",
        show_default=False,
    ),
]

#: One connection attempt of the first metadata request (retried until REMOTE_TIMEOUT_S).
CONNECT_ATTEMPT_S = 1.0
#: librdkafka's local error codes for "connection refused / reset" and "unknown host".
_TRANSPORT, _RESOLVE = -195, -193
#: ... and for a failed SASL login or TLS handshake: retrying will not help either.
_AUTHENTICATION, _SSL = -169, -181
#: ... and for "every bootstrap broker closed the connection" (or could not be connected).
_ALL_BROKERS_DOWN = -187
#: How long the check that something accepts TCP connections at the address waits.
TCP_PROBE_S = 2.0

#: Who may grant an ACL, and how (there is no `loglake acls` command: Kafka's admin APIs do it).
ACL_HINT = (
    "a super user (loglake serve --super-users) grants ACLs with Kafka's admin API: kafka-acls.sh --add "
    "or an AdminClient's create_acls (docs/SECURITY.md, \"ACLs\")"
)

#: librdkafka's log lines (connection refused and the like) land here instead of on stderr.
LIBRDKAFKA_LOGGER = "loglake.cli.librdkafka"


def require_bootstrap(bootstrap: str | None, what: str) -> str:
    """The bootstrap address, or a one-line error for commands that only work against a broker."""
    if not bootstrap:
        raise CliError(
            f"{what} needs a running broker: pass --bootstrap-server HOST:PORT (or set {BOOTSTRAP_ENV})"
        )
    return bootstrap


def _librdkafka_logger() -> logging.Logger:
    logger = logging.getLogger(LIBRDKAFKA_LOGGER)
    # Only `--log-level DEBUG` shows librdkafka's lines; otherwise a refused connection would
    # print a flood of them before our own one-line error.
    logger.setLevel(logging.DEBUG if logging.getLogger().level <= logging.DEBUG else logging.CRITICAL + 1)
    return logger


def _ignore_error(err: Any) -> None:
    """librdkafka's error_cb: transport errors surface through the calls' own timeouts."""


def client_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    """A confluent-kafka config: ours, then `--command-config`'s settings (TLS, SASL, tuning), then
    what the caller needs for its client (group id, callbacks)."""
    timeout_ms = int(REMOTE_TIMEOUT_S * 1000)
    return {
        "bootstrap.servers": bootstrap,
        "client.id": "loglake-cli",
        "logger": _librdkafka_logger(),
        "error_cb": _ignore_error,
        "socket.timeout.ms": timeout_ms,
        "socket.connection.setup.timeout.ms": timeout_ms,
        **command_config.client_settings(),
        **extra,
    }


def _bad_settings(bootstrap: str, exc: BaseException) -> CliError:
    """A client librdkafka refused to make: a malformed address, or a setting of --command-config."""
    src = command_config.source()
    where = f"--bootstrap-server {bootstrap!r}" + (f" or --command-config {src}" if src else "")
    return CliError(f"bad {where}: {describe_error(exc)}")


def _reason(text: str) -> str:
    """"host:port/bootstrap: Connect to ipv4#... failed: Connection refused (after 0ms in state CONNECT)"
    -> "Connection refused"."""
    text = text.split(" (after ", 1)[0]
    return text.rsplit(": ", 1)[-1].strip() or text


def _denial(text: str) -> str:
    """librdkafka's "sasl_ssl://127.0.0.1:9093/bootstrap: SASL authentication error: ... (after 3ms
    in state AUTH_REQ)" -> from "SASL"/"SSL" on, without the broker prefix and the state."""
    text = text.split(" (after ", 1)[0]
    return text.split("/bootstrap: ", 1)[-1].strip() or text


def unreachable(bootstrap: str) -> CliError:
    return CliError(f"cannot reach a broker at {bootstrap} within {REMOTE_TIMEOUT_S:g}s")


def principal() -> str:
    """The principal the broker takes this command for, as far as --command-config tells: the SASL
    user, the TLS client certificate's, or User:ANONYMOUS."""
    from loglake.broker.security.tls import ANONYMOUS

    settings = command_config.client_settings()
    protocol = settings.get("security.protocol", "plaintext").upper()
    if protocol.startswith("SASL") and settings.get("sasl.username"):
        return f"User:{settings['sasl.username']}"
    if protocol == "SSL" and settings.get("ssl.certificate.location"):
        return f"the principal of the client certificate {settings['ssl.certificate.location']}"
    return ANONYMOUS


def denied(message: str, detail: str = "") -> CliError:
    """The broker refused this command's principal (an ACL is missing): `message`, who, `detail`."""
    who = principal()
    return CliError(f"{message} for {who}{detail}", hint=f"grant {who if who.startswith('User:') else 'it'} an ACL: {ACL_HINT}")


#: librdkafka's authorization error names -> the kind of resource the ACL is missing on.
_AUTHORIZATION_FAILED = {
    "TOPIC_AUTHORIZATION_FAILED": "topic",
    "GROUP_AUTHORIZATION_FAILED": "group",
    "CLUSTER_AUTHORIZATION_FAILED": "the cluster",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": "transactional id",
}


def _plaintext() -> bool:
    """Does this command speak plaintext Kafka (no security.protocol of TLS or SASL given)?"""
    return command_config.client_settings().get("security.protocol", "plaintext").lower() == "plaintext"


def _tcp_accepts(bootstrap: str) -> str | None:
    """The first HOST:PORT of `bootstrap` that accepts a TCP connection, or None."""
    import socket

    for address in bootstrap.split(","):
        host, sep, port = address.strip().rpartition(":")
        if not sep or not port.isdigit():
            continue
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=TCP_PROBE_S):
                return address.strip()
        except OSError:
            continue
    return None


def not_plaintext_kafka(address: str, silent_s: float | None = None) -> CliError:
    """`address` accepted the connection and closed it without answering a plaintext request, or
    (`silent_s`) kept it open that long without answering."""
    if silent_s is None:
        what = "it did not answer a plaintext Kafka request: is it a TLS or SASL listener?"
    else:
        what = f"it did not answer a plaintext Kafka request within {silent_s:g}s: is it a TLS or SASL listener, or a stopped process?"
    return CliError(
        f"connected to {address} but {what}",
        hint="give the listener's client settings with --command-config FILE (security.protocol=SSL, SASL_SSL or "
        "SASL_PLAINTEXT, with ssl.ca.location and sasl.mechanism/sasl.username/sasl.password as it needs; "
        "docs/SECURITY.md)",
    )


def describe_error(exc: BaseException) -> str:
    """A KafkaException (or other failure) as a short message."""
    args = getattr(exc, "args", ())
    err = args[0] if args else None
    if err is not None and hasattr(err, "str") and hasattr(err, "name"):
        text = err.str() or err.name()
        return str(text).strip()
    return str(exc).strip() or type(exc).__name__


def error_name(exc: BaseException) -> str:
    """librdkafka's error code name (UNKNOWN_TOPIC_OR_PART, GROUP_ID_NOT_FOUND, ...), or ''."""
    args = getattr(exc, "args", ())
    err = args[0] if args else None
    return str(err.name()) if err is not None and hasattr(err, "name") else ""


def result(future: Future[Any], what: str) -> Any:
    """Wait (bounded) for an admin future; failures become one-line CliErrors naming `what`."""
    try:
        return future.result(timeout=ADMIN_CALL_TIMEOUT_S)
    except TimeoutError:
        raise CliError(f"{what}: the broker did not answer within {ADMIN_CALL_TIMEOUT_S:g}s") from None
    except Exception as exc:
        name = error_name(exc)
        message = describe_error(exc)
        if name in _AUTHORIZATION_FAILED:
            raise denied(f"{what}: authorization denied on {_AUTHORIZATION_FAILED[name]}") from None
        if name in ("UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC") and "unknown topic '" not in message:
            message = "unknown topic"  # librdkafka's generic "Broker: Unknown topic or partition"
        raise CliError(f"{what}: {message}") from None


class Remote:
    """An AdminClient on `bootstrap`, checked to be reachable when made."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka.admin import AdminClient

        self.bootstrap = bootstrap
        self._refused: list[str] = []
        self._denied: list[str] = []
        self._down = False
        try:
            self.admin = AdminClient(client_config(bootstrap, error_cb=self._on_error))
        except Exception as exc:  # a malformed address or config
            raise _bad_settings(bootstrap, exc) from None
        self._connect()

    def _on_error(self, err: Any) -> None:
        if err.code() in (_TRANSPORT, _RESOLVE):
            self._refused.append(str(err.str()))
        elif err.code() in (_AUTHENTICATION, _SSL):
            self._denied.append(str(err.str()))
        elif err.code() == _ALL_BROKERS_DOWN:
            self._down = True

    def _connect(self) -> None:
        """The first metadata request, retried until REMOTE_TIMEOUT_S; a refused connection or an
        unknown host ends it at once (with the reason), as nothing listens there."""
        deadline = time.monotonic() + REMOTE_TIMEOUT_S
        while True:
            try:
                self.admin.list_topics(timeout=CONNECT_ATTEMPT_S)
                return
            except Exception:
                self.admin.poll(0)  # serve error_cb, and librdkafka's log lines to its (silent) logger
            if self._denied:
                raise CliError(f"the broker at {self.bootstrap} refused the connection: {_denial(self._denied[-1])}")
            if self._refused:
                raise CliError(f"cannot reach a broker at {self.bootstrap}: {_reason(self._refused[-1])}")
            if self._down and _plaintext():
                # Every broker closed the connection: a TLS or SASL listener does that to a
                # plaintext client (librdkafka then retries until the deadline, saying nothing).
                address = _tcp_accepts(self.bootstrap)
                if address is not None:
                    raise not_plaintext_kafka(address)
            if time.monotonic() >= deadline:
                # Whether librdkafka gave up on a silent connection before this deadline is a race:
                # a port that accepts is told as such either way.
                address = _tcp_accepts(self.bootstrap) if _plaintext() else None
                if address is not None:
                    raise not_plaintext_kafka(address, REMOTE_TIMEOUT_S)
                raise unreachable(self.bootstrap)

    def metadata(self, topic: str | None = None) -> Any:
        try:
            return self.admin.list_topics(topic=topic, timeout=REMOTE_TIMEOUT_S)
        except Exception:
            self.admin.poll(0)
            raise unreachable(self.bootstrap) from None

    def topic_names(self) -> list[str]:
        return sorted(t for t in self.metadata().topics if not t.startswith("__"))

    def partitions(self, topic: str) -> list[int]:
        """The topic's partition ids; CliError when the broker does not know the topic."""
        md = self.metadata().topics.get(topic)
        if md is None and not self.may_describe(topic):
            raise denied(f"authorization denied on topic {topic!r}", " (not allowed to describe it)")
        if md is None or (md.error is not None and not md.partitions):
            raise CliError(f"unknown topic {topic!r}")
        return sorted(md.partitions)

    def may_describe(self, topic: str) -> bool:
        """False when the broker refuses to describe `topic` to this principal. A listing of all
        topics leaves such a topic out as if it did not exist; asking for it alone tells (as in
        Kafka, also for a topic that does not exist: the broker does not say which)."""
        from confluent_kafka import TopicCollection

        future = self.admin.describe_topics(TopicCollection([topic]), request_timeout=REMOTE_TIMEOUT_S)[topic]
        try:
            future.result(timeout=ADMIN_CALL_TIMEOUT_S)
        except Exception as exc:
            return error_name(exc) != "TOPIC_AUTHORIZATION_FAILED"
        return True

    def broker_id(self) -> int:
        brokers = self.metadata().brokers
        if not brokers:
            raise unreachable(self.bootstrap)
        return int(min(brokers))

    def offsets(self, topic: str, partitions: Iterable[int], spec: str | int) -> dict[int, int]:
        """ListOffsets per partition: spec 'earliest', 'latest' or a timestamp in ms (-1: none)."""
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        wanted = list(partitions)
        if not wanted:
            return {}
        if spec == "earliest":
            offset_spec = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
        elif spec == "latest":
            offset_spec = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        else:
            offset_spec = OffsetSpec.for_timestamp(int(spec))
        futures = self.admin.list_offsets(
            {TopicPartition(topic, p): offset_spec for p in wanted}, request_timeout=REMOTE_TIMEOUT_S
        )
        return {tp.partition: int(result(f, f"list offsets of {topic}").offset) for tp, f in futures.items()}


def consumer(bootstrap: str, **extra: Any) -> Any:
    from confluent_kafka import Consumer

    try:
        return Consumer(client_config(bootstrap, **extra))
    except Exception as exc:
        raise _bad_settings(bootstrap, exc) from None


def producer(bootstrap: str, **extra: Any) -> Any:
    from confluent_kafka import Producer

    try:
        return Producer(client_config(bootstrap, **extra))
    except Exception as exc:
        raise _bad_settings(bootstrap, exc) from None


def parse_config_list(values: Iterable[str] | None, what: str) -> dict[str, str]:
    """`k=v,k2=v2` (repeatable; a value with commas in [brackets], as kafka-configs.sh) into a dict."""
    out: dict[str, str] = {}
    for raw in values or []:
        for item in _split_top_level(raw):
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise typer.BadParameter(f"{what} must look like key=value[,key=value], got {raw!r}")
            if value.startswith("[") and value.endswith("]"):
                value = value[1:-1]
            out[key] = value
    return out


def parse_name_list(values: Iterable[str] | None) -> list[str]:
    return [n.strip() for raw in values or [] for n in raw.split(",") if n.strip()]


def _split_top_level(raw: str) -> list[str]:
    items: list[str] = []
    depth = 0
    current = ""
    for ch in raw:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    items.append(current)
    return [i for i in items if i.strip()]


def sources(entries: Mapping[str, Any]) -> dict[str, tuple[str | None, str, bool]]:
    """describe_configs entries as name -> (value, source name, is an override on the entity)."""
    from confluent_kafka.admin import ConfigSource

    out: dict[str, tuple[str | None, str, bool]] = {}
    for name, entry in entries.items():
        try:
            source = ConfigSource(entry.source).name
        except ValueError:
            source = str(entry.source)
        out[name] = (entry.value, source, source.startswith("DYNAMIC_"))
    return out
