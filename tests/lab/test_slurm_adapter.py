"""The Slurm CLI adapter against the lab's real slurmctld (22.05)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest
from slurm_burst_lab.service import Lab

from slurm_burst.adapters.proc import Result, run
from slurm_burst.adapters.slurm.cli import SlurmCli, SlurmError


@pytest.fixture()
def slurm(lab: Lab) -> SlurmCli:
    return lab.slurm


def test_nodes(slurm: SlurmCli, lab: Lab) -> None:
    nodes = {n.name: n for n in slurm.nodes()}
    gpu = nodes["burst-gpu-1"]
    assert gpu.is_cloud and gpu.powered_down and gpu.sinfo_state == "idle~"
    assert gpu.gres == "gpu:simgpu:2" and gpu.partitions == ("burst-gpu",)
    assert gpu.features == ("cloud", "gpu") and gpu.cpus == 2 and gpu.real_memory_mb == 1000
    onprem = nodes["onprem-1"]
    assert onprem.state == "idle" and onprem.addr == "10.250.0.2" and not onprem.is_cloud
    assert onprem.boot_time is not None


def test_partitions(slurm: SlurmCli) -> None:
    parts = {p.name: p for p in slurm.partitions()}
    assert (
        parts["burst-cpu"].nodes == "burst-cpu-[1-32]" and parts["burst-cpu"].suspend_time == "30"
    )
    assert parts["onprem"].default and not parts["burst-gpu"].default


def test_jobs(slurm: SlurmCli, lab: Lab) -> None:
    env = lab.env()
    out = run(
        [
            "sbatch",
            "--parsable",
            "-p",
            "onprem",
            "-t",
            "5",
            "-J",
            "adapter-test",
            # the node's own view of the filesystem: a VM's /tmp is its own, so the test's
            # working directory (a checkout under /tmp, say) may not exist there
            "-D",
            lab.lab.shared_dir,
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 30",
        ],
        env=env,
    ).stdout
    job_id = int(out.strip().split(";")[0])
    try:
        deadline = time.monotonic() + 15
        while True:
            job = next(j for j in slurm.jobs() if j.job_id == job_id)
            if job.state == "RUNNING" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert job.state == "RUNNING" and job.nodes == "onprem-1"
        assert job.name == "adapter-test" and job.partition == "onprem" and job.user == "root"
        assert job.time_limit_min == 5 and job.tres_requested["cpu"] == "1"
        assert job.submit_time is not None and job.start_time is not None
    finally:
        run(["scancel", str(job_id)], env=env)


def test_update_reason_is_data_not_shell(slurm: SlurmCli) -> None:
    reason = """it's "quoted"; $(touch /tmp/pwned) `id` & more"""
    slurm.update_nodes(["burst-gpu-2"], state="drain", reason=reason)
    try:
        node = next(n for n in slurm.nodes() if n.name == "burst-gpu-2")
        assert node.reason == reason and "DRAIN" in node.flags
    finally:
        slurm.update_nodes(["burst-gpu-2"], state="resume")


def test_batches_and_typed_errors(lab: Lab) -> None:
    calls: list[Sequence[str]] = []

    def counting(argv: Sequence[str], **kw: Any) -> Result:
        calls.append(argv)
        return run(argv, **kw)

    slurm = SlurmCli(slurm_conf=str(lab.slurm_conf), batch=4, runner=counting)
    names = [f"burst-cpu-{i}" for i in range(1, 5)] + ["burst-gpu-1", "burst-gpu-2"]
    slurm.update_nodes(names, state="drain", reason="batch test")
    try:
        updates = [c for c in calls if "update" in c]
        assert [c[2] for c in updates] == ["nodename=burst-cpu-[1-4]", "nodename=burst-gpu-[1-2]"]
        assert all("DRAIN" in n.flags for n in slurm.nodes() if n.name in names)
    finally:
        slurm.update_nodes(names, state="resume")
    with pytest.raises(SlurmError, match="Invalid node name"):
        slurm.update_nodes(["no-such-node"], state="drain", reason="x")
    with pytest.raises(ValueError):
        slurm.update_nodes(["a1", "a2"], addrs=["10.0.0.1"])
