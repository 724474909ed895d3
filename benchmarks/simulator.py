"""The simulator's figures (issue 33): never, always and the example config's policy
together on every trace in shared/traces with the daemon's recheck every 10 s (the lab's)
and every 300 s (the default), in CPU seconds, with the policy's decisions counted (the
work that grew with a trace's span); a year of SDSC-BLUE (goal <= 10 s) and all of it
(goal <= 30 s); three jobs of 10**9 s (goal < 1 s); the largest resident memory (goal
<= 1 GB).

    python benchmarks/simulator.py [TRACE ...]
"""

from __future__ import annotations

import gzip
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sizes import QUICK  # noqa: E402

from slurm_burst.config import load_config  # noqa: E402
from slurm_burst.core.policy import ALWAYS, NEVER, Rule  # noqa: E402
from slurm_burst.core.simulate import CloudGroup, Setup, simulate  # noqa: E402
from slurm_burst.core.workload import Trace, TraceJob, parse_alibaba, parse_swf  # noqa: E402
from slurm_burst.services.simulation import cloud_groups  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces"
CONFIG = ROOT / "slurm-conf" / "example" / "slurm-burst.toml"
YEAR = 365 * 86400.0
EXAMPLE = load_config(CONFIG)


def load(path: Path) -> tuple[Trace, int, int]:
    parser = parse_alibaba if path.name.startswith("alibaba") else parse_swf
    with gzip.open(path, "rt") as fh:
        trace = parser(fh, path.name)
    if path.name.startswith("alibaba"):
        return trace, 1_000_000, 40
    return trace, trace.max_procs or 1, 0


def three(jobs: list[TraceJob], trace: Trace, cpus: int, gpus: int, recheck: float) -> tuple[
    float, int
]:  # fmt: skip
    """CPU seconds for never, always and the policy; the policy's decisions."""
    cfg = EXAMPLE
    groups = cloud_groups(cfg)
    policy = replace(cfg.policy.rule(), recheck=recheck)
    accounts = {a: replace(cfg.policy.rule(account=a), recheck=recheck)
                for a in cfg.policy.accounts}  # fmt: skip
    t = time.process_time()
    decisions = 0
    for rule, rules in ((NEVER, {}), (ALWAYS, {}), (policy, accounts)):
        setup = Setup(cpus=cpus, gpus=gpus, groups=groups, rule=rule, rules=rules,
                      week_origin=trace.week_origin)  # fmt: skip
        decisions = simulate(jobs, setup).decisions
    return time.process_time() - t, decisions


def main() -> None:
    names = sys.argv[1:] or sorted(p.name for p in TRACES.glob("*.gz"))
    if QUICK and not sys.argv[1:]:  # the smallest trace
        names = sorted(names, key=lambda n: (TRACES / n).stat().st_size)[:1]
    if not TRACES.is_dir():
        print(f"simulator: {TRACES} not found, skipped")
        return
    for name in names:
        trace, cpus, gpus = load(TRACES / name)
        for recheck in (10.0, 300.0):
            cpu, decisions = three(trace.jobs, trace, cpus, gpus, recheck)
            goal = "  (goal <= 30 s)" if name.startswith("SDSC-BLUE") else ""
            print(f"simulate {name}: {len(trace.jobs):,} jobs, recheck {recheck:g} s: never, "
                  f"always, policy in {cpu:.1f} s CPU ({decisions:,} decisions){goal}")  # fmt: skip
        if name.startswith("SDSC-BLUE"):
            year = [j for j in trace.jobs if j.submit < trace.jobs[0].submit + YEAR]
            cpu, decisions = three(year, trace, cpus, gpus, 10.0)
            print(f"simulate {name}, its first year: {len(year):,} jobs, recheck 10 s: "
                  f"{cpu:.1f} s CPU ({decisions:,} decisions; goal <= 10 s)")  # fmt: skip
    long = [TraceJob(str(k), float(k), 1e9, 1e9, 1) for k in range(3)]
    setup = Setup(cpus=1, groups=(CloudGroup("c", 1, 0, 0.01, 10),), rule=Rule(recheck=10.0))
    t = time.process_time()
    out = simulate(long, setup)
    print(f"simulate three jobs of 10**9 s, recheck 10 s: {time.process_time() - t:.4f} s CPU "
          f"({out.decisions} decisions; goal < 1 s)")  # fmt: skip
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"simulator max RSS {rss:,.0f} MiB (goal <= 1,024 MiB)")


if __name__ == "__main__":
    main()
