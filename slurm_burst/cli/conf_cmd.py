"""``slurm-burst conf``: render Slurm configuration from the slurm-burst config."""

from __future__ import annotations

from pathlib import Path

import click

from slurm_burst.cli.common import app
from slurm_burst.services.slurmconf import render


@click.group("conf")
def group() -> None:
    """Slurm configuration generated from the slurm-burst config."""


@group.command("render")
@click.option(
    "--output-dir",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write slurm-burst.conf and gres.conf here instead of printing them.",
)
@click.pass_context
def render_cmd(ctx: click.Context, output_dir: Path | None) -> None:
    """Print the slurm.conf Include fragment (power saving, CLOUD nodes, burst
    partitions) and the matching gres.conf.

    \b
    Install with:
      slurm-burst conf render -o /etc/slurm
      echo 'Include /etc/slurm/slurm-burst.conf' >> /etc/slurm/slurm.conf
      scontrol reconfigure   # node definition changes need a slurmctld restart
    """
    files = render(app(ctx).config)
    if output_dir is None:
        for name, text in files.items():
            click.echo(f"#### {name}\n{text}")
        return
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = output_dir / name
        tmp = path.with_name(name + ".tmp")
        tmp.write_text(text)
        tmp.chmod(0o644)
        tmp.replace(path)
        click.echo(f"wrote {path}")
