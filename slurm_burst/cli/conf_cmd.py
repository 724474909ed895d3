"""``slurm-burst conf``: render Slurm configuration from the slurm-burst config."""

from __future__ import annotations

from pathlib import Path

import click

from slurm_burst.cli.common import EXIT_BAD_INPUT, app, fail
from slurm_burst.services.slurmconf import render, write_files


@click.group("conf")
def group() -> None:
    """Slurm configuration generated from the slurm-burst config."""


@group.command("render")
@click.option(
    "--output-dir",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write slurm-burst.conf and gres.conf (with staging.store, also burst_buffer.conf "
    "and burst_buffer.lua) here instead of printing them.",
)
@click.option(
    "--slurm-release",
    metavar="X.Y",
    help="Render for this Slurm release (default: slurm.release, else sinfo --version).",
)
@click.pass_context
def render_cmd(ctx: click.Context, output_dir: Path | None, slurm_release: str | None) -> None:
    """Print the slurm.conf Include fragment (power saving, CLOUD nodes, burst
    partitions) and the matching gres.conf.

    \b
    Install with:
      slurm-burst conf render -o /etc/slurm
      echo 'Include slurm-burst.conf' >> /etc/slurm/slurm.conf   # relative: configless
      scontrol reconfigure   # node definition changes need a slurmctld restart
    """
    from slurm_burst.wiring.light import slurm_release as release_of_cluster
    from slurm_burst.wiring.storage import kept_paths

    cfg = app(ctx).config
    try:
        files = render(cfg, slurm_release or release_of_cluster(cfg), kept_paths(cfg))
    except ValueError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    if output_dir is None:
        for name, text in files.items():
            click.echo(f"#### {name}\n{text}")
        return
    try:
        written = write_files(output_dir, files, 0o644)
    except OSError as exc:
        fail(f"cannot write into {output_dir}: {exc.strerror or exc}", EXIT_BAD_INPUT)
    for path in written:
        click.echo(f"wrote {path}")


@group.command("install-hooks")
@click.option("--dir", "hook_dir", help="Install here instead of slurm.hook_dir.")
@click.pass_context
def install_hooks_cmd(ctx: click.Context, hook_dir: str | None) -> None:
    """Install slurm-burst-resume, -suspend, -resume-fail, -prolog-slurmctld and
    -stage-in into slurm.hook_dir.

    \b
    They are what the rendered fragment's ResumeProgram, SuspendProgram,
    ResumeFailProgram and PrologSlurmctld name, and what burst_buffer.lua's data_in
    runs; each runs 'slurm-burst --config THIS_CONFIG resume|...' with this Python,
    so slurmctld needs no environment of ours.
    """
    from slurm_burst.services.slurmconf import install_hooks

    a = app(ctx)
    target = hook_dir or a.config.slurm.hook_dir
    try:
        installed = install_hooks(target, str(a.config_path.resolve()))
    except OSError as exc:
        fail(f"cannot install the hooks into {target}: {exc.strerror or exc}", EXIT_BAD_INPUT)
    for path in installed:
        click.echo(f"installed {path}")
