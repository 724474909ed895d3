"""Pre-staged data, sbatch -> RUNNING minus boot and pull (issue 29), in the lab (root):
``python benchmarks/prestaged.py [--json] [--release 22.05]``.

A 64 MiB dataset (64 files) is pushed first with ``slurm-burst stage push``, then a job
that names it (``#BB_LUA stage_in``) is submitted as the lab's job user, three times
each on the nodes below. sbatch -> RUNNING is slurmctld's own: its log's submit RPC to
the end of the job's configuration (millisecond stamps; polling through another
release's chroot wrapper added seconds):

- a node that is up already (it ran a job before and idles within SuspendTime): the
  stage-in finds the data stored (nothing sent), the PrologSlurmctld asks the daemon to
  pull onto the node, the job starts once the pull is over. The figure is sbatch ->
  RUNNING minus the pull (the ledger's pull row);
- a cold node: the figure is sbatch -> RUNNING minus the node's resume request ->
  joined (boot, bootstrap and the pull: the pull is part of the join). Slurm's own
  ``pre_run`` poll (60-s sleeps, docs/staging.md) is in it, and says so.

Goal: <= 5 s. The lab is brought up and down here: run it with no lab of yours up.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
LAB_CONFIG = ROOT / "slurm-conf" / "lab" / "slurm-burst.toml"
SB = [sys.executable, "-m", "slurm_burst", "--config", str(LAB_CONFIG)]


def _run(argv: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(argv, check=True, capture_output=True, text=True, env=env, timeout=120)
    return str(done.stdout)


def _job(env: dict[str, str], job: str) -> dict[str, str]:
    out = _run(["scontrol", "show", "job", "-o", job], env)
    return dict(t.split("=", 1) for t in out.split() if "=" in t)


def _submit(
    env: dict[str, str], user: str, shared: Path, script: str, node: str, other: bool
) -> str:
    """sbatch as ``user``: the host's sbatch through runuser; another release's wrapper
    chroots first, as root, then becomes the user (SBLAB_AS_UID)."""
    import pwd

    path = shared / f"prestaged-{time.monotonic_ns()}.sh"
    path.write_text(script)
    path.chmod(0o755)
    pw = pwd.getpwnam(user)
    as_user = [] if other else ["runuser", "-u", user, "--"]
    env = {**env, "SBLAB_AS_UID": f"{pw.pw_uid}:{pw.pw_gid}"} if other else env
    return _run([*as_user, "sbatch", "--parsable", "-p", "burst-cpu",
                 "-w", node, "-n1", "-t", "5", "-A", "physics", "-D", str(shared),
                 "-o", "/dev/null", str(path)], env).strip().split(";")[0]  # fmt: skip


def _to_running(env: dict[str, str], job: str, t0: float, timeout: float = 400) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _job(env, job).get("JobState", "")
        if state in ("RUNNING", "COMPLETING", "COMPLETED"):
            return time.monotonic() - t0
        if state in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            raise RuntimeError(f"job {job} ended {state}")
        time.sleep(0.05)
    raise TimeoutError(f"job {job} did not start in {timeout:g} s")


def _slurm_took(log: Path, job: str) -> float | None:
    """sbatch -> RUNNING as slurmctld logs it (ms stamps): the submit RPC to the end of
    the job's configuration (prolog and pre_run done). None if a line is missing."""
    import datetime as dt

    submit = running = None
    for line in log.read_text(errors="replace").splitlines():
        if f"JobId={job} " not in line + " ":
            continue
        at = dt.datetime.fromisoformat(line[1:24])
        if "_slurm_rpc_submit_batch_job" in line:
            submit = at
        elif "Configuration for" in line and "is complete" in line:
            running = at
    return (running - submit).total_seconds() if submit and running else None


