"""``slurm-burst hostlist``: Slurm's hostlist grammar, for scripts that must not guess."""

from __future__ import annotations

import click

from slurm_burst.cli.common import emit, json_option
from slurm_burst.core.hostlist import compress, expand


@click.group("hostlist")
def group() -> None:
    """Expand or compress Slurm hostlist expressions (no controller needed)."""


@group.command("expand")
@click.argument("expression")
@json_option
def expand_cmd(expression: str, as_json: bool) -> None:
    """Print one node name per line for EXPRESSION, e.g. 'gpu-a[01-02]-[1-2]'."""
    names = expand(expression)
    emit(names, True) if as_json else click.echo("\n".join(names))


@group.command("compress")
@click.argument("names", nargs=-1, required=True)
@click.option("--sort", is_flag=True, help="Sort like 'scontrol show hostlistsorted'.")
@click.option("--unique", is_flag=True, help="Drop repeated names (implies --sort).")
def compress_cmd(names: tuple[str, ...], sort: bool, unique: bool) -> None:
    """Compress NAMES (or comma-separated lists) into one hostlist expression."""
    flat = [n for arg in names for n in expand(arg)]
    click.echo(compress(flat, sort=sort, unique=unique))
