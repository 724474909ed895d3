"""Cloud-to-cloud traffic and interruption notices in the lab (root; issue 32's figures).

- **Throughput between two cloud nodes**, directly against through the hub, on the same
  lab links: a job on burst-dir-[1-2] sends 256 MiB from the batch host to a task on
  the other node through srun's standard input, three times each way round: with the
  direct tunnel up, and with the batch host's agent stopped and its direct routes
  removed (its traffic back on the hub's tunnel). MiB/s and the hub's bytes per run.
- **Interruption notice -> the job's signal**: a job on a spot EC2 node, then on a GCE
  Spot node (issue 50), then on an Azure Spot node (issue 52), that asked for
  ``--signal=B:USR1``; the emulator raises EC2's notice on its instance, preempts the
  GCE instance (its metadata server says so, the node's agent waiting on it), or
  schedules a ``Preempt`` event on the Azure VM (its metadata service's Scheduled
  Events, the node's agent polling them every second); the time until the batch shell
  has the signal (goal <= 5 s), three times quiet and three times with two CPU burners
  beside it.
  ``--notices-only``: these alone; ``--provider ec2|gce|azure``: that provider's alone.

Brings the lab up if it is down (and down again after); with a lab of yours up, it uses
it and leaves it up.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from launch import burners  # noqa: E402
from sizes import size  # noqa: E402
from slurm_burst_lab.service import Lab  # noqa: E402

from slurm_burst.adapters.state.store import Store  # noqa: E402
from slurm_burst.config import Config, load_config  # noqa: E402
from slurm_burst.wiring.light import state_db_path  # noqa: E402

SENT = size(256, 16) * 2**20
RUNS = size(3, 1)
SEND = """#!/bin/sh
{prepare}
i=0
until [ -n "{through_hub}" ] || ip -o route show dev wg-burst-d | grep -q .; do
    i=$((i + 1)); [ $i -gt 120 ] && exit 3; sleep 0.5
