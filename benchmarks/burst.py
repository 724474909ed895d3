"""Burst-path figures (issue 3), printed by `make bench`.

- hook latency: 1,000 runs of the installed resume hook program (a new Python process
  each, as slurmctld runs it), p50/p99; goal p99 < 300 ms. A thread writes the
  heartbeat meanwhile, as the daemon does.
- in the lab (root): resume of 1, 8 and 32 nodes through Slurm (sbatch -N N), wall
  time from the first resume request to the last node joined; sbatch -> RUNNING and
  srun -> first output on cold nodes, minus the lab's boot delay.
"""

from __future__ import annotations

import os
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


def bench_hooks(calls: int = 1000) -> None:
    from slurm_burst.adapters.state.store import Store
    from slurm_burst.services.slurmconf import hook_programs

    with tempfile.TemporaryDirectory() as tmp:
        text = LAB_CONFIG.read_text()
        for old, new in (
            ('state_dir = "/var/lib/slurm-burst-lab/daemon"', f'state_dir = "{tmp}/daemon"'),
            ('socket = "/var/lib/slurm-burst-lab/run/daemon.sock"', f'socket = "{tmp}/d.sock"'),
            ('hook_log = "/var/lib/slurm-burst-lab/log/hooks.log"', f'hook_log = "{tmp}/h.log"'),
        ):
            assert old in text, old
            text = text.replace(old, new)
        cfg = Path(tmp, "cfg.toml")
        cfg.write_text(text)
        prog = Path(tmp, "slurm-burst-resume")
        prog.write_text(hook_programs(str(cfg))["slurm-burst-resume"])
        prog.chmod(0o755)
        store = Store(Path(tmp, "daemon", "state.db"))
        stop = threading.Event()

        def beat() -> None:
            while not stop.is_set():
                store.beat(time.time(), {"pid": os.getpid()})
                stop.wait(1.0)

        t = threading.Thread(target=beat, daemon=True)
        t.start()
        samples = []
        try:
            for i in range(calls):
                node = f"burst-cpu-[{1 + i % 31}-{2 + i % 31}]"
                started = time.perf_counter()
                subprocess.run([str(prog), node], check=True, env={"PATH": "/usr/bin:/bin"})
                samples.append(time.perf_counter() - started)
        finally:
            stop.set()
            t.join()
        assert len(store.pending_requests()) == calls
    p50, p99 = pct(samples, 50) * 1000, pct(samples, 99) * 1000
    verdict = "OK" if p99 < 300 else "OVER GOAL"
    print(
        f"{'resume hook, ' + str(calls) + ' runs':<46} p50 {p50:6.1f} ms  p99 {p99:6.1f} ms"
        f"  max {max(samples) * 1000:6.1f} ms  (goal p99 < 300 ms)  {verdict}"
    )


def _slurm(*argv: str) -> str:
    env = {**os.environ, "SLURM_CONF": "/var/lib/slurm-burst-lab/etc/slurm/slurm.conf"}
    return subprocess.run(argv, check=True, capture_output=True, text=True, env=env).stdout


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


def bench_lab_burst() -> None:
    from slurm_burst.adapters.state.store import Store
    from slurm_burst.config import load_config
    from slurm_burst.core.hostlist import expand
    from slurm_burst.lab.service import Lab
    from slurm_burst.wiring import state_db_path

    cfg = load_config(LAB_CONFIG)
    lab = Lab(cfg)
    if lab.status()["up"]:
        print("lab burst benchmarks skipped: a lab is up (make lab-down first)")
        return
    delay = float(cfg.providers["lab"].options.get("boot_delay", 0))
    shared = cfg.lab.shared_dir  # type: ignore[union-attr]
    lab.up()
    try:
        store = Store(state_db_path(cfg), create=False)
        for n in (1, 8, 32):
            seen = {e["id"] for e in store.events()}
            t0 = time.time()
            job = _slurm(
                "sbatch",
                "--parsable",
                "-p",
                "burst-cpu",
                f"-N{n}",
                "-t",
                "5",
                "-D",
                shared,
                "-o",
                "/dev/null",
                "--wrap",
                "srun true",
            ).strip()
            running_at: float | None = None
            while True:
                state = _job_state(job)
                if state in ("RUNNING", "COMPLETING", "COMPLETED") and running_at is None:
                    running_at = time.time()
                if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
                    break
                time.sleep(0.1)
            nodes = expand(
                dict(
                    t.split("=", 1)
                    for t in _slurm("scontrol", "show", "job", "-o", job).split()
                    if "=" in t
                )["NodeList"]
            )
            new = [e for e in store.events() if e["id"] not in seen and e["node"] in nodes]
            req = min(float(e["at"]) for e in new if e["event"] == "node.requested")
            joined = [e["at"] for e in new if e["event"] == "node.joined"]
            assert running_at is not None, f"job {job} ended {state} without running"
            print(
                f"{'resume ' + str(n) + ' node(s) (' + state + ')':<46} request -> all joined "
                f"{max(joined) - req:6.2f} s   sbatch -> RUNNING {running_at - t0:6.2f} s "
                f"(- boot delay {delay:g} s = {running_at - t0 - delay:6.2f} s)"
            )
            _wait_released(store)
        t0 = time.time()
        proc = subprocess.Popen(
            ["srun", "-p", "burst-cpu", "-N1", "-t", "2", "hostname"],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "SLURM_CONF": str(lab.slurm_conf)},
        )
        assert proc.stdout is not None
        proc.stdout.readline()
        first = time.time() - t0
        proc.wait()
        print(
            f"{'srun on a cold node -> first output':<46} {first:6.2f} s "
            f"(- boot delay = {first - delay:6.2f} s; goal <= 5 s)"
        )
        _wait_released(store)
    finally:
        lab.down()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    bench_hooks()
    if os.geteuid() == 0:
        bench_lab_burst()
