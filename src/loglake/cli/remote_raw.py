"""Requests the CLI sends itself, for APIs neither confluent-kafka nor kafka-python has a call for.

One connection to the bootstrap broker, opened the way `--command-config` says: plain TCP, TLS
(``ssl.ca.location``, ``ssl.certificate.location``/``ssl.key.location``/``ssl.key.password``,
``ssl.endpoint.identification.algorithm``, ``enable.ssl.certificate.verification``) and SASL
(``sasl.mechanism`` PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 with ``sasl.username`` and
``sasl.password``), the same settings librdkafka reads for the other commands. Requests are
encoded with the kafka-python message classes the broker's codec uses.

A TLS or SASL setting this path does not know is refused (`CliError`) rather than ignored: a
connection quietly weaker than the one the file asks for is the one outcome not allowed.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Mapping
from typing import Any

from kafka.protocol.parser import KafkaProtocol

from loglake.broker.protocol.api_keys import ApiKey
from loglake.broker.protocol.messages import request_class
from loglake.cli import command_config
from loglake.cli.common import CliError
from loglake.cli.remote import REMOTE_TIMEOUT_S, unreachable
from loglake.kafka_errors import ErrorCode
from loglake.scram import MECHANISMS, ScramClient, ScramError

#: Largest response read (a describe of CLIENT_QUOTA_ENTITIES_MAX entities fits).
RESPONSE_BYTES_MAX = 64 * 1024 * 1024
#: Versions of the SASL requests sent (handshake v1: the tokens then go in SaslAuthenticate).
SASL_HANDSHAKE_VERSION, SASL_AUTHENTICATE_VERSION = 1, 1
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
#: The settings this path reads; other ssl.* / sasl.* settings are refused.
KNOWN = frozenset(
    {
        "security.protocol",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.key.password",
        "ssl.endpoint.identification.algorithm",
        "enable.ssl.certificate.verification",
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
    }
)


def build(struct: Any, version: int, values: dict[str, Any]) -> dict[str, Any]:
    """Request fields with nested struct arrays turned into kafka-python's data classes."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        field = struct.fields[name]
        if value is not None and field.is_struct_array():
            value = [field.data_class(**build(field, version, v), version=version) for v in value]
        out[name] = value
    return out


def error_name(code: int) -> str:
    member = ErrorCode._value2member_map_.get(code)
    return member.name if member is not None else f"error {code}"


def _checked(settings: Mapping[str, str], what: str) -> dict[str, str]:
    unknown = sorted(k for k in settings if k.startswith(("ssl.", "sasl.")) and k not in KNOWN)
    if unknown:
        raise CliError(
            f"{what} sends its own requests and does not support {', '.join(unknown)} from --command-config "
            f"(it reads {', '.join(sorted(KNOWN))})"
        )
    protocol = settings.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise CliError(
            f"--command-config: security.protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}"
        )
    return {**settings, "security.protocol": protocol}


def _tls(settings: Mapping[str, str]) -> ssl.SSLContext:
    try:
        ctx = ssl.create_default_context(cafile=settings.get("ssl.ca.location"))
        if settings.get("enable.ssl.certificate.verification", "true").lower() == "false":
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif settings.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
            ctx.check_hostname = False
        if "ssl.certificate.location" in settings:
            ctx.load_cert_chain(
                settings["ssl.certificate.location"],
                settings.get("ssl.key.location"),
                settings.get("ssl.key.password"),
            )
    except (OSError, ssl.SSLError) as exc:
        raise CliError(f"--command-config: TLS files: {exc}") from None
    return ctx


class Connection:
    """One connection to the bootstrap broker, authenticated as `--command-config` says."""

    def __init__(self, bootstrap: str, what: str) -> None:
        host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
        if not host or not port.isdigit():
            raise CliError(f"bad --bootstrap-server {bootstrap!r}: want HOST:PORT")
        self.bootstrap, self.what = bootstrap, what
        settings = _checked(command_config.client_settings(), what)
        host = host.strip("[]")
        self._proto = KafkaProtocol(client_id="loglake-cli")
        try:
            self._sock: socket.socket = socket.create_connection((host, int(port)), timeout=REMOTE_TIMEOUT_S)
        except OSError:
            raise unreachable(bootstrap) from None
        try:
            if settings["security.protocol"] in ("SSL", "SASL_SSL"):
                try:
                    self._sock = _tls(settings).wrap_socket(self._sock, server_hostname=host)
                except (OSError, ssl.SSLError) as exc:
                    raise CliError(
                        f"the broker at {bootstrap} refused the connection: TLS handshake: {exc}"
                    ) from None
            if settings["security.protocol"].startswith("SASL_"):
                self._login(settings)
        except BaseException:
            self._sock.close()
            raise

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, api_key: int, version: int, **fields: Any) -> Any:
        """Send one request; its decoded response (CliError if the connection fails)."""
        cls = request_class(api_key)
        self._proto.send_request(cls[version](**build(cls._struct, version, fields)))
        received = 0
        try:
            self._sock.sendall(self._proto.send_bytes())
            while received < RESPONSE_BYTES_MAX:
                data = self._sock.recv(65536)
                if not data:
                    break
                received += len(data)
                responses = self._proto.receive_bytes(data)
                if responses:
                    return responses[0][1]
        except OSError:
            raise unreachable(self.bootstrap) from None
        raise CliError(f"{self.bootstrap} closed the connection without answering {cls.name}")

    def _login(self, settings: Mapping[str, str]) -> None:
        mechanism = settings.get("sasl.mechanism") or settings.get("sasl.mechanisms") or "GSSAPI"
        if mechanism != "PLAIN" and mechanism not in MECHANISMS:
            raise CliError(
                f"{self.what}: sasl.mechanism {mechanism} is not supported (PLAIN, {', '.join(MECHANISMS)})"
            )
        user, password = settings.get("sasl.username"), settings.get("sasl.password")
        if not user or password is None:
            raise CliError(f"--command-config: {mechanism} needs sasl.username and sasl.password")
        resp = self.request(ApiKey.SASL_HANDSHAKE, SASL_HANDSHAKE_VERSION, mechanism=mechanism)
        if resp.error_code:
            offered = ", ".join(resp.mechanisms or ()) or "none"
            raise CliError(f"the broker at {self.bootstrap} does not offer {mechanism} (it offers {offered})")
        if mechanism == "PLAIN":
            self._authenticate(b"\0" + user.encode() + b"\0" + password.encode())
            return
        scram = ScramClient(mechanism, user, password)
        try:
            final = scram.final(self._authenticate(scram.first()))
            scram.verify(self._authenticate(final))
        except ScramError as exc:
            raise CliError(
                f"the broker at {self.bootstrap} refused the connection: {mechanism}: {exc}"
            ) from None

    def _authenticate(self, token: bytes) -> bytes:
        resp = self.request(ApiKey.SASL_AUTHENTICATE, SASL_AUTHENTICATE_VERSION, auth_bytes=token)
        if resp.error_code:
            raise CliError(
                f"the broker at {self.bootstrap} refused the connection: {error_name(resp.error_code)}: "
                f"{resp.error_message or 'authentication failed'}"
            )
        return bytes(resp.auth_bytes or b"")
