"""``slurm-burst status``: the daemon at a glance."""

from __future__ import annotations

import time
from typing import Any

import click

from slurm_burst.cli.common import EXIT_FAILED, app, emit, json_option, state_store, ts


@click.command("status")
@json_option
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """The daemon at a glance: leader, last reconcile pass, nodes, protected groups, spend.

    \b
    Reads the daemon's state database (and, with HA, who holds the lock).
    Exit 0 when the daemon's heartbeat is fresh, 1 when it is stale or the
    daemon never ran: usable as a monitoring check.
    """
    from slurm_burst.services.status import status as build

    cfg = app(ctx).config
    leader = None
    if cfg.daemon.ha_url:
        from slurm_burst.wiring.light import leader as make_leader

        leader = make_leader(cfg).leader_info() or None
    st = build(cfg, state_store(ctx), time.time(), leader).doc()
    if as_json:
        emit(st, True)
    else:
        _print(st)
    if not st["daemon"]["running"]:
        ctx.exit(EXIT_FAILED)


def _print(st: dict[str, Any]) -> None:
    d = st["daemon"]
    age = d["heartbeat_age"]
    if age is None:
        click.echo("daemon:    never ran")
    else:
        state = "running" if d["running"] else "STALE"
        click.echo(f"daemon:    {state} (pid {d['pid']}, heartbeat {age:.0f} s ago)")
    extra = f"; standby: {', '.join(st['followers'])}" if st["followers"] else ""
    click.echo(f"leader:    {st['leader'] or '-'}{extra}")
    last = st["last_pass"]
    if last:
        acts = ", ".join(f"{k} {v}" for k, v in sorted(last["actions"].items())) or "no repairs"
        click.echo(
            f"last pass: {ts(last['ended'])} ({last['seconds']:.2f} s; {acts}; "
            f"{len(last['errors'])} errors)"
        )
        for where, err in sorted(last["errors"].items()):
            click.echo(f"  ! {where}: {err}")
        if last["jobs"]:
            jobs = ", ".join(f"{k.lower()} {v}" for k, v in sorted(last["jobs"].items()))
            click.echo(f"jobs:      {jobs} (burst partitions)")
    else:
        click.echo("last pass: none yet")
    click.echo(f"spend:     ${st['spend_per_hour_total']:.2f}/h")
    for name, g in st["protected_groups"].items():
        click.echo(f"PROTECTED: {name} until {ts(g['until'])}: {g['reason']}")
    for name, c in st["caps"].items():
        click.echo(f"cap:       {name} holds {c['holding']} of max_nodes={c['max_nodes']}")
    for u in st["unavailable_sizes"]:
        click.echo(f"cooling:   {u['provider']}/{u['size']} until {ts(u['until'])} ({u['code']})")
    rows = [
        [g, ", ".join(f"{s} {n}" for s, n in sorted(states.items()))]
        for g, states in sorted(st["nodes"].items())
    ]
    if rows:
        emit(rows, False, columns=["GROUP", "NODES BY STATE"], rows=lambda r: r, title=None)
