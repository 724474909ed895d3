"""``slurm-burst resume|suspend|resume-fail HOSTLIST``: what slurm.conf's power-saving
programs run. They record the request and return; the daemon does the work."""

from __future__ import annotations

import sys
import time

import click

from slurm_burst.cli.common import app, redact_logs
from slurm_burst.services.hooks import run_hook, setup_hook_logging

# A hook must not hold slurmctld's power-save thread: Slurm commands get seconds, not minutes.
HOOK_SLURM_TIMEOUT = 5.0
_EPILOG = (
    "Exit codes: 0 recorded; 1 the daemon's heartbeat is stale (resume: nodes set DOWN); "
    "2 bad hostlist, bad config, or no node of ours."
)


def _hook(kind: str) -> click.Command:
    @click.command(kind, epilog=_EPILOG)
    @click.argument("hostlist")
    @click.pass_context
    def command(ctx: click.Context, hostlist: str) -> None:
        from slurm_burst.core.records import StoreError
        from slurm_burst.wiring import node_store, scheduler, slurm_group

        a = app(ctx)
        a.check_drivers = False  # importing libcloud to check driver names costs ~150 ms
        cfg = a.config
        setup_hook_logging(cfg.daemon.hook_log, slurm_group(cfg))
        redact_logs()
        try:
            store = node_store(cfg)
        except StoreError as exc:
            click.echo(f"slurm-burst {kind}: {exc}", err=True)
            sys.exit(1)
        result = run_hook(
            kind,
            hostlist,
            cfg,
            store,
            lambda: scheduler(cfg, timeout=HOOK_SLURM_TIMEOUT),
            time.time(),
        )
        if result.unknown:
            click.echo(
                f"slurm-burst {kind}: not ours, skipped: {','.join(result.unknown)}", err=True
            )
        if result.message:
            click.echo(f"slurm-burst {kind}: {result.message}", err=True)
        sys.exit(result.code)

    command.help = {
        "resume": "ResumeProgram: ask the daemon to start cloud nodes HOSTLIST.",
        "suspend": "SuspendProgram: ask the daemon to release cloud nodes HOSTLIST.",
        "resume-fail": "ResumeFailProgram: release nodes that failed to resume; return them "
        "to service.",
    }[kind]
    return command


resume = _hook("resume")
suspend = _hook("suspend")
resume_fail = _hook("resume-fail")


_PROLOG_EPILOG = (
    "Exit codes: 0 the job's cloud nodes have registered (or it has none), then the "
    "site's own prolog (slurm.prolog_chain) decides; 1 a node failed, the daemon is not "
    "running, or the nodes were not ready within ResumeTimeout plus 30 s (Slurm requeues "
    "a batch job, cancels an interactive one)."
)


@click.command("prolog-slurmctld", epilog=_PROLOG_EPILOG)
@click.pass_context
def prolog_slurmctld(ctx: click.Context) -> None:
    """PrologSlurmctld: hold a job with cloud nodes until they have joined the cluster.

    Reads SLURM_JOB_ID and SLURM_JOB_NODELIST from the environment Slurm gives it;
    waits on the daemon's state database, not on slurmctld.
    """
    import os

    from slurm_burst.services.prolog import chain, run_prolog
    from slurm_burst.wiring import node_store, slurm_group

    a = app(ctx)
    a.check_drivers = False
    cfg = a.config
    setup_hook_logging(cfg.daemon.hook_log, slurm_group(cfg))
    redact_logs()
    result = run_prolog(os.environ, cfg, lambda: node_store(cfg, create=False))
    if result.message:
        click.echo(f"slurm-burst prolog-slurmctld: {result.message}", err=True)
    if result.code == 0 and cfg.slurm.prolog_chain:
        try:
            chain(cfg.slurm.prolog_chain, os.environ)
        except OSError as exc:
            click.echo(
                f"slurm-burst prolog-slurmctld: cannot run {cfg.slurm.prolog_chain}: "
                f"{exc.strerror or exc}",
                err=True,
            )
            sys.exit(1)
    sys.exit(result.code)
