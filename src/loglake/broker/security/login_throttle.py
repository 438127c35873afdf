"""`LoginThrottle`: failed SASL logins limited per source address and per principal.

Kafka bounds password guessing only by `connection.failed.authentication.delay.ms`: a client
opening connections in parallel guesses as fast as the broker derives keys. Here each source
address and each claimed principal has a leaky bucket of failed logins, and `limit` leak away per
`window_s`. A login is charged to both buckets when it is admitted (`admit`: before its password
is checked, so logins in flight on parallel connections count at once) and refunded when it
succeeds; a failure before admission (a malformed message) is charged when it happens. While a
bucket holds `limit` (`limit` failures in quick succession, then one more per `window_s / limit`),
a login it covers is refused before its password is looked at: the SASL session answers
SASL_AUTHENTICATION_FAILED, as for a wrong password, without the key derivation. So from one
address at most ``limit + limit * t / window_s`` wrong passwords are checked in `t` seconds, and
for one principal as many from all addresses together.

* **source**: the peer's address; an IPv6 one counts by its /64 (`IPV6_PREFIX`), as one host is
  usually given a whole /64 to pick addresses from.
* **principal**: the name the client claims (``User:NAME``), whether or not it has credentials,
  so a throttled name says nothing about whether it exists.
* **trusted pairs**: a (principal, source) pair that logged in within `TRUSTED_FOR_S` is let
  through both buckets, so neither a neighbour behind the same NAT guessing other names nor a
  stranger guessing this principal's password locks out a client that has logged in from there
  before. The pair's next failure ends its trust: it buys a guesser one attempt at most.

A refused attempt adds nothing to a bucket (a client retrying in a loop gets the leak rate, not a
lock that never ends). Memory is bounded: each table holds at most its `*_MAX` entries, and a
new one beyond that forgets the one touched longest ago (an address or principal under attack is
touched on every attempt, so it stays). Principals are kept as 16-byte digests (names may be 1 KiB).

Used from the event loop only (the SASL session's steps): no lock. /metrics reads the sizes and
counters from its own thread; those are single reads of ints.
"""

from __future__ import annotations

import enum
import hashlib
import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "IPV6_PREFIX",
    "PRINCIPALS_MAX",
    "SOURCES_MAX",
    "TRUSTED_FOR_S",
    "TRUSTED_MAX",
    "LoginThrottle",
    "Refusal",
    "ThrottleScope",
    "source_key",
]

#: Most source addresses (IPv6: /64 networks) with a bucket at once.
SOURCES_MAX = 10_000
#: Most principals with a bucket at once.
PRINCIPALS_MAX = 10_000
#: Most (principal, source) pairs remembered as having logged in.
TRUSTED_MAX = 10_000
#: How long a successful login keeps its (principal, source) pair trusted.
TRUSTED_FOR_S = 24 * 3600.0
#: An IPv6 source is counted by this prefix of its address.
IPV6_PREFIX = 64
#: Bytes of the digest a principal is kept as.
_DIGEST_BYTES = 16


class ThrottleScope(enum.StrEnum):
    """Which bucket refused a login (the values label /metrics)."""

    SOURCE = "source"
    PRINCIPAL = "principal"


@dataclass(frozen=True)
class Refusal:
    """Why a login is refused unchecked: its scope's bucket is full."""

    scope: ThrottleScope
    #: The source key of a source bucket (a principal's is named by the log line already).
    source: str
    limit: int
    window_s: float

    def __str__(self) -> str:
        who = f"from {self.source}" if self.scope is ThrottleScope.SOURCE else "as this principal"
        return (
            f"refused without checking the password: {self.limit} failed logins {who} within {self.window_s:.0f} s "
            f"(login throttle, per {self.scope.value})"
        )


def source_key(host: str) -> str:
    """What a peer address is counted as: an IPv4 address itself, an IPv6 one its /64 network
    (an IPv4-mapped one its IPv4 address), anything else (not an IP address) as it is."""
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, IPV6_PREFIX), strict=False))
    return str(addr)


def _digest(principal: str) -> bytes:
    return hashlib.blake2b(principal.encode("utf-8", "surrogatepass"), digest_size=_DIGEST_BYTES).digest()


