"""``slurm-burst ledger``: what the cloud cost, and whom to charge, from the SQL ledger."""

from __future__ import annotations

import contextlib
import csv
import json
import sys
from datetime import UTC, date, datetime, timedelta
from typing import Any

import click

from slurm_burst.cli.common import EXIT_BAD_INPUT, SlurmName, Whole, app, emit, fail, json_option

BY_CHOICES = ("account", "user", "partition", "month", "day", "job")


def _ledger(ctx: click.Context) -> Any:
    from slurm_burst.wiring.ledger import ledger

    return ledger(app(ctx).config)


def _period(start: str | None, end: str | None) -> tuple[date, date]:
    """[from, to] as given (to inclusive) -> [from, to+1); default: this month so far."""
    today = datetime.now(UTC).date()
    try:
        first = date.fromisoformat(start) if start else today.replace(day=1)
        last = date.fromisoformat(end) if end else today
    except ValueError as exc:
        fail(f"dates are YYYY-MM-DD: {exc}", EXIT_BAD_INPUT)
    if last < first:
        fail(f"--to {last} is before --from {first}", EXIT_BAD_INPUT)
    if last >= date.max:
        fail(f"--to must be before {date.max}", EXIT_BAD_INPUT)
    return first, last + timedelta(days=1)


period_options = [
    click.option(
        "--from",
        "start",
        metavar="YYYY-MM-DD",
        help="First day (UTC) [default: the 1st of this month].",
    ),
    click.option(
        "--to", "end", metavar="YYYY-MM-DD", help="Last day (UTC), included [default: today]."
    ),
]


def with_period(f: Any) -> Any:
    for opt in reversed(period_options):
        f = opt(f)
    return f


@click.group("ledger")
def group() -> None:
    """The cost ledger: instances, job usage, cost allocation, reports for finance.

    Money is kept in integer micro-dollars; every dollar an instance cost is
    allocated exactly once: to the jobs that used it, or as overhead (boot,
    idle, failed launches) spread by ledger.overhead.
    """


@group.command("instances")
@json_option
@click.pass_context
def instances(ctx: click.Context, as_json: bool) -> None:
    """One row per instance: times, hours, price (with its rate), cost, failure code."""
    rows = _ledger(ctx).instances()
    emit(
        rows,
        as_json,
        columns=[
            "NODE",
            "INSTANCE",
            "SIZE",
            "$/H",
            "REQUESTED",
            "JOINED",
            "TERMINATED",
            "HOURS",
            "COST",
            "FAILED",
        ],
        rows=lambda rs: [
            [
                r["node"],
                r["instance_id"],
                r["size"],
                f"{r['price_per_hour']:.4f}",
                (r["requested"] or "")[11:19],
                (r["joined"] or "")[11:19],
                (r["terminated"] or "")[11:19],
                "" if r["hours"] is None else f"{r['hours']:.4f}",
                "" if r["cost"] is None else f"{r['cost']:.6f}",
                r["failure_code"] or "",
            ]
            for r in rs
        ],
        title="slurm-burst ledger: instances",
    )


