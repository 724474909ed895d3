"""``slurm-burst group``: node groups, their launch health and protected mode."""

from __future__ import annotations

import time

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
    from slurm_burst.wiring import group_control

    cfg = app(ctx).config
    if name not in cfg.node_groups:
        fail(
            f"no node group {name!r} (groups: {', '.join(sorted(cfg.node_groups))})", EXIT_BAD_INPUT
        )
    try:
        undrained = group_control(cfg, state_store(ctx)).enable(name)
    except Exception as exc:
        fail(f"group {name}: {exc}", EXIT_FAILED)
    click.echo(f"node group {name} enabled; {len(undrained)} node(s) undrained in Slurm")
