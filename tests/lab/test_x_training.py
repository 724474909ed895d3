"""A real distributed job across burst nodes (issue 53, its short form): four cloud nodes
of a group whose nodes tunnel to each other directly (burst-dir-[1-4]) run Debian's
OpenMPI ranks launched by Slurm (``srun --mpi=pmix`` on the releases whose packages ship
PMIx), their traffic over the WireGuard mesh (OpenMPI told to use the mesh's subnet);
an allreduce benchmark checks its sums from 8 B to 1 MiB, and the data-parallel
training loop (examples/training) ends with the same loss, bit for bit, as one process
on the controller. The job waits until each node's direct tunnels to the three others
are up before its ranks start; the hub carries next to nothing of the job's traffic."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from slurm_burst_lab.service import Lab

from slurm_burst.adapters.state.store import Store
from slurm_burst.config import Config
from slurm_burst.core.runtime import compare, mismatches
from slurm_burst.runtimeref import node_manifest_path, read_manifest
from tests.conftest import ROOT
from tests.lab.conftest import CLOUD_JOIN, RELEASE, user_env
from tests.lab.release import release
from tests.lab.test_x_burst import sbatch, wait_job
from tests.lab.test_x_mesh_direct import hub_bytes
from tests.lab.test_zy_demo import section

NODES = [f"burst-dir-{i}" for i in range(1, 5)]
STEPS = 40
PYTHON = "/usr/bin/python3"  # Debian's, with its mpi4py and numpy (the nodes' image too)
# OpenMPI over the mesh (the nodes' other interfaces reach nothing of each other's)
# (reachable=weighted: Open MPI 5's netlink check pairs a peer only with the interface
# the kernel routes it through, wg-burst-d for a direct peer, which has no IPv4 address)
# (and mpirun, 26.05's, allowed to run a job of root's, as the lab's test jobs are)
MPI_ENV = (
    "export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include={subnet} "
    "OMPI_MCA_oob_tcp_if_include={subnet} OMPI_MCA_reachable=weighted "
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
)
MPIRUN = "mpirun --bind-to none --map-by ppr:1:node"

# each node's direct tunnels to the three others up before the ranks start
TUNNELS = """#!/bin/bash
i=0
until [ "$(ip -o route show dev wg-burst-d | wc -l)" -ge 3 ]; do
    i=$((i + 1)); [ $i -gt 240 ] && { echo "$(hostname): no direct tunnels"; exit 3; }
    sleep 0.5
done
"""
SCRIPT = """#!/bin/bash
#SBATCH -N4
{mpi_env}
echo "phase start $(date +%s.%N)"
srun --ntasks-per-node=1 bash {shared}/tunnels.sh
echo "phase tunnels $(date +%s.%N)"
{launch} {python} {shared}/allreduce.py --json --max-bytes 1048576 --iters 5
echo "phase allreduce $(date +%s.%N)"
{launch} {python} {shared}/train.py --data {shared}/train-data.npz --steps {steps}
echo "phase train $(date +%s.%N)"
"""


def launcher() -> str:
    """How this release's packages launch MPI ranks: srun with PMIx where Slurm's
    packages ship it (22.05, 24.11); on 26.05, whose packages ship pmi2 only, Open
    MPI's mpirun inside the allocation (it starts its daemons with srun)."""
    if RELEASE == "26.05":
        return MPIRUN
    return "srun --mpi=pmix"


