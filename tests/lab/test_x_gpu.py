"""GPU nodes in the lab: the simulated NVML (``lab/simnvml``) behind the real
nvidia-ml-py, in the GPU VMs the daemon launches.

- A healthy GPU node passes its check before slurmd starts, joins, and runs a
  ``--gres=gpu:1`` job; the utilization written into the VM's simulated GPUs shows up
  in ``/metrics`` (per group) and, for the GPU index Slurm gave the job, in the
  ledger's ``gpu_usage`` rows for that job.
- The same check is Slurm's HealthCheckProgram on the joined node: a GPU that goes bad
  (XID 79) under a running job drains the node with ``(Code:GpuUnhealthy)`` in its
  reason, the job completes; once the node is idle, the reconcile loop releases its
  instance and the node is back in service, powered down.

The fault cases (a node born with a bad GPU is kept out and its job runs on a new
instance) are in test_y_faults.py, with the rest of the fault matrix.
"""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from slurm_burst_lab.service import Lab
from sqlalchemy import select

from slurm_burst.adapters.ledger.models import GpuUsageRow
from slurm_burst.adapters.state.store import Store
from slurm_burst.config import Config
from slurm_burst.core.slurm import parse_job_gpus
from slurm_burst.wiring.ledger import ledger
from tests.conftest import wait
from tests.lab.conftest import GPU_BUSY_JOB, sh

NODE = "burst-gpu-1"


def vm_of(cloud: Any, node: str) -> Any:
    for n in cloud.list_nodes():
        if n.state == "running" and n.extra.get("tags", {}).get("slurm-burst-node") == node:
            return n
    return None


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def scrape(cfg: Config) -> str:
    url = f"http://{cfg.daemon.metrics_listen}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:  # the lab's own daemon
        return str(r.read().decode())


def test_utilization_reaches_the_metrics_and_the_jobs_ledger_rows(
    lab: Lab, lab_config: Config, env: dict[str, str], cloud: Any
) -> None:
    job = sh(env, "sbatch", "--parsable", "-p", "burst-gpu", "-w", NODE, "--gres=gpu:1",
             "-t", "5", "-o", "/dev/null", "--wrap", "sleep 25").split(";")[0].strip()  # fmt: skip
    try:
        wait(lambda: "RUNNING" in sh(env, "squeue", "-h", "-j", job, "-o", "%T"), 120,
             f"job {job} running on {NODE}")  # fmt: skip
        (held,) = parse_job_gpus(sh(env, "scontrol", "-d", "-o", "show", "job", job)).values()
        assert len(held) == 1
        other = 1 - held[0]
        vm = vm_of(cloud, NODE)
        cloud.ex_set_gpu_state(vm, {f"gpu{held[0]}.util": 90, f"gpu{other}.util": 10,
                                    f"gpu{held[0]}.power_mw": 350000})  # fmt: skip

        def sampled() -> bool:
            text = scrape(lab_config)
            return metric(text, 'slurm_burst_gpu_utilization_ratio{group="gpu"}') == 0.5

        wait(sampled, 30, "the group's utilization (90 % and 10 %) in /metrics")
        text = scrape(lab_config)
        assert metric(text, 'slurm_burst_gpus_sampled{group="gpu"}') == 2
        assert metric(text, 'slurm_burst_gpu_power_watts{group="gpu"}') == 410.0  # 350 + 60
        wait(lambda: "COMPLETED" in sh(env, "sacct", "-n", "-X", "-j", job, "-o", "State"),
             60, f"job {job} completed")  # fmt: skip
    finally:
        sh(env, "scancel", job, check=False)
    led = ledger(lab_config)

    def recorded() -> list[GpuUsageRow]:
        with led.engine.connect() as conn:
            q = select(GpuUsageRow).where(GpuUsageRow.job_id == int(job))
            return list(conn.execute(q).all())  # type: ignore[arg-type]

    rows = wait(recorded, 30, f"job {job}'s GPU usage in the ledger")
    assert all(r.node == NODE and r.gpus == 1 for r in rows)
    gs = sum(r.gpu_seconds for r in rows)
    busy = sum(r.busy_gpu_seconds for r in rows)
    # the samples before the utilization was written read 0 %: at most a few of them
    assert gs > 10 and 0.5 < busy / gs < 0.901, (gs, busy)  # rows are rounded to 1 ms
    GPU_BUSY_JOB["job"] = job


def test_a_gpu_going_bad_on_a_joined_node_drains_it_and_the_instance_goes(
    lab: Lab, lab_config: Config, env: dict[str, str], cloud: Any, store: Store
) -> None:
    """slurmd runs the HealthCheckProgram every few seconds in the lab; the program is
    the GPU check in its quick mode, and it drains the node itself while a job runs
    there. Once the job is done (drained and idle), the reconcile loop lets the
    instance go and powers the node down, so that its next resume gets another one."""
    assert lab_config.gpu.health_check_program
    job = sh(env, "sbatch", "--parsable", "-p", "burst-gpu", "-w", NODE, "-t", "5",
             "-o", "/dev/null", "--wrap", "sleep 20").split(";")[0].strip()  # fmt: skip
    try:
        wait(lambda: "RUNNING" in sh(env, "squeue", "-h", "-j", job, "-o", "%T"), 120,
             f"job {job} running on {NODE}")  # fmt: skip
        cloud.ex_set_gpu_state(vm_of(cloud, NODE), {"gpu1.xid": 79})

        def drained() -> str:
            out = sh(env, "sinfo", "-h", "-n", NODE, "-o", "%T|%E")
            return out if "(Code:GpuUnhealthy)" in out and out.startswith("drain") else ""

        out = wait(drained, 3 * lab_config.gpu.health_check_interval + 30, f"{NODE} drained")
        assert out.startswith("draining|")  # the job still runs: drained, not killed
        assert "XID 79 on PCI:0000:11:00 in the kernel log" in out  # quick: no event wait
        wait(lambda: "COMPLETED" in sh(env, "sacct", "-n", "-X", "-j", job, "-o", "State"),
             60, f"job {job} completed on the draining node")  # fmt: skip
    finally:
        sh(env, "scancel", job, check=False)

    def released() -> bool:
        rec = store.node(NODE)
        return rec is not None and str(rec.state) == "terminated" and rec.error == "GpuUnhealthy"

    wait(released, 60, f"{NODE}'s instance released by the reconcile loop (GpuUnhealthy)")
    wait(lambda: sh(env, "sinfo", "-h", "-n", NODE, "-o", "%t").strip() == "idle~", 60,
         f"{NODE} powered down and back in service")  # fmt: skip
    assert vm_of(cloud, NODE) is None


@pytest.fixture(autouse=True)
def _healthy_again(cloud: Any) -> Any:
    yield
    vm = vm_of(cloud, NODE)
    if vm is not None:
        cloud.ex_set_gpu_state(vm, {})