done
start=$(date +%s%N)
head -c {sent} /dev/zero | srun -N1 -n1 -x "$(hostname)" --input=all wc -c
end=$(date +%s%N)
echo "ms $(( (end - start) / 1000000 ))"
"""
HUB = "pkill -f /run/slurm-burst-agent.py; ip route flush dev wg-burst-d; sleep 1"
CHECKPOINTING = """#!/bin/sh
#SBATCH --signal=B:USR1@60
trap 'date +%s.%N > "{shared}/usr1.$SLURM_JOB_ID"; exit 0' USR1
while :; do sleep 0.2; done
"""


def run(env: dict[str, str], *argv: str) -> str:
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True,
                          timeout=600).stdout  # fmt: skip


def sbatch_wait(env: dict[str, str], shared: str, *args: str) -> tuple[int, str]:
    out = run(env, "sbatch", "--parsable", "--wait", "-t", "10", "-o", f"{shared}/%j.out",
              "-D", shared, *args)  # fmt: skip
    job = int(out.strip().split(";")[0])
    return job, Path(shared, f"{job}.out").read_text(errors="replace")


def hub_bytes(cfg: Config) -> int:
    """Bytes through the hub's tunnels so far, in and out, as WireGuard counts them per
    peer (the interface's own counters miss what wireguard-go forwards between peers)."""
    said = subprocess.run(["wg", "show", cfg.mesh.interface, "transfer"], capture_output=True,
                          text=True, check=True, timeout=10).stdout  # fmt: skip
    return sum(int(n) for line in said.splitlines() for n in line.split("\t")[1:])


def throughput(lab: Lab, cfg: Config, env: dict[str, str]) -> None:
    shared = lab.lab.shared_dir
    run(env, "srun", "-p", "burst-direct", "-N2", "-t", "5", "true")  # both up, joined
    for label, prepare in (("direct", ""), ("through the hub", HUB)):
        script = Path(shared, "send.sh")
        script.write_text(SEND.format(prepare=prepare, through_hub="y" if prepare else "",
                                      sent=SENT))  # fmt: skip
        rates, moved = [], []
        for _ in range(RUNS):
            before = hub_bytes(cfg)
            _job, out = sbatch_wait(env, shared, "-p", "burst-direct", "-N2", str(script))
            moved.append((hub_bytes(cfg) - before) / 2**20)
            ms = int(out.split("ms")[-1].split()[0])
            rates.append(SENT / 2**20 / (ms / 1000))
        rate, hub = statistics.median(rates), statistics.median(moved)
        print(f"cloud-to-cloud {label:<16} {rate:7.1f} MiB/s median (best {max(rates):.1f}); "
              f"hub carried {hub:7.1f} MiB a run")  # fmt: skip
        if prepare:  # the agents are gone: release the nodes, they come back with new ones
            run(env, "scontrol", "update", "nodename=burst-dir-[1-2]", "state=power_down")
            time.sleep(15)
    run(env, "scontrol", "update", "nodename=burst-dir-[1-2]", "state=power_down")


# each provider's spot partition, its profile and size, and how its emulator reclaims
NOTICES = {
    "ec2": ("burst-spot", "aws", "t3.micro", "interrupt?instance={id}&in=60"),
    "gce": ("burst-gspot", "gcp", "n2-standard-2", "preempt?instance={id}&in=60"),
    "azure": ("burst-azspot", "azure", "Standard_D2s_v5", "event?vm={id}&type=Preempt&in=60"),
}


def notices(
    lab: Lab, cfg: Config, env: dict[str, str], label: str = "quiet", provider: str = "ec2"
) -> None:
    shared = lab.lab.shared_dir
    partition, profile, size_name, reclaim = NOTICES[provider]
    options = cfg.providers[profile].options
    control = str(options.get("endpoint") or f"http://127.0.0.1:{options['port']}")
    store = Store(state_db_path(cfg))
    script = Path(shared, "checkpointing.sh")
    script.write_text(CHECKPOINTING.format(shared=shared))
    took = []
    for _ in range(RUNS):
        store.mark_unavailable(profile, f"{size_name}/spot", 0.0, "")  # the last run cooled it
        job = int(run(env, "sbatch", "--parsable", "-p", partition, "-N1", "-t", "10",
                      "-o", f"{shared}/%j.out", "-D", shared,
                      str(script)).split(";")[0])  # fmt: skip
        while "RUNNING" not in run(env, "squeue", "-h", "-j", str(job), "-o", "%T"):
            time.sleep(0.5)
        node = run(env, "squeue", "-h", "-j", str(job), "-o", "%N").strip()
        rec = store.node(node)
        assert rec is not None
        time.sleep(3)  # the batch shell's trap is set
        at = time.time()
        url = f"{control}/_emulator/{reclaim.format(id=rec.instance_id)}"
        context = None
        if options.get("ca_file"):  # Azure's emulator: TLS with the lab's own CA
            import ssl

            context = ssl.create_default_context(cafile=str(options["ca_file"]))
        with urllib.request.urlopen(url, timeout=10, context=context) as r:
            json.loads(r.read())
        mark = Path(shared, f"usr1.{job}")
        deadline = time.monotonic() + 30
        while not (mark.exists() and mark.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        took.append(float(mark.read_text()) - at if mark.exists() else float("inf"))
        run(env, "scancel", str(job))
        run(env, "scontrol", "update", f"nodename={node}", "state=power_down")
    mid = statistics.median(took)
    verdict = "OK" if mid <= 5 else "OVER GOAL"
    print(f"{provider} interruption notice -> the job's USR1 ({label}): median {mid:.2f} s, "
          f"max {max(took):.2f} s (goal <= 5 s)  {verdict}")  # fmt: skip


@contextlib.contextmanager
def lab_session() -> Iterator[tuple[Lab, Config, dict[str, str]]]:
    """The lab, its config and its environment: brought up if it is down (and down again
    after), used and left up if it is up already."""
    cfg = load_config(ROOT / "slurm-conf" / "lab" / "slurm-burst.toml")
    lab = Lab(cfg)
    was_up = bool(lab.status()["up"])
    if not was_up:
        lab.up()
    try:
        yield lab, cfg, lab.env()
    finally:
        if not was_up:
            lab.down()


def main() -> None:
    notices_only = "--notices-only" in sys.argv[1:]
    with lab_session() as (lab, cfg, env):
        if not notices_only:
            throughput(lab, cfg, env)
        argv = sys.argv[1:]
        only = argv[argv.index("--provider") + 1] if "--provider" in argv[:-1] else ""
        for provider in [only] if only in NOTICES else NOTICES:
            notices(lab, cfg, env, provider=provider)
            with burners(2):
                notices(lab, cfg, env, "2 CPU burners", provider)


if __name__ == "__main__":
    main()
