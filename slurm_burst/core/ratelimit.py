"""A token bucket: calls to a rate-limited API, spread to stay within its budget.

Providers limit their APIs per account as a bucket that refills at a steady rate (EC2's
request tokens, GCE's per-minute quotas, Azure Resource Manager's buckets). One bucket
per provider profile, shared by every worker, keeps the daemon inside it: a caller
takes a token and waits until the bucket has it. Waits queue in order, so a thousand
joining nodes get their turns instead of racing. Pure: the time is an argument.
"""

from __future__ import annotations

import math


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up; ``rate`` 0: no limit."""

    def __init__(self, rate: float, burst: float | None = None) -> None:
        if not (rate >= 0 and math.isfinite(rate)):
            raise ValueError(f"rate must be a finite number >= 0, not {rate!r}")
        self.rate = rate
        self.burst = max(1.0, burst if burst is not None else rate)
        self.tokens = self.burst
        self.stamp: float | None = None

    def reserve(self, now: float, amount: float = 1.0) -> float:
        """Take ``amount`` tokens (one call; or bytes, for a bandwidth limit); the seconds
        to wait before going on (0: at once)."""
        if self.rate == 0:
            return 0.0
        if self.stamp is not None:
            elapsed = max(0.0, now - self.stamp)  # a caller whose clock read is a bit older
            self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
        self.stamp = now if self.stamp is None else max(self.stamp, now)
        self.tokens -= amount
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate
