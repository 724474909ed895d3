"""The burst policy service on a queue held in memory: which jobs it looks at, what it
sends (one update per partition list), what it records, and what it leaves to Slurm.
The lab's config (the policy's groups: burst-cpu, 2 CPUs at $0.085/h, and burst-gpu,
2 GPUs at $2.50/h, each partition MaxTime 1 h, not the cheaper EC2 group; medgen on-prem
only)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from slurm_burst.config.load import load_config
from slurm_burst.core.slurm import QueuedJob, SchedulerError
from slurm_burst.services.burstpolicy import BurstPolicy
from slurm_burst.services.simulation import cloud_groups
from slurm_burst.wiring import policy_settings
from tests.conftest import LAB_CONFIG
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
    doc = store.meta_get("policy")
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
    assert store.meta_get("policy")["complaints"] == r.complaints


def test_budgets_and_the_cap_hold_jobs_back_in_priority_order() -> None:
    # 600 s + 10 s boot at $0.085/h (burst-cpu): $0.0144 a job
    q = Queue([job(1, priority=1), job(2, priority=9), job(3, account="chemistry")])
    p, store = policy(q, ({"physics": 0.02}, None))
    r = p.pass_once()
    assert r.verdicts == {"burst": 2, "wait": 1}
    rows = {row["job"]: row for row in store.meta_get("policy")["jobs"]}
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
        and store.meta_get("policy")["error"] == r.error
    )


@pytest.mark.parametrize("n", [1000])
def test_a_pass_makes_one_read_and_one_update_per_partition_list(n: int) -> None:
    q = Queue([job(i, cpus=1 + i % 2) for i in range(n)])
    p, store = policy(q)
    r = p.pass_once()
    assert q.reads == 1 and len(q.calls) == 1 and r.steered == n
    assert len(store.meta_get("policy")["jobs"]) == n


def test_a_protected_group_is_skipped_for_the_next_cheapest() -> None:
    q = Queue([job(1)])
    p, store = policy(q)
    store.protect_group("cpu", T0 + 600, "2 failed launches in a row")
    r = p.pass_once()
    assert r.steered == 0 and r.verdicts == {"never": 1}  # no other group fits a CPU job
    assert store.meta_get("policy")["jobs"][0]["reason"] == "no node group fits the job"
    store.unprotect_group("cpu")
    p.clock.advance(10)  # type: ignore[attr-defined]
    assert p.pass_once().steered == 1
