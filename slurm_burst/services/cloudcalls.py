"""Every cloud call, timed, paced and retried: the Cloud port wrapped for the daemon.

**Budgets.** Providers throttle per account and region, per API (EC2: one token bucket
per API; see :mod:`slurm_burst.core.ratelimit`). Every provider profile on the same
account and region shares one :class:`SharedBudget`, and every call first takes its
API's token (``RunInstances`` also the instances it asks for): a caller that may wait
waits its turn; one that may not (a booting node's host-key read, driven by timers)
gets :class:`~slurm_burst.core.cloud.Busy` with the seconds to come back after.

**Throttled answers** (``RequestLimitExceeded``, HTTP 429/503) cut the API's rate in
the shared budget, and a waiting caller retries up to ``daemon.api_attempts`` times
with exponential backoff and full jitter; a launch is retried with the same
idempotency token, so a retry after a throttled-but-accepted request returns the
instance it made, never a second. Other errors pass through at once, typed, with the
provider's code.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from slurm_burst.core.cloud import Busy, CloudError, Instance, LaunchSpec, backoff
from slurm_burst.core.ratelimit import ApiBudgets
from slurm_burst.ports import Cloud, Metrics

log = logging.getLogger(__name__)
T = TypeVar("T")
TURNS_KEPT = 10_000


@dataclass(frozen=True, kw_only=True)
class CallSettings:
    """How a provider's calls are retried (wiring.clouds.managed_clouds builds them)."""

    attempts: int = 5  # tries of a throttled call (daemon.api_attempts)
    base: float = 1.0  # seconds of the first backoff (daemon.api_backoff)
    cap: float = 30.0  # the longest backoff (daemon.api_backoff_max)


class SharedBudget:
    """One account and region's :class:`ApiBudgets`, shared by the profiles on it."""

    def __init__(
        self,
        account: str,
        budgets: ApiBudgets,
        metrics: Metrics | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,  # quota windows are the wall clock's minutes
    ) -> None:
        self.account = account
        self.budgets = budgets
        self.metrics = metrics
        self.monotonic = monotonic
        self.wall = wall
        self._lock = threading.Lock()
        # (api, key) -> (when to ask again, the quota window promised, whether paced too)
        self._turns: dict[tuple[str, str], tuple[float, int | None, bool]] = {}

    def reserve(self, api: str, made: int = 0) -> float:
        with self._lock:
            return self.budgets.reserve(api, self.monotonic(), made, self.wall())

    def wait_turn(self, api: str, sleep: Callable[[float], None], made: int = 0) -> None:
        """Sleep until a call of ``api`` may go: its quota window first (a caller that
        woke after the window it was promised ended asks again: that window's calls are
        counted, the next one's are promised to others), then the buckets that pace
        calls within a window (the callers a window lets go at its start are spread)."""
        while True:
            with self._lock:
                pause, window = self.budgets.reserve_window(api, self.wall())
            if pause > 0:
                sleep(pause)
            with self._lock:
                if window is not None and self.budgets.window_index(api, self.wall()) != window:
                    continue  # woke too late for its window
                pause = self.budgets.reserve_rest(api, self.monotonic(), made)
            if pause > 0:
                sleep(pause)
            with self._lock:
                if window is None or self.budgets.window_index(api, self.wall()) == window:
                    return

    def turn(self, api: str, key: str) -> float:
        """A caller that does not wait (``key``: what it reads): 0.0 if it may call now;
        else the seconds until it should ask again, its turn kept for it (a queue: a
        thousand callers told to come back are not all told the same instant). As in
        :meth:`wait_turn`: a place in the quota window first, then the paced tokens
        within it; a caller back after its window ended asks for a place anew."""
        with self._lock:
            now, wall = self.monotonic(), self.wall()
            held = self._turns.pop((api, key), None)
            window: int | None = None
            if held is not None:
                due, window, paced = held
                if due - now > 1e-6:
                    self._turns[(api, key)] = held
                    return due - now
                if window is not None and self.budgets.window_index(api, wall) != window:
                    held = None  # back after its window ended: its place there is gone
                elif paced:
                    return 0.0
            if held is None:
                pause, window = self.budgets.reserve_window(api, wall)
                if pause > 0:
                    return self._keep(api, key, now + pause, window, paced=False)
            pause = self.budgets.reserve_rest(api, now)
            if pause > 0:
                return self._keep(api, key, now + pause, window, paced=True)
            return 0.0

    def _keep(self, api: str, key: str, due: float, window: int | None, paced: bool) -> float:
        """Keep a caller's turn (the lock held); the seconds until it should ask again."""
        self._turns[(api, key)] = (due, window, paced)
        if len(self._turns) > 4 * TURNS_KEPT:  # forget turns nobody came back for
            old = sorted(self._turns.items(), key=lambda kv: kv[1][0])
            self._turns = dict(old[-TURNS_KEPT:])
        return due - self.monotonic()

    def counted_as(self, api: str) -> str:
        """What the provider counts ``api``'s calls in: its quota group (GCE), or itself."""
        return self.budgets.counted_as(api)

    def throttled(self, api: str) -> None:
        with self._lock:
            self.budgets.throttled(api, self.monotonic(), self.wall())

    def observe(self, api: str, remaining: float) -> None:
        """The provider said what is left of ``api``'s bucket in an answer."""
        with self._lock:
            self.budgets.observe(api, self.monotonic(), remaining)

    def levels(self) -> dict[str, float]:
        with self._lock:
            return self.budgets.levels(self.monotonic(), self.wall())

    def export(self) -> None:
        """Tokens left per API, into the metrics (the reconcile pass calls it)."""
        if self.metrics is not None:
            for api, tokens in self.levels().items():
                self.metrics.api_tokens(self.account, api, tokens)


