"""Token buckets and quota windows: calls to a rate-limited API, spread to stay within
its budget.

Providers limit their APIs per account as buckets that refill at a steady rate. EC2
keeps one bucket per API and account and region (its "request tokens"), and for a few
APIs a second bucket of what the request makes ("resource tokens": RunInstances'
instances). :class:`ApiBudgets` is the daemon's copy of such a set of buckets, shared
by every provider profile on the same account and region, kept below the provider's
refill (``share``) because the account's budget is also spent by consoles and other
tools. A throttled answer (the provider's buckets are emptier than ours think) cuts
that API's rate at once; it comes back slowly. Waits queue in order, so a thousand
joining nodes get their turns instead of racing.

Other providers count calls per quota group in fixed windows instead: GCE's rate quotas
allow so many calls of a group (reads, lists, writes, operation reads) in each 60-s
interval, the intervals synchronized to the minute, refilled whole at the next one
(a limit reached at 10:00:15 refills at 10:01:00), and answer 403 rateLimitExceeded
past it. :class:`QuotaWindow` is that: a window's calls spent are spent until its end,
however slowly they went. Pure: the time is an argument (a window's, the wall clock's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

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

    def observe(self, now: float, remaining: float) -> None:
        """The provider said ``remaining`` calls are left in its bucket (Azure's
        ``x-ms-ratelimit-remaining-*``): others spend the account's bucket too, so ours
        never holds more than that; it is not raised (calls promised are promised)."""
        if self.rate == 0 or not math.isfinite(remaining):
            return
        self._refill(now)
        self.tokens = min(self.tokens, max(0.0, remaining))

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


class QuotaWindow:
    """``limit`` calls in each ``interval`` seconds, the intervals starting at multiples
    of ``interval`` of the wall clock (a quota refilled whole at each, not a token at a
    time). Calls are not made in the ``guard`` seconds either side of an interval's
    edge, so that a clock that differs from the provider's by less than that never
    counts a call in the interval the provider does not. Callers past the limit are
    given turns in later intervals, in order; ``limit`` 0: no limit.
    """

    def __init__(self, limit: float, interval: float = 60.0, guard: float = 1.0) -> None:
        if not (limit >= 0 and math.isfinite(limit)):
            raise ValueError(f"limit must be a finite number >= 0, not {limit!r}")
        if not (interval > 0 and math.isfinite(interval)) or not 0 <= guard < interval / 4:
            raise ValueError(f"interval {interval!r} and guard {guard!r} do not make a window")
        self.limit = limit
        self.interval = interval
        self.guard = guard
        self.slot = -math.inf  # the interval the next call goes in (ahead: callers queued)
        self.used = 0.0  # what is promised in it

    def _earliest(self, now: float) -> float:
        """The first interval a call made at ``now`` may still go in."""
        k = math.floor(now / self.interval)
        return float(k if now < (k + 1) * self.interval - self.guard else k + 1)

    def _advance(self, now: float) -> None:
        first = self._earliest(now)
        if first > self.slot:
            self.slot, self.used = first, 0.0

    def _start(self, slot: float) -> float:
        return slot * self.interval + self.guard

    def reserve(self, now: float, amount: float = 1.0) -> float:
        """Take ``amount`` calls; the seconds to wait before going on (0: at once)."""
        if self.limit == 0:
            return 0.0
        self._advance(now)
        amount = min(amount, self.limit)  # a call larger than a window takes a window
        if self.used + amount > self.limit + 1e-9:
            self.slot, self.used = self.slot + 1, 0.0
        self.used += amount
        return max(0.0, self._start(self.slot) - now)

    def ready_in(self, now: float, amount: float = 1.0) -> float:
        """Seconds until ``amount`` calls may go, taking none (0: now)."""
        if self.limit == 0:
            return 0.0
        self._advance(now)
        slot = self.slot
        if self.used + min(amount, self.limit) > self.limit + 1e-9:
            slot += 1
        return max(0.0, self._start(slot) - now)

    def left(self, now: float) -> float:
        """Calls left in the current interval (negative: promised to waiting callers)."""
        if self.limit == 0:
            return math.inf
        self._advance(now)
        k = self._earliest(now)
        if self.slot == k:
            return self.limit - self.used
        return -((self.slot - k - 1) * self.limit + self.used)

    def spent(self, now: float) -> None:
        """The provider said the interval is used up (others spend the quota too): no
        more calls in it; callers already queued keep their turns."""
        if self.limit == 0:
            return
        self._advance(now)
        if self.slot == self._earliest(now):
            self.used = self.limit


@dataclass(frozen=True)
class Limit:
    """One of a provider's buckets: ``burst`` tokens, refilled at ``refill`` a second."""

    burst: float
    refill: float


