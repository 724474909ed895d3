"""Host-key reads stay within one budget per provider, however many nodes join at once."""

from __future__ import annotations

import math
import threading

import pytest

from slurm_burst.core.ratelimit import TokenBucket
from slurm_burst.services.cloudcalls import CallSettings, ManagedCloud


def most_in_any_window(times: list[float], window: float) -> int:
    times = sorted(times)
    j, best = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - window:
            j += 1
        best = max(best, i - j + 1)
    return best


@pytest.mark.parametrize(("rate", "burst"), [(10, 10), (2, 1), (50, 5)], ids=str)
def test_a_bucket_spreads_a_thousand_callers_over_the_rate(rate: float, burst: float) -> None:
    bucket = TokenBucket(rate, burst)
    starts = [bucket.reserve(0.0) for _ in range(1000)]
    assert starts[: int(burst)] == [0.0] * int(burst)
    assert starts == sorted(starts)  # in turn: nobody overtakes
    assert starts[-1] == pytest.approx((1000 - burst) / rate)
    assert most_in_any_window(starts, 1.0) <= burst + rate


def test_a_bucket_refills_while_idle_but_saves_no_more_than_its_burst() -> None:
    bucket = TokenBucket(5, 5)
    assert [bucket.reserve(0.0) for _ in range(5)] == [0.0] * 5
    assert bucket.reserve(100.0) == 0.0  # refilled
    waits = [bucket.reserve(100.0) for _ in range(5)]
    assert waits[:4] == [0.0] * 4 and waits[4] == pytest.approx(0.2)


@pytest.mark.parametrize("rate", [-1, math.nan, math.inf])
def test_a_bucket_refuses_a_rate_that_is_not_a_number_of_calls(rate: float) -> None:
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(rate)


def test_no_rate_means_no_wait() -> None:
    bucket = TokenBucket(0)
    assert {bucket.reserve(0.0) for _ in range(100)} == {0.0}


class Keys:
    """A provider whose host-key reads are stamped with the reading thread's fake time."""

    name = "p"

    def __init__(self, local: threading.local) -> None:
        self.local = local
        self.at: list[float] = []
        self.lock = threading.Lock()

    def host_keys(self, instance_id: str) -> list[tuple[str, str]]:
        with self.lock:
            self.at.append(self.local.t)
        return []


def test_a_thousand_joining_nodes_read_within_the_providers_budget() -> None:
    """16 workers poll host keys for 1,000 nodes. Fake time: a thread reads the shared
    clock, and its sleep moves it (and the clock, if later) forward."""
    now, lock, local = [0.0], threading.Lock(), threading.local()

    def monotonic() -> float:
        local.base = local.t = now[0]
        return now[0]

    def sleep(seconds: float) -> None:
        local.t = local.base + seconds
        with lock:
            now[0] = max(now[0], local.t)

    inner = Keys(local)
    cloud = ManagedCloud(inner, CallSettings(reads_per_second=10), sleep=sleep, monotonic=monotonic)  # type: ignore[arg-type]

    def worker(nodes: range) -> None:
        for n in nodes:
            cloud.host_keys(f"i-{n}")

    threads = [threading.Thread(target=worker, args=(range(k, 1000, 16),)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(inner.at) == 1000
    assert most_in_any_window(inner.at, 1.0) <= 20  # burst 10 + 10 a second
    assert max(inner.at) >= (1000 - 10) / 10 - 1e-6  # nobody skipped the queue
