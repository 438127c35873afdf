"""The `--cluster` URL: where a cluster's metadata lives in etcd.

`etcd://HOST:PORT[,HOST:PORT...]/PREFIX` — one or more etcd members and the key prefix that keeps
a cluster apart from others in one etcd. Parsed where the setting is checked (loglake.broker.config)
and where cluster mode connects (loglake.cluster.node, loglake.cluster.etcd_client).
"""

from __future__ import annotations

from loglake.errors import ConfigError

__all__ = ["ENDPOINTS_MAX", "parse_cluster_url", "parse_endpoints"]

#: Most endpoints accepted in one cluster URL.
ENDPOINTS_MAX = 16


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """`host:port[,host:port...]` -> [(host, port), ...]; ConfigError on anything else."""
    out: list[tuple[str, int]] = []
    for part in text.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"etcd endpoint {part.strip()!r} is not HOST:PORT")
        out.append((host.strip("[]"), int(port)))
    if not out or len(out) > ENDPOINTS_MAX:
        raise ConfigError(f"give 1 to {ENDPOINTS_MAX} etcd endpoints, not {len(out)}")
    return out


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], str]:
    """`etcd://HOST:PORT[,HOST:PORT...]/PREFIX` -> (endpoints, "/PREFIX"); ConfigError otherwise.

    The PREFIX keeps several clusters (or test runs) apart in one etcd; it is required, so two
    clusters never share the keyspace's root by accident.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme != "etcd":
        raise ConfigError(f"cluster URL {url!r} must start with etcd://")
    hosts, slash, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    if not slash or not prefix:
        raise ConfigError(f"cluster URL {url!r} needs a key prefix: etcd://HOST:PORT[,HOST:PORT...]/PREFIX")
    if any(c in prefix for c in "\0\n") or "//" in prefix:
        raise ConfigError(f"cluster URL {url!r}: the prefix {prefix!r} is not a clean key path")
    return parse_endpoints(hosts), "/" + prefix
