"""``slurm-burst db``: the ledger database's schema (Alembic migrations)."""

from __future__ import annotations

import click

from slurm_burst.cli.common import app, emit, json_option


@click.group("db")
def group() -> None:
    """The ledger database: create it, upgrade its schema, show its version.

    The daemon upgrades the schema itself when it starts (under a lock, so two
    daemons or an admin's 'db upgrade' at the same time are safe).
    """


@group.command("upgrade")
@click.option("--to", "target", default="head", show_default=True, help="Target revision.")
@click.pass_context
def upgrade(ctx: click.Context, target: str) -> None:
    """Create the ledger tables, or bring them to this version's schema. Idempotent."""
    from slurm_burst.wiring.ledger import ledger

    cfg = app(ctx).config
    before, after = ledger(cfg, check_schema=False).upgrade(target)
    if before == after:
        click.echo(f"ledger schema already at {after}")
    else:
        click.echo(f"ledger schema upgraded: {before or 'empty'} -> {after}")


@group.command("current")
@json_option
@click.pass_context
def current(ctx: click.Context, as_json: bool) -> None:
    """The schema revision of the database and the one this slurm-burst needs."""
    from slurm_burst.wiring.ledger import ledger

    cfg = app(ctx).config
    have, head = ledger(cfg, check_schema=False).revision()
    data = {"current": have, "head": head, "up_to_date": have == head}
    emit(
        data,
        as_json,
        columns=["CURRENT", "HEAD", "UP TO DATE"],
        rows=lambda d: [[d["current"] or "-", d["head"], "yes" if d["up_to_date"] else "no"]],
    )
