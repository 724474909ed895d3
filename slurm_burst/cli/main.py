"""``slurm-burst``: the sysadmin's command line. Each command group lives in its own module.

Command modules are imported only when their command runs: the resume/suspend
hooks are this same program, and slurmctld waits for them, so ``slurm-burst
resume`` must not pay for importing libcloud, paramiko or SQLAlchemy.
"""

from __future__ import annotations

import importlib
import logging

import click

from slurm_burst import __version__, extensions
from slurm_burst.cli.common import EXIT_CODES, AppContext, fail, redact_logs
from slurm_burst.config import resolve_config_path
from slurm_burst.core.errors import BurstError

_EPILOG = "Exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()) + "."

# command name -> "module:attribute"
COMMANDS = {
    "config": "slurm_burst.cli.config_cmd:group",
    "conf": "slurm_burst.cli.conf_cmd:group",
    "hostlist": "slurm_burst.cli.hostlist_cmd:group",
    "resume": "slurm_burst.cli.hooks_cmd:resume",
    "suspend": "slurm_burst.cli.hooks_cmd:suspend",
    "resume-fail": "slurm_burst.cli.hooks_cmd:resume_fail",
    "prolog-slurmctld": "slurm_burst.cli.hooks_cmd:prolog_slurmctld",
    "stage-in": "slurm_burst.cli.hooks_cmd:stage_in",
    "daemon": "slurm_burst.cli.daemon_cmd:daemon",
    "nodes": "slurm_burst.cli.daemon_cmd:nodes",
    "events": "slurm_burst.cli.daemon_cmd:events",
    "ledger": "slurm_burst.cli.ledger_cmd:group",
    "budget": "slurm_burst.cli.budget_cmd:group",
    "prices": "slurm_burst.cli.prices_cmd:group",
    "db": "slurm_burst.cli.db_cmd:group",
    "status": "slurm_burst.cli.status_cmd:status",
    "group": "slurm_burst.cli.group_cmd:group",
    "simulate": "slurm_burst.cli.simulate_cmd:simulate",
    "policy": "slurm_burst.cli.policy_cmd:group",
    "jobs": "slurm_burst.cli.jobs_cmd:jobs",
    "stage": "slurm_burst.cli.stage_cmd:group",
    "runtime": "slurm_burst.cli.runtime_cmd:group",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use; plugins add theirs
    (slurm_burst.extensions), looked up only for a name that is not ours."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({**_plugin_commands(), **COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name) or _plugin_commands().get(cmd_name)
        if target is None:
            return None
        module, attr = target.split(":")
        cmd = getattr(importlib.import_module(module), attr)
        assert isinstance(cmd, click.Command)
        return cmd

    def invoke(self, ctx: click.Context) -> object:
        """The one place an error ends a command: a BurstError (every error a user can
        see derives from it) exits with its ``exit_code``, its message on stderr."""
        try:
            return super().invoke(ctx)
        except BurstError as exc:
            fail(str(exc) or exc.code, exc.exit_code)


def _plugin_commands() -> dict[str, str]:
    try:
        return extensions.commands()
    except extensions.ExtensionError as exc:  # a broken plugin hides its commands, said once
        logging.getLogger(__name__).warning("%s", exc)
        return {}


@click.group(
    cls=LazyGroup, epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]}
)
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
    """Cloud bursting for Slurm: hooks, provisioning daemon and cost ledger."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    redact_logs()
    ctx.obj = AppContext(config_path=resolve_config_path(config_path), verbose=verbose)


def main() -> None:
    cli(prog_name="slurm-burst")
