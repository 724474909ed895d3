"""Azure Resource Manager's request limits, as the Azure emulator counts them.

ARM throttles each subscription and principal ("security principal": the app a token
was given to) per region with token buckets, one per kind of request ("Understand how
Azure Resource Manager throttles requests", read 2026-11): reads (GET) 250 tokens
refilled at 25 a second, writes (PUT, PATCH, POST) 200 at 10 a second, deletes 200 at
10 a second. Every answer carries what is left of its bucket in
``x-ms-ratelimit-remaining-subscription-reads`` (``-writes``, ``-deletes``); a request
with none left is answered 429 with ``Retry-After`` (seconds) and the error code
``SubscriptionRequestsThrottled``. Written here apart from slurm-burst's own buckets, so
that a mistake in the daemon's arithmetic is not mirrored in the cloud it is tested
against.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from dataclasses import dataclass, field

# kind -> (bucket, refill a second), per subscription and principal
DEFAULTS = {"reads": (250.0, 25.0), "writes": (200.0, 10.0), "deletes": (200.0, 10.0)}
HEADER = "x-ms-ratelimit-remaining-subscription-{}"


def kind_of(method: str) -> str:
    """What ARM counts an HTTP method's request as."""
    return {"GET": "reads", "HEAD": "reads", "DELETE": "deletes"}.get(method, "writes")


@dataclass
class Bucket:
    size: float
    rate: float
    level: float = -1.0
    stamp: float = 0.0

    def take(self, now: float) -> tuple[bool, float]:
        """Take a token: (taken, what is left); not taken: left is the seconds until one."""
        if self.level < 0:
            self.level, self.stamp = self.size, now
        self.level = min(self.size, self.level + max(0.0, now - self.stamp) * self.rate)
        self.stamp = now
        if self.level >= 1.0:
            self.level -= 1.0
            return True, self.level
        return False, (1.0 - self.level) / self.rate if self.rate > 0 else 3600.0


@dataclass
class ArmLimits:
    """The buckets of every (subscription, principal) seen, ``factor`` times ARM's
    documented sizes and rates (a test's small ones; the benchmark's 1.0)."""

    factor: float = 1.0
    buckets: dict[tuple[str, str, str], Bucket] = field(default_factory=dict)
    throttled: Counter[str] = field(default_factory=Counter)  # by kind
    lowest: dict[str, float] = field(default_factory=dict)  # the least ever left, by kind
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, subscription: str, principal: str, kind: str, now: float) -> tuple[bool, int]:
        """A request of ``kind``: (allowed, the header's remaining count) or (False, the
        Retry-After seconds)."""
        size, rate = DEFAULTS[kind]
        with self._lock:
            b = self.buckets.get((subscription, principal, kind))
            if b is None:
                b = self.buckets[(subscription, principal, kind)] = Bucket(
                    max(1.0, size * self.factor), rate * self.factor
                )
            ok, left = b.take(now)
            if not ok:
                self.throttled[kind] += 1
                return False, max(1, math.ceil(left))
            self.lowest[kind] = min(self.lowest.get(kind, math.inf), left)
            return True, int(left)

    def clear(self) -> None:
        with self._lock:
            self.buckets.clear()
            self.throttled.clear()
            self.lowest.clear()
