"""Cloud-to-cloud traffic off the hub: two nodes of a group with ``cloud_to_cloud =
"wireguard"`` (burst-dir-[1-2]) tunnel to each other directly, their agents reading
their peers from the daemon's node API. A job on them sends 32 MiB from one node's
batch script to the other's task through ``srun``'s standard input (srun on the first
node, slurmstepd on the second: Slurm's own node-to-node path, by NodeAddr, the mesh
address), and the hub's WireGuard interface counts next to nothing of it; through the
hub it would count the 32 MiB twice (in, and forwarded out)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from slurm_burst_lab.service import Lab

from slurm_burst.adapters.state.store import Store
from slurm_burst.config import Config
from tests.conftest import wait
from tests.lab.conftest import sh
from tests.lab.test_x_burst import in_vm, running_vms, sbatch, wait_job

NODES = ["burst-dir-1", "burst-dir-2"]
SENT = 32 * 2**20
DIRECT_FIGURES: dict[str, str] = {}

# On the batch host: wait until its tunnel to the other node is direct (its agent routes
# it once the two have shaken hands), then send SENT bytes to a task on the other node.
SCRIPT = f"""#!/bin/sh
i=0
until ip -o route show dev wg-burst-d | grep -q .; do
    i=$((i + 1)); [ $i -gt 120 ] && {{ echo "no direct route"; exit 3; }}; sleep 0.5
done
start=$(date +%s%N)
head -c {SENT} /dev/zero | srun -N1 -n1 -x "$(hostname)" --input=all wc -c
end=$(date +%s%N)
echo "ms $(( (end - start) / 1000000 ))"
"""


def hub_bytes(cfg: Config) -> int:
    """Bytes through the hub's tunnels so far, in and out, as WireGuard counts them per
    peer (the interface's own counters miss what wireguard-go forwards between peers)."""
    said = subprocess.run(["wg", "show", cfg.mesh.interface, "transfer"], capture_output=True,
                          text=True, check=True, timeout=10).stdout  # fmt: skip
    return sum(int(n) for line in said.splitlines() for n in line.split("\t")[1:])


def test_two_cloud_nodes_talk_directly_and_the_hub_carries_next_to_nothing(
    lab: Lab, lab_config: Config, env: dict[str, str], store: Store, cloud: Any
) -> None:
    up = subprocess.run(["srun", "-p", "burst-direct", "-N2", "-t", "5", "hostname"], env=env,
                        capture_output=True, text=True, timeout=240, check=False)  # fmt: skip
    assert up.returncode == 0, up.stderr[-3000:]
    shared = lab.lab.shared_dir
    script = Path(shared, "direct.sh")
    script.write_text(SCRIPT)
    before = hub_bytes(lab_config)
    job_id = sbatch(env, shared, "-p", "burst-direct", "-N2", str(script))
    info = wait_job(env, job_id, timeout=120)
    moved = hub_bytes(lab_config) - before
    out = Path(shared, f"{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED", (info, out)
    assert str(SENT) in out.split(), out
    # Slurm's own messages (the job's launch, the step's, their completions) still go
    # through the hub: kilobytes. The 32 MiB never do.
    assert moved < 2 * 2**20, f"the hub carried {moved} bytes of a {SENT}-byte transfer"
    ms = int(out.split("ms")[-1].split()[0])
    DIRECT_FIGURES.update(hub_bytes=str(moved), mib_per_s=f"{SENT / 2**20 / (ms / 1000):.1f}")
    # each node's direct tunnel is up with the other's key; the hub's tunnels are as before
    vms = running_vms(cloud)
    keys = {n: getattr(store.node(n), "wg_pubkey", "") for n in NODES}
    for me, other in (NODES, NODES[::-1]):
        dump = in_vm(cloud, vms[me], "wg", "show", "wg-burst-d", "latest-handshakes")
        shaken = dict(line.split("\t") for line in dump.splitlines() if "\t" in line)
        assert int(shaken.get(keys[other], "0")) > 0, (me, dump)
    sh(env, "scontrol", "update", f"nodename={','.join(NODES)}", "state=power_down")
    wait(
        lambda: all(str(getattr(store.node(n), "state", "")) == "terminated" for n in NODES),
        90,
        "the direct nodes torn down",
    )
