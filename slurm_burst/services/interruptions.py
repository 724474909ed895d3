"""A cloud node to be reclaimed (an interruption notice, passed on by the node's agent
through the node API: EC2's spot ``instance-action``, GCE's preemption or terminating
host maintenance): its jobs checkpoint and are requeued, and its capacity is replaced
by the fallback.

On a notice, at once:

1. the event ``spot.interruption`` (once per instance: a repeated notice is known);
2. the node's spot size cools down (the notice's code: ``SpotInterruption``,
   ``Preempted``; not for a host maintenance): the node's next launch, and any other
   node's, goes to the next candidate, the spot group's on-demand fallback;
3. each job running on the node gets the signal it asked for with ``--signal`` (read
   from its batch script; ``B:`` to the batch shell only), to checkpoint on.

Then, shortly before the reclaim (``core.interruption.MARGIN`` seconds) for a job that
got a signal, at once for one that did not: the jobs' stage-outs (``#BB_LUA stage_out``)
are synced a last time, whatever their ``sync=`` (at most until ``SYNC_SPARE`` seconds
before the reclaim: the checkpoint a job wrote on its signal is what it resumes from),
its jobs are requeued (``scontrol requeue``), and the node is failed with the notice's
code and torn down (the ledger's ``terminated`` event says so), then returned to
Slurm's service: a requeued job that lands on it again gets a new instance, on the
fallback.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slurm_burst.core.cloud import CapacityError
from slurm_burst.core.errors import BurstError
from slurm_burst.core.interruption import Notice, declared_signal, requeue_at
from slurm_burst.core.records import NodeRecord
from slurm_burst.ports import Clock, JobControl, NodeStore
from slurm_burst.services.periodic import contain

log = logging.getLogger(__name__)

LEAVE_WAIT = 8.0  # seconds a requeued job gets to leave the node before it is failed
SYNC_SPARE = 2.0  # seconds before the reclaim by which the last sync gives way to the requeue


@dataclass(frozen=True)
class InterruptionPorts:
    store: NodeStore
    jobs: JobControl
    clock: Clock
    cool: Callable[[NodeRecord, CapacityError], None]  # the node's size cooled down
    fail: Callable[[str, str, str], bool]  # fails a node from outside its worker
    submit: Callable[[str], None]  # hands a node to its worker
    # syncs jobs' stage-outs now, waiting at most the seconds given: the jobs synced
    sync_outputs: Callable[[list[int], float], list[int]] | None = None


class Interruptions:
    def __init__(self, ports: InterruptionPorts) -> None:
        self.p = ports
        self.timers: list[threading.Timer] = []

    def notice(self, rec: NodeRecord, notice: Notice) -> dict[str, Any]:
        """Handle ``rec``'s notice (see the module); what was done, for the agent."""
        p = self.p
        now = p.clock.now()
        if not p.store.notice_seen(rec.instance_id, rec.name, notice.action, notice.at):
            return {"known": True}
        left = notice.at - now
        p.store.event(now, "spot.interruption", rec.name,
                      f"{notice.code}: {notice.action} in {left:.0f} s "
                      f"({rec.instance_id})")  # fmt: skip
        log.warning("node.interruption node=%s instance=%s action=%s code=%s in=%.0f",
                    rec.name, rec.instance_id, notice.action, notice.code, left)  # fmt: skip
        if notice.capacity:
            p.cool(rec, CapacityError(f"{rec.provider}/{rec.size}: interruption notice",
                                      notice.code))  # fmt: skip
        jobs = self._running_on(rec.name)
        signalled: list[int] = []
        for job_id in jobs:
            try:
                declared = declared_signal(p.jobs.batch_script(job_id))
                if declared is not None:
                    p.jobs.signal_job(job_id, declared.signal, declared.batch_only)
                    signalled.append(job_id)
                    p.store.event(p.clock.now(), "job.signalled", rec.name,
                                  f"job {job_id}: {declared.signal}")  # fmt: skip
            except (BurstError, ValueError) as exc:  # the job ended meanwhile; a bad spec
                log.warning("node.interruption_signal_failed job=%d error=%s", job_id, exc)
        when = requeue_at(notice, bool(signalled), now)
        timer = threading.Timer(max(0.0, when - now), self._reclaim,
                                (rec.name, jobs, notice.code, notice.at))  # fmt: skip
        timer.daemon = True
        self.timers = [t for t in self.timers if t.is_alive()]  # the ones that fired: gone
        self.timers.append(timer)
        timer.start()
        return {"jobs": jobs, "signalled": signalled, "requeue_at": when}

    def _running_on(self, node: str) -> list[int]:
        try:
            return self.p.jobs.jobs_on(node)
        except BurstError as exc:
            log.warning("node.interruption_jobs_unread node=%s error=%s", node, exc)
            return []

    def _reclaim(self, node: str, jobs: list[int], code: str, until: float) -> None:
        """Sync the jobs' outputs (until ``SYNC_SPARE`` s before ``until``, the reclaim),
        requeue the node's jobs, then fail the node (torn down, back in service)."""
        p = self.p
        if jobs and p.sync_outputs is not None:
            try:
                budget = max(0.0, until - p.clock.now() - SYNC_SPARE)
                synced = p.sync_outputs(jobs, budget)
                if synced:
                    p.store.event(p.clock.now(), "output.synced_on_notice", node,
                                  ",".join(map(str, synced)))  # fmt: skip
            except Exception as exc:  # boundary: a timer thread; the requeue comes first
                contain("node.interruption_sync", exc, None)
        try:
            if jobs:
                p.jobs.requeue(jobs)
                p.store.event(p.clock.now(), "job.requeued", node,
                              ",".join(map(str, jobs)))  # fmt: skip
        except BurstError as exc:  # ended meanwhile: nothing to requeue
            log.warning("node.interruption_requeue_failed node=%s error=%s", node, exc)
        self._left(node, jobs)
        try:
            if p.fail(node, code, "the provider reclaims the instance (interruption notice)"):
                p.submit(node)
        except Exception as exc:  # boundary: a timer thread; the reconcile loop sees it gone
            contain("node.interruption", exc, None)

    def _left(self, node: str, jobs: list[int]) -> None:
        """Wait (up to LEAVE_WAIT s) until the requeued jobs have left the node: failing
        the node while one still completes there makes Slurm requeue it a second time."""
        if not jobs:
            return
        deadline = self.p.clock.monotonic() + LEAVE_WAIT
        while self.p.clock.monotonic() < deadline:
            try:
                there = self.p.jobs.jobs_on(node, "all")  # completing ones too
            except BurstError:
                return
            if not set(jobs) & set(there):
                return
            self.p.clock.sleep(0.5)

    def close(self) -> None:
        for t in self.timers:
            t.cancel()
