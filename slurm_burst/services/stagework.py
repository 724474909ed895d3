"""The daemon's half of stage-in: the stages the hook recorded, worked as each job's user.

Every pass of the daemon's main loop (a second, or at once when a hook wakes it):

- a stage just recorded for a job bound to burst partitions only is pushed now; one
  for any other job is checked (resolved as the job's user, the site's rules, the
  markers in its tree): ``deferred`` if its data may leave, ``kept_home`` if not;
- a ``deferred`` stage whose job Slurm has given cloud nodes (a node being brought up
  for it) is pushed: its nodes pull it before they join;
- a stage left ``checking`` or ``pushing`` by a daemon that stopped is taken up again
  (a push resumes: what is stored is not sent again);
- records untouched for ``keep_days`` are forgotten.

The reading and sending happen in a child process that is the job's user (its uid,
gid and groups): ``slurm-burst stage push --as-user USER``, so the daemon's threads
never fork with their locks held, and only what that user may read can leave. At most
``parallel`` stages move at once; each in a thread of its own, off the main loop.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from slurm_burst.core.errors import BurstError
from slurm_burst.core.jobs import job_ids
from slurm_burst.core.nodestate import NodeState
from slurm_burst.core.records import StageRecord, StageState, StoreError
from slurm_burst.core.staging import SensitiveData
from slurm_burst.core.usage import TransferDirection
from slurm_burst.ports import Clock, NodeStore, StagePusher
from slurm_burst.services.outputs import Outputs
from slurm_burst.services.periodic import contain
from slurm_burst.services.transfers import TransferBook

log = logging.getLogger(__name__)

_ACTIVE = frozenset({NodeState.REQUESTED, NodeState.LAUNCHING, NodeState.BOOTING,
                     NodeState.BOOTSTRAPPING, NodeState.JOINED})  # fmt: skip


@dataclass(frozen=True)
class StageWorkSettings:
    parallel: int = 2  # stages moving at once
    keep_days: float = 7.0  # a record untouched this long is forgotten


class StageWork:
    def __init__(
        self,
        settings: StageWorkSettings,
        store: NodeStore,
        pusher: StagePusher,
        clock: Clock,
        puller: Callable[[int, str], None] | None = None,
        book: TransferBook | None = None,
        outputs: Outputs | None = None,
    ) -> None:
        self.settings = settings
        self.outputs = outputs  # jobs' stage-outs: synced and sealed from the same pass
        self.book = book  # each push into the ledger and the metrics
        self.puller = puller  # (job, node): a pull the prolog asked for, answered in meta
        self.store = store
        self.pusher = pusher
        self.clock = clock
        self._pool = ThreadPoolExecutor(max(1, settings.parallel), thread_name_prefix="stage")
        self._busy: set[int] = set()  # jobs whose stage a thread works on
        self._pulls: set[tuple[int, str]] = set()  # (job, node): pulls a thread works on
        self._lock = threading.Lock()
        self._forgot_at = 0.0

    def pass_once(self) -> int:
        """Start what is due; returns how many stages were started."""
        started = 0
        due = self.store.stages([StageState.REQUESTED, StageState.CHECKING,
                                 StageState.PUSHING, StageState.DEFERRED])  # fmt: skip
        bound = (
            self._jobs_with_cloud_nodes()
            if any(r.state == StageState.DEFERRED for r in due)
            else set()
        )
        for rec in due:
            if rec.state != StageState.DEFERRED:
                started += self._start(rec, rec.burst_only or rec.state == StageState.PUSHING)
            elif rec.job_id in bound:
                started += self._start(rec, push=True)
        if self.outputs is not None:
            started += self.outputs.pass_once()
        if self.puller is not None:
            for job, node in self.store.pulls_asked():
                started += self._start_pull(job, node)
        now = self.clock.now()
        if now - self._forgot_at > 3600:
            self._forgot_at = now
            gone = self.store.forget_stages(now - self.settings.keep_days * 86400)
            if gone:
                log.info("stage.forgotten count=%d", gone)
        return started

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.outputs is not None:
            self.outputs.shutdown()

    # -- helpers -----------------------------------------------------------------------

    def _jobs_with_cloud_nodes(self) -> set[int]:
        jobs: set[int] = set()
        for node in self.store.nodes():
            if node.state in _ACTIVE:
                jobs.update(job_ids(node.job_list()))
        return jobs

    def _start_pull(self, job: int, node: str) -> int:
        key = (job, node)
        with self._lock:
            if key in self._pulls:
                return 0
            self._pulls.add(key)
        log.info("stage.pull_asked job=%s node=%s", job, node)

        def work() -> None:
            try:
                assert self.puller is not None
                self.puller(job, node)
            except StoreError as exc:
                log.error("stage.pull_unrecorded job=%s node=%s error=%s", job, node, exc)
            except Exception as exc:  # boundary: a pool thread; the prolog times out
                contain("stage.pull", exc, None)
            finally:
                with self._lock:
                    self._pulls.discard(key)

        self._pool.submit(work)
        return 1

    def _start(self, rec: StageRecord, push: bool) -> int:
        with self._lock:
            if rec.job_id in self._busy:
                return 0
            self._busy.add(rec.job_id)
        state = StageState.PUSHING if push else StageState.CHECKING
        if rec.state != state:
            self.store.update_stage(rec.job_id, self.clock.now(), expect=[rec.state], state=state)
        log.info("stage.%s job=%s user=%s account=%s stages=%d",
                 "push" if push else "check", rec.job_id, rec.owner.user, rec.owner.account,
                 len(rec.stages))  # fmt: skip
        self._pool.submit(self._work, rec, push)
        return 1

    def _work(self, rec: StageRecord, push: bool) -> None:
        try:
            state, message, datasets = self._move(rec, push)
            self.store.update_stage(
                rec.job_id, self.clock.now(), state=state, message=message, datasets=datasets
            )
            log.log(
                logging.INFO if state != StageState.FAILED else logging.ERROR,
                "stage.%s job=%s %s", state, rec.job_id, message,
            )  # fmt: skip
        except StoreError as exc:  # the next pass finds it where it was and tries again
            log.error("stage.unrecorded job=%s error=%s", rec.job_id, exc)
        except Exception as exc:  # boundary: a pool thread; a defect fails this stage only
            contain("stage.work", exc, None)
            with contextlib.suppress(StoreError):
                why = f"internal error: {type(exc).__name__}"
                self.store.update_stage(
                    rec.job_id, self.clock.now(), state=StageState.FAILED, message=why
                )
        finally:
            with self._lock:
                self._busy.discard(rec.job_id)

    def _move(self, rec: StageRecord, push: bool) -> tuple[str, str, list[dict[str, Any]]]:
        datasets: list[dict[str, Any]] = []
        who = rec.owner
        for s in rec.stages:
            try:
                out = self.pusher.push(who.user, s["src"], who.account, who.qos, check=not push)
            except BurstError as exc:
                home = exc.code == SensitiveData.code
                if push and not home and self.book is not None:
                    self.book.failed(TransferDirection.IN)
                return (StageState.KEPT_HOME if home else StageState.FAILED,
                        f"{exc.code}: {exc}"[:900], datasets)  # fmt: skip
            if push and self.book is not None:  # one row per push: a push again is new
                attempt = f"{rec.created_at}:{rec.updated_at}"
                self.book.pushed(out, account=who.account, user=who.user, job_id=rec.job_id,
                                 dst=s["dst"], stage_id=attempt)  # fmt: skip
            datasets.append({"dst": s["dst"], **_kept(out)})
        if not push:
            total = sum(int(d.get("bytes", 0)) for d in datasets)
            return StageState.DEFERRED, f"cleared: {total} bytes may leave", datasets
        sent = sum(int(d.get("bytes_sent", 0)) for d in datasets)
        return StageState.STAGED, f"stored; {sent} bytes sent", datasets


def _kept(out: dict[str, Any]) -> dict[str, Any]:
    return {k: out[k] for k in _KEPT if k in out}


_KEPT: Sequence[str] = ("src", "real_src", "manifest", "files", "bytes", "bytes_sent", "objects",
                        "objects_sent", "requests", "seconds", "unchanged")  # fmt: skip
