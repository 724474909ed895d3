"""The burst policy tuned on a site's own history: the first part of a trace (by submit
time) to tune on, the rest held out to say what the tuned setting does on jobs it has not
seen, with the site's node groups, prices, spend cap and budgets (core.tuning searches;
the simulator measures).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from multiprocessing import get_context
from typing import Any

from slurm_burst.config import Config
from slurm_burst.config.model import PolicyConfig
from slurm_burst.core.policy import ALWAYS, NEVER, Rule
from slurm_burst.core.simulate import (
    MONTH,
    CloudGroup,
    Setup,
    Summary,
    shares,
    simulate,
    summarize,
)
from slurm_burst.core.tuning import (
    Knobs,
    Point,
    Space,
    best_within,
    bisect_burst_share,
    bisect_wait_per_dollar,
    cheapest,
    frontier,
)
from slurm_burst.core.workload import Trace, TraceJob
from slurm_burst.services.simulation import SimulationError, cloud_groups

GOAL_CUT, GOAL_COST = 0.9, 0.5  # the goal: 90 % of the wait cut at half the cost
# Under a minute of mean wait to cut (a cloud node boots in more), a share of the cut
# says nothing: the held-out part has nothing worth bursting for.
MIN_CUT = 60.0


@dataclass(frozen=True)
class Bench:
    """What a setting is measured against: the on-prem pool, the cloud, the money."""

    policy: PolicyConfig
    groups: tuple[CloudGroup, ...]
    cpus: int
    gpus: int
    week_origin: int = 0
    spend_cap: float | None = None  # dollars a month
    budgets: Mapping[str, float] = field(default_factory=dict)  # dollars a month
    warm_tables: Mapping[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)

    def rules(self, knobs: Knobs | None) -> tuple[Rule, dict[str, Rule]]:
        """The default rule and the per-account ones, the config's or with ``knobs``."""
        p = self.policy
        if knobs is not None:
            p = replace(p, wait_per_dollar=knobs.wait_per_dollar, min_wait=knobs.min_wait,
                        wait_factor=knobs.wait_factor, burst_share=knobs.burst_share)  # fmt: skip
        return p.rule(), {a: p.rule(account=a) for a in p.accounts}

    def setup(self, rule: Rule, rules: Mapping[str, Rule], warm: float, money: bool) -> Setup:
        groups = self.groups
        if warm != 1.0:
            groups = tuple(replace(g, warm=tuple(replace(w, nodes=round(w.nodes * warm))
                                                 for w in g.warm if round(w.nodes * warm)))
                           for g in groups)  # fmt: skip
        return Setup(cpus=self.cpus, gpus=self.gpus, groups=groups, rule=rule, rules=rules,
                     week_origin=self.week_origin,
                     spend_cap=self.spend_cap if money else None,
                     budgets=self.budgets if money else {})  # fmt: skip

    def run(self, jobs: Sequence[TraceJob], name: str, knobs: Knobs | None = None) -> Summary:
        """``never``, ``always``, ``policy`` (the config's) or ``tuned`` (``knobs``)."""
        if name == "never":
            setup = self.setup(NEVER, {}, 0.0, money=False)
        elif name == "always":
            setup = self.setup(ALWAYS, {}, 1.0, money=False)
        else:
            rule, rules = self.rules(knobs)
            setup = self.setup(rule, rules, knobs.warm if knobs else 1.0, money=True)
        return summarize(jobs, simulate(jobs, setup), setup)


@dataclass(frozen=True)
class Figures:
    """A policy on one part of the trace, beside never-burst and burst-always there."""

    summary: Summary
    wait_cut: float | None
    cost_share: float | None
    dollars_per_month: float