class ManagedCloud:
    def __init__(
        self,
        cloud: Cloud,
        settings: CallSettings = CallSettings(),  # frozen: one shared is safe
        metrics: Metrics | None = None,
        *,
        budget: SharedBudget | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.inner = cloud
        self.name = cloud.name
        self.attempts = settings.attempts
        self.base = settings.base
        self.cap = settings.cap
        self.metrics = metrics
        self.budget = budget or SharedBudget(cloud.name, ApiBudgets(None))
        self.sleep = sleep
        self.rand = rand
        apis: Mapping[str, str] = getattr(cloud, "api_names", None) or {}
        self._apis = dict(apis)
        if hasattr(cloud, "turn"):  # a call that makes more inside (GCE's bulk launch's
            cloud.turn = self._wait_turn  # wait and listing) takes their turns here too
        self._local = threading.local()  # the key of a call that may not wait, if one
        if hasattr(cloud, "meter"):  # a provider's connection that paces each request
            cloud.meter = BudgetMeter(self)  # (Azure) takes its turns here

    def api(self, call: str) -> str:
        """The provider's API behind one of our calls (EC2: ``get`` is DescribeInstances)."""
        return self._apis.get(call, call)

    def _call(
        self, call: str, fn: Callable[..., T], *args: Any, made: int = 0, wait: bool = True
    ) -> T:
        api = self.api(call)
        for attempt in range(self.attempts):
            if wait:
                self._wait_turn(api, made)
            else:
                after = self.budget.turn(api, str(args[0]) if args else "")
                if after > 0:
                    raise Busy(f"{self.name}: {api}: our budget's turn comes later", after)
            started = time.monotonic()
            error: str | None = None
            self._local.key = None if wait else (str(args[0]) if args else "")
            try:
                result = fn(*args)
            except Busy:
                raise  # our own budget said later (a metered request): no call was made
            except CloudError as exc:
                error = exc.code
                if not exc.retryable:
                    raise
                if not getattr(exc, "counted", False):
                    self._throttled_answer(api)
                if not wait or attempt + 1 >= self.attempts:
                    raise
                delay = self._retry_delay(attempt, getattr(exc, "after", 0.0))
                log.warning(
                    "cloud.throttled provider=%s call=%s code=%s attempt=%d retry_in=%.2f",
                    self.name,
                    api,
                    exc.code,
                    attempt + 1,
                    delay,
                )
                self.sleep(delay)
                continue
            finally:
                self._local.key = None
                if self.metrics is not None:
                    self.metrics.cloud_call(self.name, call, time.monotonic() - started, error)
            return result
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _wait_turn(self, api: str, made: int = 0) -> None:
        """Take the call's token (and ``made`` resource tokens), sleeping until it is due."""
        self.budget.wait_turn(api, self.sleep, made)

    def _retry_delay(self, attempt: int, after: float) -> float:
        """Seconds before retry ``attempt`` (0-based) of a throttled call: the backoff with
        full jitter, and at least the provider's Retry-After (``after``; capped)."""
        return max(backoff(attempt, self.base, self.cap, self.rand()), min(self.cap, after))

    def _throttled_answer(self, api: str) -> None:
        """The provider throttled ``api``: its shared rate is cut, and it is counted."""
        self.budget.throttled(api)
        if self.metrics is not None:  # a quota group's, where the provider counts by group
            self.metrics.api_throttled(self.name, self.budget.counted_as(api))

    def launch(self, spec: LaunchSpec) -> Instance:
        return self._call("launch", self.inner.launch, spec, made=1)

    @property
    def batch_max(self) -> int:
        """Nodes one launch call may make (1: the provider launches one at a time)."""
        return self.inner.batch_max

    @property
    def lists_fleet(self) -> bool:
        """Whether booting nodes read one shared listing (:meth:`list_fleet`) instead of
        one describe each (EC2)."""
        return bool(getattr(self.inner, "lists_fleet", False))

    def launch_many(self, spec: LaunchSpec) -> list[Instance]:
        return self._call("launch", self.inner.launch_many, spec, made=spec.count)

    def find(self, token: str, cluster: str) -> list[Instance]:
        return self._call("find", self.inner.find, token, cluster)

    def tag(self, instance_id: str, tags: Mapping[str, str]) -> None:
        self._call("tag", self.inner.tag, instance_id, tags)

    def get(self, instance_id: str) -> Instance | None:
        return self._call("get", self.inner.get, instance_id)

    def list_instances(self, cluster: str) -> list[Instance]:
        return self._call("list", self.inner.list_instances, cluster)

    def list_fleet(self, cluster: str) -> list[Instance]:
        """The cluster's instances that are not terminated, in pages (one budgeted call
        a page)."""
        pages: Callable[..., list[Instance]] = getattr(self.inner, "list_fleet")  # noqa: B009
        api = self.api("list")
        started = time.monotonic()
        error: str | None = None
        try:
            return pages(cluster, lambda: self._wait_turn(api))
        except CloudError as exc:
            error = exc.code
            if exc.retryable:
                self._throttled_answer(api)
            raise
        finally:
            if self.metrics is not None:
                self.metrics.cloud_call(self.name, "list", time.monotonic() - started, error)

    def terminate(self, instance_id: str) -> None:
        self._call("terminate", self.inner.terminate, instance_id, made=1)

    def create_placement(self, name: str) -> None:
        self._call("create_placement", self.inner.create_placement, name)

    def delete_placement(self, name: str) -> None:
        self._call("delete_placement", self.inner.delete_placement, name)

    def host_keys(self, instance_id: str, size: str = "") -> list[tuple[str, str]]:
        """One read of the instance's host keys, if our budget has a token now; else
        :class:`Busy` (the caller comes back later: it holds no thread meanwhile). A
        throttled answer is raised at once, for the same reason."""
        return self._call("host_keys", self.inner.host_keys, instance_id, size, wait=False)


class BudgetMeter:
    """The pacing of a provider connection's every request (Azure's: ARM counts each as a
    read, a write or a delete, per subscription and principal), from the managed cloud's
    shared budget: a request waits its turn, or raises :class:`Busy` in a call that may
    not wait (a booting node's host-key read); what an answer says is left is taken in;
    a throttled answer cuts that kind's rate, is counted, and is repeated after its
    ``Retry-After`` (up to the call's attempts) unless the call may not wait."""

    def __init__(self, managed: ManagedCloud) -> None:
        self.managed = managed
        self._repeats = threading.local()

    def _key(self) -> str | None:
        return getattr(self.managed._local, "key", None)

    def before(self, kind: str) -> None:
        key = self._key()
        if key is None:
            self.managed.budget.wait_turn(kind, self.managed.sleep)
            return
        after = self.managed.budget.turn(kind, key)
        if after > 0:
            raise Busy(f"{self.managed.name}: {kind}: our budget's turn comes later", after)

    def after(self, kind: str, remaining: float) -> None:
        self._repeats.n = 0
        self.managed.budget.observe(kind, remaining)

    def throttled(self, kind: str, retry_after: float) -> bool:
        m = self.managed
        m._throttled_answer(kind)  # its rate cut, the throttle counted
        n = getattr(self._repeats, "n", 0) + 1
        self._repeats.n = n
        if self._key() is not None or n >= m.attempts:
            self._repeats.n = 0
            return False
        delay = m._retry_delay(n - 1, retry_after)
        log.warning("cloud.throttled provider=%s call=%s attempt=%d retry_in=%.2f",
                    m.name, kind, n, delay)  # fmt: skip
        m.sleep(delay)
        return True