def _done(env: dict[str, str], job: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _job(env, job).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED"):
            return
        time.sleep(0.2)


def _pull_seconds(job: str) -> float:
    rows = json.loads(_run([*SB, "ledger", "transfers", "--job", job, "--json"], dict(os.environ)))
    pulls = [r["seconds"] for r in rows if r["direction"] == "pull"]
    if not pulls:
        raise RuntimeError(f"job {job}: no pull in the ledger")
    return float(sum(pulls))


def _events_after(store: Any, last: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while page := store.events(since_id=last):
        out += page
        last = int(page[-1]["id"])
    return out


def _join_seconds(store: Any, node: str, since_id: int) -> float:
    """The node's resume request -> joined, from the daemon's events after ``since_id``."""
    evs = [e for e in _events_after(store, since_id) if e.get("node") == node]
    req = [float(e["at"]) for e in evs if e["event"] == "node.requested"]
    joined = [float(e["at"]) for e in evs if e["event"] == "node.joined"]
    if not req or not joined:
        raise RuntimeError(f"{node}: no request and join since the job was submitted")
    return max(joined) - min(req)


def bench(release: str | None) -> dict[str, Any]:
    from slurm_burst_lab.accounting import JOB_USER
    from slurm_burst_lab.components import lab_env
    from slurm_burst_lab.images import HOST_RELEASE
    from slurm_burst_lab.service import Lab

    from slurm_burst.adapters.state.store import Store
    from slurm_burst.config import load_config
    from slurm_burst.wiring.light import state_db_path

    cfg = load_config(LAB_CONFIG)
    lab = Lab(cfg, release=release or HOST_RELEASE)
    if lab.status()["up"]:
        raise SystemExit("a lab is up: make lab-down first (this brings its own up and down)")
    lab.up(timeout=180)
    try:
        env = lab.env()
        other = (release or HOST_RELEASE) != HOST_RELEASE
        log = Path(lab.lab.state_dir) / "log" / "slurmctld.log"
        shared = Path(lab.lab.shared_dir) / "prestaged-bench"
        shared.mkdir(exist_ok=True)
        shared.chmod(0o1777)
        data = Path(lab.lab.state_dir) / "data" / "prestaged-bench"
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True)
        for i in range(64):
            (data / f"part-{i:02d}").write_bytes(os.urandom(1 << 20))
        for p in (data.parent, data, *data.iterdir()):
            p.chmod(0o755 if p.is_dir() else 0o644)
        keys = {**os.environ, **lab_env(cfg)}
        pushed = json.loads(_run([*SB, "stage", "push", str(data), "-A", "physics",
                                  "--as-user", JOB_USER, "--json"], keys))  # fmt: skip
        store = Store(state_db_path(cfg), create=False)
        script = f'#!/bin/sh\n#BB_LUA stage_in src={data} dst=d\ntest -d "$SLURM_BURST_STAGE_D"\n'
        warm: list[dict[str, Any]] = []
        cold: list[dict[str, Any]] = []
        node = "burst-cpu-30"
        first = _submit(env, JOB_USER, shared, "#!/bin/sh\ntrue\n", node, other)  # brings it up
        _done(env, first, timeout=300)
        for _ in range(3):
            t0 = time.monotonic()
            job = _submit(env, JOB_USER, shared, script, node, other)
            took = _to_running(env, job, t0)
            _done(env, job)
            took = _slurm_took(log, job) or took  # polled through the lab's wrapper: slower
            pull = _pull_seconds(job)
            warm.append({"job": job, "sbatch_to_running_s": round(took, 2),
                         "pull_s": round(pull, 2),
                         "minus_pull_s": round(took - pull, 2)})  # fmt: skip
        for node in ("burst-cpu-27", "burst-cpu-28", "burst-cpu-29"):
            seen = _events_after(store, 0)
            since = int(seen[-1]["id"]) if seen else 0
            t0 = time.monotonic()
            job = _submit(env, JOB_USER, shared, script, node, other)
            took = _to_running(env, job, t0)
            _done(env, job)
            took = _slurm_took(log, job) or took
            joined = _join_seconds(store, node, since)
            cold.append({"job": job, "sbatch_to_running_s": round(took, 2),
                         "request_to_joined_s": round(joined, 2),
                         "minus_boot_and_pull_s": round(took - joined, 2)})  # fmt: skip
        version = _run(["sinfo", "--version"], env).strip()
    finally:
        lab.down()
    med_warm = statistics.median(float(r["minus_pull_s"]) for r in warm)
    med_cold = statistics.median(float(r["minus_boot_and_pull_s"]) for r in cold)
    return {
        "slurm": version,
        "dataset_bytes": pushed["bytes"],
        "prestaged_sbatch_to_running_minus_boot_pull_s": round(med_warm, 2),
        "prestaged_cold_node_sbatch_to_running_minus_boot_pull_s": round(med_cold, 2),
        "node_up_already": warm,
        "cold_node": cold,
        "note": "a cold node's figure holds Slurm's pre_run poll (60-s sleeps in "
        "burst_buffer_lua.c while the job's nodes boot), not ours to shorten",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--release", help="the Slurm release the lab runs (default: the host's)")
    ap.add_argument("--burners", action="store_true", help="two CPU burners alongside")
    args = ap.parse_args()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(2 if args.burners else 0)]  # fmt: skip
    if os.geteuid() != 0:
        out: dict[str, Any] = {"prestaged_sbatch_to_running_minus_boot_pull_s": None,
                               "skipped": "needs root (the lab)"}  # fmt: skip
    else:
        try:
            out = bench(args.release)
        finally:
            for b in burners:
                b.kill()
                b.wait()
        out["burners"] = len(burners)
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return
    for k, v in out.items():
        print(f"{k:<56} {v}")


if __name__ == "__main__":
    main()