@dataclass(frozen=True)
class Tuning:
    tuned: Knobs
    reached: bool  # the target was reached on the tuning part
    points: tuple[Point, ...]  # every setting measured
    tuning: dict[str, Figures]  # never, always, policy, tuned on the tuning part
    held_out: dict[str, Figures]  # the same on the held-out part
    tuning_jobs: int
    held_out_jobs: int
    target: float
    checked: tuple[Point, ...] = ()  # each combination's best, on the tuning part's latest third

    @property
    def held_out_cut(self) -> float:
        """Seconds of mean wait burst-always cuts on the held-out part."""
        return max(0.0, self.held_out["never"].summary.mean_wait
                   - self.held_out["always"].summary.mean_wait)  # fmt: skip

    @property
    def goal_met(self) -> bool | None:
        """The issue's goal on the held-out part: >= 90 % of the cut at <= 50 % cost
        (None: burst-always cuts under ``MIN_CUT`` seconds there, nothing to share)."""
        if self.held_out_cut < MIN_CUT:
            return None
        t = self.held_out["tuned"]
        return (t.wait_cut is None or t.wait_cut >= GOAL_CUT) and (
            t.cost_share is None or t.cost_share <= GOAL_COST
        )

    @property
    def verdict(self) -> str:
        met = self.goal_met
        return "nothing to cut" if met is None else "met" if met else "missed"

    @property
    def frontier(self) -> list[Point]:
        return frontier(self.points)

    @property
    def goal_reachable(self) -> bool:
        """Some setting measured on the tuning part met the goal there: on the part the
        settings were fitted on and, where there is one, on the latest third they were
        checked on (a load that moved within the tuning part shows there)."""
        return self.goal_on_fit and (not self.checked or _meets_goal(self.checked))

    @property
    def goal_on_fit(self) -> bool:
        """A setting met the goal on the part the settings were fitted on."""
        return _meets_goal(self.points)


def _meets_goal(points: Sequence[Point]) -> bool:
    """One of ``points`` reaches the goal's cut within its cost."""
    p = best_within(points, GOAL_COST)
    return p is not None and p.reaches(GOAL_CUT)


def split(trace: Trace, share: float) -> tuple[list[TraceJob], list[TraceJob]]:
    """The first ``share`` of the jobs by submit time, and the rest."""
    k = min(len(trace.jobs) - 1, max(1, round(len(trace.jobs) * share)))
    return trace.jobs[:k], trace.jobs[k:]


def bench(
    trace: Trace,
    cfg: Config,
    cpus: int,
    gpus: int,
    budgets: Mapping[str, float] | None = None,
    spend_cap: float | None = None,
) -> Bench:
    groups = cloud_groups(cfg)
    if not groups:
        raise SimulationError("no node group with a price in the config: nothing to burst to")
    cap = spend_cap if spend_cap is not None else (cfg.policy.spend_cap or None)
    tables = {g.name: tuple((w.name, w.nodes) for w in g.warm.values())
              for g in cfg.node_groups.values() if g.warm}  # fmt: skip
    return Bench(cfg.policy, groups, cpus, gpus, trace.week_origin, cap, dict(budgets or {}),
                 tables)  # fmt: skip


@dataclass(frozen=True)
class _Part:
    """A part of the trace with its never-burst and burst-always figures."""

    jobs: list[TraceJob]
    never: Summary
    always: Summary

    @property
    def cuts(self) -> bool:
        return self.never.mean_wait > self.always.mean_wait


_BENCH: tuple[Bench, _Part, _Part | None] | None = None  # a worker's


def _measure(b: Bench, part: _Part, k: Knobs) -> Point:
    s = b.run(part.jobs, "tuned", k)
    cut, share = shares(s, part.never, part.always)
    return Point(k, cut, share, s.cloud_cost, s.mean_wait, s.p95_wait)


def _combo(args: tuple[str, float, float, float, float, Space]) -> tuple[list[Point], Point | None]:
    """The points one combination's bisection measured on the fitting part, and its best
    setting measured on the checking part (None: there is none)."""
    assert _BENCH is not None
    b, fit, check = _BENCH
    kind, min_wait, wait_factor, warm, target, space = args

    def measure(k: Knobs) -> Point:
        return _measure(b, fit, k)

    if kind == "burst_share":
        points = bisect_burst_share(measure, target, min_wait, warm, space)
    else:
        points = bisect_wait_per_dollar(measure, target, min_wait, wait_factor, warm, space)
    if check is None:
        return points, None
    pick = cheapest(points, target) or max(points, key=lambda p: (p.wait_cut or 0.0, -p.cost))
    return points, _measure(b, check, pick.knobs)


def _init(state: tuple[Bench, _Part, _Part | None]) -> None:
    global _BENCH
    _BENCH = state


