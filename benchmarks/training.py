"""Distributed training across burst nodes in the lab (root; issue 53's figures):
``python benchmarks/training.py [--no-demo]``.

- **Allreduce bus bandwidth at 1 MiB and 64 MiB between 4 cloud nodes** (burst-dir-[1-4],
  ``examples/training/allreduce.py``, OpenMPI launched by ``srun --mpi=pmix``), three
  ways on the same lab links: through the nodes' direct WireGuard tunnels; through the
  hub (each node's agent stopped and its direct routes removed first: its traffic takes
  the hub's tunnel); and over the raw lab link with no WireGuard at all (OpenMPI on the
  VMs' own addresses: the ceiling).
- **Training steps per second on 2 and 4 nodes** (``examples/training/train.py``, no
  sleep in a step: the allreduce of each step's gradients dominates).
- **A reclaim's cost**: ``scripts/demo-training.sh`` (``make demo-training``): the time
  from the notice to the job training again from its checkpoint, and that as a share of
  the job's wall time (sbatch to its end). ``--no-demo``: the first two alone.

Relative figures: the lab's VMs share one kernel and two cores. Brings the lab up if it
is down (and down again after); with a lab of yours up, it uses it and leaves it up.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cloudnet import lab_session  # noqa: E402
from sizes import size  # noqa: E402
from slurm_burst_lab.service import Lab  # noqa: E402

from slurm_burst.config import Config  # noqa: E402

PYTHON = "/usr/bin/python3"  # Debian's, with mpi4py and numpy: the nodes' too
NODES = "burst-dir-[1-4]"
MAX_BYTES = size(64, 1) << 20
STEPS = size(400, 40)
# each node's direct tunnels answer (or, through the hub, are gone) before the ranks start
PREPARE = {
    "direct": """for _ in $(seq 240); do
    peers=$(ip -o route show dev wg-burst-d | cut -d" " -f1)
    ok=$(( $(echo $peers | wc -w) >= {peers} ))
    for p in $peers; do timeout 2 bash -c ": </dev/tcp/$p/6818" 2>/dev/null || ok=0; done
    [ "$ok" = 1 ] && exit 0
    sleep 0.5
done; exit 3""",
    # (the pattern's brackets: it does not match this command's own line)
    "hub": "pkill -f /run/slurm-burst-agent[.]py; ip route flush dev wg-burst-d; sleep 1",
    "raw": "true",
}
JOB = """#!/bin/bash
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include={subnet} \
OMPI_MCA_oob_tcp_if_include={subnet} OMPI_MCA_reachable=weighted OMPI_ALLOW_RUN_AS_ROOT=1 \
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
srun --ntasks-per-node=1 bash -c '{prepare}' || exit 3
srun --mpi=pmix {python} {shared}/{program}
"""


def run(env: dict[str, str], *argv: str, timeout: float = 120) -> str:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                          check=True)  # fmt: skip
    return done.stdout


def job(env: dict[str, str], shared: str, nodes: int, subnet: str, prepare: str,
        program: str) -> str:  # fmt: skip
    """One batch job on ``nodes`` direct-group nodes, waited for: its output."""
    script = Path(shared, "training-bench.sh")
    script.write_text(JOB.format(subnet=subnet, prepare=prepare.replace("'", "'\\''"),
                                 python=PYTHON, shared=shared, program=program))  # fmt: skip
    out = run(env, "sbatch", "--parsable", "--wait", "-p", "burst-direct", f"-N{nodes}",
              "-t", "15", "-o", f"{shared}/%j.out", str(script), timeout=900)  # fmt: skip
    job_id = out.strip().split(";")[0]
    return Path(shared, f"{job_id}.out").read_text(errors="replace")


def release(env: dict[str, str]) -> None:
    """The direct group's nodes powered down (the hub's run stopped their agents)."""
    run(env, "scontrol", "update", f"nodename={NODES}", "state=power_down_force")
    run(env, "sleep", "20")


def allreduce(lab: Lab, cfg: Config, env: dict[str, str]) -> None:
    shared = lab.lab.shared_dir
    program = f"allreduce.py --json --max-bytes {MAX_BYTES} --iters 3"
    raw = str(cfg.providers["lab"].options["subnet"])  # the VMs' own addresses
    ways = (("direct tunnels", cfg.mesh.subnet, PREPARE["direct"].format(peers=3)),
            ("through the hub", cfg.mesh.subnet, PREPARE["hub"]),
            ("raw lab link (no WireGuard)", raw, PREPARE["raw"]))  # fmt: skip
    for label, subnet, prepare in ways:
        out = job(env, shared, 4, subnet, prepare, program)
        rows = {r["bytes"]: r for r in map(json.loads, re.findall(r"^\{.*\}$", out, re.M))}
        if not rows:
            print(f"allreduce {label}: no result\n{out[-2000:]}")
            continue
        one, top = rows.get(1 << 20), rows[max(rows)]
        first = f"1 MiB {one['busbw_MBps']:6.1f} MB/s" if one else "1 MiB -"
        print(
            f"allreduce 4 nodes, {label:<28} bus bandwidth {first}, "
            f"{max(rows) >> 20} MiB {top['busbw_MBps']:6.1f} MB/s"
        )
        if label == "through the hub":
            release(env)


def steps(lab: Lab, cfg: Config, env: dict[str, str]) -> None:
    shared = lab.lab.shared_dir
    data = Path(shared, "train-data.npz")
    run(env, PYTHON, str(Path(shared, "train.py")), "--data", str(data), "--make-data",
        "4096,32,7", "--steps", "1")  # fmt: skip
    prepare = PREPARE["direct"]
    for nodes in (2, 4):
        out = job(env, shared, nodes, cfg.mesh.subnet, prepare.format(peers=nodes - 1),
                  f"train.py --data {data} --steps {STEPS}")  # fmt: skip
        m = re.search(r"^trained (\d+) steps in ([0-9.]+) s", out, re.M)
        if not m:
            print(f"training on {nodes} nodes: no result\n{out[-2000:]}")
            continue
        rate = int(m.group(1)) / float(m.group(2))
        print(
            f"training on {nodes} nodes (1 rank each)        {rate:7.1f} steps/s "
            f"({m.group(1)} steps, global batch 256)"
        )


def reclaim(env: dict[str, str]) -> None:
    done = subprocess.run(["scripts/demo-training.sh"], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env={**env, "TERM": "dumb"})  # fmt: skip
    out = done.stdout
    took = re.search(r"^from the notice to training again: (\d+) s$", out, re.M)
    wall = re.search(r"^job \d+: COMPLETED after (\d+) s", out, re.M)
    if done.returncode or not took or not wall:
        print(f"reclaim: the demo failed ({done.returncode})\n{out[-3000:]}{done.stderr[-2000:]}")
        return
    lost, total = int(took.group(1)), int(wall.group(1))
    print(
        f"reclaim: notice -> training again from the checkpoint {lost:5d} s; "
        f"{100 * lost / total:.0f}% of the job's {total} s (sbatch to end)"
    )


def main() -> None:
    with lab_session() as (lab, cfg, env):
        for name in ("train.py", "allreduce.py"):
            shutil.copy(ROOT / "examples" / "training" / name, Path(lab.lab.shared_dir, name))
        allreduce(lab, cfg, env)
        steps(lab, cfg, env)
        release(env)
        if "--no-demo" not in sys.argv[1:]:
            reclaim(env)


if __name__ == "__main__":
    main()
