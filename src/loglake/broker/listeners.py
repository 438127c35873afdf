"""Listeners the Kafka way: ``PROTOCOL://HOST:PORT``, one or more, and what each advertises.

A listener is a security protocol (Kafka's names: PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL) and
an address. A bare ``HOST:PORT`` is PLAINTEXT, so settings written before listeners had a protocol
keep working. As in Kafka without ``listener.security.protocol.map``, a listener's name is its
protocol, so each protocol can be used by one listener at most.

Advertised listeners (``--advertised-listener``) are matched to listeners **by protocol** when
they name one (``SSL://broker.example:9093``) and **by position** when they are a bare
``HOST:PORT`` (after the ones that name a protocol are placed, the bare ones go, in order, to the
listeners left, in listener order). A listener nothing is
matched to advertises its own address; port 0 in an advertised address means the port the
listener got.

Safe by default (`exposed_without_authentication`): a PLAINTEXT listener, or an SSL listener that
does not require a client certificate, bound to anything but a loopback address lets anyone who
can reach it read and write every topic, so `loglake serve` refuses to start with it unless
``--allow-unauthenticated-public-listener`` is given.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from loglake.errors import ConfigError

PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL = "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"
SECURITY_PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
#: Listen hosts that mean "every interface".
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class Listener:
    protocol: str
    host: str
    port: int

    @property
    def name(self) -> str:
        """Kafka's listener name; loglake's listeners are named after their protocol."""
        return self.protocol

    @property
    def tls(self) -> bool:
        return self.protocol in (SSL, SASL_SSL)

    @property
    def sasl(self) -> bool:
        return self.protocol in (SASL_PLAINTEXT, SASL_SSL)

    def url(self, host: str | None = None, port: int | None = None) -> str:
        h = self.host if host is None else host
        shown = f"[{h}]" if ":" in h else h
        return f"{self.protocol}://{shown}:{self.port if port is None else port}"


def parse_host_port(value: str, what: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"{what} must be HOST:PORT or PROTOCOL://HOST:PORT, got {value!r}")
    host = host.strip("[]") or "0.0.0.0"
    number = int(port)
    if not 0 <= number <= 65535:
        raise ConfigError(f"{what}: port {number} out of range")
    return host, number


def parse_listener(text: str, what: str) -> tuple[Listener, bool]:
    """One ``PROTOCOL://HOST:PORT`` or bare ``HOST:PORT`` (PLAINTEXT); and whether it named a protocol."""
    text = text.strip()
    protocol, sep, rest = text.partition("://")
    if not sep:
        host, port = parse_host_port(text, what)
        return Listener(PLAINTEXT, host, port), False
    proto = protocol.upper()
    if proto not in SECURITY_PROTOCOLS:
        raise ConfigError(f"{what} {text!r}: unknown security protocol {protocol!r}; one of {', '.join(SECURITY_PROTOCOLS)}")
    host, port = parse_host_port(rest, what)
    return Listener(proto, host, port), True


def split_list(value: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """A list setting's items: a list as given, or a comma-separated string, each item stripped."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else [part for v in value for part in str(v).split(",")]
    return [i.strip() for i in items if i.strip()]


def parse_listeners(value: str | list[str] | tuple[str, ...], what: str = "--listen") -> list[Listener]:
    listeners = [parse_listener(item, what)[0] for item in split_list(value)]
    if not listeners:
        raise ConfigError(f"{what}: at least one listener is needed (HOST:PORT or PROTOCOL://HOST:PORT)")
    seen: set[str] = set()
    for lst in listeners:
        if lst.protocol in seen:
            raise ConfigError(
                f"{what}: two {lst.protocol} listeners; a listener is named by its protocol, so each protocol "
                "can be used once (as in Kafka, listener names must be unique)"
            )
        seen.add(lst.protocol)
    return listeners


def match_advertised(
    listeners: list[Listener], advertised: str | list[str] | tuple[str, ...] | None, what: str = "--advertised-listener"
) -> list[tuple[str, int] | None]:
    """For each listener, the (host, port) it advertises when one is configured (port 0 stays 0:
    the caller puts the bound port there), else None. See the module doc for the matching rule."""
    out: list[tuple[str, int] | None] = [None] * len(listeners)
    by_protocol = {lst.protocol: i for i, lst in enumerate(listeners)}
    parsed = [(item, *parse_listener(item, what)) for item in split_list(advertised)]
    # Entries that name a protocol first, then the bare ones in order into the listeners left.
    for item, adv, named in sorted(parsed, key=lambda p: not p[2]):
        if named:
            index = by_protocol.get(adv.protocol)
            if index is None:
                raise ConfigError(f"{what} {item!r}: no {adv.protocol} listener to advertise it for")
            if out[index] is not None:
                raise ConfigError(f"{what} {item!r}: the {adv.protocol} listener is advertised twice")
        else:
            free = [i for i, taken in enumerate(out) if taken is None]
            if not free:
                raise ConfigError(f"{what} {item!r}: more advertised listeners than listeners")
            index = free[0]
        out[index] = (adv.host, adv.port)
    return out


def is_loopback(host: str) -> bool:
    """True for loopback addresses and names that resolve only to them; a name that does not
    resolve cannot be listened on anyway (the bind fails with its own error), so it counts too."""
    if host in WILDCARD_HOSTS:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return True
    return all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def exposed_without_authentication(listeners: list[Listener], ssl_client_auth: str) -> list[Listener]:
    """Listeners that would let anyone who can reach a non-loopback address in unauthenticated:
    PLAINTEXT, and SSL unless client certificates are required."""
    return [
        lst
        for lst in listeners
        if (lst.protocol == PLAINTEXT or (lst.protocol == SSL and ssl_client_auth != "required")) and not is_loopback(lst.host)
    ]


def check_exposure(listeners: list[Listener], ssl_client_auth: str, allowed: bool) -> None:
    """Raise UnsafeListenerError (exit 2) for a listener `exposed_without_authentication`, unless `allowed`."""
    from loglake.errors import UnsafeListenerError

    exposed = exposed_without_authentication(listeners, ssl_client_auth)
    if exposed and not allowed:
        shown = ", ".join(lst.url() for lst in exposed)
        raise UnsafeListenerError(
            f"refusing to start: {shown} would let anyone who can reach it read and write every topic without "
            "authenticating; listen on 127.0.0.1, or use an SSL listener with --ssl-client-auth required, "
            "or pass --allow-unauthenticated-public-listener to accept that (docs/SECURITY.md)"
        )


def canonical_host_name() -> str:
    """What a wildcard listener advertises: `socket.getfqdn()` (Kafka takes the canonical host name
    too), or the plain host name when that resolves to a loopback name such as "localhost"."""
    fqdn = socket.getfqdn()
    if fqdn == "localhost" or fqdn.startswith("localhost."):
        name = socket.gethostname()
        if name and not name.startswith("localhost"):
            return name
    return fqdn


__all__ = [
    "PLAINTEXT",
    "SASL_PLAINTEXT",
    "SASL_SSL",
    "SECURITY_PROTOCOLS",
    "SSL",
    "WILDCARD_HOSTS",
    "Listener",
    "canonical_host_name",
    "check_exposure",
    "exposed_without_authentication",
    "is_loopback",
    "match_advertised",
    "parse_host_port",
    "parse_listener",
    "parse_listeners",
    "split_list",
]
