#!/usr/bin/env python3
"""What an ACL decision costs: `Authorizer.authorize` per second with N bindings, for the
lookups a Produce or Fetch makes (one per topic per request): a literal hit, a prefixed hit, a
miss, and a principal without bindings. The bindings are spread over topics, with a tenth of
them prefixed (`tea` to `team000-`, lengths 3 to 8) so the prefix index has work (docs/SECURITY.md, "ACLs").

    .venv/bin/python benchmarks/authorizer.py                 # 0, 1,000, 10,000, 100,000 bindings
    .venv/bin/python benchmarks/authorizer.py --bindings 5000

Prints a JSON document: decisions per second and microseconds per decision, by case.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from loglake.broker.security.authorizer import (
    AclOperation,
    Authorizer,
    Binding,
    PatternType,
    Permission,
    ResourceType,
)

#: Decisions timed per case (each case runs at least this many, then as many as fit 1 s).
DECISIONS_MIN = 20_000


def build(n: int) -> Authorizer:
    bindings = []
    for i in range(n):
        if i % 10 == 0:
            name, pattern = f"team{i % 997:03d}-"[: 3 + (i // 10) % 6], PatternType.PREFIXED
        else:
            name, pattern = f"topic-{i}", PatternType.LITERAL
        bindings.append(Binding(int(ResourceType.TOPIC), name, int(pattern), f"User:u{i % 50}", "*",
                                int(AclOperation.WRITE), int(Permission.ALLOW)))
    return Authorizer(allow_if_no_acl=False, bindings=bindings)


def rate(authz: Authorizer, principal: str, topic: str) -> dict[str, float]:
    count, started = 0, time.perf_counter()
    while count < DECISIONS_MIN or time.perf_counter() - started < 1.0:
        for _ in range(1000):
            authz.authorize(principal, "10.0.0.1", AclOperation.WRITE, ResourceType.TOPIC, topic)
        count += 1000
    seconds = time.perf_counter() - started
    return {"decisions_per_s": round(count / seconds), "us_per_decision": round(seconds / count * 1e6, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bindings", type=int, action="append", help="binding counts (repeatable)")
    args = parser.parse_args()
    out: dict[str, Any] = {}
    for n in args.bindings or [0, 1_000, 10_000, 100_000]:
        authz = build(n)
        out[str(n)] = {
            "literal_hit": rate(authz, "User:u1", "topic-1"),
            "prefixed_hit": rate(authz, "User:u0", "team000-orders"),
            "miss": rate(authz, "User:u1", "no-such-topic-with-a-long-name"),
            "no_bindings_for_principal": rate(authz, "User:nobody", "topic-1"),
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