def test_mpi_ranks_on_four_cloud_nodes_reduce_and_train_as_one_process_would(
    lab: Lab, lab_config: Config, env: dict[str, str], store: Store
) -> None:
    launch = launcher()
    shared = lab.lab.shared_dir
    for name in ("train.py", "allreduce.py"):
        shutil.copy(ROOT / "examples" / "training" / name, Path(shared, name))
    data = Path(shared, "train-data.npz")
    alone = subprocess.run(
        [PYTHON, str(Path(shared, "train.py")), "--data", str(data), "--make-data",
         "4096,32,7", "--steps", str(STEPS)],
        env={"PATH": "/usr/bin:/bin", "OMPI_ALLOW_RUN_AS_ROOT": "1",
             "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self"},
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    want = alone.splitlines()[-1]
    assert want.startswith("final loss "), alone
    Path(shared, "tunnels.sh").write_text(TUNNELS)
    script = Path(shared, "mpi-training.sh")
    script.write_text(SCRIPT.format(mpi_env=MPI_ENV.format(subnet=lab_config.mesh.subnet),
                                    launch=launch, python=PYTHON, shared=shared,
                                    steps=STEPS))  # fmt: skip
    before = hub_bytes(lab_config)
    submitted = time.time()
    job_id = sbatch(env, shared, "-p", "burst-direct", "-t", "10", str(script))
    info = wait_job(env, job_id, timeout=300)
    ended = time.time()
    out = Path(shared, f"{job_id}.out").read_text(errors="replace")
    assert info["JobState"] == "COMPLETED", (info, out[-3000:])
    rows = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert [r["bytes"] for r in rows] == [8, 64, 512, 4096, 32768, 262144, 1 << 20], out
    assert all(r["ranks"] == 4 for r in rows), rows
    got = [x for x in out.splitlines() if x.startswith("final loss ")]
    assert got == [want], (got, want, out[-2000:])
    through_hub = hub_bytes(lab_config) - before
    moved = sum(r["bytes"] for r in rows) * 5 * 2  # each size's iterations, both ways at least
    phases = dict(x.split()[1:3] for x in out.splitlines() if x.startswith("phase "))
    last = submitted
    took = {}
    for name, at in phases.items():  # seconds each phase took (start: sbatch to running)
        took[name] = f"{float(at) - last:.1f}"
        last = float(at)
    CLOUD_JOIN["mpi on 4 cloud nodes"] = {
        **took,
        "done_s": f"{ended - last:.1f}",
        "launch": launch,
        "busbw_1MiB_MBps": f"{rows[-1]['busbw_MBps']:.1f}",
        "hub_bytes": str(through_hub),
    }
    assert through_hub < moved, (through_hub, moved)  # the ranks talk directly
    # each node was checked against the on-prem runtime (captured at lab up) and passed
    reference, _ = read_manifest(lab.lab.runtime_reference)
    for name in NODES:
        said, _ = read_manifest(node_manifest_path(lab_config.daemon.state_dir, name))
        assert said.fields.keys() >= {"os", "glibc", "mpi", "package:numpy", "library:libmpi.so.40"}
        assert mismatches(compare(reference, said, "compatible")) == [], name
    # released: powered down and torn down (the namespace cloud keeps a terminated VM's
    # record listed for a while, as EC2 does, so its listing is not waited on)
    release(env, lab, store, NODES, "cloud", set())


@pytest.mark.full  # 4-5 min: make test-full only (docs/testing.md, the time budget)
def test_the_training_demo_survives_a_reclaim_and_ends_as_one_process_does(
    lab: Lab, lab_config: Config, store: Store
) -> None:
    """``make demo-training`` as the README shows it: ``scripts/demo-training.sh`` on the
    release under test. One sbatch (stage-in of the dataset, stage-out of the checkpoints
    every 60 s, ``--signal=USR1``) on four EC2 Spot nodes; an interruption notice on rank
    0's node mid-run; the ranks checkpoint, the daemon syncs that checkpoint before the
    requeue (no periodic sync has run yet: it is what the job resumes from), the job
    resumes on on-demand nodes at the step it was signalled at, and ends with the loss
    one process reaches, bit for bit; the model comes home verified; the ledger has both
    lives, the reclaimed instance's code and the transfers."""
    from slurm_burst.wiring import ledger

    env = user_env(LAB_SLURM=RELEASE, COLUMNS="200", TERM="dumb", NO_COLOR="1")
    done = subprocess.run(["scripts/demo-training.sh"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    out = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout)
    assert done.returncode == 0, f"exited {done.returncode}\n{out[-6000:]}\n{done.stderr[-3000:]}"
    job = re.search(r"^submitted job (\d+):", out, re.M)
    assert job, out
    job_id = int(job.group(1))
    said = Path(lab.lab.shared_dir, "training", f"{job_id}.out").read_text(errors="replace")
    signalled = re.findall(r"^signalled: checkpointed at step (\d+),", said, re.M)
    resumed = re.findall(r"^resumed at step (\d+) ", said, re.M)
    assert len(signalled) == 1 and resumed == signalled, said[-3000:]  # no step redone
    want = Path(lab.lab.shared_dir, "training", "reference.out").read_text().splitlines()[-1]
    assert [x for x in said.splitlines() if x.startswith("final loss ")] == [want], said[-2000:]
    events = store.events(limit=10**6)
    mine = [e for e in events if e["event"] == "output.synced_on_notice"
            and str(job_id) in e["detail"].split(",")]  # fmt: skip
    assert mine, [e for e in events if e["event"].startswith("output.")][-10:]
    [out_rec] = store.outputs(job_id)
    assert out_rec.state == "sealed" and "verified" in out_rec.message, out_rec
    rows = [r for r in ledger.ledger(lab_config).instances()
            if r["node"].startswith("burst-train-")]  # fmt: skip
    reclaimed = [r for r in rows if r["failure_code"] == "SpotInterruption"]
    assert reclaimed and all(r["terminated"] for r in rows), rows
    report = section(out, "the ledger")
    assert f"job {job_id} REQUEUED" in report and f"job {job_id} COMPLETED" in report, report
    assert reclaimed[-1]["instance_id"] in report, report
    took = re.search(r"^from the notice to training again: (\d+) s$", out, re.M)
    assert took, out
    CLOUD_JOIN["training demo: notice -> training again"] = {"seconds": took.group(1)}
