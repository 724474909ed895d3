"""``slurm-burst jobs``: the burst policy's decisions for pending jobs."""

from __future__ import annotations

from typing import Any

import click

from slurm_burst.cli.common import EXIT_FAILED, app, emit, json_option, state_store, ts


@click.command("jobs")
@click.option(
    "--verdict",
    type=click.Choice(["burst", "wait", "never"]),
    help="Only the jobs with this decision.",
)
@json_option
@click.pass_context
def jobs(ctx: click.Context, verdict: str | None, as_json: bool) -> None:
    """The burst policy's last pass and its decisions for pending jobs.

    \b
    burst  the job was given a burst partition (it runs where Slurm starts it first)
    wait   on-prem is expected to start it soon enough; looked at again later
    never  on-prem only, no node group fits, or the job costs too much

    Reads the daemon's state database: what the leader's last pass decided (bursts
    and nevers first, up to 1,000 jobs). Exit 0; 1 when the policy is off or has
    not run.
    """
    cfg = app(ctx).config
    doc: dict[str, Any] | None = state_store(ctx).policy_report()
    if not cfg.policy.enabled or doc is None:
        why = "is off (policy.enabled)" if not cfg.policy.enabled else "has not run yet"
        if as_json:
            emit({"enabled": cfg.policy.enabled, "last_pass": None, "jobs": []}, True)
        else:
            click.echo(f"the burst policy {why}")
        ctx.exit(EXIT_FAILED)
    rows = [r for r in doc.get("jobs", []) if verdict is None or r["verdict"] == verdict]
    if as_json:
        last = {k: v for k, v in doc.items() if k != "jobs"}
        emit({"enabled": True, "last_pass": last, "jobs": rows}, True)
        return
    totals = ", ".join(f"{k} {v}" for k, v in sorted(doc.get("totals", {}).items())) or "none"
    click.echo(
        f"last pass: {ts(doc['at'])} ({doc['seconds']:.2f} s): {doc['pending']} pending, "
        f"{doc['eligible']} may burst, {doc['decided']} decided, {doc['steered']} sent; "
        f"decisions held: {totals}"
    )
    if doc.get("error"):
        click.echo(f"  ! {doc['error']}")
    for said in doc.get("complaints", []):
        click.echo(f"  ! slurm: {said}")
    emit(
        rows,
        False,
        columns=["JOB", "VERDICT", "GROUP", "COST", "LOOK AGAIN", "REASON"],
        rows=lambda rs: [
            [
                r["job"],
                r["verdict"],
                r["group"] or "-",
                f"${r['cost']:.2f}" if r["cost"] is not None else "-",
                ts(r["look_again"]) if r["look_again"] else "-",
                r["reason"],
            ]
            for r in rs
        ],
    )
