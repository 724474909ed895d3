"""``slurm-burst policy``: the burst policy tuned on the site's own job history."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

import click

from slurm_burst.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_PRECONDITION,
    FiniteRange,
    Progress,
    Whole,
    app,
    emit,
    fail,
    json_option,
)
from slurm_burst.cli.simulate_cmd import (
    config_or_example,
    duration,
    emit_simulation,
    load_trace,
    pool_of,
    trace_options,
)
from slurm_burst.config import Config
from slurm_burst.core.workload import Trace
from slurm_burst.services.tuning import MIN_CUT, pct

DROPIN_NAME = "50-policy-tune.toml"
_ACCOUNT = re.compile(r"[A-Za-z0-9_.@+-]{1,64}", re.ASCII)


@click.group("policy")
def group() -> None:
    """The burst policy: tune its settings on the site's own job history."""


@group.command("tune")
@trace_options
@click.option(
    "--target",
    type=FiniteRange(0.01, 1.0),
    default=0.9,
    show_default=True,
    help="The share of burst-always's mean-wait cut to reach, at the least cost.",
)
@click.option(
    "--split",
    type=FiniteRange(0.1, 0.9),
    default=0.5,
    show_default=True,
    help="The share of the jobs (by submit time) tuned on; the rest is held out.",
)
@click.option(
    "--budget",
    "budget_args",
    multiple=True,
    metavar="ACCOUNT=DOLLARS",
    help="An account's monthly budget, respected by the settings tried (repeatable).",
)
@click.option(
    "--spend-cap",
    type=FiniteRange(0, 1e12),
    metavar="DOLLARS",
    help="The monthly spend cap for all accounts [default: the config's policy.spend_cap].",
)
@click.option(
    "--workers",
    type=Whole(0, 256),
    default=0,
    show_default=True,
    help="Processes measuring settings side by side (0: one per CPU).",
)
@click.option(
    "--apply",
    "apply_",
    is_flag=True,
    help=f"Write the tuned settings to the config's drop-in directory ({DROPIN_NAME} in "
    "slurm-burst.d beside the config), leaving the config file as it is.",
)
@click.option(
    "--plot",
    "plot_dir",
    metavar="DIR",
    help="Also write tuning-frontier.png there (needs matplotlib).",
)
@json_option
@click.pass_context
def tune(
    ctx: click.Context,
    trace_path: str,
    fmt: str,
    cpus: int | None,
    gpus: int,
    limit_factor: float,
    target: float,
    split: float,
    budget_args: tuple[str, ...],
    spend_cap: float | None,
    workers: int,
    apply_: bool,
    plot_dir: str | None,
    as_json: bool,
) -> None:  # fmt: skip
    """Tune the burst policy on a job trace of this site (sacct, SWF or the GPU CSV):
    search wait_per_dollar, burst_share, min_wait, wait_factor and the warm pools' size
    for the cheapest setting that reaches --target of burst-always's mean-wait cut on the
    first part of the trace (each candidate fitted on its older two thirds and checked on
    its latest third), then say what it does on the rest (held out): its share of the
    wait cut and of the cost, dollars a month, mean and p95 wait, beside never-burst,
    burst-always and the config's own [policy]. Prints a [policy] block to paste, or
    with --apply writes it as a drop-in. The config's node groups, prices, spend cap
    and the --budget given apply to every setting tried.

    Where no setting reaches 90 % of the cut at half burst-always's cost (the goal the
    defaults aim at), it says so and lists the frontier: the settings no other beats on
    both.

    \b
    Exit status: 0 tuned (and applied); 1 --apply, but the target was not reached
    (nothing written); 2 bad input; 3 --plot without matplotlib.

    \b
    Examples:
      sacct -a -X -P -n -S 2025-11-01 -o JobIDRaw,Account,User,Submit,Start,End,\\
        TimelimitRaw,NCPUS,AllocTRES > year.txt
      slurm-burst policy tune --trace year.txt --cpus 4096
      slurm-burst policy tune --trace year.txt --cpus 4096 --budget chem=2000 --apply
    """
    budgets = _budgets(budget_args)
    cfg = config_or_example(ctx)
    trace = load_trace(trace_path, fmt, limit_factor)
    pool = pool_of(trace, cpus, gpus)
    target_path = _dropin(ctx) if apply_ else None
    run_tuning(trace, cfg, pool, gpus, as_json=as_json, plot_dir=plot_dir, target=target,
               split=split, budgets=budgets, spend_cap=spend_cap, workers=workers,
               apply_to=target_path)  # fmt: skip


