"""Calls stay within one budget per provider account and API, however many nodes join at
once; a throttled answer slows the API down for everyone on the account."""

from __future__ import annotations

import heapq
import math
from pathlib import Path

import pytest

from slurm_burst.adapters.cloud.providers.ec2 import API_TABLE as EC2
from slurm_burst.core.cloud import Busy, Instance, LaunchSpec, ThrottledError
from slurm_burst.core.ratelimit import FLOOR, RECOVER, ApiBudgets, TokenBucket
from slurm_burst.services.cloudcalls import CallSettings, ManagedCloud, SharedBudget


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
    """A provider whose calls are stamped with the fake time; ``throttle`` answers the
    next calls RequestLimitExceeded."""

    name = "p"
    api_names = {"host_keys": "GetConsoleOutput", "launch": "RunInstances"}

    def __init__(self, now: list[float]) -> None:
        self.now = now
        self.at: list[float] = []
        self.throttle = 0

    def host_keys(self, instance_id: str, size: str = "") -> list[tuple[str, str]]:
        self.at.append(self.now[0])
        if self.throttle:
            self.throttle -= 1
            raise ThrottledError("RequestLimitExceeded: slow down")
        return []

    def launch_many(self, spec: LaunchSpec) -> list[Instance]:
        self.at.append(self.now[0])
        return []


def managed(inner: Keys, now: list[float], share: float = 1.0) -> ManagedCloud:
    budget = SharedBudget("acct", ApiBudgets(EC2, share), monotonic=lambda: now[0])

    def sleep(seconds: float) -> None:
        now[0] += seconds

    return ManagedCloud(inner, CallSettings(base=0.5), budget=budget, sleep=sleep, rand=lambda: 0.5)  # type: ignore[arg-type]


def test_a_thousand_joining_nodes_read_within_the_accounts_budget() -> None:
    """1,000 nodes read their consoles through the timers: a read our budget has no token
    for is no call, and says when to come back; coming back then finds one."""
    now = [0.0]
    inner = Keys(now)
    cloud = managed(inner, now, share=0.75)
    due = [(0.0, n) for n in range(1000)]  # (when the node comes back, node): a heap
    busy = 0
    while due:
        at, n = heapq.heappop(due)
        now[0] = max(now[0], at)
        try:
            cloud.host_keys(f"i-{n}", "c5.large")
        except Busy as exc:
            busy += 1
            assert exc.after > 0
            heapq.heappush(due, (now[0] + exc.after, n))
    assert len(inner.at) == 1000  # every node read once: a refused turn costs no call
    assert 0 < busy <= 1000  # each told its turn once, not again and again
    refill = EC2.limit("GetConsoleOutput").refill * 0.75
    assert most_in_any_window(inner.at, 1.0) <= EC2.limit("GetConsoleOutput").burst + refill
    window = [t for t in inner.at if t >= 10.0]
    assert most_in_any_window(window, 10.0) <= refill * 10 + 1  # within 75 % of the refill
    assert busy > 0


def test_a_throttled_answer_cuts_the_rate_and_it_climbs_back() -> None:
    bucket = TokenBucket(10, 10)
    for _ in range(10):
        bucket.reserve(0.0)
    bucket.cut(0.0)
    assert bucket.level(0.0) == 0 and bucket.current_rate(0.0) == pytest.approx(5.0)
    assert bucket.ready_in(0.0) == pytest.approx(0.2)  # at the cut rate
    assert bucket.current_rate(60.0) == pytest.approx(7.5)  # halfway back
    assert bucket.current_rate(RECOVER + 1) == 10.0
    bucket.cut(200.0)
    bucket.cut(200.5)  # the answers to calls already in flight: one cut
    assert bucket.current_rate(200.5) == pytest.approx(5.0, rel=0.01)
    bucket.cut(202.0)  # throttled again after that: halved again, never below the floor
    assert bucket.current_rate(202.0) == pytest.approx(2.5, rel=0.02)
    for i in range(20):
        bucket.cut(203.0 + 2 * i)
    assert 10 * FLOOR <= bucket.current_rate(243.0) <= 10 * FLOOR * 1.5


def test_ready_in_takes_nothing() -> None:
    bucket = TokenBucket(2, 1)
    assert bucket.ready_in(0.0) == 0.0 and bucket.ready_in(0.0) == 0.0
    assert bucket.reserve(0.0) == 0.0
    assert bucket.ready_in(0.0) == pytest.approx(0.5)
    assert bucket.ready_in(0.5) == 0.0


def test_a_throttled_read_is_raised_at_once_and_slows_the_api_for_everyone() -> None:
    now = [0.0]
    inner = Keys(now)
    cloud = managed(inner, now)
    other = ManagedCloud(inner, budget=cloud.budget)  # type: ignore[arg-type]  # same account
    inner.throttle = 1
    with pytest.raises(ThrottledError):
        cloud.host_keys("i-1", "c5.large")
    assert len(inner.at) == 1  # not retried in place: the node's timer comes back
    with pytest.raises(Busy) as got:
        other.host_keys("i-2", "c5.large")  # the shared bucket was emptied by the cut
    assert got.value.after == pytest.approx(1 / 10)  # 20 a second, cut to 10


