"""Fallback reasons and the candidate's ejection state.

Every failed candidate attempt (whatever its reason) counts towards
``consecutiveFailures``; a success resets the count. On reaching it the candidate is ejected
for ``cooldownSeconds``: requests chosen for it go to stable with reason ``ejected``, without
trying it. When the cooldown ends the count starts from zero and the candidate gets traffic
again.

An ejection is one event: requests that were already on their way to the candidate when it
was ejected, and fail after, neither eject it again nor extend its cooldown (an outage with
a hundred requests in flight is one ejection, not a hundred).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

Reason = Literal[
    "version_mismatch", "latency_too_high", "upstream_error", "unreachable", "ejected", "adapter_missing"
]
REASONS: tuple[Reason, ...] = (
    "version_mismatch",
    "latency_too_high",
    "upstream_error",
    "unreachable",
    "ejected",
    "adapter_missing",
)


def reason_for_status(status: int) -> Reason | None:
    """The fallback reason a candidate response status calls for, or None to keep it."""
    if status == 426:
        return "version_mismatch"
    if status >= 500:
        return "upstream_error"
    return None


class CandidateHealth:
    """Consecutive-failure counting and ejection of one candidate endpoint."""

    def __init__(
        self,
        consecutive_failures: int,
        cooldown: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = consecutive_failures
        self.cooldown = cooldown
        self.failures = 0
        self.ejected_until = 0.0
        self.ejections = 0
        self.clock = clock

    def ejected(self) -> bool:
        """Whether the candidate is in its cooldown now."""
        if self.ejected_until == 0.0:
            return False
        if self.clock() < self.ejected_until:
            return True
        self.ejected_until = 0.0
        self.failures = 0
        return False

    def success(self) -> None:
        self.failures = 0

    def failure(self) -> bool:
        """Count a failure; True when it ejects the candidate (never while it is ejected)."""
        if self.ejected():
            return False  # a request in flight since before the ejection: nothing new
        self.failures += 1
        if self.failures >= self.limit:
            self.failures = 0
            self.ejected_until = self.clock() + self.cooldown
            self.ejections += 1
            return True
        return False


__all__ = ["REASONS", "CandidateHealth", "Reason", "reason_for_status"]
