"""`make bench`: print the figures the issues ask for.

Hostlists: expand 100,000 names and compress them back (goal <= 0.5 s).
Lab (root): `lab up` (goal <= 60 s), `lab down` (goal <= 10 s), and namespace VM
create -> sshd accepting (goal <= 1 s + the boot delay). Timings are wall clock,
best and median of several runs; the lab is brought up/down here, so run it
with no lab of yours up.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sizes  # noqa: E402

from slurm_burst.core.hostlist import compress, expand  # noqa: E402


def timed(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return min(samples), statistics.median(samples)


def report(name: str, best: float, median: float, goal: float | None = None) -> None:
    verdict = "" if goal is None else ("  OK" if median <= goal else "  OVER GOAL")
    goal_s = "" if goal is None else f"  (goal <= {goal:g} s)"
    print(f"{name:<46} best {best:8.4f} s  median {median:8.4f} s{goal_s}{verdict}")


def bench_hostlist() -> None:
    expr = "gpu-[00001-50000],cpu-a[1-25000]-[1-2]"
    names = expand(expr)
    assert len(names) == 100_000
    report("hostlist expand 100,000 names", *timed(lambda: expand(expr), 7))
    report("hostlist compress 100,000 names", *timed(lambda: compress(names), 7))
    report(
        "hostlist expand + compress (round trip)",
        *timed(lambda: compress(expand(expr)), 7),
        goal=0.5,
    )
    shuffled = names[::-1]
    report(
        "hostlist compress sorted (hostlistsorted)",
        *timed(lambda: compress(shuffled, sort=True), 5),
    )


def bench_trace_stream(megabytes: int = 512) -> None:
    """`simulate` on a gzip of ``megabytes`` MiB of blank lines (a few hundred KB): the
    reader streams it and stops at its line cap, so time and memory stay small (it
    read the whole file into memory and split it: MemoryError near 1 GiB)."""
    import gzip
    import resource

    sb = str(Path(sys.executable).parent / "slurm-burst")
    with tempfile.TemporaryDirectory() as tmp:
        bomb = Path(tmp, "blank.swf.gz")
        with gzip.open(bomb, "wb", compresslevel=1) as fh:
            chunk = b"\n" * (1 << 20)
            for _ in range(megabytes):
                fh.write(chunk)
        packed = bomb.stat().st_size >> 10
        t = time.perf_counter()
        argv = [sb, "simulate", "--trace", str(bomb), "--format", "swf", "--cpus", "64"]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp)
        took = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest child
    assert done.returncode == 2 and "lines" in done.stderr, done.stderr
    what = f"simulate, {megabytes} MiB of blank lines ({packed} KiB .gz)"
    print(f"{what:<46} refused in {took:5.1f} s, max RSS {rss:5.0f} MiB (goal: no MemoryError)")


def bench_lab(runs: int = 3) -> None:
    from slurm_burst_lab.service import Lab

    from slurm_burst.adapters.cloud.registry import driver_class
    from slurm_burst.config import load_config

    lab = Lab(load_config(ROOT / "slurm-conf" / "lab" / "slurm-burst.toml"))
    if lab.status()["up"]:
        print("lab benchmarks skipped: a lab is up (make lab-down first)")
        return
    ups, downs = [], []
    for _ in range(runs):
        t = time.perf_counter()
        lab.up()
        ups.append(time.perf_counter() - t)
        t = time.perf_counter()
        lab.down()
        downs.append(time.perf_counter() - t)
    report("lab up (to on-prem idle, burst idle~)", min(ups), statistics.median(ups), goal=60)
    report("lab down (everything removed)", min(downs), statistics.median(downs), goal=10)

    delay = 1.0
    with tempfile.TemporaryDirectory() as tmp:
        cloud = driver_class("nscloud")(
            state_dir=f"{tmp}/cloud", bridge="sbb-br0", subnet="10.253.0.0/24", boot_delay=delay
        )
        size = next(s for s in cloud.list_sizes() if s.id == "ns.cpu2")
        image = cloud.list_images()[0]
        samples = []
        try:
            for i in range(5):
                t = time.perf_counter()
                node = cloud.create_node(f"bench-{i}", size, image)
                ip = node.public_ips[0]
                while True:
                    try:
                        with socket.create_connection((ip, 22), timeout=0.2) as s:
                            if s.recv(4) == b"SSH-":
                                break
                    except OSError:
                        time.sleep(0.01)
                samples.append(time.perf_counter() - t)
                cloud.destroy_node(node)
        finally:
            cloud.ex_teardown()
    over = [s - delay for s in samples]
    report(
        f"VM create -> sshd banner (boot delay {delay:g} s)",
        min(samples),
        statistics.median(samples),
    )
    report("  of which beyond the boot delay", min(over), statistics.median(over), goal=1.0)


FAILED: list[str] = []


def script(name: str, *args: str) -> None:
    """``benchmarks/NAME.py ARGS`` in a process of its own; a failure is said, and counted."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *args],
                          check=False)  # fmt: skip
    if done.returncode != 0:
        FAILED.append(f"{name}.py (exit {done.returncode})")
        print(f"benchmark {name}.py failed: exit {done.returncode}", file=sys.stderr)