def test_a_large_launch_waits_for_the_instance_tokens_instead_of_failing() -> None:
    """RunInstances' resource bucket: 1,000 instances at once, then 2 a second (here all
    of the refill: share 1)."""
    now = [0.0]
    inner = Keys(now)
    cloud = managed(inner, now)
    for _ in range(2):
        cloud.launch_many(_spec(500))
    assert inner.at == [0.0, 0.0]
    cloud.launch_many(_spec(100))  # the bucket is empty: 100 instances take 50 s
    assert inner.at[-1] == pytest.approx(50.0)


def test_profiles_on_one_account_share_its_budget(tmp_path: Path) -> None:
    from slurm_burst.wiring import clouds
    from tests.conftest import lab_config_in

    extra = """
[providers.aws1]
driver = "ec2"
region = "us-east-1"
credentials = { key_env = "K", secret_env = "S" }

[providers.aws2]
driver = "ec2"
region = "us-east-1"
credentials = { key_env = "K", secret_env = "S" }
api_limits = { GetConsoleOutput = [10, 2] }

[providers.aws3]
driver = "ec2"
region = "eu-west-1"
credentials = { key_env = "K", secret_env = "S" }
"""
    cfg = lab_config_in(tmp_path, extra)
    built = {n: Keys([0.0]) for n in ("aws1", "aws2", "aws3")}
    got = clouds.api_budgets(cfg, built)  # type: ignore[arg-type]
    assert got["aws1"] is got["aws2"] and got["aws3"] is not got["aws1"]
    assert got["aws1"].account == "aws1"
    assert got["aws3"].budgets.ready_in("GetConsoleOutput", 0.0) == 0.0


def _spec(count: int) -> LaunchSpec:
    return LaunchSpec(
        node="n", cluster="c", group="g", size="c5.large", image="ami-1", token="t",
        ssh_public_key="", user_data="", count=count,
    )  # fmt: skip


def test_gce_profiles_of_one_project_share_its_per_minute_quotas(tmp_path: Path) -> None:
    """GCE counts calls per project and quota group in minute windows: two regions of
    one project are one budget, a host-key read and an instance read share the read
    group, and a 403 rateLimitExceeded spends the rest of the minute."""
    from slurm_burst.wiring import clouds
    from tests.conftest import lab_config_in

    extra = """
[providers.gce1]
driver = "gce"
region = "us-central1"
zone = "us-central1-a"
options = { project = "p1" }
credentials = { key_env = "G1", secret_env = "GS1" }

[providers.gce2]
driver = "gce"
region = "europe-west4"
zone = "europe-west4-a"
options = { project = "p1" }
credentials = { key_env = "G1", secret_env = "GS1" }

[providers.gce3]
driver = "gce"
region = "us-central1"
zone = "us-central1-a"
options = { project = "p2" }
credentials = { key_env = "G2", secret_env = "GS2" }
api_limits = { read_requests = [1, 0.05] }
"""
    cfg = lab_config_in(tmp_path, extra)
    built = {n: Keys([0.0]) for n in ("gce1", "gce2", "gce3")}
    got = clouds.api_budgets(cfg, built)  # type: ignore[arg-type]
    assert got["gce1"] is got["gce2"] and got["gce3"] is not got["gce1"]
    mine = got["gce3"].budgets  # the site's own: 3 reads a minute
    waits = [mine.reserve(api, 0.0, wall=610.0)
             for api in ("instances.get", "instances.getGuestAttributes", "instances.get",
                         "instances.getGuestAttributes")]  # fmt: skip
    assert waits == [0.0, 0.0, 0.0, 51.0]
    shared = got["gce1"].budgets
    assert shared.reserve("instances.aggregatedList", 0.0, wall=610.0) == 0.0
    shared.throttled("instances.aggregatedList", 0.0, wall=611.0)
    assert shared.ready_in("instances.aggregatedList", 0.0, wall=611.0) == 50.0
    assert shared.ready_in("instances.get", 0.0, wall=611.0) == 0.0  # another group


def test_a_throttled_gce_call_is_counted_under_its_quota_group() -> None:
    from slurm_burst.adapters.cloud.providers.gce import API_TABLE

    budget = SharedBudget("gcp", ApiBudgets(API_TABLE), wall=lambda: 610.0)
    assert budget.counted_as("instances.getGuestAttributes") == "read_requests"
    assert budget.counted_as("RunInstances") == "RunInstances"  # not in a group: itself
    budget.throttled("instances.get")
    assert budget.levels()["read_requests"] == 0.0  # the minute is spent


