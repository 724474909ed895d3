"""``slurm-burst prices``: what each configured size costs, from the config alone.

Prices come from ``node_groups.*.price_per_hour`` and ``[rates.*]``, never from
libcloud's bundled price tables (stale, and blind to a site's discounts).
"""

from __future__ import annotations

from datetime import UTC, datetime

import click

from slurm_burst.cli.common import EXIT_FAILED, app, emit, json_option


@click.group("prices")
def group() -> None:
    """Prices per instance-hour of the configured sizes (the ledger charges these)."""


@group.command("check")
@click.option(
    "--at",
    metavar="DATE",
    help="Check the rates in force at this UTC date (YYYY-MM-DD); default now.",
)
@json_option
@click.pass_context
def check(ctx: click.Context, at: str | None, as_json: bool) -> None:
    """List each node group's sizes on each provider with its price and where the
    price comes from; warn about every size without one.

    A size without a price is launched all the same, but its instance-hours are
    recorded at $0: chargeback and budgets then undercount. Exit 1 when any
    configured size has no price, 0 when all have one.
    """
    from slurm_burst.core.pricing import dollars

    cfg = app(ctx).config
    when = datetime.now(UTC)
    if at:
        try:
            when = datetime.strptime(at, "%Y-%m-%d").replace(tzinfo=UTC)
        except ValueError:
            from slurm_burst.cli.common import EXIT_BAD_INPUT, fail

            fail(f"--at {at!r}: not a date (YYYY-MM-DD)", EXIT_BAD_INPUT)
    table = cfg.rate_table
    rows = []
    for gname, g in sorted(cfg.node_groups.items()):
        for provider, size in g.candidates():
            price = table.price(size, g.gpus, when)
            rows.append(
                {
                    "group": gname,
                    "provider": provider,
                    "size": size,
                    "price_per_hour": float(dollars(price.micros_per_hour)) if price else None,
                    "source": price.source if price else None,
                    "version": price.version if price else None,
                }
            )
    missing = [r for r in rows if r["price_per_hour"] is None]
    doc = {"at": when.isoformat(), "sizes": rows, "unpriced": len(missing)}
    emit(
        doc,
        as_json,
        columns=["GROUP", "PROVIDER", "SIZE", "$/HOUR", "SOURCE"],
        rows=lambda d: [
            [
                r["group"],
                r["provider"],
                r["size"],
                "-" if r["price_per_hour"] is None else f"{r['price_per_hour']:.4f}",
                r["source"] or "NO PRICE",
            ]
            for r in d["sizes"]
        ],
        title=f"prices at {when:%Y-%m-%d}",
    )
    for r in missing:
        click.echo(
            f"warning: node_groups.{r['group']}: size {r['size']} ({r['provider']}) has no "
            "price: its instance-hours would be recorded at $0 (set price_per_hour or a "
            "[rates.*] entry)",
            err=True,
        )
    if missing:
        raise SystemExit(EXIT_FAILED)
