"""GCE's rate quotas as what they are: so many calls of a quota group in each 60-s
interval synchronized to the minute, refilled whole at the next (core.ratelimit)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_burst.core.ratelimit import ApiBudgets, ApiTable, Limit, Quota, QuotaWindow

NO_BUCKET = Limit(1.0, 0.0)  # refill 0: no token bucket


def test_a_window_is_refilled_whole_at_the_next_minute_not_a_token_at_a_time() -> None:
    w = QuotaWindow(3, guard=1.0)
    assert [w.reserve(600.0 + 15) for _ in range(3)] == [0.0, 0.0, 0.0]  # 10:00:15
    # the fourth waits for 10:01:00 (and the guard): not 20 s, as a bucket would say
    assert w.reserve(615.0) == pytest.approx(661.0 - 615.0)
    assert w.left(615.0) == -1.0  # a call promised in the next interval
    assert w.reserve(615.0) == pytest.approx(46.0)
    assert w.reserve(615.0) == pytest.approx(46.0)
    assert w.reserve(615.0) == pytest.approx(106.0)  # the next interval is full too
    assert w.left(662.0) == -1.0 and w.left(721.5) == 2.0  # one promised to 10:02


def test_no_call_goes_in_the_guard_either_side_of_an_edge() -> None:
    w = QuotaWindow(10, guard=1.0)
    assert w.reserve(659.5) == pytest.approx(1.5)  # 0.5 s before the edge: after it
    assert w.reserve(660.2) == pytest.approx(0.8)  # just after: once the guard has passed
    assert w.ready_in(661.0) == 0.0


def test_a_throttled_answer_spends_the_rest_of_the_interval() -> None:
    w = QuotaWindow(100)
    assert w.reserve(610.0) == 0.0
    w.spent(612.0)  # others spent the project's quota too
    assert w.left(612.0) == 0.0
    assert w.reserve(612.0) == pytest.approx(49.0)  # 10:01:00 + the guard
    unlimited = QuotaWindow(0)
    unlimited.spent(1.0)
    assert unlimited.reserve(1.0) == 0.0 and unlimited.left(1.0) == math.inf


@pytest.mark.parametrize(("limit", "interval", "guard"), [(-1, 60, 1), (math.nan, 60, 1),
                                                          (5, 0, 0), (5, 60, 20)])  # fmt: skip
def test_a_window_that_cannot_be_is_refused(limit: float, interval: float, guard: float) -> None:
    with pytest.raises(ValueError):
        QuotaWindow(limit, interval, guard)


@settings(max_examples=300, deadline=None)
@given(
    limit=st.integers(1, 40),
    gaps=st.lists(st.floats(0.0, 20.0), min_size=1, max_size=300),
    skew=st.floats(-0.99, 0.99),
)
def test_the_provider_never_counts_more_than_the_limit_in_an_interval(
    limit: int, gaps: list[float], skew: float
) -> None:
    """Callers arrive at any times and call when told: the provider, whose clock is off
    ours by less than the guard, counts at most ``limit`` calls in any of its intervals,
    and every caller's turn comes in order."""
    w = QuotaWindow(limit, 60.0, guard=1.0)
    now, calls = 1_000_000.0, []
    for gap in gaps:
        now += gap
        calls.append(now + w.reserve(now))
    assert calls == sorted(calls)
    counted = Counter(math.floor((t + skew) / 60.0) for t in calls)
    assert max(counted.values()) <= limit


def test_budgets_share_one_window_per_quota_group_and_keep_buckets_for_the_rest() -> None:
    table = ApiTable(
        apis={"ec2ish": Limit(2, 1.0)}, default=NO_BUCKET, resources={},
        quotas={"reads": Quota(8), "writes": Quota(4)},
        quota_of={"get": "reads", "list": "reads", "insert": "writes"},
    )  # fmt: skip
    b = ApiBudgets(table, share=0.5)  # our half of the project's quota
    waits = [b.reserve(api, 5.0, wall=610.0) for api in ("get", "list", "get", "list")]
    assert waits == [0.0, 0.0, 0.0, 0.0]
    assert b.reserve("get", 5.0, wall=610.0) == pytest.approx(51.0)  # reads: 4 of 8 ours
    assert b.reserve("insert", 5.0, wall=610.0) == 0.0  # writes are counted apart
    assert b.reserve("ec2ish", 5.0) == 0.0 and b.reserve("ec2ish", 5.0) == 0.0
    assert b.reserve("ec2ish", 5.0) == pytest.approx(2.0)  # a bucket: a token at a time
    b.throttled("insert", 5.0, wall=611.0)
    assert b.ready_in("insert", 5.0, wall=611.0) == pytest.approx(50.0)
    assert b.levels(5.0, wall=611.0)["writes"] == 0.0
    assert b.levels(5.0, wall=611.0)["reads"] == -1.0  # one read waits for the next minute


def test_a_sites_own_quota_for_a_group_is_all_ours() -> None:
    table = ApiTable(apis={}, default=NO_BUCKET, resources={}, quotas={"reads": Quota(1500)},
                     quota_of={"get": "reads"})  # fmt: skip
    b = ApiBudgets(table, share=0.75, overrides={"reads": Limit(0, 0.1)})  # 6 a minute
    # at 10:00:00 sharp: the guard first, then six; the seventh at 10:01:01
    assert [b.reserve("get", 0.0, wall=600.0) for _ in range(7)] == [1.0] * 6 + [61.0]
    assert ApiBudgets(table, share=0.75).levels(0.0, wall=600.0) == {}  # none used yet
