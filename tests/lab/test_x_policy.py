"""The burst policy in the lab, against the real slurmctld: a pending on-prem job that
would wait longer than its time limit is given a burst partition and runs in the cloud;
one whose wait is short enough stays on-prem; an on-prem-only account's job never runs
on a burst node, whatever partitions it asks for (Slurm's DenyAccounts, from ``conf
render``), and the policy says so; an account without budget left is not sent.

The lab's on-prem partition is one node of 2 CPUs; a 2-CPU job holds it for 30 minutes,
so Slurm's backfill expects the next on-prem job to start in 30 minutes. The lab's
policy sends jobs to its CPU and GPU groups only (``policy.groups``): the EC2 group's
VMs run the host's slurmd, which the other releases' slurmctld refuses."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from slurm_burst.adapters.state.store import Store
from tests.conftest import LAB_CONFIG, invoke, wait
from tests.lab.conftest import job_fields, sh
from tests.lab.test_x_prolog import state, submit

SB = ["--config", str(LAB_CONFIG)]


@pytest.fixture
def onprem_busy(env: dict[str, str]) -> Iterator[int]:
    """The on-prem node held for 30 minutes by a 2-CPU job; everything cancelled after."""
    hold = submit(env, "-p", "onprem", "-n2", "-t", "30", "--wrap", "sleep 1800")
    wait(lambda: state(env, hold) == "RUNNING", 30, f"job {hold} on onprem-1")
    yield hold
    sh(env, "scancel", "-u", "root", check=False)


def decision(store: Store, job: int) -> dict[str, Any] | None:
    doc = store.policy_report() or {}
    return next((r for r in doc.get("jobs", []) if r["job"] == str(job)), None)


def sacct(env: dict[str, str], job: int, fields: str) -> list[str]:
    """The job's accounting record once slurmdbd holds it whole: slurmctld sends it
    after the job ends, so a job COMPLETED in ``scontrol`` may not be in ``sacct`` yet
    on a loaded machine."""
    got: list[str] = []

    def recorded() -> bool:
        nonlocal got
        out = sh(env, "sacct", "-X", "-n", "-P", "-j", str(job), "-o", fields, check=False)
        got = out.strip().split("|") if out.strip() else []
        return bool(got) and all(got)

    wait(recorded, 60, f"job {job} in sacct", every=1)
    return got


def test_a_long_wait_bursts_and_a_short_one_stays_on_prem(
    env: dict[str, str], store: Store, onprem_busy: int
) -> None:
    long = submit(env, "-p", "onprem", "-n1", "-t", "5", "--wrap", "hostname")  # 30 min > 5
    short = submit(env, "-p", "onprem", "-n1", "-t", "45", "--wrap", "hostname")  # 30 <= 45
    wait(lambda: state(env, long) == "COMPLETED", 120, f"job {long} to run in the cloud")
    part, nodes = sacct(env, long, "Partition,NodeList")
    # the cheapest of the policy's groups (policy.groups: not EC2) that fits one CPU
    assert part == "burst-cpu" and nodes.startswith("burst-cpu-"), (part, nodes)
    shown = sh(env, "scontrol", "show", "job", str(long))  # AdminComment: its own line
    said = re.search(r"^\s*AdminComment=(.*)$", shown, re.M)
    assert said and said.group(1).startswith("slurm-burst: sent to burst-cpu "), shown
    said_out = invoke([*SB, "events", "--json"]).stdout  # JSON lines
    events = [json.loads(line) for line in said_out.splitlines()]
    sent = [e for e in events if e["event"] == "job.burst" and f"job {long}:" in e["detail"]]
    assert sent and "expected on-prem wait" in sent[0]["detail"], events[-5:]
    wait(lambda: (decision(store, short) or {}).get("reason", "").startswith("expected"), 60,
         f"job {short} decided with Slurm's estimate")  # fmt: skip
    d = decision(store, short)
    assert d is not None and d["verdict"] == "wait", d
    assert state(env, short) == "PENDING" and job_fields(env, short)["Partition"] == "onprem"
    shown = json.loads(invoke([*SB, "jobs", "--json", "--verdict", "wait"]).stdout)
    assert str(short) in [r["job"] for r in shown["jobs"]], shown
    assert shown["last_pass"]["slurm_calls"] >= 1 and not shown["last_pass"]["error"], shown


def test_an_onprem_only_account_never_runs_on_a_burst_node(
    env: dict[str, str], store: Store, onprem_busy: int
) -> None:
    direct = subprocess.run(
        ["sbatch", "-A", "medgen", "-p", "burst-cpu", "-t", "5", "--wrap", "hostname"],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    # EnforcePartLimits=ANY (conf render): refused at submission, not left pending
    assert direct.returncode != 0 and "account/partition" in direct.stderr, direct.stderr
    both = submit(env, "-A", "medgen", "-p", "onprem,burst-cpu", "-n1", "--wrap", "hostname")
    plain = submit(env, "-A", "medgen", "-p", "onprem", "-n1", "--wrap", "hostname")
    wait(lambda: (decision(store, plain) or {}).get("verdict") == "never", 60,
         f"job {plain} decided")  # fmt: skip
    assert decision(store, plain)["reason"] == "on-prem only"  # type: ignore[index]
    # a physics job asking for the same partitions starts in the cloud at once...
    other = submit(env, "-A", "physics", "-p", "onprem,burst-cpu", "-n1", "--wrap", "hostname")
    wait(lambda: state(env, other) == "COMPLETED", 120, f"job {other} in the cloud")
    # ...while the medgen jobs are still pending on-prem
    for job in (both, plain):
        assert state(env, job) == "PENDING", job_fields(env, job)
    sh(env, "scancel", str(onprem_busy))
    for job in (both, plain):
        wait(lambda j=job: state(env, j) == "COMPLETED", 120, f"job {job} on-prem")  # type: ignore[misc]
        assert sacct(env, job, "NodeList") == ["onprem-1"]


def test_an_account_over_budget_is_not_sent(
    env: dict[str, str], store: Store, onprem_busy: int
) -> None:
    """Over budget, Slurm holds the account's jobs (GrpTRESMins, set by ``budget set``) and
    the policy, which also sees no money left, sends none of them; ``slurm-burst jobs``
    says why. A job of another account, submitted after it, is sent."""
    invoke([*SB, "budget", "set", "chemistry", "0"])
    try:
        job = submit(env, "-A", "chemistry", "-p", "onprem", "-n1", "--wrap", "hostname")
        other = submit(env, "-A", "physics", "-p", "onprem", "-n1", "--wrap", "hostname")
        wait(lambda: state(env, other) == "COMPLETED", 120, f"job {other} in the cloud")
        d = decision(store, job)
        assert d is not None and d["verdict"] == "wait", d
        assert d["reason"].startswith(("budget:", "Slurm holds it: AssocGrpBilling")), d
        assert state(env, job) == "PENDING" and job_fields(env, job)["Partition"] == "onprem"
    finally:
        invoke([*SB, "budget", "set", "chemistry", "1000"])
