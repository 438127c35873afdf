"""Subscription regexes (KIP-848 `SubscribedTopicRegex`), compiled with Python's `re`, full match.

Kafka evaluates them with RE2/J, which runs in linear time. Python's `re` backtracks, so a
pattern such as ``(a+)+$`` could take exponential time on a topic name and stall the event loop.
`compile_subscription` therefore refuses (None -> INVALID_REGULAR_EXPRESSION) what RE2 does not
have or what can backtrack without bound:

* backreferences and lookaround assertions (RE2 has neither);
* a repetition (``*``, ``+``, ``{n,}``, ``{n,m}`` with m > 1) of something that itself contains
  a repetition or an alternation, e.g. ``(a+)+``, ``(a|ab)*``: the shapes of catastrophic
  backtracking. ``(foo|bar)-.*`` and ``^prefix.*`` are fine.

Everything else is Python syntax, which for ordinary topic patterns agrees with RE2.
"""

from __future__ import annotations

import re
from re import _constants as _c  # type: ignore[attr-defined]  # Python 3.11+: re.compile's parser
from re import _parser as _p  # type: ignore[attr-defined]
from typing import Any

# re's parser is private and has no types: a parsed pattern is a sequence of (op, argument) nodes.
_Parsed = Any
_REPEATS = {_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT}
_REFUSED = {_c.GROUPREF, _c.GROUPREF_EXISTS, _c.ASSERT, _c.ASSERT_NOT}


def _children(op: _Parsed, av: _Parsed) -> list[_Parsed]:
    """The sub-patterns of one parsed node."""
    if op in _REPEATS:
        return [av[2]]
    if op is _c.SUBPATTERN:
        return [av[3]]
    if op is _c.BRANCH:
        return list(av[1])
    if op is _c.ATOMIC_GROUP:
        return [av]
    return []


def _has(pattern: _Parsed, kinds: set[_Parsed], many_only: bool) -> bool:
    for op, av in pattern:
        if op in kinds and (not many_only or op is _c.BRANCH or av[1] > 1):
            return True
        if any(_has(child, kinds, many_only) for child in _children(op, av)):
            return True
    return False


def _safe(pattern: _Parsed) -> bool:
    for op, av in pattern:
        if op in _REFUSED:
            return False
        if op in _REPEATS and av[1] > 1 and _has(av[2], _REPEATS | {_c.BRANCH}, True):
            return False
        if not all(_safe(child) for child in _children(op, av)):
            return False
    return True


def compile_subscription(pattern: str) -> re.Pattern[str] | None:
    """The compiled pattern, or None if it does not compile or is refused (see the module doc)."""
    try:
        parsed = _p.parse(pattern)
        if not _safe(parsed):
            return None
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        return None


__all__ = ["compile_subscription"]
