"""The burst policy's decisions, table-driven, and the simulator on hand-made traces whose
schedule can be worked out on paper (FCFS, EASY backfill, a burst, the cloud's limit)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurm_burst.core.policy import (
    ALWAYS,
    NEVER,
    DataMove,
    Decision,
    Offer,
    PendingJob,
    Rule,
    Verdict,
    data_move,
    decide,
    decide_all,
)
from slurm_burst.core.simulate import CloudGroup, Setup, simulate, summarize
from slurm_burst.core.workload import TraceJob

NOW = 1_000_000.0
JOB = PendingJob("7", limit=3600, cpus=4, account="physics")
OFFER = Offer("cpu", nodes=1, price_per_hour=0.36, boot=120)  # $0.372 for the hour + boot
DEAR = Offer("gpu", nodes=8, price_per_hour=80.0, boot=120)  # $82.67
BY_LIMIT = Rule(wait_per_dollar=0, wait_factor=1)  # a wait longer than the time limit


@pytest.mark.parametrize(
    ("expected_start", "offer", "rule", "money", "verdict", "reason"),
    [
        # the default: an hour of wait for each dollar ($0.372: 22 min), at least 10 min
        (NOW + 1500, OFFER, Rule(), None, Verdict.BURST,
         "expected on-prem wait 25 min > 22 min; cloud $0.37"),
        (NOW + 1200, OFFER, Rule(), None, Verdict.WAIT, "expected on-prem wait 20 min <= 22 min"),
        (NOW + 7300, DEAR, Rule(), None, Verdict.WAIT, "expected on-prem wait 2.0 h <= 82.7 h"),
        (NOW + 7300, OFFER, BY_LIMIT, None, Verdict.BURST,
         "expected on-prem wait 2.0 h > 60 min; cloud $0.37"),
        (NOW + 3000, OFFER, BY_LIMIT, None, Verdict.WAIT, "expected on-prem wait 50 min <= 60 min"),
        (None, OFFER, BY_LIMIT, None, Verdict.WAIT, "no on-prem estimate; waited 0 s <= 60 min"),
        (float("inf"), OFFER, Rule(), None, Verdict.BURST,
         "expected on-prem wait never > 22 min; cloud $0.37"),
        (NOW + 7300, None, Rule(), None, Verdict.NEVER, "no node group fits the job"),
        (NOW + 7300, OFFER, NEVER, None, Verdict.NEVER, "on-prem only"),
        (NOW + 7300, OFFER, Rule(max_job_cost=0.1), None, Verdict.NEVER,
         "cloud cost $0.37 over the $0.10 cap"),
        (NOW + 7300, OFFER, Rule(), 0.2, Verdict.WAIT, "budget: $0.37 needed, $0.20 left"),
        (NOW + 1, OFFER, ALWAYS, None, Verdict.BURST,
         "expected on-prem wait 1 s > 0 s; cloud $0.37"),
        (NOW + 300, OFFER, Rule(wait_per_dollar=0), None, Verdict.WAIT,
         "expected on-prem wait 5 min <= 10 min"),  # min_wait
    ],
    ids=["cheap-burst", "cheap-wait", "dear-wait", "long-wait", "short-wait", "no-estimate",
         "never-onprem", "no-group", "onprem-only", "job-cap", "budget", "always", "min-wait"],
)  # fmt: skip
def test_decide(
    expected_start: float | None,
    offer: Offer | None,
    rule: Rule,
    money: float | None,
    verdict: Verdict,
    reason: str,
) -> None:
    d = decide(JOB, NOW, expected_start, offer, rule, money)
    assert (d.verdict, d.reason) == (verdict, reason)
    if verdict == Verdict.WAIT:
        assert d.look_again is not None and NOW < d.look_again <= NOW + rule.recheck


def test_a_jobs_data_adds_its_move_to_the_threshold_and_its_dollars_to_the_cost() -> None:
    """20 min to move its data, $1 to move it: the threshold is the wait for $0.372 + $1
    + 20 min of the node ($0.12): 89 min, plus the 20 min; the budget sees $1.49."""
    data = DataMove(seconds=1200, cost=1.0, bytes=150 << 30)
    d = decide(JOB, NOW, NOW + 6000, OFFER, Rule(), None, data)
    assert (d.verdict, d.reason) == (
        Verdict.WAIT,
        "expected on-prem wait 1.7 h <= 1.8 h (with 20 min to move its data)",
    )
    d = decide(JOB, NOW, NOW + 7000, OFFER, Rule(), None, data)
    assert (d.verdict, d.reason) == (
        Verdict.BURST,
        "expected on-prem wait 1.9 h > 1.8 h (with 20 min to move its data); cloud $1.49",
    )
    d = decide(JOB, NOW, NOW + 7000, OFFER, Rule(), 1.0, data)
    assert (d.verdict, d.reason) == (Verdict.WAIT, "budget: $1.49 needed, $1.00 left")
    # data that takes longer to move than the whole wait: never worth it, whatever the rule
    slow = DataMove(seconds=9000, cost=0.0)
    assert decide(JOB, NOW, NOW + 8000, OFFER, ALWAYS, None, slow).verdict == Verdict.WAIT
    [d] = decide_all([JOB], NOW, {"7": NOW + 8000}, {"7": OFFER}, default=ALWAYS,
                     data={"7": slow})  # fmt: skip
    assert d.verdict == Verdict.WAIT


def test_what_moving_data_takes() -> None:
    gib = 1 << 30
    # 100 GiB at 1,000 Mbit/s, sent at $0.09/GB and stored a month at $0.02/GB; pulled
    # whole by each of 4 nodes at $0.01/GB
    m = data_move(100 * gib, 100 * gib, 4, 1000.0, 0.09, 0.01, 0.02)
    assert m.seconds == pytest.approx(100 * gib * 8 / 1e9)
    assert m.cost == pytest.approx(100 * (0.09 + 0.02) + 400 * 0.01)
    assert m.bytes == 100 * gib
    stored = data_move(0, 100 * gib, 1, 1000.0, 0.09, 0.01, 0.02)  # pulled only
    assert stored.seconds == 0.0 and stored.cost == pytest.approx(1.0)
    assert data_move(-5, -5, 0, 0.0) == DataMove(0.0, 0.0, 0)  # nonsense counts as nothing


def test_a_waiting_job_is_looked_at_again_when_its_wait_would_cross_the_threshold() -> None:
    """Without an estimate the wait grows with time: the next look is when it would
    cross. With one, at the next recheck (not every second while it hovers below)."""
    waited = PendingJob("9", limit=3600, cpus=4, submit=NOW - 3550)
    d = decide(waited, NOW, None, OFFER, replace(BY_LIMIT, recheck=300))
    assert d.verdict == Verdict.WAIT and d.look_again == NOW + 51
    d = decide(JOB, NOW, NOW + 3550, OFFER, replace(BY_LIMIT, recheck=300))
    assert d.verdict == Verdict.WAIT and d.look_again == NOW + 300


def test_the_whole_wait_counts_from_submission_and_without_an_estimate_the_wait_so_far() -> None:
    waited = PendingJob("8", limit=3600, cpus=4, submit=NOW - 3000)
    d = decide(waited, NOW, NOW + 1200, OFFER, BY_LIMIT)  # 50 min so far + 20 to come
    assert (d.verdict, d.reason) == (
        Verdict.BURST,
        "expected on-prem wait 70 min > 60 min; cloud $0.37",
    )
    d = decide(waited, NOW, None, OFFER, BY_LIMIT)
    assert d.verdict == Verdict.WAIT and d.look_again == NOW + 300
    d = decide(waited, NOW + 700, None, OFFER, BY_LIMIT)
    assert (d.verdict, d.reason) == (
        Verdict.BURST,
        "no on-prem estimate; waited 62 min > 60 min; cloud $0.37",
    )
    late = decide(waited, NOW, NOW - 500, OFFER, BY_LIMIT)  # an estimate in the past: now
    assert late.reason == "expected on-prem wait 50 min <= 60 min"


def test_when_money_binds_slurms_priority_order_wins() -> None:
    jobs = [PendingJob(str(i), 3600, 4, account="physics", priority=p)
            for i, p in enumerate((1.0, 5.0, 3.0))]  # fmt: skip
    out = decide_all(
        jobs, NOW, {j.id: float("inf") for j in jobs}, {j.id: OFFER for j in jobs},
        budgets={"physics": 0.8},
    )  # fmt: skip
    assert [d.verdict for d in out] == [Verdict.WAIT, Verdict.BURST, Verdict.BURST]
    capped = decide_all(
        jobs, NOW, {j.id: float("inf") for j in jobs}, {j.id: OFFER for j in jobs}, spend_cap=0.5
    )
    assert [d.verdict for d in capped] == [Verdict.WAIT, Verdict.BURST, Verdict.WAIT]
    assert all(isinstance(d, Decision) for d in capped)


def J(i: int, submit: float, run: float, cpus: int, limit: float | None = None) -> TraceJob:
    return TraceJob(str(i), submit, run, limit or run, cpus)


def test_fcfs_and_easy_backfill() -> None:
    """4 CPUs. Job 0 takes 3 until 100; job 1 needs 4 (reservation at 100); job 2 (1 CPU,
    ends by 50) backfills at once; job 3 (1 CPU, 200 s) would delay job 1: it waits."""
    jobs = [J(0, 0, 100, 3), J(1, 1, 10, 4), J(2, 2, 48, 1, 50), J(3, 3, 200, 1)]
    out = simulate(jobs, Setup(cpus=4, rule=NEVER))
    assert out.start == [0, 100, 2, 110]
    assert out.where == ["onprem"] * 4


def test_a_long_wait_bursts_and_the_cloud_is_billed_for_boot_and_run() -> None:
    group = CloudGroup("cpu", cpus=4, gpus=0, price_per_hour=3.6, max_nodes=1, boot=60)
    jobs = [J(0, 0, 10_000, 4), J(1, 1, 3600, 4), J(2, 2, 3600, 4)]
    setup = Setup(cpus=4, groups=(group,), rule=Rule(min_wait=0, wait_per_dollar=0, wait_factor=1))
    out = simulate(jobs, setup)
    # job 1 expects to wait ~10,000 s > its 3,600 s limit: it bursts at once; job 2 too,
    # but the group's one node is taken until 3,661: it looks again every 300 s and
    # bursts at 3,902 (still a long wait on-prem), running from 3,962
    assert out.where == ["onprem", "cpu", "cpu"]
    assert out.start == [0, 61, 3962]
    hour = pytest.approx(3.6 * (60 + 3600) / 3600)
    assert out.cost == [0, hour, hour]
    s = summarize(jobs, out, setup)
    assert s.burst_jobs == 2 and s.cloud_node_hours == pytest.approx(2 * (60 + 3600) / 3600)
    assert s.mean_wait == pytest.approx((0 + 60 + 3960) / 3)


def test_a_job_larger_than_the_pool_runs_only_in_the_cloud_or_not_at_all() -> None:
    jobs = [J(0, 0, 100, 8)]
    assert simulate(jobs, Setup(cpus=4, rule=NEVER)).where == [""]
    group = CloudGroup("big", cpus=8, gpus=0, price_per_hour=1.0, max_nodes=2, boot=30)
    assert simulate(jobs, Setup(cpus=4, groups=(group,))).where == ["big"]


def test_gpus_are_a_resource_of_their_own() -> None:
    jobs = [TraceJob("0", 0, 100, 100, 1, gpus=2), TraceJob("1", 1, 100, 100, 1, gpus=1)]
    out = simulate(jobs, Setup(cpus=8, gpus=2, rule=NEVER))
    assert out.start == [0, 100]
    with pytest.raises(ValueError):
        simulate(jobs, Setup(cpus=0))


def test_the_most_specific_setting_wins() -> None:
    from slurm_burst.config.load import parse_config
    from tests.unit.test_config import GOOD

    cfg, found = parse_config(
        GOOD + "[policy]\nwait_factor = 2\nmax_job_cost = 50\n"
        "[policy.partitions.burst-gpu]\nmin_wait = 60\n"
        "[policy.qos.urgent]\nwait_factor = 0.5\n"
        "[policy.accounts.secret]\nonprem_only = true\n"
        "[policy.accounts.rich]\nmax_job_cost = 0\n"
    )
    assert cfg is not None and not [p for p in found if p.severity == "error"], found
    p = cfg.policy
    assert p.rule() == Rule(min_wait=600, wait_factor=2, max_job_cost=50)
    assert p.rule(partition="burst-gpu", qos="urgent") == Rule(
        min_wait=60, wait_factor=0.5, max_job_cost=50
    )
    assert p.rule(account="secret", qos="urgent").onprem_only
    assert p.rule(account="rich").max_job_cost is None
    _, found = parse_config(GOOD + "[policy]\nwait_factor = nan\n[policy.qos.x]\nmin_wait = -1\n")
    assert {q.path for q in found if q.severity == "error"} == {
        "policy.wait_factor",
        "policy.qos.x.min_wait",
    }
