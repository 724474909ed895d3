"""``slurm-burst config``: check and show the configuration."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from slurm_burst.cli.common import EXIT_BAD_INPUT, EXIT_OK, _driver_exists, app, emit, json_option
from slurm_burst.config import check_config


@click.group("config")
def group() -> None:
    """Check or show the slurm-burst configuration."""


@group.command("check")
@json_option
@click.pass_context
def check(ctx: click.Context, as_json: bool) -> None:
    """List EVERY problem in the config file, with key path and line.

    Exits 2 if there is at least one error; warnings alone exit 0.
    """
    path = app(ctx).config_path
    cfg, problems = check_config(path, driver_exists=_driver_exists)
    errors = [p for p in problems if p.severity == "error"]
    if as_json:
        emit(
            {
                "config": str(path),
                "ok": not errors and cfg is not None,
                "problems": [dataclasses.asdict(p) for p in problems],
            },
            True,
        )
    else:
        for p in problems:
            click.echo(p.render(str(path)), err=p.severity == "error")
        if errors:
            click.echo(
                f"{path}: {len(errors)} error(s), {len(problems) - len(errors)} warning(s)",
                err=True,
            )
        else:
            click.echo(f"{path}: OK ({len(problems)} warning(s))")
    ctx.exit(EXIT_BAD_INPUT if errors or cfg is None else EXIT_OK)


@group.command("show")
@json_option
@click.pass_context
def show(ctx: click.Context, as_json: bool) -> None:
    """Print the effective configuration, defaults filled in."""
    cfg = app(ctx).config
    data = _plain(cfg)
    if as_json:
        emit(data, True)
        return
    for section, value in data.items():
        click.echo(f"[{section}] {value}")


def _plain(value: Any) -> Any:
    """The config as plain data (dataclasses.asdict cannot copy its read-only mappings)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value
