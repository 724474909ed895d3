"""Warm capacity windows: parsing, which count holds when (overnight windows, overlaps),
the week as minutes, and the simulator's warm pool worked out on paper."""

from __future__ import annotations

import pytest

from slurm_burst.core.policy import NEVER, Rule
from slurm_burst.core.simulate import CloudGroup, Setup, simulate, summarize
from slurm_burst.core.warm import (
    node_seconds,
    parse_clock,
    parse_days,
    seconds_until_below,
    warm_nodes,
    week_profile,
    window,
)
from slurm_burst.core.workload import TraceJob

MON, FRI, SAT, SUN = 0, 4, 5, 6


@pytest.mark.parametrize(
    ("text", "days"),
    [("mon-fri", {0, 1, 2, 3, 4}), ("sat,sun", {5, 6}), ("fri-mon", {4, 5, 6, 0}),
     ("daily", set(range(7))), ("mon-wed,fri", {0, 1, 2, 4}), (" Tue ", {1})],
)  # fmt: skip
def test_days(text: str, days: set[int]) -> None:
    assert parse_days(text) == days


@pytest.mark.parametrize("text", ["", "monday", "mon-", "mon..fri", "1-5", "mon,,fri"])
def test_days_not_understood(text: str) -> None:
    with pytest.raises(ValueError, match="days"):
        parse_days(text)


@pytest.mark.parametrize("text", ["8", "8:0", "24:01", "12:60", "-1:00", "08:00:00", "ab:cd"])
def test_clock_not_understood(text: str) -> None:
    with pytest.raises(ValueError, match="time"):
        parse_clock(text)


def test_which_count_holds_when() -> None:
    day = window(2, "mon-fri", "08:00", "20:00")
    night = window(1, "fri", "22:00", "06:00")  # into Saturday morning
    always = window(1, "daily", "00:00", "24:00")
    assert [warm_nodes([day], MON, m) for m in (479, 480, 1199, 1200)] == [0, 2, 2, 0]
    assert warm_nodes([night], FRI, 1380) == 1 and warm_nodes([night], SAT, 300) == 1
    assert warm_nodes([night], SAT, 360) == 0 and warm_nodes([night], FRI, 300) == 0
    assert warm_nodes([day, always], MON, 600) == 2 and warm_nodes([day, always], SUN, 0) == 1
    assert day.minutes_a_week() == 5 * 720 and night.minutes_a_week() == 480
    with pytest.raises(ValueError, match="empty"):
        window(1, "mon", "08:00", "08:00")
    with pytest.raises(ValueError, match="nodes"):
        window(0, "mon", "08:00", "09:00")


def test_the_week_in_minutes() -> None:
    profile = week_profile([window(2, "mon-fri", "08:00", "20:00")])
    week = 7 * 86400.0
    assert node_seconds(profile, 0, week, 0) == 2 * 5 * 12 * 3600
    assert node_seconds(profile, 0, 3 * week, 0) == 3 * 2 * 5 * 12 * 3600
    # from Monday 07:00 (origin) for two hours: one hour warm, two nodes
    assert node_seconds(profile, 0, 7200, 7 * 60) == 2 * 3600
    assert seconds_until_below(profile, 30, 8 * 60, 1) == 12 * 3600 - 30
    assert seconds_until_below(profile, 0, 8 * 60, 3) == 0


def test_a_warm_pool_starts_jobs_at_once_and_is_paid_for_idle() -> None:
    """2 CPUs on-prem, busy for 10 h. Short jobs arrive on Monday 09:00 and 10:00; a
    warm node of 2 CPUs at $1/h is up mon-fri 08:00-20:00. Each job starts at once on
    it; the pool costs 12 h a weekday over the trace's span (Monday 00:00 to 10:00)."""
    jobs = [TraceJob("0", 0, 36_000, 36_000, 2), TraceJob("1", 9 * 3600, 600, 600, 2),
            TraceJob("2", 10 * 3600 - 900, 600, 600, 2)]  # fmt: skip
    warm = (window(1, "mon-fri", "08:00", "20:00"),)
    group = CloudGroup("cpu", cpus=2, gpus=0, price_per_hour=1.0, max_nodes=4, boot=120,
                       warm=warm)  # fmt: skip
    setup = Setup(cpus=2, groups=(group,), rule=Rule(wait_per_dollar=1e9))  # never bursts
    out = simulate(jobs, setup)
    assert out.start == [0, 9 * 3600, 10 * 3600 - 900] and out.warm == [False, True, True]
    assert out.cost == [0.0, 0.0, 0.0]  # within the window
    s = summarize(jobs, out, setup)
    assert s.warm_jobs == 2 and s.warm_cost == pytest.approx(2.0)  # 08:00-10:00, one node
    assert s.cloud_cost == pytest.approx(2.0) and s.mean_wait == 0
    cold = simulate(jobs, Setup(cpus=2, groups=(group,), rule=NEVER))
    assert cold.warm == [False] * 3 and cold.start[1] == 36_000  # never: no warm pool
    assert cold.warm_cost == 0
