"""``slurm-burst status`` and ``slurm-burst group``: the daemon at a glance, node groups."""

from __future__ import annotations

import time
from typing import Any

import click

from slurm_burst.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    app,
    emit,
    fail,
    json_option,
    state_store,
    ts,
)


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
    from slurm_burst.services.reconciler import status as build

    cfg = app(ctx).config
    leader = None
    if cfg.daemon.ha_url:
        from slurm_burst.wiring import leader as make_leader

        leader = make_leader(cfg).leader_info() or None
    st = build(cfg, state_store(ctx), time.time(), leader)
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
    for u in st["unavailable_sizes"]:
        click.echo(f"cooling:   {u['provider']}/{u['size']} until {ts(u['until'])} ({u['code']})")
    rows = [
        [g, ", ".join(f"{s} {n}" for s, n in sorted(states.items()))]
        for g, states in sorted(st["nodes"].items())
    ]
    if rows:
        emit(rows, False, columns=["GROUP", "NODES BY STATE"], rows=lambda r: r, title=None)


@click.group("group")
def group() -> None:
    """Node groups: health and protected mode."""


@group.command("list")
@json_option
@click.pass_context
def list_groups(ctx: click.Context, as_json: bool) -> None:
    """Each node group: failed launches in a row, protected until."""
    cfg = app(ctx).config
    health = state_store(ctx).groups()
    now = time.time()
    out = [
        {
            "group": name,
            "partition": g.partition,
            "nodes": g.hostlist,
            "failures_in_a_row": health[name].failures if name in health else 0,
            "protected": name in health and health[name].protected(now),
            "protected_until": health[name].protected_until if name in health else 0,
            "reason": health[name].reason if name in health else "",
        }
        for name, g in sorted(cfg.node_groups.items())
    ]
    emit(
        out,
        as_json,
        columns=["GROUP", "PARTITION", "NODES", "FAILURES", "PROTECTED UNTIL"],
        rows=lambda rs: [
            [
                r["group"],
                r["partition"],
                r["nodes"],
                r["failures_in_a_row"],
                ts(r["protected_until"]) if r["protected"] else "-",
            ]
            for r in rs
        ],
    )


@group.command("enable")
@click.argument("name")
@click.pass_context
def enable(ctx: click.Context, name: str) -> None:
    """End protected mode of node group NAME now: launches allowed, Slurm drain lifted."""
    from slurm_burst import wiring
    from slurm_burst.services.reconciler import Reconciler

    cfg = app(ctx).config
    if name not in cfg.node_groups:
        fail(
            f"no node group {name!r} (groups: {', '.join(sorted(cfg.node_groups))})", EXIT_BAD_INPUT
        )
    rec = Reconciler(cfg, state_store(ctx), wiring.scheduler(cfg), {}, None, None)  # type: ignore[arg-type]
    try:
        rec.enable(name)
    except Exception as exc:
        fail(f"group {name}: {exc}", EXIT_FAILED)
    click.echo(f"node group {name} enabled")
