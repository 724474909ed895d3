"""Burst-path figures (issue 3), printed by `make bench`.

- hook latency: 1,000 runs of the installed resume hook program (a new Python process
  each, as slurmctld runs it), p50/p99; goal p99 < 300 ms. A thread writes the
  heartbeat meanwhile, as the daemon does.
- in the lab (root), on the host's Slurm: sbatch -> RUNNING on 1 and 8 cold nodes (3
  runs each, median) and srun -> first output on 1, minus the lab's boot delay (goal
  <= 5 s: the PrologSlurmctld lets Slurm launch the batch job when its nodes register,
  issue 15); then 32 nodes: resume request -> all joined.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAB_CONFIG = ROOT / "slurm-conf" / "lab" / "slurm-burst.toml"


def pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def bench_hooks(calls: int = 1000, locked: bool = False, dynamic_nodes: int = 0) -> None:
    """The resume hook run as slurmctld runs it, ``calls`` times; ``locked``: with the
    state database write-locked by another connection all along, so every request goes
    to the spool after daemon.hook_db_timeout (0.5 s here) and must be found there.
    ``dynamic_nodes``: the config also has a dynamic group of that many nodes, and the
    hook is asked for its nodes (benchmarks/dynamic.py)."""
    from slurm_burst.adapters.state.requestspool import RequestSpool
    from slurm_burst.adapters.state.store import Store
    from slurm_burst.core.records import StoreError
    from slurm_burst.services.slurmconf import hook_programs

    with tempfile.TemporaryDirectory() as tmp:
        text = LAB_CONFIG.read_text()
        for old, new in (
            ('state_dir = "/var/lib/slurm-burst-lab/daemon"', f'state_dir = "{tmp}/daemon"'),
            ('socket = "/var/lib/slurm-burst-lab/run/daemon.sock"', f'socket = "{tmp}/d.sock"'),
            ('hook_log = "/var/lib/slurm-burst-lab/log/hooks.log"', f'hook_log = "{tmp}/h.log"'),
            ('spool_dir = "/var/lib/slurm-burst-lab/run/spool"', f'spool_dir = "{tmp}/spool"'),
            # locked: no heartbeat can be written while the lock is held, so the daemon
            # counts as alive for the whole run (here the spool is measured, not staleness)
            ("heartbeat_stale = 60", "heartbeat_stale = 600\nhook_db_timeout = 0.5" if locked
             else "heartbeat_stale = 60"),
            *([("[slurm]\n", f"[slurm]\nmax_node_count = {dynamic_nodes + 1000}\n")]
              if dynamic_nodes else []),
        ):  # fmt: skip
            assert old in text, old
            text = text.replace(old, new)
        if dynamic_nodes:
            from dynamic import group_toml

            text += group_toml(dynamic_nodes)
        cfg = Path(tmp, "cfg.toml")
        cfg.write_text(text)
        prog = Path(tmp, "slurm-burst-resume")
        prog.write_text(hook_programs(str(cfg))["slurm-burst-resume"])
        prog.chmod(0o755)
        store = Store(Path(tmp, "daemon", "state.db"))
        stop = threading.Event()

        def beat() -> None:
            while not stop.is_set():
                with contextlib.suppress(StoreError):  # locked: the daemon
                    store.beat(time.time(), {"pid": os.getpid()})  # waits too
                stop.wait(1.0)

        t = threading.Thread(target=beat, daemon=True)
        t.start()
        holder = None
        if locked:
            time.sleep(0.1)  # the first beat is in
            holder = sqlite3.connect(Path(tmp, "daemon", "state.db"), isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")
        samples = []
        try:
            for i in range(calls):
                k = i % min(31, dynamic_nodes - 1) if dynamic_nodes else i % 31
                node = (f"dyn-[{1 + k:04d}-{2 + k:04d}]" if dynamic_nodes
                        else f"burst-cpu-[{1 + k}-{2 + k}]")  # fmt: skip
                started = time.perf_counter()
                done = subprocess.run([str(prog), node], env={"PATH": "/usr/bin:/bin"},
                                      stderr=subprocess.PIPE, text=True)  # fmt: skip
                samples.append(time.perf_counter() - started)
                assert done.returncode == (4 if locked else 0), (done.returncode, done.stderr)
        finally:
            if holder is not None:
                holder.execute("ROLLBACK")
            stop.set()
            t.join()
        kept = len(RequestSpool(Path(tmp, "spool")).pending()) if locked else 0
        assert len(store.pending_requests()) + kept == calls, "a request was lost"
    p50, p99 = pct(samples, 50) * 1000, pct(samples, 99) * 1000
    goal = 800 if locked else 300  # locked: hook_db_timeout (500 ms) + the spool's fsyncs
    verdict = "OK" if p99 < goal else "OVER GOAL"
    what = (
        f"resume hook, {calls} runs"
        + (", database locked" if locked else "")
        + (f", a {dynamic_nodes}-node dynamic group" if dynamic_nodes else "")
    )
    print(
        f"{what:<46} p50 {p50:6.1f} ms  p99 {p99:6.1f} ms"
        f"  max {max(samples) * 1000:6.1f} ms  (goal p99 < {goal} ms)  {verdict}"
        + (f"  {kept} of {calls} in the spool" if locked else "")
    )


# the lab's slurm.conf, and the commands of the Slurm release it runs first on PATH
SLURM_ENV = {
    **os.environ,
    "SLURM_CONF": "/var/lib/slurm-burst-lab/etc/slurm/slurm.conf",
    "PATH": f"/var/lib/slurm-burst-lab/slurm/bin:{os.environ.get('PATH', '/usr/bin:/bin')}",
}


def _slurm(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, env=SLURM_ENV).stdout


def _job_state(job: str) -> str:
    out = _slurm("scontrol", "show", "job", "-o", job)
    return dict(t.split("=", 1) for t in out.split() if "=" in t)["JobState"]


def _wait_released(store: object, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = _slurm("sinfo", "-h", "-p", "burst-cpu", "-o", "%T")
        busy = [s for s in out.split() if s != "idle~"]
        if not busy and all(r.state == "terminated" for r in store.nodes()):  # type: ignore[attr-defined]
            return
        time.sleep(1)
    raise TimeoutError("burst nodes were not released")


def _sbatch_to_running(nodes: str, n: int, shared: str) -> tuple[str, float, float]:
    """Submit an ``n``-node batch job onto cold ``nodes``; return (job, seconds to RUNNING,
    seconds to done)."""
    t0 = time.time()
    job = _slurm("sbatch", "--parsable", "-p", "burst-cpu", f"-N{n}", "-w", nodes, "-t", "5",
                 "-D", shared, "-o", "/dev/null", "--wrap", "true").strip()  # fmt: skip
    running_at: float | None = None
    while True:
        state = _job_state(job)
        if state in ("RUNNING", "COMPLETING", "COMPLETED") and running_at is None:
            running_at = time.time()
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            break
        time.sleep(0.05)
    assert running_at is not None, f"job {job} ended {state} without running"
    return job, running_at - t0, time.time() - t0


def _srun_first_output(node: str) -> float:
    t0 = time.time()
    proc = subprocess.Popen(
        ["srun", "-p", "burst-cpu", "-N1", "-w", node, "-t", "2", "hostname"],
        stdout=subprocess.PIPE,
        text=True,
        env=SLURM_ENV,
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    first = time.time() - t0
    proc.wait()
    return first


def _quiet(timeout: float = 120) -> None:
    """Until no burst node is powering up or down: a run measures itself, not the tail
    of the one before."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = _slurm("sinfo", "-h", "-N", "-p", "burst-cpu", "-o", "%T").split()
        if not [s for s in states if s.endswith(("#", "%", "!")) or "POWER" in s.upper()]:
            return
        time.sleep(0.5)