def run_tuning(
    trace: Trace,
    cfg: Config,
    pool: int,
    gpus: int,
    *,
    as_json: bool,
    plot_dir: str | None,
    target: float = 0.9,
    split: float = 0.5,
    budgets: dict[str, float] | None = None,
    spend_cap: float | None = None,
    workers: int = 0,
    apply_to: Path | None = None,
    simulate: bool = False,
) -> None:
    """Tune and report: ``policy tune``'s output, or (``simulate``) ``simulate``'s table
    of the four policies on the held-out part."""
    from slurm_burst.core.simulate import Comparison
    from slurm_burst.services import tuning as t

    b = t.bench(trace, cfg, pool, gpus, budgets, spend_cap)
    progress = Progress(enabled=not as_json or sys.stderr.isatty(), counts=True)
    result = t.tune(trace, b, target, split, workers=workers, progress=progress)
    progress.done()
    block = t.policy_block(result, b, trace.source)
    doc = t.as_doc(result, b, trace, block)
    if plot_dir:
        doc["plots"] = _plot(result, trace.source, plot_dir)
    if simulate:
        from slurm_burst.services.simulation import as_json as doc_of

        rows = [Comparison(name, f.summary, f.wait_cut, f.cost_share)
                for name, f in result.held_out.items()]  # fmt: skip
        sim = doc_of(trace, pool, gpus, b.groups, rows)
        sim.update({k: doc[k] for k in ("split", "tuned", "reached", "goal", "policy_block")})
        sim.setdefault("plots", doc.get("plots"))
        title = (f"{result.held_out_jobs:,} held-out jobs (the last {1 - split:.0%}) on "
                 f"{pool:,} CPUs, {gpus:,} GPUs ({trace.source}); tuned on the first "
                 f"{result.tuning_jobs:,}")  # fmt: skip
        emit_simulation(sim, as_json, gpus, title)
        if not as_json:
            _small_cut(result)
            click.echo("\n" + block, nl=False)
        return
    if apply_to is not None and result.reached:
        doc["applied"] = str(_write_dropin(apply_to, block))
    emit(doc, as_json, columns=_COLUMNS, rows=_rows,
         title=f"held out: {result.held_out_jobs:,} jobs of {trace.source}")  # fmt: skip
    if not as_json:
        _say(result, doc, block)
    if apply_to is not None and not result.reached:
        fail(f"the target ({target:.0%} of burst-always's wait cut) was not reached on the "
             f"tuning part: nothing written to {apply_to}", EXIT_FAILED)  # fmt: skip


_COLUMNS = ["POLICY", "WAIT CUT", "COST", "$ / MONTH", "MEAN WAIT", "P95 WAIT", "BURST JOBS"]


def _rows(doc: dict[str, Any]) -> list[list[str]]:
    return [
        [
            name,
            "-" if f["wait_cut"] is None else f"{f['wait_cut']:.0%}",
            "-" if f["cost_share"] is None else f"{f['cost_share']:.0%}",
            f"{f['dollars_per_month']:,.0f}",
            duration(f["mean_wait"]),
            duration(f["p95_wait"]),
            f"{f['burst_jobs']:,}",
        ]
        for name, f in doc["held_out"].items()
    ]