def _gce_readers(callers: int, late: float = 0.0) -> tuple[dict[int, int], int]:
    """``callers`` host-key readers asking at once on GCE's table (each back when told,
    every seventh ``late`` seconds after that): calls per wall-clock minute, and the
    most in any one second."""
    from collections import Counter

    from slurm_burst.adapters.cloud.providers.gce import API_TABLE

    t = [1000.0]
    offset = 60 * 1000 + 10.0 - 1000.0  # 10 s into a wall-clock minute
    budget = SharedBudget("gcp", ApiBudgets(API_TABLE), monotonic=lambda: t[0],
                          wall=lambda: t[0] + offset)  # fmt: skip
    minutes: Counter[int] = Counter()
    seconds: Counter[int] = Counter()
    queue = [(i * 0.002, i) for i in range(callers)]
    heapq.heapify(queue)
    while queue:
        at, i = heapq.heappop(queue)
        t[0] = 1000.0 + at
        wait = budget.turn("instances.getGuestAttributes", f"i-{i}")
        if wait > 0:
            heapq.heappush(queue, (at + wait + (late if i % 7 == 0 else 0.0), i))
        else:
            minutes[int((t[0] + offset) // 60)] += 1
            seconds[int(t[0])] += 1
    return dict(minutes), max(seconds.values())


def test_gce_readers_told_to_wait_for_a_window_are_spread_within_it_not_sent_at_its_start() -> None:
    """5,000 readers at once: each minute holds the daemon's share of the read quota
    (1,125 of 1,500) and no second more than the total bucket lets through (50): the
    readers a window lets go at its start are paced by the total, as the 5,000-node
    benchmark showed they must be (545 calls in one second, 472 throttled, before)."""
    minutes, peak = _gce_readers(5000)
    assert max(minutes.values()) <= 1125 and sum(minutes.values()) == 5000, minutes
    assert peak <= 50, peak


def test_a_gce_reader_back_after_its_window_ended_asks_for_a_place_anew() -> None:
    """A reader that comes back late (its timer ran late on a loaded daemon) does not
    call in the next minute on the turn of the one before: that minute's calls are
    promised to others. Every seventh reader here is half a minute late each time."""
    minutes, _ = _gce_readers(3000, late=30.0)
    assert max(minutes.values()) <= 1125 and sum(minutes.values()) == 3000, minutes


@pytest.mark.parametrize(
    ("remaining", "level"),
    [(10.0, 10.0), (250.0, 100.0), (-3.0, 0.0), (math.nan, 100.0), (math.inf, 100.0)],
    ids=["capped", "never-raised", "negative", "nan", "inf"],
)
def test_what_the_provider_says_is_left_caps_the_bucket_and_never_raises_it(
    remaining: float, level: float
) -> None:
    """Azure's x-ms-ratelimit-remaining-*: others spend the subscription's bucket too, so
    ours holds no more than what the answer says; it is never raised above its own."""
    bucket = TokenBucket(10, 100)
    bucket.observe(0.0, remaining)
    assert bucket.level(0.0) == level
    assert bucket.level(1.0) == min(100.0, level + 10)  # and refills as before


def test_a_metered_request_waits_its_turn_or_a_call_that_may_not_wait_is_told_later() -> None:
    """The Azure connection's meter: a request of a kind takes that kind's token from the
    shared budget (a launch's requests wait; a host-key read's raise Busy), what an answer
    says is left caps it, and a 429 cuts the rate and is repeated after Retry-After up to
    the call's attempts, unless the call may not wait."""
    from slurm_burst.adapters.cloud.providers.azure_arm import API_TABLE as ARM
    from slurm_burst.services.cloudcalls import BudgetMeter

    slept: list[float] = []
    clock = [0.0]

    class Inner:
        name = "az"

        def host_keys(self, instance_id: str, size: str = "") -> list[tuple[str, str]]:
            meter.before("writes")  # the POST for the serial log's address
            return [("ssh-ed25519", "AAAA")]

    budget = SharedBudget("az", ApiBudgets(ARM, share=1.0), monotonic=lambda: clock[0],
                          wall=lambda: clock[0])  # fmt: skip
    managed = ManagedCloud(Inner(), CallSettings(attempts=3), budget=budget,  # type: ignore[arg-type]
                           sleep=slept.append, rand=lambda: 0.5)  # fmt: skip
    meter = BudgetMeter(managed)
    meter.after("writes", 0.0)  # ARM said none are left
    with pytest.raises(Busy) as later:
        managed.host_keys("vm_1")
    assert later.value.after > 0 and slept == []  # told, not put to sleep
    meter.before("writes")  # a launch's request: waits its turn
    assert slept and slept[-1] > 0
    assert meter.throttled("writes", 7.0) and slept[-1] == 7.0  # Retry-After honoured
    assert meter.throttled("writes", 7.0)
    assert not meter.throttled("writes", 7.0)  # the call's attempts are spent: raised
