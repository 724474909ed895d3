"""The PrologSlurmctld in the lab: batch jobs start when their cloud nodes register, a node
that fails requeues its job (which then runs on a fresh instance), and 50 jobs waiting in
the prolog leave slurmctld free for ``scontrol reconfigure`` and on-prem work."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

from slurm_burst_lab.service import Lab

from slurm_burst.adapters.state.store import Store
from slurm_burst.config import Config
from tests.conftest import LAB_CONFIG, invoke, wait
from tests.lab.conftest import job_fields, sh

HOOK_LOG = Path("/var/lib/slurm-burst-lab/log/hooks.log")
CTLD_LOG = Path("/var/lib/slurm-burst-lab/log/slurmctld.log")


def state(env: dict[str, str], job: int) -> str:
    return job_fields(env, job).get("JobState", "GONE")


def submit(env: dict[str, str], *args: str) -> int:
    out = sh(env, "sbatch", "--parsable", "-t", "5", "-o", "/dev/null", *args)
    return int(out.strip().split(";")[0])


def cold(env: dict[str, str], nodes: str) -> bool:
    out = sh(env, "sinfo", "-h", "-N", "-n", nodes, "-o", "%T")
    return bool(out.split()) and all(s == "idle~" for s in out.split())


def log_lines(path: Path, pattern: str) -> list[str]:
    return [
        line for line in path.read_text(errors="replace").splitlines() if re.search(pattern, line)
    ]


def test_a_batch_job_starts_when_its_cloud_node_registers(
    lab: Lab, env: dict[str, str], store: Store
) -> None:
    """Not at Slurm's next 30-second check: slurmctld says the prolog ended the job's
    configuration, and the prolog said it saw the node registered."""
    node = "burst-cpu-30"
    wait(lambda: cold(env, node), 120, f"{node} powered down")
    job = submit(env, "-p", "burst-cpu", "-w", node, "--wrap", "sleep 1")
    wait(lambda: state(env, job) in ("RUNNING", "COMPLETING", "COMPLETED"), 90, f"job {job} runs")
    assert log_lines(CTLD_LOG, rf"prolog_running_decr: Configuration for JobId={job} is complete")
    assert log_lines(HOOK_LOG, rf"prolog\.ready job={job} count=1 ")
    rec = store.node(node)
    assert rec is not None and rec.registered_at >= rec.state_since > 0


def test_a_node_failing_in_bootstrap_requeues_its_job_which_then_runs(
    lab: Lab,
    lab_config: Config,
    env: dict[str, str],
    store: Store,
    faults: Any,
) -> None:
    """The first instance has a GPU missing: its GPU check fails it in bootstrap
    (GpuUnhealthy, seconds after it boots), Slurm requeues the job (the prolog's failure
    adds nothing worse: the job is pending with BeginTime, not held), and after Slurm's
    requeue delay it runs on a new instance."""
    from slurm_burst_lab.simnvml import FAULTS

    node = "burst-gpu-8"  # of its own: the GPU fault matrix uses 3-7, test_x_gpu 1
    wait(lambda: cold(env, node), 120, f"{node} powered down")
    faults([{"call": "create_node", "node": node, "times": 1, "gpu": FAULTS["gpu-missing"]}])
    job = submit(env, "-p", "burst-gpu", "-w", node, "--wrap", "hostname")
    first = wait(lambda: (store.node(node) or None) and store.node(node).instance_id, 60,  # type: ignore[union-attr]
                 "the first instance")  # fmt: skip
    wait(lambda: log_lines(HOOK_LOG, rf"prolog\.failed job={job} "), 150, "the prolog to fail")
    failed = log_lines(HOOK_LOG, rf"prolog\.failed job={job} ")[0]
    code = store.node(node).error  # type: ignore[union-attr]
    assert f"node {node} " in failed and code == "GpuUnhealthy" and code in failed
    wait(lambda: state(env, job) == "PENDING", 30, f"job {job} requeued")
    info = job_fields(env, job)
    # not held; 26.05 says Cleaning while the requeued job's first run is cleaned up
    assert info["Reason"] in ("BeginTime", "None", "Priority", "Resources", "Cleaning"), info
    assert info.get("Restarts") == "1", info
    wait(lambda: state(env, job) == "COMPLETED", 300, f"job {job} to run again")
    second = store.node(node).instance_id  # type: ignore[union-attr]
    assert second and second != first


def test_fifty_jobs_waiting_in_the_prolog_leave_slurmctld_free(
    lab: Lab, env: dict[str, str], store: Store, faults: Any
) -> None:
    """50 batch jobs wait for 25 nodes whose launch takes 15 s; meanwhile ``scontrol
    reconfigure`` returns, and an on-prem job runs at once. The jobs are then cancelled
    and their nodes powered down by force, as an admin would (not left to join and idle
    for SuspendTime: a minute of the run)."""
    nodes = [f"burst-cpu-{i}" for i in range(4, 29)]
    hostlist = "burst-cpu-[4-28]"
    wait(lambda: cold(env, hostlist), 180, f"{hostlist} powered down")
    faults([{"call": "create_node", "node": n, "delay_after": 15} for n in nodes])
    t0 = time.monotonic()
    jobs = [submit(env, "-p", "burst-cpu", "-n1", "-w", n, "--wrap", "true")
            for n in nodes for _ in range(2)]  # fmt: skip
    try:
        wait(lambda: sum(state(env, j) == "CONFIGURING" for j in jobs) == 50, 20,
             "50 jobs configuring")  # fmt: skip
        wait(lambda: len(prologs_waiting(jobs)) == 50, 20, "50 prologs waiting")
        waiting = time.monotonic() - t0
        t = time.monotonic()
        sh(env, "scontrol", "reconfigure")
        reconfigure = time.monotonic() - t
        t = time.monotonic()
        out = subprocess.run(["srun", "-p", "onprem", "-N1", "-t", "1", "hostname"],
                             env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
        onprem = time.monotonic() - t
        assert out.returncode == 0 and out.stdout.strip() == "onprem-1", out
        states = [state(env, j) for j in jobs]
        print(f"\n50 jobs waiting {waiting:.1f} s after the first sbatch; reconfigure "
              f"{reconfigure:.2f} s, on-prem srun {onprem:.2f} s meanwhile")  # fmt: skip
        assert states.count("CONFIGURING") == 50, states
    finally:
        sh(env, "scancel", *map(str, jobs), check=False)
        _release(env, store, nodes, hostlist)


def _release(env: dict[str, str], store: Store, nodes: list[str], hostlist: str) -> None:
    """Leave the 25 nodes to the next tests, powered down and the cpu group enabled.
    Best effort, not what this test asserts: in CI some of these nodes have failed
    (InstanceVanished while booting, under investigation), and a group protected by
    failures keeps its nodes drained until enabled."""
    sh(env, "scontrol", "update", f"NodeName={hostlist}", "State=POWER_DOWN_FORCE",
       check=False)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not not_live(store, nodes):
        time.sleep(1)
    invoke(["--config", str(LAB_CONFIG), "group", "enable", "cpu"], expect=None)
    while time.monotonic() < deadline and not cold(env, hostlist):
        time.sleep(1)


def prologs_waiting(jobs: list[int]) -> set[int]:
    waiting = {int(m) for m in re.findall(r"prolog\.waiting job=(\d+)", HOOK_LOG.read_text())}
    return waiting & set(jobs)


def not_live(store: Store, nodes: list[str]) -> bool:
    recs = store.nodes_named(nodes)
    return all(str(recs[n].state) == "terminated" for n in nodes if n in recs)
