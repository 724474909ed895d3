"""``slurm-burst ledger``: what the cloud cost, from the SQL ledger."""

from __future__ import annotations

import click

from slurm_burst.cli.common import app, emit, json_option


@click.group("ledger")
def group() -> None:
    """The cost ledger: every instance slurm-burst launched, with its times and price."""


@group.command("instances")
@json_option
@click.pass_context
def instances(ctx: click.Context, as_json: bool) -> None:
    """One row per instance: requested/running/joined/terminated times, hours, cost."""
    from slurm_burst.wiring import ledger

    rows = ledger(app(ctx).config).instances()
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
                "" if r["cost"] is None else f"{r['cost']:.4f}",
            ]
            for r in rs
        ],
        title="slurm-burst ledger: instances",
    )