CHECK_SHARE = 1 / 3  # of the tuning part: the latest jobs, each combination's best checked


def tune(
    trace: Trace,
    b: Bench,
    target: float = GOAL_CUT,
    share: float = 0.5,
    space: Space | None = None,
    workers: int = 0,
    progress: Callable[[str, int, int], None] | None = None,
) -> Tuning:
    """Tune on the first ``share`` of ``trace``'s jobs, measure on the rest. Within the
    tuning part, each combination is bisected on its first two thirds and its best
    setting checked on its last third (the latest jobs, as a held-out part would be):
    the cheapest setting that reaches ``target`` there wins, so a setting that only fits
    the older jobs' load loses to one that holds as the load moves. ``workers``:
    processes measuring settings side by side (0: one per CPU)."""
    if len(trace.jobs) < 2:
        raise SimulationError("a trace of at least two jobs is needed to tune and to hold out")
    space = space or _space(b)
    first, rest = split(trace, share)
    tell = progress or (lambda step, done, total: None)
    tell("baselines", 0, 4)
    whole = _Part(first, b.run(first, "never"), b.run(first, "always"))
    k = len(first) - round(len(first) * CHECK_SHARE)
    fit_jobs, check_jobs = first[:k], first[k:]
    fit: _Part | None = None
    check: _Part | None = None
    if len(check_jobs) >= 2 and len(fit_jobs) >= 2:
        fit = _Part(fit_jobs, b.run(fit_jobs, "never"), b.run(fit_jobs, "always"))
        check = _Part(check_jobs, b.run(check_jobs, "never"), b.run(check_jobs, "always"))
    if fit is None or not fit.cuts:
        fit = whole  # too few jobs, or nothing to cut in the older part: tune on it all
    if check is not None and not check.cuts:
        check = None  # nothing to cut in the latest part: it cannot choose
    combos = space.combos()
    points: list[Point] = []
    checked: list[Point] = []
    if not fit.cuts:  # nothing to cut: the most frugal setting
        points = [_measure(b, fit, Knobs(space.high, *combos[0][1:]))]
    else:
        global _BENCH
        _BENCH = (b, fit, check)
        n = min(workers or os.cpu_count() or 1, len(combos))
        args = [(kind, m, f, w, target, space) for kind, m, f, w in combos]
        tell("tuning", 0, len(combos))
        found: Iterable[tuple[list[Point], Point | None]]
        if n <= 1:
            found = map(_combo, args)
            pool = None
        else:
            pool = ProcessPoolExecutor(n, mp_context=get_context("fork"), initializer=_init,
                                       initargs=(_BENCH,))  # fmt: skip
            found = pool.map(_combo, args)
        try:
            for done, (measured, check_point) in enumerate(found, start=1):
                points += measured
                if check_point is not None:
                    checked.append(check_point)
                tell("tuning", done, len(combos))
        finally:
            if pool is not None:
                pool.shutdown()
            _BENCH = None
    if checked:
        best = cheapest(checked, target)
        reached = best is not None
        if best is None:
            best = max(checked, key=lambda p: (p.wait_cut or 0.0, -p.cost))
    else:
        best = cheapest(points, target)
        reached = best is not None
        if best is None:  # the setting that comes closest
            best = max(points, key=lambda p: (p.wait_cut or 0.0, -p.cost))
    tell("held out", 0, 4)
    figures_first = _figures(b, first, best.knobs, whole.never, whole.always)
    figures_rest = _figures(b, rest, best.knobs)
    tell("held out", 4, 4)
    return Tuning(best.knobs, reached, tuple(points), figures_first, figures_rest, len(first),
                  len(rest), target, tuple(checked))  # fmt: skip


def _space(b: Bench) -> Space:
    warm = (0.0, 1.0, 2.0) if any(g.warm for g in b.groups) else (1.0,)
    m = b.policy.min_wait
    return Space(min_waits=tuple(sorted({0.0, m, max(1800.0, m)})), warm=warm,
                 share_cap=b.policy.wait_per_dollar or 3600.0)  # fmt: skip


