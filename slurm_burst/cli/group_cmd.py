"""``slurm-burst group``: node groups, their launch health and protected mode."""

from __future__ import annotations

import time

import click

from slurm_burst.cli.common import (
    EXIT_BAD_INPUT,
    Whole,
    app,
    emit,
    fail,
    json_option,
    state_store,
    ts,
)
from slurm_burst.core.errors import BurstError


@click.group("group")
def group() -> None:
    """Node groups: health and protected mode."""


@group.command("list")
@json_option
@click.pass_context
def list_groups(ctx: click.Context, as_json: bool) -> None:
    """Each node group: its nodes (a dynamic group's: the names it may use, of which
    slurmctld holds max_nodes), warm nodes wanted now (of its pool), failed launches in
    a row, protected until."""
    from slurm_burst.services.warmpool import wanted

    cfg = app(ctx).config
    store = state_store(ctx)
    health = store.groups()
    now = time.time()
    out = [
        {
            "group": name,
            "warm_now": wanted(g, store, now) if g.warm_pool() else 0,
            "warm_pool": len(g.warm_pool()),
            "partition": g.partition,
            "nodes": g.hostlist,
            "slurm_nodes": g.nodes,  # declared in slurm.conf, or dynamic (made by the daemon)
            "max_nodes": g.limit,
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
        columns=["GROUP", "PARTITION", "NODES", "WARM", "FAILURES", "PROTECTED UNTIL"],
        rows=lambda rs: [
            [
                r["group"],
                r["partition"],
                r["nodes"]
                + (f" (dynamic, {r['max_nodes']} made)" if r["slurm_nodes"] == "dynamic" else ""),
                f"{r['warm_now']}/{r['warm_pool']}" if r["warm_pool"] else "-",
                r["failures_in_a_row"],
                ts(r["protected_until"]) if r["protected"] else "-",
            ]
            for r in rs
        ],
    )


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> float:
    """``90m``, ``2h``, ``1d``, ``45s``: seconds, between a minute and 30 days."""
    from slurm_burst.core.numbers import is_digits

    number, unit = text[:-1], text[-1:]
    if unit not in _UNITS or not is_digits(number) or len(number) > 6:
        fail(f"--for {text!r}: a whole number and s, m, h or d (e.g. 90m, 2h)", EXIT_BAD_INPUT)
    seconds = int(number) * _UNITS[unit]
    if not 60 <= seconds <= 30 * 86400:
        fail(f"--for {text!r}: between a minute and 30 days", EXIT_BAD_INPUT)
    return float(seconds)


@group.command("warm")
@click.argument("name")
@click.option("--nodes", type=Whole(1, 100_000), help="Nodes to keep up.")
@click.option("--for", "duration", metavar="DURATION", help="How long: 90m, 2h, 1d.")
@click.option("--off", is_flag=True, help="End the override now (the windows still hold).")
@click.pass_context
def warm(ctx: click.Context, name: str, nodes: int | None, duration: str | None, off: bool) -> None:
    """Keep NODES of group NAME's warm pool joined for DURATION, beyond its windows.

    \b
    For a workshop or a deadline: slurm-burst group warm gpu --nodes 2 --for 3h
    The pool is the group's last nodes, as many as its largest warm window (they
    are in SuspendExcNodes), so a group needs a [node_groups.NAME.warm.*] window.
    """
    from slurm_burst.core.hostlist import compress
    from slurm_burst.core.records import WarmOverride

    cfg = app(ctx).config
    if name not in cfg.node_groups:
        fail(f"no node group {name!r} (groups: {', '.join(sorted(cfg.node_groups))})",
             EXIT_BAD_INPUT)  # fmt: skip
    pool = cfg.node_groups[name].warm_pool()
    store = state_store(ctx)
    if off:
        store.set_warm_override(name, None)
        click.echo(f"node group {name}: override ended; its windows hold")
        return
    if not pool:
        fail(f"node group {name} has no warm pool: add a [node_groups.{name}.warm.*] window "
             "(its largest count is the pool's size)", EXIT_BAD_INPUT)  # fmt: skip
    if nodes is None or duration is None:
        fail("give --nodes and --for (or --off)", EXIT_BAD_INPUT)
    if nodes > len(pool):
        fail(f"--nodes {nodes}: the warm pool of {name} has {len(pool)} ({compress(pool)})",
             EXIT_BAD_INPUT)  # fmt: skip
    until = time.time() + _duration(duration)
    store.set_warm_override(name, WarmOverride(nodes, until))
    click.echo(f"node group {name}: {nodes} of {compress(pool)} kept up until {ts(until)}")


@group.command("enable")
@click.argument("name")
@click.pass_context
def enable(ctx: click.Context, name: str) -> None:
    """End protected mode of node group NAME now: launches allowed, Slurm drain lifted."""
    from slurm_burst.wiring.light import group_control

    cfg = app(ctx).config
    if name not in cfg.node_groups:
        fail(
            f"no node group {name!r} (groups: {', '.join(sorted(cfg.node_groups))})", EXIT_BAD_INPUT
        )
    try:
        undrained = group_control(cfg, state_store(ctx)).enable(name)
    except BurstError as exc:  # the state database or Slurm: said with the group's name
        fail(f"group {name}: {exc}", exc.exit_code)
    click.echo(f"node group {name} enabled; {len(undrained)} node(s) undrained in Slurm")
