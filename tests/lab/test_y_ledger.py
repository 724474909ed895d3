"""Chargeback and budgets in the lab: after the lab's burst jobs (test_x_burst's, or one
GPU job of its own when this module runs alone), against the real slurmdbd (MariaDB),
sacct and slurmctld.

- the jobs land in the ledger from sacct, every terminated instance is split,
  ``ledger report --by job --format json`` shows the GPU job with its account,
  GPU-hours and cost, and ``--by account`` adds up to the provider cost to the
  micro-dollar (overhead included); a sampled GPU job has its GPU utilization and
  idle GPU cost, which the account report adds up;
- an account set over budget: its next burst job pends with Slurm's own reason
  (AssocGrpBillingMinutes) and no instance is created, while another account's
  job still bursts.
"""

from __future__ import annotations

import json
import subprocess
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from slurm_burst_lab.service import Lab

from slurm_burst.config import Config
from slurm_burst.core.slurm import records_instances
from slurm_burst.wiring.clouds import cloud_driver
from slurm_burst.wiring.ledger import ledger
from tests.conftest import LAB_CONFIG, invoke, wait
from tests.lab.conftest import GPU_BUSY_JOB

SB = ["--config", str(LAB_CONFIG)]


@pytest.fixture(scope="module")
def gpu_job(env: dict[str, str]) -> str:
    """A GPU burst job that has run: one of this lab session's (test_x_burst's), or one
    submitted now and waited for when the module runs alone."""
    ran = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-r", "burst-gpu", "-s", "CD", "-S", "2000-01-01",
         "-o", "JobID"],
        env=env, text=True, capture_output=True, timeout=30, check=True,
    ).stdout.split()  # fmt: skip
    if ran:
        return ran[0]
    job = subprocess.run(
        ["sbatch", "--parsable", "-p", "burst-gpu", "--gres=gpu:1", "-t", "5", "-o", "/dev/null",
         "--wrap", "hostname"],
        env=env, text=True, capture_output=True, timeout=30, check=True,
    ).stdout.strip()  # fmt: skip

    def ended() -> str:  # its final state in sacct, '' until it has one
        state = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"],
            env=env, text=True, capture_output=True, timeout=30, check=False,
        ).stdout.strip()  # fmt: skip
        return "" if state in ("", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING") else state

    state = wait(ended, 240, f"GPU burst job {job}", every=2)
    assert state == "COMPLETED", state
    return job


def _report(by: str) -> dict[str, Any]:
    r = invoke(
        [
            *SB,
            "ledger",
            "report",
            "--by",
            by,
            "--from",
            "2000-01-01",
            "--to",
            "2100-01-01",
            "--format",
            "json",
        ]
    )
    return dict(json.loads(r.stdout))


def test_report_after_the_burst_jobs(lab: Lab, lab_config: Config, gpu_job: str) -> None:
    led = ledger(lab_config)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the daemon ingests and splits every 5 s
        instances = led.instances()
        closed = [i for i in instances if i["terminated"]]
        pending = led.closed_unallocated(led.ingest_cursor() or closed[0]["terminated"])
        if closed and len(closed) == len(instances) and not pending:
            by_account = _report("account")
            if by_account["total"]["total_micros"] == sum(i["cost_micros"] for i in closed):
                break
        invoke([*SB, "ledger", "sync"])
        time.sleep(2)
    else:
        open_ = [i["instance_id"] for i in led.instances() if not i["terminated"]]
        pytest.fail(
            f"not settled: open instances {open_}, unallocated "
            f"{led.closed_unallocated(led.ingest_cursor() or datetime.now(UTC))}, report total "
            f"{_report('account')['total']['total_micros']} vs provider "
            f"{sum(i['cost_micros'] or 0 for i in led.instances())}"
        )
    provider_total = sum(i["cost_micros"] for i in instances)
    assert provider_total > 0
    assert sum(r["total_micros"] for r in by_account["rows"]) == provider_total  # to the cent
    by_job = _report("job")
    gpu_jobs = [r for r in by_job["rows"] if r["partition"] == "burst-gpu" and r["job"].isdigit()]
    assert gpu_jobs, by_job
    job = gpu_jobs[0]
    assert job["account"] == "physics"  # root's default account in the lab
    assert job["gpu_hours"] > 0 and job["total"] > 0 and job["state"]
    assert sum(r["total_micros"] for r in by_job["rows"]) == provider_total
    assert by_account["total"]["overhead"] > 0  # boot and idle before suspend are shown
    # a sampled GPU job has its GPU use and idle GPU cost; test_x_gpu's (when it ran in
    # this session) kept its GPU 90 % busy (0 % before that was set)
    sampled = [r for r in gpu_jobs if r["gpu_util"] is not None]
    for r in sampled:
        assert r["idle_gpu_micros"] == round(r["allocated_micros"] * (1 - r["gpu_util"]))
    if GPU_BUSY_JOB:
        busy = [r for r in sampled if r["job"] == GPU_BUSY_JOB["job"]]
        assert busy and busy[0]["gpu_util"] > 0.5, gpu_jobs
    idle = sum(r["idle_gpu_micros"] for r in by_job["rows"])
    assert (idle > 0) == any(r["gpu_util"] < 1 for r in sampled)
    # rounded per charge line by account, per job here: at most a micro-dollar each
    assert abs(sum(r["idle_gpu_micros"] for r in by_account["rows"]) - idle) <= len(sampled)
    gpu = [i for i in instances if i["partition"] == "burst-gpu"]
    assert gpu and all(i["price_source"] == "rates.gpu1-2026" for i in gpu)
    assert all(i["price_per_hour"] == pytest.approx(2.80) for i in gpu)


def test_slurm_accounts_each_burst_instance_as_the_ledger_does(
    lab: Lab, lab_config: Config, env: dict[str, str], gpu_job: str
) -> None:
    """23.11 and newer: each burst node's slurmd named its instance (``--instance-id``,
    ``--instance-type``), so ``sacctmgr show instance`` lists what the ledger holds:
    every instance Slurm recorded is the ledger's, on the same node and of the same
    size, the GPU job's among them. (22.05 has no instance accounting: the same facts
    go in the node's comment, tests/unit/test_instance_facts.py.)"""
    release = lab.running_release() or ""
    if not release or not records_instances(release):
        pytest.skip(f"Slurm {release} has no instance accounting (23.11+)")
    ran_on = subprocess.run(["sacct", "-n", "-X", "-P", "-j", gpu_job, "-o", "NodeList"],
                            env=env, text=True, capture_output=True, timeout=30,
                            check=True).stdout.split()  # fmt: skip
    ours = {i["instance_id"]: i for i in ledger(lab_config).instances()}

    def listed() -> dict[str, tuple[str, str]]:
        out = subprocess.run(
            ["sacctmgr", "-n", "-P", "show", "instance", "format=NodeName,InstanceId,InstanceType"],
            env=env, text=True, capture_output=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        rows = [line.split("|") for line in out.splitlines() if line.count("|") == 2]
        found = {iid: (node, kind) for node, iid, kind in rows if iid}  # nodes' other records
        return found if any(node in ran_on for node, _ in found.values()) else {}

    slurm = wait(listed, 60, "the GPU job's instance in sacctmgr show instance")
    for iid, (node, kind) in slurm.items():
        assert iid in ours, (iid, node, sorted(ours))
        assert (ours[iid]["node"], ours[iid]["size"]) == (node, kind), (iid, ours[iid])


def _squeue(env: dict[str, str], job: str) -> tuple[str, str]:
    out = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T|%r"],
        env=env,
        text=True,
        capture_output=True,
        timeout=10,
    ).stdout.strip()
    state, _, reason = out.partition("|")
    return state, reason


def _sbatch(env: dict[str, str], account: str) -> str:
    return subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-p",
            "burst-cpu",
            "-A",
            account,
            "-t",
            "10",
            "--wrap",
            "hostname",
        ],
        env=env,
        text=True,
        capture_output=True,
        check=True,
        timeout=10,
    ).stdout.strip()


