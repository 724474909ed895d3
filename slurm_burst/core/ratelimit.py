"""Token buckets: calls to a rate-limited API, spread to stay within its budget.

Providers limit their APIs per account as buckets that refill at a steady rate. EC2
keeps one bucket per API and account and region (its "request tokens"), and for a few
APIs a second bucket of what the request makes ("resource tokens": RunInstances'
instances). :class:`ApiBudgets` is the daemon's copy of such a set of buckets, shared
by every provider profile on the same account and region, kept below the provider's
refill (``share``) because the account's budget is also spent by consoles and other
tools. A throttled answer (the provider's buckets are emptier than ours think) cuts
that API's rate at once; it comes back slowly. Waits queue in order, so a thousand
joining nodes get their turns instead of racing. Pure: the time is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

CUT = 0.5  # a throttled answer halves the API's rate ...
FLOOR = 0.05  # ... never below this share of it ...
RECOVER = 120.0  # ... and it climbs back to the full rate over this many seconds
CUT_SPACING = 1.0  # throttled answers this close to the last cut are the same episode


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up; ``rate`` 0: no limit.

    :meth:`cut` (a throttled answer) drops the saved tokens and the rate; the rate then
    climbs back linearly to ``rate`` over :data:`RECOVER` seconds.
    """

    def __init__(self, rate: float, burst: float | None = None) -> None:
        if not (rate >= 0 and math.isfinite(rate)):
            raise ValueError(f"rate must be a finite number >= 0, not {rate!r}")
        if burst is not None and not (burst >= 0 and math.isfinite(burst)):
            raise ValueError(f"burst must be a finite number >= 0, not {burst!r}")
        self.rate = rate
        self.burst = max(1.0, burst if burst is not None else rate)
        self.tokens = self.burst
        self.stamp: float | None = None
        self._cut_at: float | None = None  # when the last cut was
        self._cut_rate = rate  # the rate right after it

    def current_rate(self, now: float) -> float:
        """The refill rate now: ``rate``, or climbing back to it after a cut."""
        if self._cut_at is None:
            return self.rate
        climbed = max(0.0, now - self._cut_at) / RECOVER
        if climbed >= 1.0:
            self._cut_at = None
            return self.rate
        return self._cut_rate + (self.rate - self._cut_rate) * climbed

    def _refill(self, now: float) -> None:
        if self.stamp is not None:
            elapsed = max(0.0, now - self.stamp)  # a caller whose clock read is a bit older
            self.tokens = min(self.burst, self.tokens + elapsed * self.current_rate(now))
        self.stamp = now if self.stamp is None else max(self.stamp, now)

    def reserve(self, now: float, amount: float = 1.0) -> float:
        """Take ``amount`` tokens (one call; or bytes, for a bandwidth limit); the seconds
        to wait before going on (0: at once)."""
        if self.rate == 0:
            return 0.0
        self._refill(now)
        self.tokens -= amount
        return 0.0 if self.tokens >= 0 else -self.tokens / self.current_rate(now)

    def ready_in(self, now: float, amount: float = 1.0) -> float:
        """Seconds until ``amount`` tokens are there, taking none (0: now)."""
        if self.rate == 0:
            return 0.0
        self._refill(now)
        short = min(amount, self.burst) - self.tokens
        # a float short of a whole token by rounding is a token: a caller told to come
        # back in 1e-17 s would come back at the same instant, again and again
        return 0.0 if short <= 1e-6 else short / self.current_rate(now)

    def level(self, now: float) -> float:
        """Tokens saved up now (negative: promised to callers still waiting)."""
        if self.rate == 0:
            return math.inf
        self._refill(now)
        return self.tokens

    def cut(self, now: float) -> None:
        """The provider said we went too fast: nothing saved up, the rate cut."""
        if self.rate == 0:
            return
        self._refill(now)
        self.tokens = min(self.tokens, 0.0)
        if self._cut_at is not None and now - self._cut_at < CUT_SPACING:
            return  # the calls in flight when the first answer came: cut once
        self._cut_rate = max(self.rate * FLOOR, self.current_rate(now) * CUT)
        self._cut_at = now


@dataclass(frozen=True)
class Limit:
    """One of a provider's buckets: ``burst`` tokens, refilled at ``refill`` a second."""

    burst: float
    refill: float


@dataclass(frozen=True)
class ApiTable:
    """A provider's documented buckets: per API, a default for the rest, and the
    resource buckets (what a call makes, counted apart from the calls); ``total`` is
    ours, over every API: the daemon's calls in any second stay under ``burst +
    refill`` (the per-API buckets, each full, would allow a burst of their sum)."""

    apis: Mapping[str, Limit]
    default: Limit
    resources: Mapping[str, Limit]  # API -> its resource bucket (instances launched...)
    total: Limit | None = None

    def limit(self, api: str) -> Limit:
        return self.apis.get(api, self.default)


class ApiBudgets:
    """The daemon's share of a provider account's buckets, per API.

    ``share`` (0 < share <= 1) of each refill is ours (a burst is the account's to spend
    at once: a 1,000-node launch may take EC2's whole instance bucket); ``overrides`` set
    an API's (burst, refill) outright. ``table`` None: no limits (a provider whose limits
    are per minute or per project and not modelled; its calls still back off on a
    throttled answer). Not thread-safe: the caller holds a lock.
    """

    def __init__(
        self,
        table: ApiTable | None,
        share: float = 0.75,
        overrides: Mapping[str, Limit] | None = None,
    ) -> None:
        if not (0 < share <= 1):
            raise ValueError(f"share must be in (0, 1], not {share!r}")
        self.table = table
        self.share = share
        self.overrides = dict(overrides or {})
        self._calls: dict[str, TokenBucket] = {}
        self._made: dict[str, TokenBucket] = {}
        total = table.total if table is not None else None
        self._total = TokenBucket(total.refill, total.burst) if total else TokenBucket(0)

    def _bucket(self, api: str) -> TokenBucket:
        b = self._calls.get(api)
        if b is None:
            if self.table is None and api not in self.overrides:
                b = TokenBucket(0)
            else:
                lim = self.overrides.get(api)
                if lim is None:
                    assert self.table is not None
                    lim = self.table.limit(api)
                b = TokenBucket(lim.refill * self.share, lim.burst)
            self._calls[api] = b
        return b

    def _resource(self, api: str) -> TokenBucket | None:
        if self.table is None or api not in self.table.resources:
            return None
        b = self._made.get(api)
        if b is None:
            lim = self.table.resources[api]
            b = self._made[api] = TokenBucket(lim.refill * self.share, lim.burst)
        return b

    def reserve(self, api: str, now: float, made: int = 0) -> float:
        """Take a call's token (and ``made`` resource tokens); seconds to wait first."""
        wait = max(self._bucket(api).reserve(now), self._total.reserve(now))
        res = self._resource(api) if made else None
        if res is not None:
            wait = max(wait, res.reserve(now, made))
        return wait

    def ready_in(self, api: str, now: float) -> float:
        """Seconds until a call of ``api`` may go, taking nothing."""
        return max(self._bucket(api).ready_in(now), self._total.ready_in(now))

    def throttled(self, api: str, now: float) -> None:
        self._bucket(api).cut(now)

    def levels(self, now: float) -> dict[str, float]:
        """Tokens saved up per API used so far (finite ones only)."""
        out = {api: b.level(now) for api, b in self._calls.items()}
        return {api: v for api, v in out.items() if math.isfinite(v)}
