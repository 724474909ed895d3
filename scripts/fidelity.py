"""The simulator against the real slurmctld and daemon: a slice of an SWF trace replayed in
the lab, time-scaled, as sleep jobs on several on-prem nodes, then the same slice through
the simulator.

Without ``--burst`` (issue 18) bursting is off; it compares start order, waits, and the
start estimates (Slurm's backfill estimate and the simulator's own) with the starts that
happened. With ``--burst`` (issue 33) the daemon's burst policy runs (the lab's
``[policy]``, ``--wait-factor`` its wait_factor, the ``cpu`` node group): it compares which
jobs each sent to the cloud, and the start times of the jobs both ran in the same place
(within one recheck plus the lab's boot timeout).

Runs outside CI (about as long as the scaled slice, 10-15 minutes by default), as root,
with no other lab running: it brings the lab up with its own copy of the lab config
(``--nodes`` on-prem nodes of 2 CPUs) and takes it down at the end.

    python scripts/fidelity.py --skip 30000 --jobs 40 --scale 120 --nodes 4
    python scripts/fidelity.py --burst --skip 30000 --jobs 60 --nodes 2 --max-cpus 2 \\
        --out tests/data/fidelity-burst.json

Prints the figures and writes them, with every job's times, to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_burst.core.policy import NEVER  # noqa: E402
from slurm_burst.core.simulate import Setup, simulate  # noqa: E402
from slurm_burst.core.workload import TraceJob, parse_swf  # noqa: E402

LAB_CONFIG = ROOT / "slurm-conf" / "lab" / "slurm-burst.toml"
TRACE = ROOT.parent / "shared" / "traces" / "SDSC-SP2-1998-4.2-cln.swf.gz"
SB = [sys.executable, "-m", "slurm_burst"]


def lab_env() -> dict[str, str]:
    state = Path("/var/lib/slurm-burst-lab")
    return {
        **os.environ,
        "SLURM_CONF": str(state / "etc" / "slurm" / "slurm.conf"),
        "PATH": f"{state / 'slurm' / 'bin'}:{os.environ['PATH']}",
        "SLURM_TIME_FORMAT": "%s",
    }


def config_copy(nodes: int, directory: Path, wait_factor: float | None = None) -> Path:
    """The lab config with ``nodes`` on-prem nodes, and the burst policy off, or (with a
    ``wait_factor``) on with that wait_factor, bursting to the ``cpu`` group only."""
    text = LAB_CONFIG.read_text()
    text = re.sub(r"(?m)^onprem_nodes = \d+", f"onprem_nodes = {nodes}", text)
    if "onprem_nodes" not in text:
        text = text.replace("[lab]\n", f"[lab]\nonprem_nodes = {nodes}\n", 1)
    if wait_factor is None:
        text = text.replace("[policy]\nenabled = true", "[policy]\nenabled = false", 1)
    else:
        text = re.sub(r"(?m)^wait_factor = .*$", f"wait_factor = {wait_factor:g}", text, count=1)
        text = re.sub(r'(?m)^groups = \["cpu", "gpu"\].*$', 'groups = ["cpu"]', text, count=1)
    path = directory / "slurm-burst.toml"
    path.write_text(text)
    path.chmod(0o640)
    return path


def slice_of(trace: Path, skip: int, count: int, scale: float, cpus: int) -> list[TraceJob]:
    """``count`` jobs after the first ``skip``, submit times from 0, every time divided by
    ``scale``; limits in whole minutes (at least one), runs inside their limits, CPUs at
    most the pool's."""
    with gzip.open(trace, "rt") as fh:
        jobs = parse_swf(fh.read().splitlines(), str(trace)).jobs[skip : skip + count]
    t0 = jobs[0].submit
    out = []
    for j in jobs:
        limit = max(1, math.ceil(j.limit / scale / 60)) * 60.0
        run = max(1.0, min(round(j.run / scale), limit - 10))
        out.append(TraceJob(j.id, (j.submit - t0) / scale, run, limit, min(j.cpus, cpus)))
    return out