def test_over_budget_account_pends_and_no_instance_is_created(
    lab: Lab, lab_config: Config, env: dict[str, str]
) -> None:
    cloud = cloud_driver(lab_config.providers["lab"])
    r = invoke([*SB, "budget", "set", "physics", "0"])
    assert "over budget" in r.stdout and "GrpTRESMins=billing=" in r.stdout
    invoke([*SB, "budget", "set", "chemistry", "1000"])
    before = {n.id for n in cloud.list_nodes()}
    blocked = _sbatch(env, "physics")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _squeue(env, blocked)[1] != "AssocGrpBillingMinutes":
            time.sleep(0.5)
        assert _squeue(env, blocked) == ("PENDING", "AssocGrpBillingMinutes")
        allowed = _sbatch(env, "chemistry")
        deadline = time.monotonic() + 120
        started = ("RUNNING", "COMPLETING", "")  # "" = already finished and gone
        while time.monotonic() < deadline and _squeue(env, allowed)[0] not in started:
            time.sleep(0.5)
        assert _squeue(env, allowed)[0] in started
        assert _squeue(env, blocked) == ("PENDING", "AssocGrpBillingMinutes")
        new = [n for n in cloud.list_nodes() if n.id not in before]
        assert len(new) == 1, "only the chemistry job's node was created"
        shown = json.loads(invoke([*SB, "budget", "show", "--json"]).stdout)
        physics = next(b for b in shown if b["account"] == "physics")
        assert physics["over_budget"] and physics["slurm_limit"] is not None
    finally:
        subprocess.run(["scancel", blocked], env=env, timeout=10)
        r = invoke([*SB, "budget", "set", "physics", "1000"])  # leave the lab usable
        assert "money left" in r.stdout
