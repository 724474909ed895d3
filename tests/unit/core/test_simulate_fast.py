"""The fast simulator (issue 33) against the slow reference it replaced: the same outcome,
job for job, on random traces that exercise backfill, GPUs, full node groups, warm pools,
per-account rules and every recheck interval; and its work bounded by a trace's events,
not its span."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from slurm_burst.core.policy import ALWAYS, NEVER, Rule
from slurm_burst.core.simulate import MONTH, CloudGroup, Outcome, Setup, simulate, summarize
from slurm_burst.core.warm import window
from slurm_burst.core.workload import TraceJob
from tests.unit.core.simulate_reference import simulate_reference


def random_case(seed: int) -> tuple[list[TraceJob], Setup]:
    r = random.Random(seed)
    pool = r.choice([4, 16, 64])
    on_gpus = r.choice([0, 0, 4])
    whole = r.random() < 0.5  # integer times: ties between events are common
    t = 0.0
    jobs = []
    for k in range(r.randint(1, 250)):
        t += r.expovariate(1 / r.choice([30, 300, 3000]))
        run = r.choice([5, 60, 600, 3600, 36000]) * r.random() + 1
        limit = run * r.choice([1, 1.5, 3])
        if whole:
            t, run, limit = float(int(t)), float(max(1, int(run))), float(int(limit) + 1)
        cpus = r.randint(1, pool + 2) if r.random() < 0.9 else r.randint(1, 3)
        gpus = r.choice([0, 0, 0, 1, 2]) if on_gpus else 0
        jobs.append(TraceJob(str(k), t, run, limit, cpus, gpus, r.choice(["a", "b"])))
    warm = (window(r.randint(1, 3), "mon-sun", "08:00", "18:00"),) if r.random() < 0.3 else ()
    groups = (
        CloudGroup("c", 8, 0, r.choice([0.1, 0.4, 2.0]), r.choice([2, 10, 1000]),
                   r.choice([60.0, 180.0]), warm),
        CloudGroup("g", 8, 1, 1.8, r.choice([1, 4, 100]), 180.0),
    )  # fmt: skip
    rule = r.choice([
        Rule(recheck=r.choice([10.0, 60.0, 300.0]), min_wait=r.choice([0.0, 600.0]),
             wait_per_dollar=r.choice([600.0, 3600.0, 20000.0]),
             wait_factor=r.choice([0.0, 0.5])),
        ALWAYS,
        NEVER,
    ])  # fmt: skip
    if rule.recheck < 60:  # the reference decides each waiting job every 10 s: keep it short
        jobs = jobs[:40]
    rules = {"b": replace(rule, wait_per_dollar=100.0)} if r.random() < 0.3 else {}
    depth = r.choice([1, 3, 100])
    setup = Setup(cpus=pool, gpus=on_gpus, groups=groups, rule=rule, rules=rules,
                  backfill_depth=depth, week_origin=r.randint(0, 10079))  # fmt: skip
    return jobs, setup


def same(a: Outcome, b: Outcome) -> list[int]:
    """The jobs whose fates differ."""

    def close(x: float, y: float) -> bool:
        return (math.isnan(x) and math.isnan(y)) or abs(x - y) <= 1e-6 * max(1.0, abs(x))

    return [
        i
        for i in range(len(a.start))
        if a.where[i] != b.where[i] or not close(a.start[i], b.start[i])
        or not close(a.cost[i], b.cost[i]) or a.warm[i] != b.warm[i]
    ]  # fmt: skip


@pytest.mark.parametrize("seed", range(120))
def test_the_same_outcome_as_the_reference(seed: int) -> None:
    jobs, setup = random_case(seed)
    fast, slow = simulate(jobs, setup), simulate_reference(jobs, setup)
    assert same(fast, slow) == []
    assert fast.warm_cost == pytest.approx(slow.warm_cost)


def test_the_work_is_bounded_by_the_events_not_the_span() -> None:
    """Three jobs of 10**9 s on a one-CPU pool with a recheck of 10 s: the reference
    would decide the waiting ones 10**8 times; the fast one decides each a few times."""
    jobs = [TraceJob(str(k), float(k), 1e9, 1e9, 1) for k in range(3)]
    setup = Setup(cpus=1, groups=(CloudGroup("c", 1, 0, 0.01, 10),),
                  rule=Rule(recheck=10.0, wait_per_dollar=1e6))  # fmt: skip
    out = simulate(jobs, setup)
    assert out.where == ["onprem", "onprem", "onprem"]
    assert out.start == [0.0, 1e9, 2e9]
    assert out.decisions <= 6


def test_a_busy_queue_is_decided_at_its_changes_not_every_recheck() -> None:
    """A queue of 100 one-CPU jobs behind a long one, none worth bursting: each is
    decided when it arrives and again only when a start could move its estimate."""
    jobs = [TraceJob("long", 0.0, 3600.0, 3600.0, 4)]
    jobs += [TraceJob(str(k), 60.0 + k, 120.0, 120.0, 1) for k in range(100)]
    setup = Setup(cpus=4, groups=(CloudGroup("c", 4, 0, 1.0, 10),),
                  rule=Rule(recheck=10.0, wait_per_dollar=1e7))  # fmt: skip
    out = simulate(jobs, setup)
    assert out.where.count("onprem") == 101
    rechecks = sum(out.start[i] - j.submit for i, j in enumerate(jobs)) / 10
    assert rechecks > 30_000 and out.decisions < 2_000
    assert same(out, simulate_reference(jobs, setup)) == []


def test_the_spend_cap_and_budgets_hold_bursts_to_the_next_month() -> None:
    """$1 bursts against a $2.50 monthly cap: two a month; an account with a $1 budget
    gets one. The held jobs burst at their first recheck of the next month."""
    jobs = [TraceJob("long", 0.0, 200 * 86400.0, 200 * 86400.0, 1)]
    jobs += [TraceJob(str(k), float(k), 3600.0, 3600.0, 1, account="a" if k > 5 else "")
             for k in range(1, 8)]  # fmt: skip
    group = CloudGroup("c", 1, 0, 1.0, 100, boot=0.0)
    setup = Setup(cpus=1, groups=(group,), rule=ALWAYS, spend_cap=2.5, budgets={"a": 1.0})
    out = simulate(jobs, setup)

    def tick(submit: float, month: int) -> float:  # first recheck of the month
        return submit + math.ceil((month * MONTH - submit) / ALWAYS.recheck) * ALWAYS.recheck

    assert out.where[1:] == ["c"] * 7
    assert out.start[1:] == [
        1.0, 2.0,  # the cap's first month
        tick(3, 1), tick(4, 1),
        tick(5, 2), tick(6, 2),  # "a" has its dollar this month, and the cap room
        tick(7, 3),  # "a"'s budget: one a month
    ]  # fmt: skip
    assert sum(out.cost) == pytest.approx(7.0)


def test_the_recent_bar_is_the_share_of_the_last_weeks_ratios_or_the_last_few() -> None:
    from slurm_burst.core.policy import Offer, PendingJob, RecentBar

    bar = RecentBar(window=100.0, least=4)
    for t, ratio in enumerate([5.0, 1.0, 4.0, math.inf, 2.0]):
        bar.add(float(t), ratio)
    assert len(bar) == 4  # inf says nothing of the queue
    assert bar.bar(10.0, 0.5) == 4.0  # half of (1, 2, 4, 5) passed 4
    assert bar.bar(10.0, 0.25) == 5.0
    # past the window the last ``least`` stay: a quiet site keeps a bar
    assert bar.bar(101.5, 0.5) == 4.0
    bar.add(101.0, 3.0)
    assert bar.bar(101.5, 0.5) == 3.0 and len(bar) == 4  # the oldest (5.0) left: (1, 2, 3, 4)
    assert RecentBar(least=4).bar(0.0, 0.5) is None  # too few seen yet
    # a job's own rule: its wait_per_dollar at most the bar, made once
    bar = RecentBar(least=1)
    offer = Offer("c", 1, 1.0, 0.0)  # $1 for an hour's limit
    rule = Rule(wait_per_dollar=3600.0, burst_share=0.5)
    job = PendingJob("1", 3600.0, 1, submit=0.0)
    assert bar.rule_for(job, 0.0, None, offer, rule) is None  # no estimate yet
    assert bar.rule_for(job, 0.0, 600.0, offer, rule) is rule  # no bar yet: as set
    own = bar.rule_for(job, 0.0, 900.0, offer, rule)  # the bar: the first job's 600 s/$
    assert own is not None and own.wait_per_dollar == 600.0


def test_burst_share_sets_each_jobs_bar_from_the_jobs_that_waited_before_it() -> None:
    """A larger share lowers the bar: waiting jobs burst sooner and the mean wait falls;
    the cap (wait_per_dollar) holds when the bar would be above it."""
    r = random.Random(3)
    jobs, t = [], 0.0
    for k in range(3000):
        t += r.expovariate(1 / 60)
        run = r.choice([300.0, 1800.0, 7200.0])
        jobs.append(TraceJob(str(k), t, run, run * 2, r.choice([1, 2, 4])))
    group = CloudGroup("c", 4, 0, 0.4, 1000, boot=60.0)

    def measure(rule: Rule) -> tuple[float, int]:
        setup = Setup(cpus=110, groups=(group,), rule=rule)
        s = summarize(jobs, simulate(jobs, setup), setup)
        return s.mean_wait, s.burst_jobs

    low = measure(Rule(min_wait=0.0, wait_per_dollar=1e6, burst_share=0.1))
    high = measure(Rule(min_wait=0.0, wait_per_dollar=1e6, burst_share=0.9))
    assert high[0] < low[0] / 5
    capped = measure(Rule(min_wait=0.0, wait_per_dollar=3600.0, burst_share=0.1))
    assert capped == measure(Rule(min_wait=0.0, wait_per_dollar=3600.0))  # the bar is above
