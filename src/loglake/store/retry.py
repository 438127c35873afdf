"""A bounded retry policy: exponential backoff with full jitter and a capped delay.

Attempt `n` (1-based) that failed is followed by a sleep drawn uniformly from
`[0, min(max_delay, base_delay * 2**(n-1))]` ("full jitter", which spreads out many clients that
failed at the same moment), and at most `max_attempts` attempts are made in all.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

#: Attempts per operation (the first try included) before giving up.
DEFAULT_MAX_ATTEMPTS = 6
#: Backoff ceiling after the first failed attempt, in seconds; doubles per further failure.
DEFAULT_BASE_DELAY = 0.1
#: No single backoff sleep is longer than this, in seconds.
DEFAULT_MAX_DELAY = 5.0


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry one operation."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    base_delay: float = DEFAULT_BASE_DELAY
    max_delay: float = DEFAULT_MAX_DELAY
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError(f"retry delays must be >= 0, got {self.base_delay}, {self.max_delay}")

    def ceiling(self, failed_attempt: int) -> float:
        """The longest sleep after attempt `failed_attempt` (1-based) failed."""
        exponent = min(max(failed_attempt - 1, 0), 62)  # no float overflow for silly attempt counts
        return min(self.max_delay, self.base_delay * (2.0**exponent))

    def delay(self, failed_attempt: int) -> float:
        """A full-jitter sleep after attempt `failed_attempt` failed."""
        return self.rng.uniform(0.0, self.ceiling(failed_attempt))

    def worst_case_total_delay(self) -> float:
        """The longest an operation can spend sleeping between its attempts."""
        return sum(self.ceiling(n) for n in range(1, self.max_attempts))
