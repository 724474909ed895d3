"""``slurm-burst resume|suspend|resume-fail HOSTLIST``: what slurm.conf's power-saving
programs run. They record the request and return; the daemon does the work."""

from __future__ import annotations

import sys
import time

import click

from slurm_burst.cli.common import app, redact_logs
from slurm_burst.services.hooks import HOOK_EXIT_CODES, run_hook, setup_hook_logging
from slurm_burst.services.stagehook import EXIT_FAILED, STAGE_IN_EXIT_CODES

# A hook must not hold slurmctld's power-save thread: Slurm commands get seconds, not minutes.
HOOK_SLURM_TIMEOUT = 5.0
_EPILOG = (
    "Exit codes (Slurm logs them): "
    + "; ".join(f"{code} {text}" for code, text in sorted(HOOK_EXIT_CODES.items()))
    + ". docs/operations.md says what to do for each."
)


def _hook(kind: str) -> click.Command:
    @click.command(kind, epilog=_EPILOG)
    @click.argument("hostlist")
    @click.pass_context
    def command(ctx: click.Context, hostlist: str) -> None:
        from slurm_burst.core.records import StoreError
        from slurm_burst.core.slurmsyntax import visible
        from slurm_burst.ports import NodeStore
        from slurm_burst.wiring.light import node_store, request_spool, scheduler, slurm_group

        a = app(ctx)
        a.check_drivers = False  # importing libcloud to check driver names costs ~150 ms
        cfg = a.config
        why = setup_hook_logging(cfg.daemon.hook_log, slurm_group(cfg), cfg.daemon.syslog)
        redact_logs()
        if why:
            click.echo(f"slurm-burst {kind}: {visible(why)}", err=True)
        store: NodeStore | None = None
        store_error = ""
        try:  # a database that cannot be opened is no reason to lose the request
            store = node_store(cfg, timeout=cfg.daemon.hook_db_timeout)
        except StoreError as exc:
            store_error = str(exc)
        result = run_hook(
            kind,
            hostlist,
            cfg,
            store,
            lambda: scheduler(cfg, timeout=HOOK_SLURM_TIMEOUT),
            time.time(),
            spool=request_spool(cfg),
            store_error=store_error,
        )
        if result.unknown:
            skipped = visible(",".join(result.unknown))[:300]
            click.echo(f"slurm-burst {kind}: not ours, skipped: {skipped}", err=True)
        if result.message:
            click.echo(f"slurm-burst {kind}: {visible(result.message)}", err=True)
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

    from slurm_burst.services.hooks import wake
    from slurm_burst.services.prolog import chain, run_prolog
    from slurm_burst.wiring.light import node_store, slurm_group

    a = app(ctx)
    a.check_drivers = False
    cfg = a.config
    setup_hook_logging(cfg.daemon.hook_log, slurm_group(cfg), cfg.daemon.syslog)
    redact_logs()
    result = run_prolog(
        os.environ, cfg, lambda: node_store(cfg, create=False), wake=lambda: wake(cfg.daemon.socket)
    )
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


_STAGE_IN_EPILOG = (
    "Exit codes (Slurm holds the job unless 0): "
    + "; ".join(f"{code} {text}" for code, text in sorted(STAGE_IN_EXIT_CODES.items()))
    + ". One line on stdout says why: Slurm shows it as the job's reason."
)


@click.command("stage-in", epilog=_STAGE_IN_EPILOG)
@click.argument("job_id")
@click.argument("script")
@click.pass_context
def stage_in(ctx: click.Context, job_id: str, script: str) -> None:
    """burst_buffer.lua's data_in: stage job JOB_ID's #BB_LUA stage_in data (SCRIPT is
    its batch script, as Slurm keeps it).

    A job bound to burst partitions only waits here until its data is in the store; any
    other job only until the daemon has checked its data may leave (docs/staging.md).
    """
    from slurm_burst.core.errors import BadInput, BurstError
    from slurm_burst.core.slurm import array_script, is_job_id
    from slurm_burst.core.slurmsyntax import visible
    from slurm_burst.fileio import file_error, read_regular
    from slurm_burst.services.burstbuffer import MAX_SCRIPT
    from slurm_burst.services.hooks import wake
    from slurm_burst.services.stagehook import run_stage_in
    from slurm_burst.wiring.light import clock, node_store, scheduler, slurm_group

    a = app(ctx)
    a.check_drivers = False
    cfg = a.config
    setup_hook_logging(cfg.daemon.hook_log, slurm_group(cfg), cfg.daemon.syslog)
    redact_logs()
    try:  # what goes wrong is said on stdout: Slurm makes it the job's reason
        if "\0" in script:
            raise BadInput("the job script's path holds a NUL byte")
        owners = scheduler(cfg, timeout=HOOK_SLURM_TIMEOUT)
        try:
            raw = read_regular(script, MAX_SCRIPT, head=True)
        except FileNotFoundError:  # 24.11+: an array task is handed its own id's path
            if not is_job_id(job_id):
                raise  # said as the missing file; a bad id is said by run_stage_in otherwise
            kept = array_script(script, int(job_id), owners.job_owner(int(job_id)).array_job_id)
            if kept is None:
                raise
            raw = read_regular(kept, MAX_SCRIPT, head=True)
        result = run_stage_in(
            job_id,
            raw.decode("utf-8", "surrogateescape"),
            cfg,
            store=node_store(cfg, timeout=cfg.daemon.hook_db_timeout),
            owners=owners,
            clock=clock(),
            wake=lambda: wake(cfg.daemon.socket),
        )
    except (BurstError, OSError) as exc:
        said = f"{exc.code}: {exc}" if isinstance(exc, BurstError) else file_error(exc)
        click.echo(visible(said)[:1000])
        sys.exit(EXIT_FAILED if isinstance(exc, BurstError) and exc.exit_code != 2 else 2)
    if result.message:
        click.echo(visible(result.message)[:1000])
    sys.exit(result.code)