@dataclass(frozen=True)
class Quota:
    """A quota group's window: ``limit`` calls each ``interval`` seconds."""

    limit: float
    interval: float = 60.0


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
    quotas: Mapping[str, Quota] = field(default_factory=dict)  # quota group -> its window
    quota_of: Mapping[str, str] = field(default_factory=dict)  # API -> its quota group

    def limit(self, api: str) -> Limit:
        return self.apis.get(api, self.default)


class ApiBudgets:
    """The daemon's share of a provider account's buckets, per API.

    ``share`` (0 < share <= 1) of each refill, and of each quota window, is ours (a burst
    is the account's to spend at once: a 1,000-node launch may take EC2's whole instance
    bucket); ``overrides`` set an API's (burst, refill) outright, or a quota group's
    window (its refill a second times the interval: the calls it allows, all ours).
    ``table`` None: no limits (a provider whose limits are not modelled; its calls still
    back off on a throttled answer). Not thread-safe: the caller holds a lock.
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
        self._windows: dict[str, QuotaWindow] = {}  # by quota group
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

    def counted_as(self, api: str) -> str:
        """``api``'s quota group, where the provider counts calls by group; else ``api``."""
        return self.table.quota_of.get(api, api) if self.table is not None else api

    def _window(self, api: str) -> QuotaWindow | None:
        """The window of ``api``'s quota group, if its provider counts calls so."""
        group = self.table.quota_of.get(api) if self.table is not None else None
        if group is None:
            return None
        w = self._windows.get(group)
        if w is None:
            assert self.table is not None
            q = self.table.quotas[group]
            own = self.overrides.get(group)  # a site's own quota: its refill a second
            limit = own.refill * q.interval if own is not None else q.limit * self.share
            w = self._windows[group] = QuotaWindow(limit, q.interval)
        return w

    def reserve_window(self, api: str, wall: float) -> tuple[float, int | None]:
        """A call's place in its quota group's window: the seconds to wait for that
        window (wall clock), and the window's index (None: ``api`` is counted in none).
        The call must go in that window: one made later is counted in another, whose
        calls are promised to others (:meth:`window_index` tells)."""
        w = self._window(api)
        if w is None:
            return 0.0, None
        wait = w.reserve(wall)
        return wait, math.floor((wall + wait) / w.interval)

    def window_index(self, api: str, wall: float) -> int | None:
        w = self._window(api)
        return None if w is None else math.floor(wall / w.interval)

    def reserve_rest(self, api: str, now: float, made: int = 0) -> float:
        """Once a call has its window (:meth:`reserve_window`): its tokens from the
        buckets that pace calls within it (the total's; a site's own limit on ``api``),
        and ``made`` resource tokens; seconds to wait first. Taken apart so that the
        callers a window lets go at its start are spread by the total, not sent at once."""
        wait = 0.0
        if self._window(api) is None or api in self.overrides:
            wait = self._bucket(api).reserve(now)
        wait = max(wait, self._total.reserve(now))
        res = self._resource(api) if made else None
        if res is not None:
            wait = max(wait, res.reserve(now, made))
        return wait

    def reserve(self, api: str, now: float, made: int = 0, wall: float | None = None) -> float:
        """Take a call's token (and ``made`` resource tokens); seconds to wait first.
        ``wall``: the wall clock's time, for quota windows (``now`` if not given). Both
        at once: the callers that wait for a window then go together
        (:class:`~slurm_burst.services.cloudcalls.SharedBudget` takes them apart)."""
        wait, _ = self.reserve_window(api, now if wall is None else wall)
        return max(wait, self.reserve_rest(api, now, made))

    def ready_in(self, api: str, now: float, wall: float | None = None) -> float:
        """Seconds until a call of ``api`` may go, taking nothing."""
        window = self._window(api)
        own = 0.0
        if window is not None:
            own = window.ready_in(now if wall is None else wall)
        if window is None or api in self.overrides:
            own = max(own, self._bucket(api).ready_in(now))
        return max(own, self._total.ready_in(now))

    def observe(self, api: str, now: float, remaining: float) -> None:
        """What the provider said is left of ``api``'s bucket (:meth:`TokenBucket.observe`)."""
        self._bucket(api).observe(now, remaining)

    def throttled(self, api: str, now: float, wall: float | None = None) -> None:
        window = self._window(api)
        if window is not None:
            window.spent(now if wall is None else wall)
        if window is None or api in self.overrides:
            self._bucket(api).cut(now)

    def levels(self, now: float, wall: float | None = None) -> dict[str, float]:
        """Tokens saved up per API used so far, and calls left in each quota group's
        interval (finite ones only)."""
        out = {api: b.level(now) for api, b in self._calls.items()}
        at = now if wall is None else wall
        out.update({group: w.left(at) for group, w in self._windows.items()})
        return {api: v for api, v in out.items() if math.isfinite(v)}
