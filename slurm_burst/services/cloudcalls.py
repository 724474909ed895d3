"""Every cloud call, timed and retried: the Cloud port wrapped for the daemon.

A throttled call (``RequestLimitExceeded``, HTTP 429/503) is retried up to
``daemon.api_attempts`` times with exponential backoff and full jitter. A
launch is retried with the same idempotency token, so a retry after a
throttled-but-accepted request returns the instance it made, never a second.
Other errors pass through at once, typed, with the provider's code.

Host-key reads are polled while nodes boot; all of a provider's workers share one
:class:`~slurm_burst.core.ratelimit.TokenBucket` of ``reads_per_second``, so a
thousand joining nodes stay within the provider's API budget.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from slurm_burst.core.cloud import CloudError, Instance, LaunchSpec, backoff
from slurm_burst.core.ratelimit import TokenBucket
from slurm_burst.ports import Cloud, Metrics

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class CallSettings:
    """How a provider's calls are retried and paced (wiring.managed_clouds builds them)."""

    attempts: int = 5  # tries of a throttled call (daemon.api_attempts)
    base: float = 1.0  # seconds of the first backoff (daemon.api_backoff)
    cap: float = 30.0  # the longest backoff (daemon.api_backoff_max)
    reads_per_second: float = 0.0  # host-key reads, shared by the provider's workers; 0 any


class ManagedCloud:
    def __init__(
        self,
        cloud: Cloud,
        settings: CallSettings = CallSettings(),  # frozen: one shared is safe
        metrics: Metrics | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = cloud
        self.name = cloud.name
        self.attempts = settings.attempts
        self.base = settings.base
        self.cap = settings.cap
        self.metrics = metrics
        self.sleep = sleep
        self.rand = rand
        self.monotonic = monotonic
        self._reads = TokenBucket(settings.reads_per_second)
        self._reads_lock = threading.Lock()

    def _call(self, call: str, fn: Callable[..., T], *args: Any) -> T:
        for attempt in range(self.attempts):
            started = time.monotonic()
            error: str | None = None
            try:
                result = fn(*args)
            except CloudError as exc:
                error = exc.code
                if not exc.retryable or attempt + 1 >= self.attempts:
                    raise
                delay = backoff(attempt, self.base, self.cap, self.rand())
                log.warning(
                    "cloud.throttled provider=%s call=%s code=%s attempt=%d retry_in=%.2f",
                    self.name,
                    call,
                    exc.code,
                    attempt + 1,
                    delay,
                )
                self.sleep(delay)
                continue
            finally:
                if self.metrics is not None:
                    self.metrics.cloud_call(self.name, call, time.monotonic() - started, error)
            return result
        raise AssertionError("unreachable: the last attempt returns or raises")

    def launch(self, spec: LaunchSpec) -> Instance:
        return self._call("launch", self.inner.launch, spec)

    @property
    def batch_max(self) -> int:
        """Nodes one launch call may make (1: the provider launches one at a time)."""
        return self.inner.batch_max

    def launch_many(self, spec: LaunchSpec) -> list[Instance]:
        return self._call("launch", self.inner.launch_many, spec)

    def find(self, token: str, cluster: str) -> list[Instance]:
        return self._call("find", self.inner.find, token, cluster)

    def tag(self, instance_id: str, tags: Mapping[str, str]) -> None:
        self._call("tag", self.inner.tag, instance_id, tags)

    def get(self, instance_id: str) -> Instance | None:
        return self._call("get", self.inner.get, instance_id)

    def list_instances(self, cluster: str) -> list[Instance]:
        return self._call("list", self.inner.list_instances, cluster)

    def terminate(self, instance_id: str) -> None:
        self._call("terminate", self.inner.terminate, instance_id)

    def host_keys(self, instance_id: str) -> list[tuple[str, str]]:
        """One read of the instance's host keys, in its turn within the provider's budget."""
        with self._reads_lock:
            wait = self._reads.reserve(self.monotonic())
        if wait > 0:
            self.sleep(wait)
        return self._call("host_keys", self.inner.host_keys, instance_id)
