"""Slurm's PrologSlurmctld: hold a job with cloud nodes until they have joined, then let go.

Slurm runs it (as SlurmUser, in slurmscriptd) when it allocates a job. For a job
without burst nodes it returns at once. For one with burst nodes it waits, reading
the daemon's state database (never polling slurmctld), until every burst node of
the job has joined and registered (``core.prolog``): then Slurm launches the batch
job at once instead of at its next 30-second check. If a node fails, or the wait
outlasts ResumeTimeout plus a margin, it exits non-zero: Slurm requeues a batch job
(cancels an interactive one), and the node's reason names the failure.

Many run at once (one per job being allocated); each reads a few rows every
``POLL`` seconds, so 50 waiting jobs cost the controller next to nothing and
slurmctld's script runner is never blocked (it runs prologs concurrently).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from slurm_burst.config import Config
from slurm_burst.core.hostlist import HostlistError, compress, expand_unique
from slurm_burst.core.prolog import FAIL, READY, judge
from slurm_burst.core.records import StageState, StoreError
from slurm_burst.ports import NodeStore

log = logging.getLogger("slurm_burst.prolog")

POLL = 0.2  # seconds between looks at the state database
# The wait ends this long after ResumeTimeout: Slurm itself gives up on the nodes at
# ResumeTimeout (and requeues), so the prolog outlives it only to see why.
MARGIN = 30
EXIT_OK, EXIT_FAILED = 0, 1


def deadline_seconds(cfg: Config) -> int:
    return cfg.slurm.resume_timeout + MARGIN


def prolog_epilog_timeout(cfg: Config) -> int:
    """The PrologEpilogTimeout ``conf render`` writes: the prolog's wait plus the same
    margin again for the site's chained prolog. It also bounds slurmd's Prolog and
    Epilog on every node (Slurm has one setting for all of them)."""
    return deadline_seconds(cfg) + MARGIN


@dataclass(frozen=True)
class PrologResult:
    code: int
    message: str = ""
    nodes: tuple[str, ...] = ()  # the job's burst nodes
    waited: float = 0.0


def run_prolog(
    env: Mapping[str, str],
    cfg: Config,
    store: Callable[[], NodeStore],
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    wake: Callable[[], object] = lambda: None,
) -> PrologResult:
    """Wait for the job's burst nodes; the state store is opened only for jobs with some."""
    job = env.get("SLURM_JOB_ID", "?")
    try:
        names = expand_unique(
            env.get("SLURM_JOB_NODELIST", ""), max_names=cfg.slurm.hostlist_max_names
        )
    except HostlistError as exc:
        log.error("prolog.bad_nodelist job=%s error=%s", job, exc)
        return PrologResult(EXIT_FAILED, f"SLURM_JOB_NODELIST not understood: {exc}")
    ours = tuple(n for n in names if cfg.group_of(n) is not None)
    if not ours:
        return PrologResult(EXIT_OK)
    started = now()
    try:
        gate = _Gate(job, ours, cfg, store(), started, now, sleep)
        result = gate.nodes_joined()
        if result.code == EXIT_OK and job.isdigit() and gate.db.stage(int(job)) is not None:
            return gate.data_on_nodes(int(job), wake)
        return result
    except StoreError as exc:
        # Not knowing is no reason to requeue every burst job (an upgrade, a lost file):
        # the job goes on as it would without a prolog, started at Slurm's next check.
        log.error("prolog.store_unreadable job=%s error=%s (job not held)", job, exc)
        return PrologResult(EXIT_OK, f"{exc}; job not held", ours, now() - started)


@dataclass(frozen=True)
class _Gate:
    """One job's wait: its burst nodes, the state database, the clock."""

    job: str
    ours: tuple[str, ...]
    cfg: Config
    db: NodeStore
    started: float
    now: Callable[[], float]
    sleep: Callable[[float], None]

    def _result(self, code: int, message: str = "") -> PrologResult:
        return PrologResult(code, message, self.ours, self.now() - self.started)

    def nodes_joined(self) -> PrologResult:
        job, ours, cfg = self.job, self.ours, self.cfg
        limit = self.started + deadline_seconds(cfg)
        log.info("prolog.waiting job=%s count=%d hostlist=%s", job, len(ours), compress(list(ours)))
        while True:
            beat = self.db.heartbeat()
            t = self.now()
            verdict = judge(
                ours,
                self.db.nodes_named(ours),
                self.started,
                None if beat is None else t - float(beat["at"]),
                cfg.daemon.heartbeat_stale,
            )
            if verdict.kind == READY:
                log.info("prolog.ready job=%s count=%d waited=%.2f", job, len(ours),
                         t - self.started)  # fmt: skip
                return self._result(EXIT_OK)
            if verdict.kind == FAIL:
                log.error("prolog.failed job=%s waited=%.1f %s", job, t - self.started,
                          verdict.message)  # fmt: skip
                return self._result(EXIT_FAILED, verdict.message)
            if t >= limit:
                message = (
                    f"nodes {compress(list(verdict.waiting))} not ready "
                    f"{deadline_seconds(cfg)} s after the job was allocated "
                    f"(ResumeTimeout {cfg.slurm.resume_timeout} s + {MARGIN} s)"
                )
                log.error("prolog.timeout job=%s %s", job, message)
                return self._result(EXIT_FAILED, message)
            self.sleep(POLL)

    def data_on_nodes(self, job: int, wake: Callable[[], object]) -> PrologResult:
        """The job's staged data on each of its burst nodes. A node that joined for it
        pulled it while joining; one that was up already (it ran another job, or is
        warm) is asked to pull now, by the daemon, and the job starts once it has."""
        ours, db = self.ours, self.db
        rec = db.stage(job)
        if rec is not None and rec.state == StageState.KEPT_HOME:
            log.error("prolog.kept_home job=%s nodes=%s", job, compress(list(ours)))
            return self._result(
                EXIT_FAILED,
                f"job {job}'s data stays on-prem ({rec.message}); it may not run on burst nodes",
            )
        limit = self.started + deadline_seconds(self.cfg)
        asked = False
        while True:
            pulled = set(db.pulled_on(job))
            missing = [n for n in ours if n not in pulled]
            if not missing:
                log.info("prolog.staged job=%s count=%d", job, len(ours))
                return self._result(EXIT_OK)
            for n in missing:
                why = db.pull_failure(job, n)
                if why:
                    log.error("prolog.stage_failed job=%s node=%s %s", job, n, why)
                    return self._result(EXIT_FAILED, f"{n}: {why}")
            if not asked:
                for n in missing:
                    db.ask_pull(job, n, self.now())
                wake()
                asked = True
            if self.now() > limit:
                return self._result(
                    EXIT_FAILED,
                    f"job {job}'s data not on {compress(missing)} "
                    f"{deadline_seconds(self.cfg)} s after the job was allocated",
                )
            self.sleep(POLL)


def chain(path: str, env: Mapping[str, str]) -> None:
    """Become the site's own PrologSlurmctld (its exit status is the prolog's); returns
    only if it cannot be run. No shell: the job's environment is passed as it is."""
    try:
        os.execve(path, [path], dict(env))
    except OSError as exc:
        log.error("prolog.chain_failed program=%s error=%s", path, exc.strerror or exc)
        raise