def main(quick: bool) -> int:
    """Every benchmark; ``quick``: each at a size that runs in seconds (sizes.py)."""
    if quick:
        os.environ[sizes.VARIABLE] = "1"  # the benchmarks' own processes
        sizes.QUICK = True
    mode = " (quick: small sizes, not the issues' figures)" if quick else ""
    print(f"slurm-burst benchmarks on {os.cpu_count()} CPU(s){mode}\n")
    bench_hostlist()
    # the ledger: 10M charge rows per database by default (BENCH_LEDGER_ROWS to change)
    rows = "20000" if quick else os.environ.get("BENCH_LEDGER_ROWS", "10000000")
    script("ledger", "--rows", rows)
    # one reconcile pass over 20,000 cloud nodes and 100,000 pending jobs
    script("reconcile", *(["--nodes", "500", "--jobs", "2000"] if quick else []))
    # resume of 1,000 nodes against the EC2 emulator: batched launch vs one call per node
    script("launch", *(["--nodes", "20", "--loaded-runs", "1"] if quick else []))
    # a 1,000-node burst within EC2's API buckets, then GCE's rate quotas, then ARM's
    # buckets, hook to all joined (about 3 min each); and 5,000 on each
    # (BENCH_SCALE_5000=1: 15 min more)
    for provider in ("ec2", "gce", "azure"):
        script("scale", "--provider", provider, "--json",
               *(["--nodes", "20", "--boot", "5", "--console", "2", "--join", "2"] if quick
                 else ["--nodes", "1000"]))  # fmt: skip
    if not quick and os.environ.get("BENCH_SCALE_5000"):
        for provider in ("ec2", "gce", "azure"):
            script("scale", "--provider", provider, "--json", "--nodes", "5000")
    # side by side with aws-plugin-for-slurm (a checkout named by AWS_PLUGIN_FOR_SLURM;
    # said and skipped without one)
    script("versus", *(["--nodes", "20", "--runs", "1"] if quick else []))
    # spot refused -> on-demand, and the calls a placement adds per job: EC2, GCE, Azure
    script("capacity")
    script("capacity", "--provider", "gce")
    script("capacity", "--provider", "azure")
    # the burst policy: one pass over 100,000 pending jobs; the simulator on both traces
    script("policy")
    # the simulator in seconds, whatever the recheck (issue 33)
    script("simulator")
    # the GPU check (8 GPUs, simulated NVML) and one telemetry pass over 1,000 GPU nodes
    script("gpu")
    # the runtime step and the image load a join adds (issue 54)
    script("runtime")
    # one scrape of a 20,000-node daemon state: its series and its CPU
    script("metrics")
    # staging: re-stage of an unchanged tree, corrupted fetches, push vs rclone copy
    # through a 200 Mbit/s shaped link (root), one JSON object
    script("staging", "--json", *(["--quick", "--trials", "20"] if quick else []))
    # what any user's script costs slurmctld in burst_buffer.lua (22.05's and 26.05's calls)
    script("submit_hook", "--json", *(["--quick"] if quick else []))
    # one node attacking the node API and a mesh store; a well-behaved node's latency
    script("served_attacks", "--json", *(["--requests", "50"] if quick else []))
    # staging in the lab (root, no lab up): pre-staged data, sbatch -> RUNNING minus
    # boot and pull, on a node up already and on a cold one
    script("prestaged", "--json")
    import burst

    burst.bench_hooks(calls=sizes.size(1000, 20))
    burst.bench_hooks(calls=sizes.size(100, 10), locked=True)
    for _ in range(sizes.size(2, 1)):
        bench_trace_stream(sizes.size(512, 8))
    if os.geteuid() == 0:
        bench_lab(runs=sizes.size(3, 1))
        # cloud-to-cloud throughput direct and through the hub; notice -> the job's signal
        script("cloudnet")
        # dynamic nodes: scontrol create + delete of 1,000 on 24.11 and 26.05's slurmctld;
        # the resume hook's p99 with and without a 1,000-node dynamic group
        script("dynamic")
        # MPI across 4 cloud nodes: allreduce direct, through the hub, raw; steps/s on 2
        # and 4 nodes; make demo-training's reclaim (its notice -> training again)
        script("training", *(["--no-demo"] if quick else []))
        if quick:
            os.environ["BENCH_BURNERS"] = "0"
        if quick:  # the host's release, no 32-node resume
            burst.bench_lab_burst(("22.05",), wide=False)
        else:
            burst.bench_lab_burst()
    else:
        print("lab benchmarks skipped: they need root")
    if FAILED:
        print(f"{len(FAILED)} benchmark(s) failed: {', '.join(FAILED)}", file=sys.stderr)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv[1:]))
