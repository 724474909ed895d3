"""``slurm-burst``: the sysadmin's command line. Each command group lives in its own module."""

from __future__ import annotations

import logging

import click

from slurm_burst import __version__
from slurm_burst.cli import conf_cmd, config_cmd, hostlist_cmd, lab_cmd
from slurm_burst.cli.common import EXIT_CODES, AppContext
from slurm_burst.config import resolve_config_path

_EPILOG = "Exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()) + "."


@click.group(epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    metavar="PATH",
    envvar="SLURM_BURST_CONFIG",
    help="Config file [env SLURM_BURST_CONFIG; default /etc/slurm-burst/slurm-burst.toml].",
)
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.version_option(__version__, prog_name="slurm-burst")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, verbose: int) -> None:
    """Cloud bursting for Slurm: hooks, provisioning daemon, cost ledger and a local lab."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    ctx.obj = AppContext(config_path=resolve_config_path(config_path))


for _module in (config_cmd, conf_cmd, hostlist_cmd, lab_cmd):
    cli.add_command(_module.group)


def main() -> None:
    cli(prog_name="slurm-burst")