def _figures(
    b: Bench,
    jobs: list[TraceJob],
    knobs: Knobs,
    never: Summary | None = None,
    always: Summary | None = None,
) -> dict[str, Figures]:
    never = never or b.run(jobs, "never")
    always = always or b.run(jobs, "always")
    runs = {"never": never, "always": always, "policy": b.run(jobs, "policy"),
            "tuned": b.run(jobs, "tuned", knobs)}  # fmt: skip
    months = max(_span(jobs), 1.0) / MONTH
    return {
        name: Figures(s, *shares(s, never, always), s.cloud_cost / months)
        for name, s in runs.items()
    }


def _span(jobs: Sequence[TraceJob]) -> float:
    return max(j.submit + j.run for j in jobs) - jobs[0].submit if jobs else 0.0


def policy_block(t: Tuning, b: Bench, source: str, when: datetime | None = None) -> str:
    """The ``[policy]`` settings the tuning found, as TOML with a comment saying where
    they come from (and the warm pools' sizes where they changed)."""
    k = t.tuned
    held = t.held_out["tuned"]
    day = (when or datetime.now(UTC)).strftime("%Y-%m-%d")
    lines = [
        f"# Tuned by `slurm-burst policy tune` on {day} from {_one_line(source)}:",
        f"# the first {t.tuning_jobs:,} jobs; on the {t.held_out_jobs:,} held out, "
        f"{pct(held.wait_cut)} of burst-always's mean-wait cut at {pct(held.cost_share)} "
        f"of its cost (${held.dollars_per_month:,.0f} a month).",
        "[policy]",
        f"wait_per_dollar = {k.wait_per_dollar:g}",
        f"min_wait = {k.min_wait:g}",
        f"wait_factor = {k.wait_factor:g}",
        f"burst_share = {k.burst_share:g}",
    ]
    if k.burst_share:
        lines.insert(2, "# burst_share sets each job's bar from the last week's waiting jobs; "
                        "wait_per_dollar only caps it.")  # fmt: skip
    if k.warm != 1.0:
        for g in b.groups:
            for name, w in b.warm_tables.get(g.name, ()):
                lines += ["", f"[node_groups.{g.name}.warm.{name}]",
                          f"nodes = {round(w * k.warm)}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def _one_line(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)[:200]


def pct(share: float | None) -> str:
    """A share as a whole percent ('-': none)."""
    return "-" if share is None else f"{share:.0%}"


def as_doc(t: Tuning, b: Bench, trace: Trace, block: str) -> dict[str, Any]:
    def figures(part: dict[str, Figures]) -> dict[str, Any]:
        return {
            name: {"mean_wait": f.summary.mean_wait, "median_wait": f.summary.median_wait,
                   "p95_wait": f.summary.p95_wait, "burst_jobs": f.summary.burst_jobs,
                   "cloud_cost": f.summary.cloud_cost,
                   "dollars_per_month": f.dollars_per_month,
                   "wait_cut": f.wait_cut, "cost_share": f.cost_share}
            for name, f in part.items()
        }  # fmt: skip

    def point(p: Point) -> dict[str, Any]:
        return {**p.knobs.__dict__, "wait_cut": p.wait_cut, "cost_share": p.cost_share,
                "cloud_cost": p.cost, "mean_wait": p.mean_wait, "p95_wait": p.p95_wait}  # fmt: skip

    return {
        "trace": {"source": trace.source, "jobs": len(trace.jobs)},
        "onprem": {"cpus": b.cpus, "gpus": b.gpus},
        "money": {"spend_cap": b.spend_cap, "budgets": dict(b.budgets)},
        "target": t.target,
        "split": {"tuning_jobs": t.tuning_jobs, "held_out_jobs": t.held_out_jobs},
        "tuned": t.tuned.__dict__,
        "reached": t.reached,
        "goal": {
            "wait_cut": GOAL_CUT,
            "cost_share": GOAL_COST,
            "met": t.goal_met,
            "verdict": t.verdict,
            "held_out_cut_seconds": t.held_out_cut,
            "min_cut_seconds": MIN_CUT,
            "reachable_on_tuning_part": t.goal_reachable,
        },
        "tuning": figures(t.tuning),
        "held_out": figures(t.held_out),
        "frontier": [point(p) for p in t.frontier],
        "checked": [point(p) for p in t.checked],
        "measured": len(t.points),
        "policy_block": block,
    }