class _Buckets:
    """Leaky buckets by key, at most `max_keys` (the least recently touched goes first)."""

    def __init__(self, limit: int, window_s: float, max_keys: int) -> None:
        self.limit = limit
        self.leak_per_s = limit / window_s
        self.max_keys = max_keys
        #: key -> (level, when it was that): oldest touched first
        self.levels: OrderedDict[bytes | str, tuple[float, float]] = OrderedDict()

    def level(self, key: bytes | str, now: float) -> float:
        held = self.levels.get(key)
        return 0.0 if held is None else max(0.0, held[0] - (now - held[1]) * self.leak_per_s)

    def full(self, key: bytes | str, now: float) -> bool:
        """Whether one more failure would pass the limit (0: no limit); a full bucket is touched
        (the last to be forgotten), as a refusal charges nothing."""
        if self.limit <= 0 or self.level(key, now) <= self.limit - 1:
            return False
        self.levels.move_to_end(key)
        return True

    def add(self, key: bytes | str, now: float, amount: float = 1.0) -> None:
        if self.limit <= 0:
            return
        level = max(0.0, self.level(key, now) + amount)
        if level == 0.0 and key not in self.levels:
            return  # a refund to a bucket that is gone: nothing to keep
        self.levels[key] = (level, now)
        self.levels.move_to_end(key)
        while len(self.levels) > self.max_keys:
            self.levels.popitem(last=False)


class LoginThrottle:
    """Failed-login buckets per source and per principal, and the trusted pairs (module doc)."""

    def __init__(
        self, per_source: int, per_principal: int, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """`per_source`, `per_principal`: failures a bucket takes per `window_s` (0: no limit)."""
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, not {window_s}")
        self.window_s = window_s
        self._clock = clock
        self._sources = _Buckets(per_source, window_s, SOURCES_MAX)
        self._principals = _Buckets(per_principal, window_s, PRINCIPALS_MAX)
        #: (principal digest, source key) -> when it last logged in: oldest first
        self._trusted: OrderedDict[tuple[bytes, str], float] = OrderedDict()
        #: Logins refused unchecked, by scope.
        self.refused = dict.fromkeys(ThrottleScope, 0)

    def admit(self, principal: str, host: str) -> Refusal | None:
        """Why a login as `principal` from `host` is refused unchecked now, or None: then it is
        charged to both buckets as a failure until it `succeeded`."""
        now, source = self._clock(), source_key(host)
        digest = _digest(principal)
        since = self._trusted.get((digest, source))
        if since is None or now - since >= TRUSTED_FOR_S:
            refusal = None
            # both asked: each full bucket is touched, however the other stands
            source_full, principal_full = self._sources.full(source, now), self._principals.full(digest, now)
            if source_full:
                refusal = Refusal(ThrottleScope.SOURCE, source, self._sources.limit, self.window_s)
            elif principal_full:
                refusal = Refusal(ThrottleScope.PRINCIPAL, source, self._principals.limit, self.window_s)
            if refusal is not None:
                self.refused[refusal.scope] += 1
                return refusal
        self._sources.add(source, now)
        self._principals.add(digest, now)
        return None

    def failed(self, principal: str | None, host: str, *, admitted: bool) -> None:
        """A login failed: charged now unless `admit` charged it (`principal` None: the client
        named none); its (principal, source) pair is no longer trusted."""
        now, source = self._clock(), source_key(host)
        if not admitted:
            self._sources.add(source, now)
        if principal is not None:
            digest = _digest(principal)
            if not admitted:
                self._principals.add(digest, now)
            self._trusted.pop((digest, source), None)

    def succeeded(self, principal: str, host: str) -> None:
        """An admitted login succeeded: its charge is refunded, and its (principal, source) pair
        is trusted from now on."""
        now, digest, source = self._clock(), _digest(principal), source_key(host)
        self._sources.add(source, now, -1.0)
        self._principals.add(digest, now, -1.0)
        pair = (digest, source)
        self._trusted[pair] = now
        self._trusted.move_to_end(pair)
        while len(self._trusted) > TRUSTED_MAX:
            self._trusted.popitem(last=False)

    def sizes(self) -> dict[str, int]:
        """Entries per table (/metrics): sources, principals, trusted pairs."""
        return {"source": len(self._sources.levels), "principal": len(self._principals.levels),
                "trusted": len(self._trusted)}
