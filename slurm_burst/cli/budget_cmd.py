"""``slurm-burst budget``: monthly budgets per account, enforced by Slurm itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from slurm_burst.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, app, emit, fail, json_option

if TYPE_CHECKING:
    from slurm_burst.services.chargeback import Chargeback


def _chargeback(ctx: click.Context) -> Chargeback:
    from slurm_burst.wiring.ledger import chargeback

    return chargeback(app(ctx).config)


@click.group("budget")
def group() -> None:
    """Budgets: what each Slurm account may spend on burst nodes per month.

    Slurm enforces them: the daemon keeps each account's GrpTRESMins=billing
    limit at what is left of its budget, so an over-budget account's burst jobs
    pend with reason AssocGrpBillingMinutes and never start a cloud node. See the
    README's "Budgets" section for the slurm.conf and sacctmgr settings.
    """


@group.command("set")
@click.argument("account")
@click.argument("amount")
@click.option("--period", type=click.Choice(["month"]), default="month", show_default=True)
@click.option("--no-sync", is_flag=True, help="Record only; the daemon syncs Slurm later.")
@click.option("--force", is_flag=True, help="Record it even if Slurm has no such account (yet).")
@click.pass_context
def set_(
    ctx: click.Context, account: str, amount: str, period: str, no_sync: bool, force: bool
) -> None:
    """Set ACCOUNT's budget to AMOUNT dollars per PERIOD (0 stops its burst jobs).

    The setting is a new ledger row (history is kept). Unless --no-sync, Slurm's
    limit for the account is updated at once. An account Slurm's accounting does not
    know is refused (exit 2; a typo would budget nobody) unless --force.
    """
    from decimal import Decimal

    from slurm_burst.core.pricing import dollars, to_micros
    from slurm_burst.core.slurmsyntax import is_name

    if not is_name(account):  # whole and ASCII: "physics\n" is no account, even --force
        fail(f"{account!r} is not a Slurm account name", EXIT_BAD_INPUT)
    micros = to_micros(amount)
    if micros < 0:
        fail("a budget cannot be negative", EXIT_BAD_INPUT)
    if micros == 0 and Decimal(amount) != 0:  # to_micros parsed it: a finite Decimal
        fail(
            f"{amount} is less than one micro-dollar: stored as 0 it would stop the "
            "account's burst jobs (set 0 to do that on purpose)",
            EXIT_BAD_INPUT,
        )
    cb = _chargeback(ctx)
    if not force and cb.accounting is not None:
        from slurm_burst.core.slurm import SchedulerError

        try:
            known = cb.accounting.has_account(account)
        except SchedulerError as exc:
            fail(f"cannot ask Slurm whether account {account!r} exists: {exc} "
                 "(--force records the budget anyway)", EXIT_FAILED)  # fmt: skip
        if not known:
            fail(f"Slurm has no account {account!r} on cluster {cb.fleet.cluster} "
                 "(sacctmgr show account); --force records the budget anyway",
                 EXIT_BAD_INPUT)  # fmt: skip
    cb.ledger.set_budget(account, micros, period)
    status = {s.account: s for s in cb.budgets(sync=not no_sync)}.get(account)
    click.echo(f"budget of {account}: ${dollars(micros)} per {period}")
    if status is not None and not no_sync:
        if status.slurm_used_micros is None:
            fail("Slurm's limit could not be read or set (see the log); the daemon retries")
        if status.slurm_limit_micros is None:
            click.echo(f"{account} has money left: no Slurm limit, its jobs may start")
        else:
            click.echo(
                f"{account} is over budget: Slurm limit GrpTRESMins=billing="
                f"{status.slurm_limit_micros} (used {status.slurm_used_micros}); "
                "new jobs pend with AssocGrpBillingMinutes"
            )


@group.command("show")
@json_option
@click.pass_context
def show(ctx: click.Context, as_json: bool) -> None:
    """Each account's budget this month: spent, committed, remaining, Slurm's limit.

    spent: the ledger's allocated cost plus overhead share; committed: running
    burst jobs' remaining time limit at their billing rate; remaining: budget -
    spent - committed.
    """

    cb = _chargeback(ctx)
    rows = [s.as_dict() for s in cb.budgets()]

    def money(v: float | None) -> str:
        return "" if v is None else f"{v:,.2f}" if abs(v) >= 0.01 or v == 0 else f"{v:.6f}"

    emit(
        rows,
        as_json,
        columns=[
            "ACCOUNT",
            "PERIOD",
            "BUDGET",
            "SPENT",
            "COMMITTED",
            "REMAINING",
            "SLURM USED",
            "SLURM LIMIT",
            "OVER",
        ],
        rows=lambda rs: [
            [
                r["account"],
                r["period"],
                money(r["budget"]),
                money(r["spent"]),
                money(r["committed"]),
                money(r["remaining"]),
                money(r["slurm_used"]),
                money(r["slurm_limit"]),
                "yes" if r["over_budget"] else "",
            ]
            for r in rs
        ],
        title="slurm-burst budgets ($)",
    )
