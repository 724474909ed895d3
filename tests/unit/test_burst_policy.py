"""The burst policy service on a queue held in memory: which jobs it looks at, what it
sends (one update per partition list), what it records, and what it leaves to Slurm.
The lab's config (the policy's groups: burst-cpu, 2 CPUs at $0.085/h, and burst-gpu,
2 GPUs at $2.50/h, each partition MaxTime 1 h, not the cheaper EC2 group; medgen on-prem
only)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from slurm_burst.config.load import load_config
from slurm_burst.core.records import StageRecord
from slurm_burst.core.slurm import JobOwner, QueuedJob, SchedulerError
from slurm_burst.services.burstpolicy import BurstPolicy
from slurm_burst.services.simulation import cloud_groups
from slurm_burst.services.transfers import StorePrices
from slurm_burst.wiring.daemon import policy_settings
from tests.conftest import LAB_CONFIG, lab_config_in
from tests.fakes.clock import FakeClock
from tests.fakes.store import MemoryStore

T0 = 1_790_000_000.0
CFG = load_config(LAB_CONFIG, driver_exists=lambda _name: True)


class Queue:
    """JobSteering over a list: steered jobs take their new partitions."""

    def __init__(self, jobs: Sequence[QueuedJob], refuse: Sequence[str] = ()) -> None:
        self.jobs = {j.id: j for j in jobs}
        self.refuse = set(refuse)
        self.calls: list[tuple[list[str], tuple[str, ...], str]] = []
        self.reads = 0

    def pending_jobs(self) -> list[QueuedJob]:
        self.reads += 1
        return list(self.jobs.values())

    def steer_jobs(
        self, job_ids: Sequence[str], partitions: Sequence[str], comment: str
    ) -> list[str]:
        self.calls.append((list(job_ids), tuple(partitions), comment))
        said = []
        for i in job_ids:
            if i in self.refuse:
                said.append(f"Job is no longer pending execution for job {i}")
            else:
                self.jobs[i] = self.jobs[i]._replace(partitions=tuple(partitions))
        return said


def report(store: MemoryStore) -> dict[str, Any]:
    doc = store.policy_report()
    assert doc is not None, "the policy pass left no report"
    return doc


def job(
    i: int,
    *,
    limit: float = 600,
    start: float | None = T0 + 7200,
    account: str = "physics",
    cpus: int = 1,
    gpus: int = 0,
    parts: tuple[str, ...] = ("onprem",),
    reason: str = "Resources",
    priority: int = 0,
) -> QueuedJob:
    return QueuedJob(
        str(i), parts, account, "normal", cpus, 1, gpus, limit, T0, float(priority), start, reason
    )


def policy(
    q: Queue, money: tuple[dict[str, float], float | None] | None = ({}, None)
) -> tuple[BurstPolicy, MemoryStore]:
    store = MemoryStore()
    clock = FakeClock(T0)
    policy = BurstPolicy(policy_settings(CFG), q, store, clock, cloud_groups(CFG), lambda: money)
    return policy, store


def test_long_waits_are_sent_in_one_update_per_partition_list() -> None:
    q = Queue([
        job(1), job(2), job(3, gpus=2, cpus=2),       # wait 2 h > 10 min: burst
        job(4, start=T0 + 300),                        # 5 min <= 10: wait
        job(5, account="medgen"),                      # on-prem only
        job(6, limit=7200),                            # over burst MaxTime (1 h): no group fits
        job(7, parts=("onprem", "burst-cpu")),         # already may burst: not ours
        job(8, reason="Dependency"),                   # held by Slurm: shown, not decided
        job(9, parts=("debug",)),                      # not an on-prem partition of ours
    ])  # fmt: skip
    p, store = policy(q)
    r = p.pass_once()
    assert (r.pending, r.eligible, r.decided, r.steered, r.slurm_calls) == (9, 6, 6, 3, 3)
    assert r.verdicts == {"burst": 3, "wait": 1, "never": 2}
    assert [(ids, parts) for ids, parts, _ in q.calls] == [
        (["1", "2"], ("onprem", "burst-cpu")),  # the cheapest group of policy.groups
        (["3"], ("onprem", "burst-gpu")),
    ]
    assert q.calls[0][2].startswith("slurm-burst: sent to burst-cpu 2026-")
    doc = report(store)
    rows = {row["job"]: row for row in doc["jobs"]}
    assert rows["1"]["verdict"] == "burst" and rows["1"]["group"] == "cpu"
    assert rows["5"] == {"job": "5", "verdict": "never", "reason": "on-prem only", "group": None,
                         "cost": None, "look_again": T0 + 10}  # fmt: skip
    assert rows["6"]["reason"] == "no node group fits the job"
    assert rows["8"]["reason"] == "Slurm holds it: Dependency"
    assert "7" not in rows and "9" not in rows
    assert rows["4"]["look_again"] == T0 + 10  # the lab's recheck
    kinds = sorted(e["event"] for e in store.events())
    assert kinds == ["job.burst"] * 3 + ["job.never"] * 2


def test_a_waiting_job_is_not_decided_again_before_its_look_again() -> None:
    q = Queue([job(1, start=T0 + 300)])
    p, _ = policy(q)
    assert p.pass_once().decided == 1
    assert p.pass_once().decided == 0  # the same instant: not due
    p.clock.advance(10)  # type: ignore[attr-defined]
    q.jobs["1"] = q.jobs["1"]._replace(expected_start=T0 + 5000)  # on-prem slipped
    r = p.pass_once()
    assert (r.decided, r.steered) == (1, 1)
    assert p.pass_once().eligible == 0  # now in a burst partition: Slurm's to start


def test_what_slurm_refuses_is_reported_and_looked_at_again() -> None:
    q = Queue([job(1), job(2)], refuse=["2"])
    p, store = policy(q)
    r = p.pass_once()
    assert r.steered == 2 and r.complaints == ["Job is no longer pending execution for job 2"]
    assert report(store)["complaints"] == r.complaints


def test_budgets_and_the_cap_hold_jobs_back_in_priority_order() -> None:
    # 600 s + 10 s boot at $0.085/h (burst-cpu): $0.0144 a job
    q = Queue([job(1, priority=1), job(2, priority=9), job(3, account="chemistry")])
    p, store = policy(q, ({"physics": 0.02}, None))
    r = p.pass_once()
    assert r.verdicts == {"burst": 2, "wait": 1}
    rows = {row["job"]: row for row in report(store)["jobs"]}
    assert rows["1"]["reason"] == "budget: $0.0144 needed, $0.0056 left"
    capped, _ = policy(Queue([job(1), job(2)]), ({}, 0.0))
    assert capped.pass_once().verdicts == {"wait": 2}


def test_no_money_known_yet_means_no_burst_and_slurm_trouble_means_no_pass() -> None:
    q = Queue([job(1)])
    p, store = policy(q, None)
    r = p.pass_once()
    assert r.steered == 0 and r.error == "waiting for the ledger's first budget pass"

    class Down(Queue):
        def pending_jobs(self) -> list[QueuedJob]:
            raise SchedulerError("squeue: Unable to contact slurm controller")

    p, store = policy(Down([]))
    r = p.pass_once()
    assert (
        r.error.startswith("reading the queue: squeue: Unable")
        and report(store)["error"] == r.error
    )


@pytest.mark.parametrize("n", [1000])
def test_a_pass_makes_one_read_and_one_update_per_partition_list(n: int) -> None:
    q = Queue([job(i, cpus=1 + i % 2) for i in range(n)])
    p, store = policy(q)
    r = p.pass_once()
    assert q.reads == 1 and len(q.calls) == 1 and r.steered == n
    assert len(report(store)["jobs"]) == n


def test_a_protected_group_is_skipped_for_the_next_cheapest() -> None:
    q = Queue([job(1)])
    p, store = policy(q)
    store.protect_group("cpu", T0 + 600, "2 failed launches in a row")
    r = p.pass_once()
    assert r.steered == 0 and r.verdicts == {"never": 1}  # no other group fits a CPU job
    assert report(store)["jobs"][0]["reason"] == "no node group fits the job"
    store.unprotect_group("cpu")
    p.clock.advance(10)  # type: ignore[attr-defined]
    assert p.pass_once().steered == 1


# -- staged data: its move is part of the decision ----------------------------------------


def _staged(store: MemoryStore, job_id: int, size: int, state: str = "deferred") -> None:
    """Job ``job_id`` asked for ``size`` bytes of data, cleared to leave (or stored)."""
    store.add_stage(StageRecord(
        owner=JobOwner(job_id, "games", 5, 60, "physics", "", ("onprem",)), burst_only=False,
        stages=[{"src": "/d", "dst": "d"}], state=state,
        datasets=[{"dst": "d", "bytes": size}],
    ))  # fmt: skip


def test_a_job_whose_data_takes_longer_to_move_than_its_wait_stays_home() -> None:
    """The lab's link: 1,000 Mbit/s. 1 TiB takes 2.4 h to send: more than the 2-h wait
    job 1 would save (its threshold adds the nodes paid for meanwhile); job 2's 10 GiB
    takes 86 s and it bursts; job 3's data is in the store already (only pulled)."""
    q = Queue([job(1), job(2), job(3), job(4)])
    p, store = policy(q)
    _staged(store, 1, 1 << 40)
    _staged(store, 2, 10 << 30)
    _staged(store, 3, 1 << 40, state="staged")
    r = p.pass_once()
    assert r.verdicts == {"burst": 3, "wait": 1}
    rows = {row["job"]: row for row in report(store)["jobs"]}
    assert rows["1"]["verdict"] == "wait"
    assert rows["1"]["reason"] == (
        "expected on-prem wait 2.0 h <= 2.7 h (with 2.4 h to move its data)"
    )
    assert rows["2"]["reason"] == (
        "expected on-prem wait 2.0 h > 11 min (with 86 s to move its data); cloud $0.0164"
    )
    assert "move its data" not in rows["3"]["reason"] and "move its data" not in rows["4"]["reason"]


