"""What a burst policy would have done: the simulator set up from the site's config.

The cloud side is the config's node groups (CPUs and GPUs per node, the cheapest of
their sizes' prices now, their node limits) with ``policy.boot_estimate`` as the boot
delay; the policies compared are the two baselines (never burst, burst always) and the
config's own, plus a sweep of ``wait_per_dollar`` when asked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime
from typing import Any

from slurm_burst.config import Config
from slurm_burst.core.errors import BadInput
from slurm_burst.core.policy import ALWAYS, NEVER, Rule
from slurm_burst.core.pricing import dollars
from slurm_burst.core.simulate import (
    CloudGroup,
    Comparison,
    Setup,
    Summary,
    shares,
    simulate,
    summarize,
)
from slurm_burst.core.warm import DAYS
from slurm_burst.core.workload import Trace


class SimulationError(BadInput, ValueError):
    """The simulation cannot run as asked; the message says why."""

    code = "SimulationInput"


def cloud_groups(cfg: Config, at: datetime | None = None) -> tuple[CloudGroup, ...]:
    when = at or datetime.now(UTC)
    out = []
    for g in cfg.node_groups.values():
        prices = [
            p.micros_per_hour
            for size in g.size_names
            if (p := cfg.rate_table.price(size, g.gpus, when))
        ]
        if not prices:
            continue  # an unpriced group would look free: left out, said by the caller
        out.append(
            CloudGroup(
                g.name,
                cpus=g.cpus,
                gpus=g.gpus,
                price_per_hour=float(dollars(min(prices))),
                max_nodes=g.limit,
                boot=cfg.policy.boot_estimate,
                warm=g.warm_windows(),
            )
        )
    return tuple(out)


def policies(cfg: Config, sweep: Sequence[float] = ()) -> dict[str, Rule]:
    default = cfg.policy.rule()
    out = {"never": NEVER, "always": ALWAYS, "policy": default}
    for seconds in sweep:
        out[f"wait_per_dollar={seconds:g}"] = replace(default, wait_per_dollar=seconds)
    return out


def run(
    trace: Trace,
    cfg: Config,
    cpus: int,
    gpus: int,
    sweep: Sequence[float] = (),
    groups: tuple[CloudGroup, ...] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[Comparison]:
    """Every policy on ``trace``; ``groups`` the cloud (default: the config's);
    ``progress`` is told each policy's jobs arrived so far (step, done, total)."""
    groups = cloud_groups(cfg) if groups is None else groups
    if not groups:
        raise SimulationError("no node group with a price in the config: nothing to burst to")
    accounts = {a: cfg.policy.rule(account=a) for a in cfg.policy.accounts}
    results: dict[str, Summary] = {}
    waits: dict[str, tuple[float, ...]] = {}
    runs = [(name, rule, groups) for name, rule in policies(cfg, sweep).items()]
    if any(g.warm for g in groups):  # what the warm pools buy: the policy without them
        cold = tuple(replace(g, warm=()) for g in groups)
        runs.insert(3, ("policy, no warm pool", cfg.policy.rule(), cold))
    for name, rule, clouds in runs:
        rules = {} if name in ("never", "always") else accounts
        setup = Setup(cpus=cpus, gpus=gpus, groups=clouds, rule=rule, rules=rules,
                      week_origin=trace.week_origin)  # fmt: skip
        tell = (
            None if progress is None else _share_of(progress, f"simulate {name}", len(trace.jobs))
        )
        out = simulate(trace.jobs, setup, tell)
        results[name] = summarize(trace.jobs, out, setup)
        waits[name] = tuple(out.waits(trace.jobs))
    never, always = results["never"], results["always"]
    return [
        Comparison(name, s, *shares(s, never, always), waits[name]) for name, s in results.items()
    ]


def _share_of(
    progress: Callable[[str, int, int], None], step: str, n: int
) -> Callable[[float], None]:
    """The simulator's share of jobs arrived, told as ``step``: done of ``n``."""

    def tell(share: float) -> None:
        progress(step, round(share * n), n)

    return tell


def as_json(
    trace: Trace, cpus: int, gpus: int, groups: Sequence[CloudGroup], rows: list[Comparison]
) -> Any:
    return {
        "trace": {
            "source": trace.source,
            "jobs": len(trace.jobs),
            "skipped": trace.skipped,
            "max_procs": trace.max_procs,
        },
        "onprem": {"cpus": cpus, "gpus": gpus},
        "cloud": [_group_doc(g) for g in groups],
        "policies": {
            r.name: {**asdict(r.summary), "wait_cut": r.wait_cut, "cost_share": r.cost_share}
            for r in rows
        },
    }


def _group_doc(g: CloudGroup) -> dict[str, Any]:
    doc = asdict(g)
    doc["warm"] = [
        {"nodes": w.nodes, "days": [DAYS[d] for d in sorted(w.days)],
         "start": f"{w.start // 60:02d}:{w.start % 60:02d}",
         "end": f"{w.end // 60:02d}:{w.end % 60:02d}"}
        for w in g.warm
    ]  # fmt: skip
    return doc