def replay(jobs: list[TraceJob], env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Submit each job at its time; sample Slurm's start estimates while they pend."""
    begin = time.time()
    ids: dict[str, str] = {}
    estimates: dict[str, float] = {}
    pending = list(jobs)
    while pending or _queued(env):
        now = time.time() - begin
        while pending and pending[0].submit <= now:
            j = pending.pop(0)
            out = subprocess.run(
                ["sbatch", "--parsable", "-p", "onprem", "-n", str(j.cpus), "-t",
                 str(int(j.limit // 60)), "-o", "/dev/null", "--wrap", f"sleep {j.run:g}"],
                env=env, capture_output=True, text=True, check=True, timeout=30,
            )  # fmt: skip
            ids[out.stdout.strip().split(";")[0]] = j.id
        for job_id, start in _estimates(env):
            if job_id in ids and ids[job_id] not in estimates:
                estimates[ids[job_id]] = start  # the first estimate Slurm gave
        time.sleep(1.0)
    acct = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(ids), "-o",
         "JobIDRaw,Submit,Start,End,Partition"],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    out: dict[str, dict[str, Any]] = {}
    for line in acct.splitlines():
        job_id, submit, start, end, partition = line.split("|")
        if job_id in ids:
            out[ids[job_id]] = {
                "submit": float(submit) - begin,
                "start": float(start) - begin,
                "end": float(end) - begin,
                "partition": partition,
                "slurm_estimate": estimates[ids[job_id]] - begin
                if ids[job_id] in estimates
                else None,
            }
    return out


def _queued(env: dict[str, str]) -> bool:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True,
                         check=False, timeout=30)  # fmt: skip
    return bool(out.stdout.strip())


def _estimates(env: dict[str, str]) -> list[tuple[str, float]]:
    argv = ["squeue", "-h", "-t", "PD", "-O", "JobID:|,StartTime:|"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=30)
    pairs = []
    for line in out.stdout.splitlines():
        job_id, start, _ = line.split("|")
        if start.isdigit():
            pairs.append((job_id.strip(), float(start)))
    return pairs


def compare(jobs: list[TraceJob], real: dict[str, dict[str, Any]], cpus: int) -> dict[str, Any]:
    """Start order and waits, the simulator given the submit times that happened."""
    order = [j for j in jobs if j.id in real]
    replayed = [TraceJob(j.id, real[j.id]["submit"], j.run, j.limit, j.cpus) for j in order]
    out = simulate(replayed, Setup(cpus=cpus, rule=NEVER, record_estimates=True))
    rows = []
    for i, j in enumerate(replayed):
        r = real[j.id]
        rows.append({
            "job": j.id, "cpus": j.cpus, "run": j.run, "limit": j.limit,
            "submit": round(r["submit"], 1), "start": round(r["start"], 1),
            "sim_start": round(out.start[i], 1),
            "slurm_estimate": r["slurm_estimate"], "sim_estimate": out.estimate.get(i),
        })  # fmt: skip
    waits = [r["start"] - r["submit"] for r in rows]
    sim_waits = [r["sim_start"] - r["submit"] for r in rows]
    pairs = agree = 0
    for a in range(len(rows)):
        for b in range(a + 1, len(rows)):
            real_gap = rows[a]["start"] - rows[b]["start"]
            if abs(real_gap) < 2:  # same moment: no order to agree on
                continue
            pairs += 1
            agree += (real_gap < 0) == (rows[a]["sim_start"] < rows[b]["sim_start"])
    waited = [r for r in rows if r["start"] - r["submit"] > 5]  # jobs that really pended
    slurm_err = [abs(r["slurm_estimate"] - r["start"]) for r in waited
                 if r["slurm_estimate"] is not None]  # fmt: skip
    sim_err = [abs(r["sim_estimate"] - r["start"]) for r in waited
               if r["sim_estimate"] is not None]  # fmt: skip
    return {
        "jobs": len(rows),
        "mean_wait": sum(waits) / len(waits),
        "sim_mean_wait": sum(sim_waits) / len(sim_waits),
        "mean_abs_wait_difference": sum(abs(a - b) for a, b in zip(waits, sim_waits, strict=True))
        / len(rows),
        "start_order_agreement": agree / pairs if pairs else None,
        "jobs_that_waited": len(waited),
        "slurm_estimate_mean_abs_error": sum(slurm_err) / len(slurm_err) if slurm_err else None,
        "slurm_estimates": len(slurm_err),
        "sim_estimate_mean_abs_error": sum(sim_err) / len(sim_err) if sim_err else None,
        "rows": rows,
    }


def compare_burst(
    jobs: list[TraceJob], real: dict[str, dict[str, Any]], cpus: int, cfg_path: Path
) -> dict[str, Any]:
    """Which jobs the daemon sent to the cloud and which the simulator would (the lab's
    policy, its node groups and prices, its boot estimate), given the submit times that
    happened; and the start times of the jobs both ran in the same place."""
    from slurm_burst.config import load_config
    from slurm_burst.services.simulation import cloud_groups

    cfg = load_config(cfg_path)
    groups = tuple(g for g in cloud_groups(cfg) if g.name in cfg.policy.groups)
    order = [j for j in jobs if j.id in real]
    replayed = [TraceJob(j.id, real[j.id]["submit"], j.run, j.limit, j.cpus) for j in order]
    out = simulate(replayed, Setup(cpus=cpus, groups=groups, rule=cfg.policy.rule()))
    slack = cfg.policy.recheck + cfg.daemon.boot_timeout
    rows = []
    for i, j in enumerate(replayed):
        r = real[j.id]
        lab_cloud = r["partition"] != "onprem"
        sim_cloud = out.where[i] not in ("onprem", "")
        rows.append({
            "job": j.id, "cpus": j.cpus, "run": j.run, "limit": j.limit,
            "submit": round(r["submit"], 1), "start": round(r["start"], 1),
            "partition": r["partition"], "sim_where": out.where[i],
            "sim_start": round(out.start[i], 1), "same_place": lab_cloud == sim_cloud,
        })  # fmt: skip
    return {"policy": {"wait_per_dollar": cfg.policy.wait_per_dollar,
                       "min_wait": cfg.policy.min_wait, "wait_factor": cfg.policy.wait_factor,
                       "recheck": cfg.policy.recheck, "boot_estimate": cfg.policy.boot_estimate},
            "start_slack": slack, **burst_figures(rows, slack), "rows": rows}  # fmt: skip


def burst_figures(rows: list[dict[str, Any]], slack: float) -> dict[str, Any]:
    """The figures of ``compare_burst``'s rows (tests/unit/test_fidelity.py reads them
    back from the committed result)."""
    same = [r for r in rows if r["same_place"]]
    off = [abs(r["start"] - r["sim_start"]) for r in same]
    return {
        "jobs": len(rows),
        "burst_lab": sum(r["partition"] != "onprem" for r in rows),
        "burst_sim": sum(r["sim_where"] not in ("onprem", "") for r in rows),
        "same_burst_decision": len(same) / len(rows) if rows else None,
        "start_within_slack": sum(d <= slack for d in off) / len(off) if off else None,
        "start_mean_abs_difference": sum(off) / len(off) if off else None,
        "start_max_abs_difference": max(off, default=None),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--skip", type=int, default=30_000)
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--scale", type=float, default=120.0, help="trace seconds per lab second")
    ap.add_argument("--nodes", type=int, default=4, help="on-prem nodes of 2 CPUs")
    ap.add_argument("--out", type=Path, default=Path("fidelity.json"))
    ap.add_argument("--burst", action="store_true", help="the burst policy on (issue 33)")
    ap.add_argument("--wait-factor", type=float, default=2.0, help="with --burst")
    ap.add_argument("--max-cpus", type=int, default=0, help="a job's CPUs at most (0: pool)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("fidelity: run as root (the lab needs it)", file=sys.stderr)
        return 3
    cpus = 2 * args.nodes
    jobs = slice_of(args.trace, args.skip, args.jobs, args.scale, args.max_cpus or cpus)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config_copy(args.nodes, Path(tmp), args.wait_factor if args.burst else None)
        subprocess.run([*SB, "--config", str(cfg), "lab", "down", "--yes"], check=False)
        subprocess.run([*SB, "--config", str(cfg), "lab", "up"], check=True)
        try:
            real = replay(jobs, lab_env())
        finally:
            subprocess.run([*SB, "--config", str(cfg), "lab", "down", "--yes"], check=False)
        if args.burst:
            result = compare_burst(jobs, real, cpus, cfg)
            result["slice"] = {"trace": args.trace.name, "skip": args.skip, "jobs": args.jobs,
                               "scale": args.scale, "nodes": args.nodes,
                               "max_cpus": args.max_cpus}  # fmt: skip
    if not args.burst:
        result = compare(jobs, real, cpus)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for key, value in result.items():
        if key != "rows":
            print(f"{key:32} {value:.3f}" if isinstance(value, float) else f"{key:32} {value}")
    print(f"every job's times: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
