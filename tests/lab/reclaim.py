"""What the lab's spot tests share: a job run while an emulator's spot capacity is refused
or withheld (GCE's, Azure's); and the reclaim tests' (EC2's interruption notice, GCE's
preemption, Azure's eviction): a job that checkpoints on its ``--signal`` runs on a spot
node, the emulator reclaims its instance, and the job gets its signal, is requeued, and
completes on a replacement, the reclaim in the ledger with its code."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurm_burst_lab.service import Lab

from slurm_burst.adapters.state.store import Store
from slurm_burst.config import Config
from slurm_burst.core.records import NodeRecord
from tests.conftest import wait


def thaw_spot(store: Store, profile: str, size: str) -> None:
    """End a spot size's cooldown a test before left (every test starts asking spot)."""
    store.mark_unavailable(profile, f"{size}/spot", 0.0, "")


def srun_with_spot(
    control: Callable[[str], dict[str, Any]], env: dict[str, str], partition: str, mode: str,
    count: int, code: str = "",
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:  # fmt: skip
    """``srun -N count hostname -I`` on ``partition`` while the emulator's spot capacity
    is ``mode`` (refuse, withhold; ``code``: a refusal's), normal again after; the
    emulator's market then. ``control``: the emulator's ``/_emulator/<what>``."""
    control(f"spot?mode={mode}" + (f"&code={code}" if code else ""))
    try:
        srun = subprocess.run(
            ["srun", "-p", partition, f"-N{count}", "-t", "5", "hostname", "-I"],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        market = control("market")
    finally:
        control("spot?mode=")
    return srun, market


def withheld_falls_back(
    control: Callable[[str], dict[str, Any]], env: dict[str, str], store: Store,
    partition: str, nodes: list[str],
) -> tuple[float, list[NodeRecord], dict[str, Any]]:  # fmt: skip
    """A job on ``nodes`` while the emulator withholds spot capacity: it runs after the
    group's spot_fallback_after (15 s), on-demand, none of the withheld instances left
    and no node failed or released on the way. Returns the srun's seconds, the nodes'
    records and the emulator's market."""
    start = max((e["id"] for e in store.events(limit=10**6)), default=0)
    began = time.monotonic()
    srun, market = srun_with_spot(control, env, partition, "withhold", len(nodes))
    took = time.monotonic() - began
    assert srun.returncode == 0, srun.stderr[-3000:]
    assert took >= 15, took  # it waited for the spot capacity first
    withheld = market["withheld"]
    recs = [r for r in map(store.node, nodes) if r is not None]
    assert len(recs) == len(nodes), recs
    assert all(r.market == "" and r.instance_id not in withheld for r in recs), recs
    assert len(withheld) >= len(nodes) and not set(withheld) & set(market["live"]), market
    events = store.events(since_id=start, limit=10**6)
    assert any(e["event"] == "size.unavailable" and "SpotCapacityWait" in e["detail"]
               for e in events)  # fmt: skip
    assert not [e for e in events if e["event"] in ("node.failed", "node.released")], events
    return took, recs, market


# A job that checkpoints on its --signal: the batch shell notes when USR1 came (in the
# shared directory) and goes on; a rerun (after the requeue) finishes at once.
CHECKPOINTING = """#!/bin/sh
#SBATCH --signal=B:USR1@60
trap 'date +%s.%N > "{shared}/usr1.$SLURM_JOB_ID"' USR1
if [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ]; then
    echo "rerun $SLURM_RESTART_COUNT on $(hostname)"; exit 0
fi
echo "first run on $(hostname)"
while :; do sleep 0.2; done
"""


def reclaimed_job_runs_again(
    lab: Lab, cfg: Config, env: dict[str, str], store: Store, partition: str,
    reclaim: Callable[[NodeRecord], object], code: str,
) -> tuple[float, NodeRecord, list[dict[str, Any]]]:  # fmt: skip
    """Run the checkpointing job on ``partition`` (one spot node), ``reclaim`` its
    instance once it runs, and check what follows (the signal within 10 s, one requeue,
    completion on an on-demand replacement, the ledger's row with ``code``). Returns
    the seconds from the reclaim to the signal, the replacement's record and the events
    since the job was submitted."""
    from slurm_burst.wiring import ledger
    from tests.lab.test_x_burst import job, sbatch, wait_job

    shared = lab.lab.shared_dir
    script = Path(shared, f"checkpointing-{partition}.sh")
    script.write_text(CHECKPOINTING.format(shared=shared))
    start = max((e["id"] for e in store.events(limit=10**6)), default=0)
    job_id = sbatch(env, shared, "-p", partition, "-N1", "--open-mode=append", str(script))
    wait(lambda: job(env, job_id).get("JobState") == "RUNNING", 180, "the job running")
    rec = store.node(job(env, job_id)["NodeList"])
    assert rec is not None and rec.market == "spot", rec
    output = Path(shared, f"{job_id}.out")
    wait(lambda: output.exists() and "first run" in output.read_text(errors="replace"), 30,
         "the job's first output")  # fmt: skip
    noticed = time.time()
    reclaim(rec)
    mark = Path(shared, f"usr1.{job_id}")
    wait(lambda: mark.exists() and mark.read_text().strip(), 20, "the job's USR1")
    took = float(mark.read_text()) - noticed
    assert took <= 10, f"USR1 {took:.1f} s after the reclaim's notice"
    info = wait_job(env, job_id, timeout=240)
    out = output.read_text(errors="replace")
    assert info["JobState"] == "COMPLETED" and out.count("first run") == 1, (info, out)
    assert re.search(r"^rerun [12] on ", out, re.M), out  # requeued (once; twice is a race)
    events = store.events(since_id=start, limit=10**6)
    kinds = {e["event"] for e in events}
    assert {"spot.interruption", "job.signalled", "job.requeued"} <= kinds, kinds
    again = store.node(info["NodeList"])
    assert again is not None and again.instance_id != rec.instance_id and again.market == ""

    def reclaimed() -> list[dict[str, Any]]:
        rows = ledger.ledger(cfg).instances()
        return [r for r in rows if r["instance_id"] == rec.instance_id and r["terminated"]]

    (row,) = wait(reclaimed, 30, "the reclaim in the ledger")
    assert row["failure_code"] == code, row
    return took, again, events