def _say(result: Any, doc: dict[str, Any], block: str) -> None:
    tuned = doc["tuning"]["tuned"]
    click.echo(
        f"\ntuned on the first {result.tuning_jobs:,} jobs: "
        f"{pct(tuned['wait_cut'])} of burst-always's wait cut at {pct(tuned['cost_share'])} "
        f"of its cost ({doc['measured']} settings measured)"
    )
    if not result.reached:
        click.echo(f"the target ({result.target:.0%} of the wait cut) was not reached: the "
                   "setting shown is the closest")  # fmt: skip
    _small_cut(result)
    if not result.goal_reachable:
        where = ("its latest third, where each setting was checked" if result.goal_on_fit
                 else "the tuning part")  # fmt: skip
        click.echo("no setting of this policy reaches 90 % of burst-always's wait cut at "
                   f"<= 50 % of its cost on {where};\nthe frontier of the part the settings "
                   "were fitted on (settings no other beats on both):")  # fmt: skip
        for p in doc["frontier"]:
            click.echo(
                f"  wait_per_dollar {p['wait_per_dollar']:>10g}  min_wait {p['min_wait']:>5g}"
                f"  wait_factor {p['wait_factor']:g}  burst_share {p['burst_share']:g}"
                f"  warm x{p['warm']:g}:  "
                f"cut {pct(p['wait_cut'])}  cost {pct(p['cost_share'])}"
            )
    if "applied" in doc:
        click.echo(f"\nwritten to {doc['applied']} (slurm-burst config check; then restart "
                   "the daemon)")  # fmt: skip
    else:
        click.echo("\n" + block, nl=False)


def _small_cut(result: Any) -> None:
    """Say so where the held-out part has no wait worth a share of."""
    if result.goal_met is None:
        click.echo(f"on the held-out part burst-always cuts {duration(result.held_out_cut)} of "
                   "mean wait: nothing worth bursting for there (the goal's shares count "
                   f"from a cut of {duration(MIN_CUT)})")  # fmt: skip


def _budgets(args: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for arg in args:
        account, sep, amount = arg.partition("=")
        if not sep or _ACCOUNT.fullmatch(account) is None:
            fail(f"--budget {arg!r}: ACCOUNT=DOLLARS (an account name of letters, digits, "
                 "_.@+-)", EXIT_BAD_INPUT)  # fmt: skip
        try:
            value = float(amount)
        except ValueError:
            value = -1.0
        if not 0 <= value <= 1e12:  # NaN fails too
            fail(f"--budget {arg!r}: DOLLARS is a number from 0 to 1e12", EXIT_BAD_INPUT)
        out[account] = value
    return out


def _dropin(ctx: click.Context) -> Path:
    """The drop-in the tuned settings go to; refused without a site config (the example
    is not the site's)."""
    from slurm_burst.config.load import dropin_dir

    path = app(ctx).config_path
    if not path.exists():
        fail(f"--apply: no config at {path} to add the drop-in to (--config)", EXIT_BAD_INPUT)
    return dropin_dir(path) / DROPIN_NAME


def _write_dropin(path: Path, block: str) -> Path:
    """``block`` as ``path``, written whole (a temporary file renamed over it), its
    directory made if missing (mode 0755), never through a link."""
    from slurm_burst.fileio import FileRefused, ensure_dir, write_durable

    try:
        ensure_dir(path.parent, 0o755, what="the drop-in directory")
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISREG(os.lstat(path).st_mode):
                raise FileRefused(f"{path} is not a regular file: not replaced")
        return write_durable(path.parent, path.name, block.encode(), 0o644)
    except FileRefused as exc:
        fail(f"--apply: {exc}", EXIT_BAD_INPUT)
    except OSError as exc:
        fail(f"--apply: {path}: {exc.strerror or exc}", EXIT_FAILED)


def _plot(result: Any, source: str, directory: str) -> list[str]:
    from slurm_burst.wiring.storage import plot_tuning

    try:
        return plot_tuning(result.points, result.target, source, directory)
    except ImportError:
        fail("--plot needs matplotlib: pip install 'slurm-burst[sim]'", EXIT_PRECONDITION)
    except OSError as exc:
        fail(f"--plot {directory}: {exc.strerror or exc}", EXIT_BAD_INPUT)