def test_moving_a_jobs_data_is_paid_for_out_of_its_budget() -> None:
    """At the store's prices ($0.09/GB in, $0.02/GB a month stored, $0.01/GB pulled),
    100 GiB cost $12 to move: more than the $5 physics has left, while the same job
    without data ($0.0144) bursts. (A day's wait: past the $12's threshold of 12 h.)"""
    from dataclasses import replace

    prices = StorePrices(store="lab", upload_per_gb=0.09, storage_per_gb_month=0.02,
                         download_per_gb=0.01)  # fmt: skip
    settings = replace(policy_settings(CFG), data_prices=prices)
    q = Queue([job(1, start=T0 + 86400), job(2, start=T0 + 86400)])
    store = MemoryStore()
    p = BurstPolicy(settings, q, store, FakeClock(T0), cloud_groups(CFG),
                    lambda: ({"physics": 5.0}, None))  # fmt: skip
    _staged(store, 1, 100 << 30)
    r = p.pass_once()
    assert r.verdicts == {"burst": 1, "wait": 1}
    rows = {row["job"]: row for row in report(store)["jobs"]}
    assert rows["1"]["reason"].startswith("budget: $12.0"), rows["1"]
    assert rows["2"]["verdict"] == "burst"


def test_without_a_store_or_with_link_mbit_0_staged_data_is_not_counted(tmp_path: Path) -> None:
    at = "grant_seconds = 300"
    cfg = lab_config_in(tmp_path, "", [(at, f"{at}\nlink_mbit = 0")])
    settings = policy_settings(cfg)
    assert settings.data_mbit == 0
    q = Queue([job(1)])
    store = MemoryStore()
    p = BurstPolicy(settings, q, store, FakeClock(T0), cloud_groups(cfg), lambda: ({}, None))
    _staged(store, 1, 1 << 40)
    assert p.pass_once().verdicts == {"burst": 1}
    slow = lab_config_in(tmp_path, "", [(at, f"{at}\nbandwidth_mbit = 200")])
    assert policy_settings(slow).data_mbit == 200  # the push's own limit, lower, wins