def bench_lab_burst(
    releases: tuple[str, ...] = ("22.05", "24.11", "26.05"), wide: bool = True
) -> None:
    """The figures below on each Slurm release the lab runs (the 32-node resume on the
    host's only, if ``wide``: it measures the daemon, not Slurm)."""
    from slurm_burst_lab.service import Lab

    from slurm_burst.config import load_config

    if Lab(load_config(LAB_CONFIG)).status()["up"]:
        print("lab burst benchmarks skipped: a lab is up (make lab-down first)")
        return
    for release in releases:
        _bench_lab_burst(release, wide=wide and release == releases[0])
    # the same on the host's release with two CPU burners beside it (BENCH_BURNERS=0: no)
    burners = int(os.environ.get("BENCH_BURNERS", "2"))
    if burners:
        procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                 for _ in range(burners)]  # fmt: skip
        try:
            _bench_lab_burst(releases[0], wide=False, label=f"{burners} CPU burners")
        finally:
            for p in procs:
                p.kill()
                p.wait()


def _bench_lab_burst(release: str, wide: bool, label: str = "") -> None:
    """Cold nodes each run (a fresh -w list), so no run waits for SuspendTime; the
    32-node resume comes last, once every node is powered down again."""
    import statistics

    from slurm_burst_lab.service import Lab

    from slurm_burst.adapters.state.store import Store
    from slurm_burst.config import load_config
    from slurm_burst.wiring.light import state_db_path

    cfg = load_config(LAB_CONFIG)
    lab = Lab(cfg, release=release)
    delay = float(cfg.providers["lab"].options.get("boot_delay", 0))
    shared = lab.lab.shared_dir
    lab.up(timeout=120)
    try:
        version = _slurm("sinfo", "--version").strip()
        store = Store(state_db_path(cfg), create=False)
        plans = {1: ["burst-cpu-1", "burst-cpu-2", "burst-cpu-3"],
                 8: ["burst-cpu-[4-11]", "burst-cpu-[12-19]", "burst-cpu-[20-27]"]}  # fmt: skip
        firsts = []
        for i in (28, 29, 30):
            _quiet()
            firsts.append(_srun_first_output(f"burst-cpu-{i}"))
        med = statistics.median(firsts) - delay
        tag = release + (f", {label}" if label else "")
        what = f"srun, 1 cold node -> first output ({tag})"
        print(
            f"{what:<46} median {med + delay:6.2f} s "
            f"- boot delay {delay:g} s = {med:5.2f} s  (runs "
            f"{', '.join(f'{x:.2f}' for x in firsts)})"
        )
        for n, lists in plans.items():
            samples = []
            for nodes in lists:
                _quiet()
                samples.append(_sbatch_to_running(nodes, n, shared)[1])
            med = statistics.median(samples) - delay
            what = f"sbatch -> RUNNING, {n} cold node(s) ({tag})"
            print(
                f"{what:<46} median {med + delay:6.2f} s "
                f"- boot delay {delay:g} s = {med:5.2f} s  (goal <= 5 s; {version}; "
                f"runs {', '.join(f'{x:.2f}' for x in samples)})  "
                f"{'OK' if med <= 5 else 'OVER GOAL'}"
            )
        if not wide:
            return
        _wait_released(store)
        seen = {e["id"] for e in store.events()}
        _, to_running, _ = _sbatch_to_running("burst-cpu-[1-32]", 32, shared)
        new = [e for e in store.events() if e["id"] not in seen]
        req = min(float(e["at"]) for e in new if e["event"] == "node.requested")
        joined = [e["at"] for e in new if e["event"] == "node.joined"]
        print(
            f"{'resume 32 nodes':<46} request -> all joined {max(joined) - req:6.2f} s   "
            f"sbatch -> RUNNING {to_running:6.2f} s (- boot delay = {to_running - delay:6.2f} s)"
        )
    finally:
        lab.down()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    bench_hooks()
    if os.geteuid() == 0:
        bench_lab_burst()