@group.command("report")
@click.option(
    "--by",
    "by",
    default="account",
    show_default=True,
    metavar="KEY[,KEY]",
    help=f"Group by one or more of: {', '.join(BY_CHOICES)}.",
)
@with_period
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
)
@json_option
@click.pass_context
def report(
    ctx: click.Context, by: str, start: str | None, end: str | None, fmt: str, as_json: bool
) -> None:
    """Chargeback: instance-hours, GPU-hours, allocated, overhead, staging (datasets
    moved for jobs: `ledger transfers`), total, idle share, and the idle GPU cost
    (allocated cost of GPU jobs times the share of their GPU time their GPUs were idle,
    from NVML samples); --by job adds each job's GPU utilization.

    \b
    Examples:
      slurm-burst ledger report --by account
      slurm-burst ledger report --by month,account --from 2026-01-01 --to 2026-06-30
      slurm-burst ledger report --by job --format json
    """
    from slurm_burst.core.usage import report_totals

    keys = [k.strip() for k in by.split(",") if k.strip()]
    bad = [k for k in keys if k not in BY_CHOICES]
    if not keys or bad:
        fail(f"--by takes {', '.join(BY_CHOICES)} (got {by!r})", EXIT_BAD_INPUT)
    if "job" in keys and len(keys) > 1:
        fail("--by job cannot be combined with other keys", EXIT_BAD_INPUT)
    first, after = _period(start, end)
    led = _ledger(ctx)
    rows = led.report(keys, first, after)
    head = ["job", "account", "user", "partition", "state"] if keys == ["job"] else keys
    nums = ["instance_hours", "gpu_hours", "allocated", "overhead", "staging", "total",
            "idle_share"]  # fmt: skip
    nums += [*(["gpu_util"] if keys == ["job"] else []), "idle_gpu"]
    if as_json or fmt == "json":
        click.echo(
            json.dumps(
                {
                    "by": keys,
                    "from": first.isoformat(),
                    "to": (after - timedelta(days=1)).isoformat(),
                    "currency": "USD",
                    "rows": rows,
                    "total": report_totals(rows),
                },
                indent=2,
                default=str,
            )
        )
        return
    if fmt == "csv":
        w = csv.writer(sys.stdout)
        w.writerow([*head, *nums])
        for r in rows:
            w.writerow([*(r[k] for k in head), *(r[k] for k in nums)])
        return
    t = report_totals(rows)

    def table(rs: list[dict[str, Any]]) -> list[list[Any]]:
        out = [
            [
                *(r[k] for k in head),
                f"{r['instance_hours']:.3f}",
                f"{r['gpu_hours']:.3f}",
                f"{r['allocated']:.6f}",
                f"{r['overhead']:.6f}",
                f"{r['staging']:.6f}",
                f"{r['total']:.6f}",
                f"{r['idle_share']:.1%}",
                *([_percent(r["gpu_util"])] if keys == ["job"] else []),
                f"{r['idle_gpu']:.6f}",
            ]
            for r in rs
        ]
        out.append(
            [
                "TOTAL",
                *[""] * (len(head) - 1),
                f"{t['instance_hours']:.3f}",
                f"{t['gpu_hours']:.3f}",
                f"{t['allocated']:.6f}",
                f"{t['overhead']:.6f}",
                f"{t['staging']:.6f}",
                f"{t['total']:.6f}",
                "",
                *([""] if keys == ["job"] else []),
                f"{t['idle_gpu']:.6f}",
            ]
        )
        return out

    emit(
        rows,
        False,
        columns=[
            *(h.upper() for h in head),
            "INST-H",
            "GPU-H",
            "ALLOCATED $",
            "OVERHEAD $",
            "STAGING $",
            "TOTAL $",
            "IDLE",
            *(["GPU UTIL"] if keys == ["job"] else []),
            "IDLE GPU $",
        ],
        rows=table,
        title=f"slurm-burst chargeback {first} .. {after - timedelta(days=1)}",
    )


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


@group.command("transfers")
@with_period
@click.option(
    "--account", type=SlurmName("account"), default="", help="Only this account's transfers."
)
@click.option("--job", type=Whole(1, 2**53), default=None, metavar="JOBID", help="Only this job's.")
@json_option
@click.pass_context
def transfers_cmd(
    ctx: click.Context, start: str | None, end: str | None, account: str, job: int | None,
    as_json: bool,
) -> None:  # fmt: skip
    """Datasets moved for jobs, newest first: pushes to a store (in), nodes' pulls
    (pull), outputs brought home (out), with bytes, time, the prices that applied and
    the cost (storage held is 'ledger storage').

    \b
    Examples:
      slurm-burst ledger transfers --account physics
      slurm-burst ledger transfers --job 4242 --json
    """
    first, after = _period(start, end)
    rows = _ledger(ctx).transfers(first, after, account, job or 0)
    emit(
        rows,
        as_json,
        columns=["ENDED", "JOB", "ACCOUNT", "USER", "DIR", "STORE", "NODE", "DATASET",
                 "BYTES", "SENT", "SECONDS", "COST $"],
        rows=lambda rs: [
            [r["at"][:19], r["job"] or "-", r["account"], r["user"], r["direction"], r["store"],
             r["node"] or "-", r["dataset"][-40:], r["logical_bytes"], r["bytes_sent"],
             f"{r['seconds']:.1f}", f"{r['cost']:.6f}"]
            for r in rs
        ],
        title=f"slurm-burst transfers {first} .. {after - timedelta(days=1)}",
    )  # fmt: skip


