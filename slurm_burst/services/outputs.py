"""A job's outputs brought home (``#BB_LUA stage_out``): synced while it runs, sealed
once it ended, and its node not released before.

Every pass of the daemon's stage work (a few seconds apart while any output is open):

- a job running on a cloud node: its first node is noted, and each output whose
  ``sync`` is due is synced: the node scans the directory (``node/stageout.py scan``,
  only changed files re-read), the daemon asks the store which objects it lacks and hands
  the node a URL per object that may PUT that object only, the node sends them, and the
  version (a manifest, as a stage-in's) is recorded with the output's destination
  pointing at it. That version is what a requeued job resumes from: its node pulls it
  back into the directory before the job starts (``services/nodestage.py``);
- a job that ended (or is gone from the queue): its outputs are sealed. The final sync
  runs while the node is still up (``ended``; ``partial`` if the node was gone: the last
  version synced comes home and the rest is lost), then the version is brought home by
  a child that is the job's user (``slurm-burst stage promote --as-user``): fetched
  beside the destination, every file's SHA-256 checked, then swapped in whole. A version
  whose objects come back wrong is never promoted: those objects are dropped from the
  store and synced again from the held node, then brought home. A final sync or a promotion that
  fails is tried again every ``RETRY`` seconds until ``release_deadline`` from the
  first try;
- a job seen running again after its outputs were sealed (a requeue) opens them again.

A node holding outputs not yet sealed is not torn down when Slurm suspends it: the
provisioner calls :meth:`Outputs.hold`, which waits until they are sealed or until
``release_deadline``; what did not come home by then is written in the output's record
(``slurm-burst stage outputs``) and the events: which version is home, and that what the
job wrote after it is lost.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import Any

from slurm_burst.core.errors import BurstError
from slurm_burst.core.hostlist import expand
from slurm_burst.core.jsonread import read_json
from slurm_burst.core.nodestate import NodeState
from slurm_burst.core.records import NodeRecord, OutputRecord, OutputState, StageRecord, StoreError
from slurm_burst.core.remote import RemoteError
from slurm_burst.core.slurm import SlurmJob
from slurm_burst.core.staging import CorruptOutput, output_dir, output_manifest
from slurm_burst.core.usage import TransferDirection
from slurm_burst.ports import (
    Clock,
    Connector,
    Metrics,
    NodeStore,
    OutputPromoter,
    RemoteShell,
    Scheduler,
)
from slurm_burst.services.periodic import contain
from slurm_burst.services.staging import Stager
from slurm_burst.services.transfers import TransferBook

log = logging.getLogger(__name__)

REMOTE = "/run/slurm-burst-stageout.py"
# an output scan's answer: node/stageout.py's MAX_FILES (a million) files of 5 values
MAX_SCAN, MAX_SCAN_VALUES = 256 * 1024 * 1024, 6_000_000
CACHE = "/var/lib/slurm-burst/stageout/{job}-{name}.json"
PINS = "/var/lib/slurm-burst/stageout/{job}-{name}.pins"  # what the last scan read, kept
LOOK = 5.0  # seconds between looks at the queue while outputs are open
REOPEN = 86400.0  # seconds a sealed output's job is still watched for a requeue
CHANGED_TRIES = 3  # scans and sends of one sync while files change under it
RETRY = 15.0  # seconds before a failed final sync or promotion is tried again
# a job in one of these is over for good (a requeued one is PENDING again)
ENDED = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "COMPLETING", "DEADLINE", "FAILED",
                   "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT"})  # fmt: skip


def _count(said: dict[str, Any], key: str) -> int:
    """A count the node program answered; 0 if it said something else (it is a node's)."""
    value = said.get(key, 0)
    return value if type(value) is int and value >= 0 else 0


class OutputError(BurstError):
    """A sync or a seal that could not be done (the message says which step and why)."""

    code = "StageOut"


class _Changed(OutputError):
    """Files changed while they were sent: that version is not recorded (caught by
    ``Outputs._settled``, which scans again; the last try's reaches the record)."""


@dataclass(frozen=True)
class OutputSettings:
    node_dir: str  # staging.node_dir: outputs are <node_dir>/<job>/<name>
    node_python: str = "python3"
    release_deadline: float = 1800.0  # staging.release_deadline
    command_timeout: float = 900.0  # one scan or send on the node
    parallel: int = 2  # jobs synced or sealed at once
    partitions: tuple[str, ...] = ()  # the burst partitions (their jobs are read); (): all


def _natural(name: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


@dataclass(frozen=True, kw_only=True)
class OutputPorts:
    store: NodeStore
    stager: Stager
    clock: Clock
    connector: Connector
    scheduler: Scheduler
    promoter: OutputPromoter  # brings a version home as the job's user
    book: TransferBook | None = None  # each version brought home: ledger and metrics
    metrics: Metrics | None = None


class Outputs:
    def __init__(self, settings: OutputSettings, ports: OutputPorts) -> None:
        self.settings = settings
        self.metrics = ports.metrics
        self._held: dict[str, float] = {}  # node -> its release deadline (monotonic)
        self.book = ports.book
        self.store = ports.store
        self.stager = ports.stager
        self.clock = ports.clock
        self.connector = ports.connector
        self.scheduler = ports.scheduler
        self.promoter = ports.promoter
        self.helper = resources.files("slurm_burst.node").joinpath("stageout.py").read_bytes()
        self._pool = ThreadPoolExecutor(max(1, settings.parallel), thread_name_prefix="output")
        self._busy: set[int] = set()
        self._lock = threading.Lock()
        self._looked = -LOOK
        self._running_since: dict[int, float] = {}
        self._sealing_since: dict[int, float] = {}  # job -> its first seal (monotonic)
        self._retry_at: dict[int, float] = {}  # job -> no seal before (monotonic)

    # -- the pass ----------------------------------------------------------------------

    def pass_once(self, force: bool = False) -> int:
        """Start the syncs and seals that are due; how many were started. The queue is
        read (the burst partitions' jobs) only while an output is open, or was sealed
        within ``REOPEN`` (its job may be requeued and run again)."""
        now = self.clock.monotonic()
        if not force and now - self._looked < LOOK:
            return 0
        recent = self.clock.now() - REOPEN
        rows = [r for r in self.store.outputs()
                if r.state in OutputState.OPEN or r.updated_at >= recent]  # fmt: skip
        if not rows:
            return 0
        self._looked = now
        jobs = {j.job_id: j for j in self.scheduler.jobs(list(self.settings.partitions) or None)}
        by_job: dict[int, list[OutputRecord]] = {}
        for r in rows:
            by_job.setdefault(r.job_id, []).append(r)
        started = 0
        for job_id, outs in by_job.items():
            job = jobs.get(job_id)
            if job is not None and job.state == "RUNNING":
                started += self._running(job, outs)
            elif any(r.state in OutputState.OPEN for r in outs) and (
                job is None or job.state in ENDED
            ):
                self._running_since.pop(job_id, None)
                if self._retry_at.get(job_id, 0.0) <= now:
                    started += self._start(job_id, final=True)
        return started

    def _running(self, job: SlurmJob, outs: list[OutputRecord]) -> int:
        first = next(iter(expand(job.nodes)), "") if job.nodes else ""
        rec = self.store.node(first) if first else None
        if rec is None:  # on-prem: nothing to bring home, the job writes there itself
            return 0
        now = self.clock.now()
        since = self._running_since.setdefault(job.job_id, now)
        for r in outs:
            if r.node != first or r.state not in OutputState.RUNNING:  # new, or requeued
                self.store.update_output(r.job_id, r.name, now, node=first,
                                         state=OutputState.SYNCED if r.manifest
                                         else OutputState.WAITING)  # fmt: skip
        due = (
            any(r.sync and now - max(r.synced_at, since) >= r.sync for r in outs)
            and rec.state == NodeState.JOINED
        )
        return self._start(job.job_id, final=False) if due else 0

    def _start(self, job_id: int, final: bool) -> int:
        with self._lock:
            if job_id in self._busy:
                return 0
            self._busy.add(job_id)
        self._pool.submit(self._work, job_id, final)
        return 1

    def _work(self, job_id: int, final: bool) -> bool:
        """Seal or sync ``job_id``, whose busy mark the caller holds (released here);
        whether a sync was done."""
        try:
            if final:
                self.seal(job_id)
                return False
            return self.sync_job(job_id)
        except StoreError as exc:  # the next pass finds it where it was
            log.error("output.unrecorded job=%s error=%s", job_id, exc)
        except Exception as exc:  # boundary: a pool thread; a defect fails this job's sync
            contain("output.work", exc, None)
        finally:
            with self._lock:
                self._busy.discard(job_id)
        return False

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- sync --------------------------------------------------------------------------

    def sync_job(self, job_id: int) -> bool:
        """Sync every open output of ``job_id`` from its node (a failure is logged and
        left for the next sync: the last version stays the one recorded); whether it
        was done."""
        outs = [r for r in self.store.outputs(job_id, OutputState.RUNNING) if r.node]
        if not outs:
            return False
        try:
            with self._session(outs[0].node) as sh:
                for r in outs:
                    self._settled(sh, r)
        except BurstError as exc:
            log.warning("output.sync_failed job=%s code=%s %s", job_id, exc.code, exc)
            why = f"last sync failed: {exc.code}: {exc}"[:900]
            for r in outs:
                self.store.update_output(r.job_id, r.name, self.clock.now(), message=why)
            return False
        return True

    def sync_now(self, job_ids: Sequence[int], timeout: float) -> list[int]:
        """Sync the running outputs of ``job_ids`` at once, whatever their ``sync=``,
        waiting at most ``timeout`` seconds: a reclaim is coming, and the checkpoint the
        job wrote on its signal is what it resumes from only if it is in the store
        before the job is requeued. A sync already under way for a job is waited for,
        then one more is run (it may have scanned before the checkpoint was written).
        The jobs whose sync was done in time."""
        deadline = self.clock.monotonic() + timeout
        done: list[int] = []
        threads = [
            threading.Thread(target=self._sync_first, args=(job_id, deadline, done),
                             name=f"output-now-{job_id}", daemon=True)
            for job_id in job_ids
            if any(r.node for r in self.store.outputs(job_id, OutputState.RUNNING))
        ]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, deadline - self.clock.monotonic()))
        return sorted(done)

    def _sync_first(self, job_id: int, deadline: float, done: list[int]) -> None:
        while True:
            with self._lock:
                if job_id not in self._busy:
                    self._busy.add(job_id)
                    break
            if self.clock.monotonic() >= deadline:
                return
            self.clock.sleep(0.2)
        if self._work(job_id, final=False) and self.clock.monotonic() <= deadline:
            done.append(job_id)

    def _up(self, name: str) -> tuple[NodeRecord | None, bool]:
        """Node ``name``'s record, and whether it is joined and reachable."""
        node = self.store.node(name)
        return node, node is not None and node.state == NodeState.JOINED and bool(node.ip)

    @contextlib.contextmanager
    def _session(self, name: str) -> Iterator[RemoteShell]:
        node, up = self._up(name)
        if node is None or not up:
            raise OutputError(f"{name} is not up ({node.state if node else 'unknown'})")
        deadline = self.clock.monotonic() + 60
        sh = self.connector.connect(node.ip, node.host_key_list(), deadline)
        try:
            sh.put(self.helper, REMOTE, 0o700)
            yield sh
        finally:
            sh.close()

    def _sync(self, sh: RemoteShell, r: OutputRecord) -> None:
        """One output's sync: scan, send what the store lacks, record the version."""
        st = self.store.stage(r.job_id)
        if st is None:
            raise OutputError(f"job {r.job_id}'s stage record is gone (whose job?)")
        account = st.owner.account
        directory = output_dir(self.settings.node_dir, r.job_id, r.name)
        cache = CACHE.format(job=r.job_id, name=r.name)
        pins = PINS.format(job=r.job_id, name=r.name)
        scan = self._run(sh, "scan", "--dir", directory, "--cache", cache, "--pins", pins,
                         "--uid", str(st.owner.uid))  # fmt: skip
        where = f"job {r.job_id} {r.name} on {r.node}"
        try:
            manifest = output_manifest(r.home, scan.get("files"), where)
        except BurstError as exc:
            raise OutputError(f"{where}: {exc}") from exc
        sent_bytes = 0
        if manifest.id != r.manifest:
            plan, _ = self.stager.output_plan(account, manifest, directory)
            if plan["files"]:
                path = f"/run/slurm-burst-send-{r.job_id}-{r.name}.json"
                plan = {**plan, "pins": pins}  # sent from what the scan read
                sh.put(json.dumps(plan).encode(), path, 0o600)  # its URLs are grants
                sent = self._run(sh, "send", "--plan", path)
                changed = [p for p in sent.get("changed", []) if isinstance(p, str)]
                if changed:  # what went under those digests may be other bytes: dropped
                    moved = set(changed)
                    digests = [e.sha256 for e in manifest.entries if e.path in moved]
                    self.stager.drop(account, "", manifest, digests)
                    raise _Changed(
                        f"{where}: {len(changed)} files changed while they were sent "
                        f"({', '.join(changed[:3])}): this version is not recorded"
                    )
                if sent.get("exit") != 0:
                    why = str(sent.get("error") or sent.get("failed"))[:400]
                    raise OutputError(f"{where}: {why}")
                sent_bytes = _count(sent, "sent_bytes")
            self.stager.commit(account, manifest)
        now = self.clock.now()
        skipped = _count(scan, "skipped_count") + _count(scan, "busy_count")
        note = f"synced {len(manifest.entries)} files, {manifest.size} bytes ({sent_bytes} sent)"
        if skipped:
            note += f"; {skipped} not regular files or busy, left out"
        if unpinned := _count(scan, "unpinned"):
            note += f"; {unpinned} not pinned (another filesystem): sent from their paths"
        self.store.update_output(
            r.job_id, r.name, now, state=OutputState.SYNCED, manifest=manifest.id,
            files=len(manifest.entries), bytes=manifest.size, synced_at=now, message=note,
        )  # fmt: skip
        log.info("output.synced job=%s name=%s files=%d bytes=%d sent_bytes=%d",
                 r.job_id, r.name, len(manifest.entries), manifest.size, sent_bytes)  # fmt: skip

    def _run(self, sh: RemoteShell, *args: str) -> dict[str, Any]:
        argv = [self.settings.node_python, REMOTE, "--exit-zero", *args]
        try:
            said = sh.run(argv, self.settings.command_timeout)
        except RemoteError as exc:
            raise OutputError(f"stage-out {args[0]} on the node: {exc}") from exc
        try:
            out = read_json(said.strip().splitlines()[-1], f"stage-out {args[0]}'s answer",
                            max_bytes=MAX_SCAN, max_values=MAX_SCAN_VALUES)  # fmt: skip
        except (ValueError, IndexError):
            out = None
        if not isinstance(out, dict):
            raise OutputError(f"stage-out {args[0]} on the node said {said[-200:]!r}")
        if args[0] == "scan" and out.get("exit") != 0:
            raise OutputError(f"stage-out scan: {str(out.get('error'))[:400]}")
        return out

    # -- seal --------------------------------------------------------------------------

    def seal(self, job_id: int) -> None:
        """The job ended: its outputs' final sync (while the node is up), then each
        brought home as the job's user. What fails is tried again on later passes (a
        held node waits for it) until ``release_deadline`` from the first try; then the
        output is lost, and its record says what is where."""
        outs = self.store.outputs(job_id, OutputState.OPEN)
        if not outs:
            return
        if not all(r.node for r in outs):  # over before a pass saw it run: where it was
            first = self._pulled_on(job_id)
            if first:
                now = self.clock.now()
                for r in outs:
                    if not r.node:
                        self.store.update_output(r.job_id, r.name, now, node=first)
                outs = self.store.outputs(job_id, OutputState.OPEN)
        since = self._sealing_since.setdefault(job_id, self.clock.monotonic())
        past = self.clock.monotonic() - since >= self.settings.release_deadline
        running = [r for r in outs if r.node and r.state in OutputState.RUNNING]
        if running and not self._final(job_id, running, past):
            return  # tried again on a later pass
        for r in self.store.outputs(job_id, OutputState.OPEN):
            self._home(r, past)
        if not self.store.outputs(job_id, OutputState.OPEN):
            self._sealing_since.pop(job_id, None)

    def _final(self, job_id: int, outs: list[OutputRecord], past: bool) -> bool:
        """The last sync of each of ``outs`` (ENDED), or PARTIAL if their node is gone (or
        the sync keeps failing past the deadline); False: failed, to be tried again."""
        now = self.clock.now()
        node, up = self._up(outs[0].node)
        if up:
            try:
                with self._session(outs[0].node) as sh:
                    for r in outs:
                        self._settled(sh, r)
                        self.store.update_output(r.job_id, r.name, self.clock.now(),
                                                 state=OutputState.ENDED)  # fmt: skip
                return True
            except BurstError as exc:
                why = f"{exc.code}: {exc}"
                log.error("output.final_sync_failed job=%s %s", job_id, why)
                if not past:
                    for r in outs:
                        self.store.update_output(r.job_id, r.name, now, message=(
                            f"the final sync failed, to be tried again: {why}"[:900]))  # fmt: skip
                    self._retry_later(job_id)
                    return False
        else:
            why = f"{outs[0].node} was gone ({node.state if node else 'unknown'})"
        for r in outs:
            self.store.update_output(r.job_id, r.name, now, state=OutputState.PARTIAL,
                                     message=f"no final sync: {why}"[:900])  # fmt: skip
        return True

    def _retry_later(self, job_id: int) -> None:
        self._retry_at[job_id] = self.clock.monotonic() + RETRY

    def _pulled_on(self, job_id: int) -> str:
        """The first of the nodes that made the job's directories at their join (their
        ``staged`` marks; hostlist order, as Slurm picks the batch host); '' if none."""
        return min(self.store.pulled_on(job_id), key=_natural, default="")

    def _settled(self, sh: RemoteShell, r: OutputRecord) -> None:
        """``_sync``, again at once (up to ``CHANGED_TRIES`` in all) when files changed
        while they were sent: written into in place since the scan (a file replaced
        whole is sent from the scan's pin); a rescan reads only what changed."""
        for _ in range(CHANGED_TRIES - 1):
            try:
                self._sync(sh, r)
                return
            except _Changed as exc:
                log.info("output.changed_while_sent job=%s name=%s %s", r.job_id, r.name, exc)
        self._sync(sh, r)

    def _home(self, r: OutputRecord, past: bool) -> None:
        now = self.clock.now()
        if not r.node:
            why = "the job ran on no cloud node: nothing to bring home"
            self.store.update_output(r.job_id, r.name, now, state=OutputState.SEALED, message=why)
            return
        if not r.manifest:
            self._lost(r, f"no version was synced before the node was lost ({r.message})")
            return
        st = self.store.stage(r.job_id)
        if st is None:
            self._lost(r, "the job's stage record is gone (whose job?)")
            return
        try:
            got = self.promoter.promote(st.owner.user, st.owner.account, r.manifest, r.home)
        except BurstError as exc:
            if self.book is not None:
                self.book.failed(TransferDirection.OUT)
            if isinstance(exc, CorruptOutput) and not past and self._send_again(r, st, exc):
                return  # its node sends the bad objects again; brought home on a later pass
            if past:
                self._lost(r, f"not brought home: {exc.code}: {exc}")
            else:
                self.store.update_output(r.job_id, r.name, now, message=(
                    f"not home yet, to be tried again: {exc.code}: {exc}"[:900]))  # fmt: skip
                self._retry_later(r.job_id)
            return
        if self.book is not None:
            self.book.brought_home(got, account=st.owner.account, user=st.owner.user,
                                   job_id=r.job_id, name=r.name, node=r.node,
                                   manifest=r.manifest)  # fmt: skip
        if r.state == OutputState.PARTIAL:
            self._lost(r, f"{r.message}; {r.home} holds the version synced at "
                       f"{r.synced_at:.0f} ({r.files} files): what the job wrote after it is "
                       "lost", home=True)  # fmt: skip
            return
        self.store.update_output(
            r.job_id, r.name, now, state=OutputState.SEALED,
            message=f"home: {got.get('files')} files, {got.get('bytes')} bytes, verified",
        )  # fmt: skip
        self.store.event(now, "output.sealed", r.node, f"job {r.job_id} {r.name} -> {r.home}")
        log.info("output.sealed job=%s name=%s home=%s files=%s", r.job_id, r.name, r.home,
                 got.get("files"))  # fmt: skip

    def _send_again(self, r: OutputRecord, st: StageRecord, exc: CorruptOutput) -> bool:
        """A version whose objects came back from the store wrong: those objects are
        dropped and the output is synced again from its node (held, the job over: the
        bytes are still there), then brought home on a later pass. False where the node
        is gone (nothing else has the bytes) or the version was its last before a loss."""
        if r.state != OutputState.ENDED or not self._up(r.node)[1]:
            return False
        account = st.owner.account
        try:
            manifest = self.stager.manifest_of(account, r.manifest)
            bad = set(exc.bad)
            digests = [e.sha256 for e in manifest.entries if not bad or e.path in bad]
            dropped = self.stager.drop(account, "", manifest, digests)
        except BurstError as err:
            log.error("output.send_again_failed job=%s name=%s error=%s", r.job_id, r.name, err)
            return False
        now = self.clock.now()
        why = f"{len(exc.bad) or 'its'} files came back from the store wrong"
        self.store.update_output(r.job_id, r.name, now, state=OutputState.SYNCED, manifest="",
                                 message=f"{why}: {dropped} objects dropped, sent again "
                                 f"from {r.node}")  # fmt: skip
        self.store.event(now, "output.sent_again", r.node,
                         f"job {r.job_id} {r.name}: {why}"[:900])  # fmt: skip
        log.warning("output.sent_again job=%s name=%s node=%s dropped=%d", r.job_id, r.name,
                    r.node, dropped)  # fmt: skip
        return True

    def _lost(self, r: OutputRecord, why: str, home: bool = False) -> None:
        now = self.clock.now()
        self.store.update_output(r.job_id, r.name, now, state=OutputState.LOST, message=why[:900])
        self.store.event(now, "output.lost", r.node, f"job {r.job_id} {r.name}: {why}"[:900])
        if self.metrics is not None:
            self.metrics.output_lost()
        log.error("output.lost job=%s name=%s home_has_version=%s %s", r.job_id, r.name, home, why)

    # -- the release of a node -----------------------------------------------------------

    def _show_held(self, name: str, deadline: float | None) -> None:
        with self._lock:
            if deadline is None:
                self._held.pop(name, None)
            else:
                self._held[name] = deadline
            left = min(self._held.values(), default=math.inf) - self.clock.monotonic()
            count = len(self._held)
        if self.metrics is not None:
            self.metrics.outputs_held(count, max(0.0, left))

    def holding(self, name: str) -> list[OutputRecord]:
        """The outputs not yet sealed of jobs that ran on node ``name``."""
        return [r for r in self.store.outputs(states=OutputState.OPEN) if r.node == name]

    def hold(self, node: NodeRecord, stopping: Callable[[], bool]) -> bool:
        """Before ``node`` is released: wait until the outputs of its jobs are sealed, at
        most ``release_deadline``; past it, they are recorded as lost. True if the node
        may go now; False if the daemon is stopping (the node is left as it is)."""
        held = self.holding(node.name)
        if not held:
            return True
        jobs = sorted({r.job_id for r in held})
        self.store.event(self.clock.now(), "node.held_for_outputs", node.name,
                         f"jobs {', '.join(map(str, jobs))}")  # fmt: skip
        log.info("node.held_for_outputs node=%s jobs=%s", node.name, jobs)
        deadline = self.clock.monotonic() + self.settings.release_deadline
        first = True
        try:
            while self.clock.monotonic() < deadline:
                self._show_held(node.name, deadline)
                if stopping():
                    return False
                self.pass_once(force=first)
                first = False
                if not self.holding(node.name):
                    return True
                self.clock.sleep(1.0)
        finally:
            self._show_held(node.name, None)
        for r in self.holding(node.name):
            version = (f"{r.home} holds nothing of it" if not r.manifest else
                       f"the version synced at {r.synced_at:.0f} ({r.files} files) is in the "
                       "store, not home")  # fmt: skip
            self._lost(r, f"not sealed within staging.release_deadline "
                       f"({self.settings.release_deadline:.0f} s) of the node's release: "
                       f"{version}")  # fmt: skip
        return True