def test_burst_share_gives_each_job_its_bar_at_its_first_estimate() -> None:
    """policy.burst_share 0.5: once 50 jobs have been seen, a job's wait_per_dollar is the
    bar half of them passed, fixed at its first decision and forgotten when it leaves."""
    from dataclasses import replace

    cfg = replace(CFG, policy=replace(CFG.policy, burst_share=0.5, wait_factor=0.0,
                                      min_wait=0.0))  # fmt: skip
    # 60 one-CPU jobs of 10 min ($0.085/h: $0.0144 each) expecting 1..60 s of wait
    q = Queue([job(i, start=T0 + i) for i in range(1, 61)])
    p = BurstPolicy(policy_settings(cfg), q, MemoryStore(), FakeClock(T0), cloud_groups(cfg),
                    lambda: ({}, None))  # fmt: skip
    p.pass_once()
    own = p._own
    assert len(own) == 60
    early = {own[str(i)].wait_per_dollar for i in range(1, 51)}
    assert early == {3600.0}  # fewer than 50 seen before them: the configured value
    late = [own[str(i)].wait_per_dollar for i in range(51, 61)]
    assert all(w < 3600.0 for w in late) and late == sorted(late)  # the bar rises with waits
    del q.jobs["1"]  # it started on-prem; the late ones burst (their partitions changed)
    p.clock.advance(10)  # type: ignore[attr-defined]
    p.pass_once()
    assert set(p._own) == {str(i) for i in range(2, 51)}