@group.command("storage")
@with_period
@click.option(
    "--account", type=SlurmName("account"), default="", help="Only this account's storage."
)
@json_option
@click.pass_context
def storage_cmd(
    ctx: click.Context, start: str | None, end: str | None, account: str, as_json: bool
) -> None:
    """Storage booked by 'slurm-burst stage gc', newest first: each store namespace's
    GB-months (GB of 2^30 bytes held for 730 hours) since the run before, at the store's
    storage_per_gb_month, charged to the namespace's account.

    \b
    Examples:
      slurm-burst ledger storage --from 2026-11-01
      slurm-burst ledger storage --account physics --json
    """
    first, after = _period(start, end)
    rows = _ledger(ctx).storage_rows(first, after, account)
    emit(
        rows,
        as_json,
        columns=["BOOKED", "STORE", "ACCOUNT", "NAMESPACE", "SINCE", "KEYS", "BYTES",
                 "GB-MONTHS", "COST $"],
        rows=lambda rs: [
            [r["at"][:19], r["store"], r["account"] or "-", r["namespace"],
             (r["start"] or "written")[:19], r["keys"], r["bytes"], f"{r['gb_months']:.6f}",
             f"{r['cost']:.6f}"]
            for r in rs
        ],
        title=f"slurm-burst storage {first} .. {after - timedelta(days=1)}",
    )  # fmt: skip


@group.command("export")
@with_period
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, allow_dash=True),
    default="-",
    show_default=True,
    help="CSV file to write ('-': standard output).",
)
@click.pass_context
def export(ctx: click.Context, start: str | None, end: str | None, output: str) -> None:
    """Every charge line as CSV for finance (one row per instance, day, payer and kind;
    one per data transfer, kind staging-in, staging-pull or staging-out; one per storage
    booking, kind staging-stored)."""
    from slurm_burst.core.usage import EXPORT_COLUMNS
    from slurm_burst.fileio import file_error, write_atomic

    first, after = _period(start, end)
    led = _ledger(ctx)
    n = 0
    try:
        with contextlib.ExitStack() as stack:
            # a new file under a name nobody can have planted, renamed into place when
            # complete; a symlink, device or FIFO at the target is refused, left as it is
            fh = sys.stdout if output == "-" else stack.enter_context(write_atomic(output, 0o640))
            w = csv.writer(fh)
            w.writerow(EXPORT_COLUMNS)
            for line in led.charge_lines(first, after):
                w.writerow(line)
                n += 1
    except OSError as exc:
        fail(f"cannot write {output}: {file_error(exc)}", EXIT_BAD_INPUT)
    if output != "-":
        click.echo(f"wrote {n} charge lines to {output}", err=True)


@group.command("sync")
@json_option
@click.pass_context
def sync(ctx: click.Context, as_json: bool) -> None:
    """Ingest finished jobs from sacct and split closed instances now (the daemon does
    this every ledger.ingest_interval)."""
    from slurm_burst.wiring.ledger import chargeback

    cb = chargeback(app(ctx).config, _ledger(ctx))
    seen, added = cb.ingest()  # the ledger or sacct failing: a BurstError, its exit code
    allocated = cb.allocate()
    emit(
        {"jobs_seen": seen, "jobs_added": added, "instances_allocated": allocated},
        as_json,
        columns=["JOBS SEEN", "JOBS ADDED", "INSTANCES ALLOCATED"],
        rows=lambda d: [[d["jobs_seen"], d["jobs_added"], d["instances_allocated"]]],
    )
