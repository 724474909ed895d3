"""What ``burst_buffer.lua``'s ``slurm_bb_data_in`` runs: ``slurm-burst stage-in JOB SCRIPT``.

Slurm runs it (as SlurmUser, in slurmscriptd) while the job pends with reason
``BurstBufferStageIn``, before it picks the job's nodes. It

1. reads the job's stage directives from its script (the same parser as the Lua hook
   at submit) and whose job it is, with which account, QOS and partitions (``squeue``);
2. records the stage in the state database and wakes the daemon, which reads the data
   as the job's user (``services/stagework.py``);
3. records its stage-outs (``stage_out``: synced and sealed by the daemon,
   ``services/outputs.py``);
4. waits for the daemon's verdict and says it on stdout, one line: Slurm holds the job
   with it as the reason when the exit status is not 0.

When data moves: a job bound to burst partitions only can run nowhere else, so the
daemon pushes its data now and the hook returns once it is stored. Any other job may
run on-prem, and must not wait for an upload it would not use: the daemon only checks
that its data may leave (resolving symlinks, as the job's user) and the hook returns;
the push starts if and when Slurm resumes cloud nodes for the job, and the nodes join
only once they hold it (the PrologSlurmctld waits for that). Data kept home keeps the
job home: the burst policy never sends it to the cloud.

Idempotent: after a slurmctld restart Slurm runs stage-in again, and finds the record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slurm_burst.config import Config
from slurm_burst.core.errors import BadInput
from slurm_burst.core.records import OutputRecord, StageRecord, StageState
from slurm_burst.core.slurm import JobOwner, is_job_id
from slurm_burst.core.staging import StageIn, StageOut, parse_stages
from slurm_burst.ports import Clock, JobOwners, NodeStore
from slurm_burst.services.hooks import heartbeat_age

log = logging.getLogger("slurm_burst.stage_in")

POLL = 0.2  # seconds between looks at the state database
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
STAGE_IN_EXIT_CODES = {
    EXIT_OK: "staged (or, for a job that may run on-prem, cleared to stage later)",
    EXIT_FAILED: "the stage failed or was refused: Slurm holds the job with the reason",
    EXIT_BAD_INPUT: "a bad job id, job script or directive: Slurm holds the job",
}


@dataclass(frozen=True)
class StageInResult:
    code: int
    message: str = ""


def burst_only(partitions: Sequence[str], cfg: Config) -> bool:
    burst = set(cfg.burst_partitions())
    return bool(partitions) and all(p in burst for p in partitions)


def record(owner: JobOwner, stages: Sequence[StageIn], cfg: Config, now: float) -> StageRecord:
    """The job's stage record (one with stage-outs only has nothing to move in: staged)."""
    return StageRecord(
        owner=owner,
        burst_only=burst_only(owner.partitions, cfg),
        stages=[{"src": s.src, "dst": s.dst} for s in stages],
        state=StageState.REQUESTED if stages else StageState.STAGED,
        message="" if stages else "nothing to stage in",
        created_at=now,
        updated_at=now,
    )


def outputs(job_id: int, outs: Sequence[StageOut], now: float) -> list[OutputRecord]:
    return [OutputRecord(job_id, o.src, o.home(job_id), o.sync, updated_at=now) for o in outs]


def run_stage_in(
    job_id: str,
    script: str,
    cfg: Config,
    *,
    store: NodeStore,
    owners: JobOwners,
    clock: Clock,
    wake: Callable[[], object],
) -> StageInResult:
    """Record the stage of job ``job_id`` (its batch script's text is ``script``) and
    wait for the daemon's verdict on it."""
    if not is_job_id(job_id):
        return StageInResult(EXIT_BAD_INPUT, f"job id {job_id[:20]!r} is not a number")
    try:
        stages = parse_stages(script)
    except BadInput as exc:
        return StageInResult(EXIT_BAD_INPUT, str(exc))
    if not stages.ins and not stages.outs:
        return StageInResult(EXIT_OK)
    owner = owners.job_owner(int(job_id))
    now = clock.now()
    with store.atomically():
        rec = store.add_stage(record(owner, stages.ins, cfg, now))
        store.add_outputs(outputs(owner.job_id, stages.outs, now))
    wake()
    log.info(
        "stage_in.recorded job=%s user=%s account=%s burst_only=%s state=%s stages=%d "
        "outputs=%d", job_id, rec.owner.user, rec.owner.account, rec.burst_only, rec.state,
        len(stages.ins), len(stages.outs),
    )  # fmt: skip
    return _wait(rec, cfg, store, clock)


def _wait(rec: StageRecord, cfg: Config, store: NodeStore, clock: Clock) -> StageInResult:
    job = rec.job_id
    warned = False
    while True:
        now_rec = store.stage(job)
        if now_rec is None:  # forgotten under us (an admin's clean-up): ask again
            return StageInResult(EXIT_FAILED, f"job {job}'s stage record vanished; try again")
        state = now_rec.state
        if state == StageState.STAGED or (
            not rec.burst_only and state in (StageState.DEFERRED, StageState.PUSHING)
        ):
            return StageInResult(EXIT_OK)
        if state == StageState.KEPT_HOME and not rec.burst_only:
            log.info("stage_in.kept_home job=%s %s (the job stays on-prem)", job, now_rec.message)
            return StageInResult(EXIT_OK, now_rec.message)
        if state in (StageState.KEPT_HOME, StageState.FAILED):
            return StageInResult(EXIT_FAILED, now_rec.message or state)
        stale = _daemon_stale(store, cfg, clock.now())
        if stale and not rec.burst_only:  # it checks when it returns; nothing moves before
            log.warning("stage_in.daemon_stale job=%s %s; left to check later", job, stale)
            return StageInResult(EXIT_OK)
        if stale and not warned:
            log.error("stage_in.daemon_stale job=%s %s; waiting for it", job, stale)
            warned = True
        clock.sleep(POLL)


def _daemon_stale(store: NodeStore, cfg: Config, now: float) -> str:
    age, unreadable = heartbeat_age(store, now)
    if unreadable:
        return f"heartbeat unreadable: {unreadable}"
    if age is None:
        return "the daemon never ran"
    return f"heartbeat {age:.0f} s old" if age > cfg.daemon.heartbeat_stale else ""
